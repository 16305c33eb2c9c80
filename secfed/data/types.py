"""The shape every dataset loader returns: (path, pid, camid) samples for train / query / gallery."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

from secfed.data.errors import DataError


UNLABELED = -1  # pid and camid of an image used without labels (a public set for distillation)


class Sample(NamedTuple):
    """One image: where it is, whose it is (dataset-level person id), and which camera saw it (0-based)."""

    path: Path
    pid: int
    camid: int


ID_LIMIT = 2**31  # identities and cameras fit the int64 label tensors with room to spare; no dataset comes near


def check_sample(sample: Sample) -> None:
    """A sample every later step can use, else a DataError naming its file (found by review: a camera
    of 10^22 in a file name overflowed the label tensor, and a file name that is not UTF-8 stopped the
    data fingerprint — both with a traceback, after `data inspect --verify` had passed the folder)."""
    if not (-1 <= sample.pid < ID_LIMIT and -1 <= sample.camid < ID_LIMIT):
        raise DataError(sample.path, f"identity {sample.pid} or camera {sample.camid} lies outside "
                                                f"[-1, 2^31): not a label of this dataset")
    try:
        str(sample.path).encode()
    except UnicodeEncodeError:
        raise DataError(sample.path, "the file name is not valid UTF-8: rename the file") from None


@dataclass(frozen=True)
class ReidDataset:
    """A ReID dataset as read from disk.

    ``pid`` values are the dataset's own labels (not relabelled): train and test hold different
    people in every standard protocol, though their numbers may coincide (MSMT17's both start at 0),
    and 0 may be a distractor id in the gallery.
    ``skipped`` counts files left out on purpose, by reason (e.g. ``{"junk": 12}``); a loader never
    drops a file without counting it here.
    """

    name: str
    train: list[Sample]
    query: list[Sample]
    gallery: list[Sample]
    skipped: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for part in (self.train, self.query, self.gallery):
            for sample in part:
                check_sample(sample)

    @property
    def num_train_pids(self) -> int:
        return len({s.pid for s in self.train})

    @property
    def num_train_cams(self) -> int:
        return len({s.camid for s in self.train})
