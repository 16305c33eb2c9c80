"""`secfed --help` and every subcommand's --help answer without loading torch, torchvision, Opacus,
SciPy or matplotlib (≈ 4 s on the dev VM): the library is imported when a command runs."""

from __future__ import annotations

import json
import subprocess
import sys

HELPS = [["--help"], ["--version"], ["train", "--help"], ["evaluate", "--help"], ["compare", "--help"],
         ["pretrain", "--help"], ["audit", "--help"], ["flower", "--help"], ["data", "synth", "--help"],
         ["data", "inspect", "--help"]]
PROBE = f"""
import json, sys
from click.testing import CliRunner
from secfed.cli.main import cli
codes = [CliRunner().invoke(cli, args).exit_code for args in {HELPS!r}]
heavy = sorted({{m.split('.')[0] for m in sys.modules}} & {{'torch', 'torchvision', 'opacus', 'scipy', 'matplotlib'}})
print(json.dumps({{"codes": codes, "heavy": heavy}}))
"""


def test_the_help_of_every_command_loads_no_torch():
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, check=True)
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert seen["codes"] == [0] * len(HELPS)  # every help was printed
    assert seen["heavy"] == []


def test_threads_beyond_what_torch_can_start_are_refused_by_name(tmp_path):
    """(review: `evaluate --threads 99999999999` was an OverflowError traceback, `--threads 100000`
    "can't start new thread"; train and pretrain already capped it)"""
    from click.testing import CliRunner

    from secfed.cli.main import cli

    for command in (["evaluate", str(tmp_path)], ["audit", str(tmp_path)]):
        result = CliRunner().invoke(cli, [*command, "--threads", "99999999999"])
        assert result.exit_code == 2 and "--threads" in result.output, result.output
