"""Federated splits of FedReIDBench (§3.2, §4.1): which client holds which training images.

- :func:`by_dataset`  one client per dataset (or synthetic domain): an edge server per site.
- :func:`by_camera`   one client per camera of one dataset.
- :func:`by_identity` one dataset's identities dealt at random into disjoint groups.

Every shard labels its images twice. ``labels`` number the shard's own identities 0..C-1 for its
private classifier (FedPav). ``global_labels`` number the identities of the whole federation, for
a single shared classifier (FedAvg): a (dataset, pid) pair by dataset, the pid itself across a
dataset's cameras or identity groups, so a person seen by two cameras keeps one global label.
Only train images are split; query and gallery stay with the evaluation.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from secfed.data.types import ReidDataset, Sample
from secfed.seeding import numpy_rng


@dataclass(frozen=True)
class ClientShard:
    """One client's training data."""

    name: str
    samples: tuple[Sample, ...]
    labels: tuple[int, ...]  # per sample: local class, 0 .. num_classes - 1
    global_labels: tuple[int, ...]  # per sample: class over the whole federation
    num_classes: int
    num_global_classes: int  # the same for every shard of one split
    label_of: dict[int, int]  # pid → local class
    global_label_of: dict[int, int]  # pid → global class

    def __len__(self) -> int:
        return len(self.samples)


def _shard(name: str, samples: Sequence[Sample], global_label_of: dict[int, int], num_global: int) -> ClientShard:
    pids = sorted({s.pid for s in samples})
    label_of = {pid: n for n, pid in enumerate(pids)}
    return ClientShard(
        name=name,
        samples=tuple(samples),
        labels=tuple(label_of[s.pid] for s in samples),
        global_labels=tuple(global_label_of[s.pid] for s in samples),
        num_classes=len(pids),
        num_global_classes=num_global,
        label_of=label_of,
        global_label_of={pid: global_label_of[pid] for pid in pids},
    )


def _require_train(dataset: ReidDataset) -> None:
    if not dataset.train:
        raise ValueError(f"dataset {dataset.name!r} has no training images to split")


def by_dataset(datasets: Sequence[ReidDataset]) -> list[ClientShard]:
    """One client per dataset, holding its train set; shard names are the dataset names."""
    names = [d.name for d in datasets]
    if duplicates := sorted({n for n in names if names.count(n) > 1}):
        raise ValueError(f"dataset names must be unique to name clients; repeated: {', '.join(duplicates)} "
                         "(load each with name=<folder name>)")
    for dataset in datasets:
        _require_train(dataset)
    offsets, total = [], 0
    for dataset in datasets:
        offsets.append(total)
        total += dataset.num_train_pids
    shards = []
    for dataset, offset in zip(datasets, offsets):
        pids = sorted({s.pid for s in dataset.train})
        shards.append(_shard(dataset.name, dataset.train, {pid: offset + n for n, pid in enumerate(pids)}, total))
    return shards


def by_camera(dataset: ReidDataset) -> list[ClientShard]:
    """One client per camera of ``dataset``'s train set, named ``<dataset>/cam<camid>`` (0-based)."""
    _require_train(dataset)
    global_label_of = {pid: n for n, pid in enumerate(sorted({s.pid for s in dataset.train}))}
    cameras = sorted({s.camid for s in dataset.train})
    return [
        _shard(f"{dataset.name}/cam{cam}", [s for s in dataset.train if s.camid == cam],
               global_label_of, len(global_label_of))
        for cam in cameras
    ]


def by_identity(dataset: ReidDataset, num_clients: int, seed: int) -> list[ClientShard]:
    """``dataset``'s train identities dealt at random into ``num_clients`` disjoint groups.

    Group sizes differ by at most one and no identity is dropped (Market-1501's 751 ids over 6
    clients: one group of 126, five of 125; the paper rounds this to "125 each"). Each client gets
    every image of its identities, from all cameras. Shards are named ``<dataset>/ids<k>``; the
    deal is drawn from ``seed``.
    """
    _require_train(dataset)
    pids = sorted({s.pid for s in dataset.train})
    if not 1 <= num_clients <= len(pids):
        raise ValueError(f"num_clients must be between 1 and the {len(pids)} train identities of "
                         f"{dataset.name!r}, got {num_clients}")
    global_label_of = {pid: n for n, pid in enumerate(pids)}
    order = numpy_rng(seed, "split/by-identity").permutation(len(pids))
    group_of = {pids[i]: rank % num_clients for rank, i in enumerate(order)}
    return [
        _shard(f"{dataset.name}/ids{k}", [s for s in dataset.train if group_of[s.pid] == k], global_label_of, len(pids))
        for k in range(num_clients)
    ]
