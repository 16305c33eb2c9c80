"""secfed.memory: freed model-sized blocks are reused without new page faults."""

from __future__ import annotations

import os
import platform
import subprocess
import sys

PROGRAM = """
import resource, sys
from secfed.memory import reuse_freed_memory
print(reuse_freed_memory())
def faults():
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    block = b"\\x01" * (64 << 20)  # written through: every page is touched
    del block
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
faults()
print(faults())
"""


def _second_allocation(reuse: bool, env: dict[str, str] | None = None) -> tuple[str, int]:
    code = PROGRAM if reuse else PROGRAM.replace("print(reuse_freed_memory())", "print('skipped')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ, **(env or {})}).stdout.split()
    return out[0], int(out[1])


def test_a_freed_64_mb_block_is_reused_without_faulting_its_pages_again() -> None:
    _, faults_default = _second_allocation(reuse=False)
    if platform.libc_ver()[0] != "glibc":
        assert _second_allocation(reuse=True)[0] == "False"
        return
    set_, faults_reused = _second_allocation(reuse=True)
    assert faults_default > 8000  # 64 MiB in 4 KiB pages, mapped afresh
    assert set_ == "True" and faults_reused < 500


def test_thresholds_set_in_the_environment_are_left_alone() -> None:
    set_, faults = _second_allocation(reuse=True, env={"MALLOC_TRIM_THRESHOLD_": "131072"})
    assert set_ == "False"


def test_the_secfed_command_asks_for_freed_memory_to_be_reused_before_it_runs() -> None:
    # `secfed` is secfed.cli.main:main; --version exits before any subcommand runs.
    code = """
import sys
import secfed.cli.main as entry
calls = []
entry.reuse_freed_memory = lambda: calls.append(1) or True
sys.argv = ["secfed", "--version"]
try:
    entry.main()
except SystemExit:
    pass
print(len(calls))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split()[-1] == "1"
