"""FedReIDBench's preprocessed folders (``data_preprocess`` of github.com/cap-ntu/FedReID).

That script turns each of the nine sets into an ImageFolder tree, one folder per person::

    ROOT/pytorch/train_all/<PID>/<image>     train (``train`` + ``val``; if absent, both are read)
    ROOT/pytorch/query/<PID>/<image>
    ROOT/pytorch/gallery/<PID>/<image>

Large sets keep their original names (``0002_c1s1_000451_03.jpg``, 1-based camera); small sets are
renamed ``cam_<0-based camera>_<pid>_<index>.<ext>``. Loading this format reproduces the paper's
exact splits. Folder ``-1`` holds junk images: left out, counted in ``skipped["junk"]``. PID 0 is a
real person in the small sets, so it is not treated as a distractor here.
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

from secfed.data.errors import DataError
from secfed.data.listing import find_base, list_images, list_subdirs, require_some
from secfed.data.types import ReidDataset, Sample
from secfed.data.usable import unusable_reason

LAYOUT = "ROOT/pytorch/{train_all,query,gallery}/<PID>/<image> (FedReIDBench data_preprocess output)"

_ORIGINAL_NAME = re.compile(r"^(?:-1|\d+)_c(\d+)", re.ASCII)  # camera is 1-based
_SMALL_SET_NAME = re.compile(r"^cam_(\d+)_", re.ASCII)  # camera is already 0-based
_PERSON_FOLDER = re.compile(r"-1|\d+", re.ASCII)


def _camera(path: Path) -> int:
    if match := _ORIGINAL_NAME.match(path.name):
        if int(match[1]) == 0:  # cameras count from 1: c0 would read as −1, the "unlabelled" marker (review)
            raise DataError(path, "camera c0 in the name: cameras are numbered from 1")
        return int(match[1]) - 1
    if match := _SMALL_SET_NAME.match(path.name):
        return int(match[1])
    raise DataError(path, "cannot read the camera from the name (expected PID_cCAM... or cam_CAM_...)")


def _read_id_folders(folder: Path, skipped: Counter[str]) -> list[Sample]:
    samples, seen = [], {}
    for person in list_subdirs(folder, skipped):
        # ASCII digits only: int() reads "+3", "1_0" and "٤" too, merging those folders with people 3, 10 and 4
        if not _PERSON_FOLDER.fullmatch(person.name):
            raise DataError(person, "folder name is not a person id (digits, or -1 for junk)")
        pid = int(person.name)
        if (other := seen.setdefault(pid, person)) != person:  # "2" and "0002": one person in two folders (review)
            raise DataError(person, f"person {pid} again (also folder {other.name}): one folder per person")
        images = list_images(person, skipped)
        if pid == -1:
            skipped["junk"] += len(images)
            continue
        samples.extend(Sample(path, pid, _camera(path)) for path in images)
    return require_some(samples, folder, "images in its person folders (junk, -1, aside)")


def load_fedreidbench(root: Path) -> ReidDataset:
    """One dataset as FedReIDBench's ``data_preprocess`` left it (``root`` or ``root/pytorch``)."""
    base = find_base(root, ("query", "gallery"), ("pytorch",), LAYOUT)
    # train_all is train + val; without it, both are read (found by review: val/ beside train/ was dropped
    # without a word) — what train_all would have held
    parts = ["train_all"] if (base / "train_all").is_dir() else [p for p in ("train", "val") if (base / p).is_dir()]
    if not parts or parts == ["val"]:
        raise DataError(base / "train_all", f"missing folder (nor is there train/); expected layout: {LAYOUT}")
    skipped: Counter[str] = Counter()
    train = [s for part in parts for s in _read_id_folders(base / part, skipped)]
    query = _read_id_folders(base / "query", skipped)
    gallery = _read_id_folders(base / "gallery", skipped)
    if reason := unusable_reason(train, query, gallery):
        raise DataError(base / "query", reason)
    return ReidDataset("fedreidbench", train, query, gallery, dict(skipped))
