"""Fixtures shared across test folders: a tiny synthetic federation on disk, made once per session."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from secfed.config import RunConfig, RunSection
from secfed.data.synth import generate

torch.set_num_threads(2)
# rich draws CLI errors in a box as wide as the terminal: a wide one keeps each message on one line
os.environ.setdefault("COLUMNS", "250")


@pytest.fixture(scope="session")
def synth_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Three small synthetic domains in Market-1501 format (a few hundred images in all)."""
    root = tmp_path_factory.mktemp("synth") / "domains"
    generate(root, domains=3, seed=7, scale=0.15, height=64, width=32)
    return root


@pytest.fixture
def tiny_config(synth_root: Path, tmp_path: Path) -> RunConfig:
    """A run that trains in seconds: ResNet-18 at 32×16, two rounds, small batches."""
    cfg = RunConfig(run=RunSection(seed=3, out=str(tmp_path / "runs"), name="tiny"))
    cfg.data.root = str(synth_root)
    cfg.data.height, cfg.data.width = 32, 16
    cfg.schedule.rounds = 2
    cfg.schedule.batch_size = 8
    cfg.secagg.enabled = False
    return cfg
