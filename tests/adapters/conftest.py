"""Fixtures of the Flower adapter's tests: toy nodes on the in-process grid (fakegrid.py)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from fakegrid import FakeGrid
from flwr.app import Array, ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from secfed.adapters.flower import Cohort, SecAggMod
from secfed.adapters.flower import node as node_files


def toy_app(mod: SecAggMod, *, weight: Callable[[int], float] = lambda p: 10.0 * (p + 1)) -> ClientApp:
    """Node p replies arrays + (p + 1)·0.01 and weight ``weight(p)`` (p = its partition-id)."""
    app = ClientApp(mods=[mod])

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        p = int(context.node_config["partition-id"])
        arrays = ArrayRecord({k: Array(a.numpy() + np.float32(0.01 * (p + 1))) for k, a in msg.content["arrays"].items()})
        metrics = MetricRecord({"num-examples": weight(p), "train_loss": 1.0 + p})
        return Message(RecordDict({"arrays": arrays, "metrics": metrics}), reply_to=msg)

    return app


@pytest.fixture
def deployment(tmp_path: Path):
    """``make(n)`` → (FakeGrid of n toy nodes with their own state folders, the cohort)."""

    def make(n: int, *, allow_unauthenticated: bool = False, weight=lambda p: 10.0 * (p + 1),
             strangers: int = 0) -> tuple[FakeGrid, Cohort]:
        nodes, sites = {}, {}
        for p in range(n):
            folder = tmp_path / f"node{p}"
            folder.mkdir()
            key = node_files.identity_key(folder)
            if p < n - strangers:
                sites[f"site-{p}"] = node_files.public_identity(key)
            config = {"partition-id": p, node_files.STATE_DIR_KEY: str(folder),
                      node_files.COHORT_KEY: str(tmp_path / "cohort.toml")}
            if allow_unauthenticated:
                config["secfed-allow-unauthenticated"] = True
            nodes[1000 + p] = (toy_app(SecAggMod(), weight=weight), config)
        cohort = Cohort(sites)
        (tmp_path / "cohort.toml").write_text(cohort.dumps())
        return FakeGrid(nodes), cohort

    return make
