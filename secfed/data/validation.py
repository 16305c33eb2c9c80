"""A validation split of the TRAINING domains: held-out identities, for choosing hyper-parameters.

Tuning on a domain's test identities (or on unseen domains) would select on what the run reports.
:func:`validation_split` instead moves a fraction of a domain's *training* identities out of its
training set and makes them the domain's query/gallery: one image per held-out identity and camera
becomes a query, the rest its gallery (ReID scoring ignores same-identity same-camera matches, so
only identities seen by two or more cameras can be held out). The test query/gallery is dropped.
"""

from __future__ import annotations

import hashlib
from collections import defaultdict

from secfed.data.types import ReidDataset, Sample


class ValidationSplitError(ValueError):
    """A domain has too few multi-camera training identities to hold any out."""


def _rank(name: str, pid: int) -> str:
    # A hash, not the run seed: the same identities are held out by every run that asks for them.
    return hashlib.sha256(f"{name}/{pid}".encode()).hexdigest()


def validation_split(dataset: ReidDataset, fraction: float) -> ReidDataset:
    """``dataset`` with ``fraction`` of its multi-camera training identities as query/gallery."""
    by_pid: dict[int, list[Sample]] = defaultdict(list)
    for sample in dataset.train:
        by_pid[sample.pid].append(sample)
    candidates = sorted((p for p, s in by_pid.items() if len({x.camid for x in s}) > 1),
                        key=lambda p: _rank(dataset.name, p))
    count = max(1, round(fraction * len(by_pid)))
    if len(candidates) < count or len(by_pid) - count < 1:
        raise ValidationSplitError(f"{dataset.name}: {len(candidates)} of {len(by_pid)} training identities are "
                                   f"seen by two cameras; cannot hold out {count} for validation")
    held = set(candidates[:count])
    query, gallery = [], []
    for pid in sorted(held):
        cameras: set[int] = set()
        for sample in by_pid[pid]:
            if sample.camid not in cameras:  # one query per identity and camera
                cameras.add(sample.camid)
                query.append(sample)
        # The gallery holds every held-out image; scoring ignores a query's same-camera matches
        # (itself included), so each query is matched against the identity's other cameras.
        gallery.extend(by_pid[pid])
    train = [s for s in dataset.train if s.pid not in held]
    return ReidDataset(dataset.name, train, query, gallery, dict(dataset.skipped))
