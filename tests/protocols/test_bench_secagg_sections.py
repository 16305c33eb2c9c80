"""bench/bench_secagg.py's scale sections still run and keep their checks, at toy sizes: the full
round (every client real) recovers the exact sum in both modes, and the server-in-a-subprocess
section reports its time and peak memory. Timings are not asserted (bench/RESULTS.md has them)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench" / "bench_secagg.py"


def test_full_and_server_sections_run_and_check_the_sum():
    done = subprocess.run(
        [sys.executable, str(BENCH), "--sections", "full,server", "--full-clients", "8,14",
         "--full-modes", "unauthenticated,authenticated", "--full-dim", "50", "--server-clients", "12",
         "--server-dim", "3000"],
        capture_output=True, text=True, timeout=120, check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    rows = [line for line in done.stdout.splitlines() if line.strip().split(" ")[0] in ("8", "14")]
    assert len(rows) == 4 and all(" exact " in row for row in rows), done.stdout
    assert done.stdout.count("growth: round CPU ∝ n^") == 2
    assert "server peak resident memory:" in done.stdout and "close unmask" in done.stdout
