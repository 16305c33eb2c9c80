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


def test_every_bench_secagg_section_runs_at_toy_size_under_a_described_machine() -> None:
    """The sections README and RESULTS cite (keystream, client, full, server, flower-overflow) still run
    from their command lines, and the header names the machine through secfed.environment.describe()."""
    sections = ("keystream", "client", "full", "server", "flower-overflow", "params")
    out = _run("bench_secagg.py", "--sections", ",".join(sections), "--dims", "64", "--clients", "4",
               "--variants", "secagg", "--modes", "authenticated", "--flower", "none",
               "--keystream-neighbours", "2", "--keystream-repeats", "1", "--full-clients", "4", "--full-dim", "16",
               "--server-clients", "4", "--server-dim", "16")
    assert "torch kernels" in out.splitlines()[0]  # describe()'s line, not a bench's own
    assert all(f"   [{s}: " in out for s in sections), out
    full = [line for line in out.splitlines() if line.lstrip().startswith("4 ") and "exact" in line]
    assert full, out  # the full section unmasked the exact sum


def test_no_bench_patches_the_protocol() -> None:
    """Benches measure the protocol through its public hooks (simulate's and drive's ``on_step``,
    ``ClientPrimitives``, ``mask_into(hasher=)``), never by patching its internals: a patched
    bench measures code that does not ship and breaks silently when the internals move."""
    patched = [f"{path.relative_to(BENCH)}:{n}" for path in sorted(BENCH.rglob("*.py"))
               for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
               if "mock.patch" in line or "monkeypatch" in line or "unittest import mock" in line]
    assert not patched, "benches patch code: " + ", ".join(patched)
