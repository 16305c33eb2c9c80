"""One round driver, any transport: runtime.drive runs select → train → aggregate → apply → record →
evaluate → checkpoint once, and a transport only carries the round's messages to the sites."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import torch

from secfed.config import RunConfig
from secfed.federation import checkpoint as ckpt
from secfed.federation.builder import build
from secfed.federation.runtime import InProcess, SilentReporter, drive, eval_due, run, start_run_dir

FLOWER = Path(__file__).resolve().parents[2] / "secfed" / "adapters" / "flower"


class Counting(InProcess):
    """The in-process transport, counting what the driver asks of it."""

    def __init__(self, run_dir: Path) -> None:
        super().__init__(run_dir)
        self.calls: list[str] = []

    def train(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        self.calls.append("train")
        return super().train(*args, **kwargs)

    def evaluate(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        self.calls.append("evaluate")
        return super().evaluate(*args, **kwargs)


def test_the_driver_over_a_transport_is_the_run(two_site_config: RunConfig, tmp_path: Path) -> None:
    """A transport that only carries messages gets the run's rounds bit for bit: the driver, not
    the transport, owns the records, the evaluation planning and the checkpoints."""
    cfg = two_site_config
    cfg.run.local_baseline = False
    cfg.schedule.rounds = 1  # one round keeps the suite fast; the Flower test checks two
    cfg.run.eval_every = 0  # evaluated only at the last round: the driver plans it, the transport runs it
    reference = run(cfg, tmp_path / "run")
    fed = build(cfg)
    ours = tmp_path / "driven"
    ours.mkdir()
    start_run_dir(fed, ours)
    transport = Counting(ours)
    drive(fed, transport, ours, SilentReporter(), history=[])
    rounds = cfg.schedule.rounds
    assert transport.calls.count("train") == rounds
    assert transport.calls.count("evaluate") == sum(eval_due(cfg, r) for r in range(1, rounds + 1)) == 1
    a = [json.loads(x) for x in (ours / "metrics.jsonl").read_text().splitlines()]
    b = [json.loads(x) for x in (reference.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [set(r) for r in a] == [set(r) for r in b] and [r["loss"] for r in a] == [r["loss"] for r in b]
    name = f"round-{rounds:04d}.pt"
    assert torch.equal(ckpt.load_checkpoint(ours / "checkpoints" / name)["global"],
                       ckpt.load_checkpoint(reference.run_dir / "checkpoints" / name)["global"])


def test_the_flower_transport_imports_nothing_private_from_secfed() -> None:
    """The Flower adapter is a transport on public pieces: no `_name` imported from a secfed module
    outside the adapter, so the round's rules cannot be restated behind the driver's back."""
    private = []
    for path in sorted(FLOWER.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("secfed"):
                private += [f"{path.name}: {node.module}.{a.name}" for a in node.names
                            if a.name.startswith("_") and not (a.name.startswith("__") and a.name.endswith("__"))]
    assert private == []
