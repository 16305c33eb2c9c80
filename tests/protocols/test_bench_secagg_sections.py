"""bench/bench_secagg.py's scale sections still run and keep their checks, at toy sizes: the full
round (every client real) recovers the exact sum in both modes, and the server section (the server
in its own process, fed wire bytes) reports its time and peak memory. Timings are not asserted
(bench/RESULTS.md has them)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench" / "bench_secagg.py"


def load_bench():
    spec = importlib.util.spec_from_file_location("bench_secagg", BENCH)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up while being defined
    spec.loader.exec_module(module)
    return module


def test_full_and_server_sections_run_and_check_the_sum(capsys):
    bench = load_bench()
    args = bench.parse_args(["--sections", "full,server", "--full-clients", "8,14", "--full-modes",
                             "unauthenticated,authenticated", "--full-dim", "50", "--server-clients", "12",
                             "--server-dim", "3000"])
    bench.SECTIONS["full"](args)
    bench.SECTIONS["server"](args)
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.strip().split(" ")[0] in ("8", "14")]
    assert len(rows) == 4 and all(" exact " in row for row in rows), out
    assert out.count("growth: round CPU ∝ n^") == 2
    assert "server peak resident memory:" in out and "close unmask" in out


def test_the_identities_section_checks_a_session_of_real_keys(capsys):
    """The cost of refusing identity keys that can stand for no one (bench/RESULTS.md), at a toy size."""
    bench = load_bench()
    bench.SECTIONS["identities"](bench.parse_args(["--sections", "identities", "--server-clients", "20"]))
    out = capsys.readouterr().out
    assert "keys unseen" in out and "keys seen (cached)" in out and "one key checked" in out
