"""Fixtures shared across test folders: a tiny synthetic federation on disk, made once per session."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

# Before torch loads OpenMP. `make test` runs two pytest-xdist workers, and tests start CLI and
# SuperNode processes beside them: more threads than cores. OpenMP's default wait spins at every
# barrier while the thread it waits for is descheduled, which made the training tests 3–7× slower
# under two workers; a passive wait changes no result, only who holds the core.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402 - after the wait policy

from secfed.config import RunConfig, RunSection  # noqa: E402
from secfed.data.synth import generate  # noqa: E402

# One torch thread per xdist worker (two workers keep both cores busy through the suite's
# single-threaded half too); two threads when the suite runs in one process.
torch.set_num_threads(1 if os.environ.get("PYTEST_XDIST_WORKER") else 2)
# rich draws CLI errors in a box as wide as the terminal: a wide one keeps each message on one line
os.environ.setdefault("COLUMNS", "250")


@pytest.fixture(scope="session")
def synth_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Three small synthetic domains in Market-1501 format (a few hundred images in all), and a public
    set of other people for distillation (``public``)."""
    root = tmp_path_factory.mktemp("synth") / "domains"
    generate(root, domains=3, seed=7, scale=0.15, height=64, width=32, public=48)
    return root


def tiny(synth_root: Path, out: Path) -> RunConfig:
    """A run that trains in seconds: ResNet-18 at 32×16, two rounds, small batches."""
    cfg = RunConfig(run=RunSection(seed=3, out=str(out), name="tiny"))
    cfg.data.root = str(synth_root)
    cfg.data.height, cfg.data.width = 32, 16
    cfg.schedule.rounds = 2
    cfg.schedule.batch_size = 8
    cfg.secagg.enabled = False
    return cfg


def small(synth_root: Path, out: Path, *, two_sites: bool = False) -> RunConfig:
    """tiny at 16×8 pixels with a 32-wide neck, evaluated after the last round only: the same code
    paths at a fraction of the arithmetic, for tests whose assertions do not depend on what the model
    learns (privacy, resume, transports, progress). ``two_sites``: two of the three domains (79 of the
    148 training images), for runs whose cost grows with the images or the sites (DP-SGD's per-example
    gradients, noise and masks of every site, resumed runs) and whose assertions hold for any number
    of sites above one."""
    cfg = tiny(synth_root, out)
    cfg.data.height, cfg.data.width = 16, 8
    cfg.model.neck_dim = 32
    cfg.run.eval_every = 0
    if two_sites:
        cfg.data.datasets = ["corridor", "plaza"]
    return cfg


@pytest.fixture
def tiny_config(synth_root: Path, tmp_path: Path) -> RunConfig:
    """:func:`tiny` writing under the test's own tmp_path."""
    return tiny(synth_root, tmp_path / "runs")


@pytest.fixture(scope="session")
def small_at(synth_root: Path) -> Callable[..., RunConfig]:
    """:func:`small` writing under a folder the caller names (a run shared by a module's tests)."""
    return lambda out, two_sites=False: small(synth_root, out, two_sites=two_sites)


@pytest.fixture
def small_config(small_at: Callable[..., RunConfig], tmp_path: Path) -> RunConfig:
    """:func:`small` writing under the test's own tmp_path."""
    return small_at(tmp_path / "runs")


@pytest.fixture
def two_site_config(small_at: Callable[..., RunConfig], tmp_path: Path) -> RunConfig:
    """:func:`small` on two sites, writing under the test's own tmp_path."""
    return small_at(tmp_path / "runs", two_sites=True)
