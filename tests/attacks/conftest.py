"""Fixtures of the audit tests: people from the synthetic domains, a toy gallery, a tiny recorded run."""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from secfed.attacks.controls import gallery_of
from secfed.attacks.judge import Gallery
from secfed.config import RunConfig, RunSection
from secfed.data.images import load_images
from secfed.data.registry import load_dataset
from secfed.federation.runtime import run

HEIGHT, WIDTH = 32, 16


@contextlib.contextmanager
def threads(n: int) -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@pytest.fixture(autouse=True)
def one_thread() -> Iterator[None]:
    """The attacks' tiny batches run faster on one thread than on two contended ones (as `secfed audit`)."""
    with threads(1):
        yield


@pytest.fixture(scope="session")
def people(synth_root: Path) -> dict[str, list[tuple[str, torch.Tensor]]]:
    """Per synthetic domain, (identity, images) of its training people (≥ 2 images each), under
    "DOMAIN:test" its test people, and under "distractors" the test people of every domain."""
    out: dict[str, list[tuple[str, torch.Tensor]]] = {"distractors": []}
    for folder in sorted(p for p in synth_root.iterdir() if p.is_dir() and p.name != "public"):
        ds = load_dataset(folder, "market1501", name=folder.name)
        counts = Counter(s.pid for s in ds.train)
        out[folder.name] = [(f"{folder.name}/{pid}", load_images([s for s in ds.train if s.pid == pid], HEIGHT, WIDTH))
                            for pid in sorted(counts) if counts[pid] >= 2]
        tests: dict[int, list] = {}
        for s in ds.query + ds.gallery:
            if s.pid > 0:
                tests.setdefault(s.pid, []).append(s)
        out[f"{folder.name}:test"] = [(f"{folder.name}:test/{pid}", load_images(ss, HEIGHT, WIDTH))
                                      for pid, ss in sorted(tests.items())]
        out["distractors"] += out[f"{folder.name}:test"]
    return out


@pytest.fixture(scope="session")
def two_people(people: dict[str, list[tuple[str, torch.Tensor]]]) -> tuple[Gallery, list[int], torch.Tensor]:
    """One training image of each of two people (the victims), and a gallery: those images, the rest of
    their domain's training images, and that domain's test people (same cameras) as distractors.
    Returns (gallery, victim indices, victim images).
    (Corridor's people have four images each: a rank-1 re-identification is then unlikely by chance.)"""
    domain = people["corridor"]
    groups = [(name, imgs[:1]) for name, imgs in domain[:2]]
    groups += [(name, imgs[1:]) for name, imgs in domain[:2]] + domain[2:]
    own = [True] * len(groups)
    groups += people["corridor:test"]
    own += [False] * len(people["corridor:test"])
    gallery, where = gallery_of(groups, own=own)
    victims = where[0] + where[1]
    return gallery, victims, gallery.images[victims]


@pytest.fixture
def toy_config() -> RunConfig:
    """The default configuration at 32×16 (what controls run their client step with)."""
    cfg = RunConfig()
    cfg.data.height, cfg.data.width = HEIGHT, WIDTH
    return cfg


@pytest.fixture(scope="session")
def recorded_run(synth_root: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One round of FedPav at 32×16, three clients, no secure aggregation, uploads recorded."""
    out = tmp_path_factory.mktemp("audit-run") / "runs"
    cfg = RunConfig(run=RunSection(seed=3, out=str(out), name="tiny"))
    cfg.data.root = str(synth_root)
    cfg.data.height, cfg.data.width = HEIGHT, WIDTH
    cfg.schedule.rounds = 1
    cfg.schedule.batch_size = 8
    cfg.secagg.enabled = False
    cfg.run.local_baseline = False
    cfg.run.eval_every = 0
    cfg.run.record_uploads = True
    with threads(1):
        return run(cfg, out / "tiny").run_dir
