"""The shape every dataset loader returns: (path, pid, camid) samples for train / query / gallery."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple


UNLABELED = -1  # pid and camid of an image used without labels (a public set for distillation)


class Sample(NamedTuple):
    """One image: where it is, whose it is (dataset-level person id), and which camera saw it (0-based)."""

    path: Path
    pid: int
    camid: int


@dataclass(frozen=True)
class ReidDataset:
    """A ReID dataset as read from disk.

    ``pid`` values are the dataset's own labels (not relabelled): train ids and test ids are
    disjoint in every standard protocol, and 0 may be a distractor id in the gallery.
    ``skipped`` counts files left out on purpose, by reason (e.g. ``{"junk": 12}``); a loader never
    drops a file without counting it here.
    """

    name: str
    train: list[Sample]
    query: list[Sample]
    gallery: list[Sample]
    skipped: dict[str, int] = field(default_factory=dict)

    @property
    def num_train_pids(self) -> int:
        return len({s.pid for s in self.train})

    @property
    def num_train_cams(self) -> int:
        return len({s.camid for s in self.train})
