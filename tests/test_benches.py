"""The benchmarks still run and still check their own answers, at toy sizes.

Timing targets are not asserted here (they live in bench/RESULTS.md); these tests keep the scripts
from rotting and keep their correctness checks — identical CMC/mAP against the per-query reference,
an exact unmasked sum — in CI.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "bench"


def _run(script: str, *args: str) -> str:
    done = subprocess.run(
        [sys.executable, str(BENCH / script), *args], capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, f"{script} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
    return done.stdout


def test_bench_eval_matches_the_per_query_reference() -> None:
    out = _run("bench_eval.py", "--queries", "150", "--gallery", "900", "--ids", "60", "--distractors", "80",
               "--dim", "32", "--repeats", "1")
    verdicts = [line for line in out.splitlines() if " vs reference: " in line]
    assert len(verdicts) == 2 and all(line.endswith("-> OK") and "CMC identical" in line for line in verdicts)


def test_bench_secagg_recovers_the_exact_sum_with_dropouts() -> None:
    out = _run("bench_secagg.py", "--dims", "3000", "--clients", "6", "--variants", "secagg,secaggplus",
               "--dropout", "0.2", "--flower", "none")
    headers = [line for line in out.splitlines() if line.startswith(("secagg n=", "secaggplus n="))]
    assert len(headers) == 2, out
    assert all("dropped=1" in line and "sum exact" in line for line in headers)
