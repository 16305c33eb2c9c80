"""Market-1501-style folders: Market-1501, DukeMTMC-reID, CUHK03-NP, and any folder in that format.

Layout (torchreid / fast-reid conventions)::

    ROOT/bounding_box_train/0002_c1s1_000451_03.jpg     train
    ROOT/query/...                                      query
    ROOT/bounding_box_test/...                          gallery

A file name starts with ``PID_cCAM``: the person id (``-1`` = junk, ``0000`` = distractor) and the
1-based camera. Junk images are left out and counted in ``skipped["junk"]`` (torchreid drops them
too); distractors are kept, in the gallery only. A pid-0 image anywhere else is an error. A subset
folder without usable images, or a query that no gallery image matches from another camera, is an
error too (:mod:`secfed.data.usable`).
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

from secfed.data.errors import DataError
from secfed.data.listing import find_base, list_images
from secfed.data.types import ReidDataset, Sample
from secfed.data.usable import unusable_reason

SUBSETS = {"train": "bounding_box_train", "query": "query", "gallery": "bounding_box_test"}
LAYOUT = "ROOT/{bounding_box_train,query,bounding_box_test}/PID_cCAM*.jpg (e.g. 0002_c1s1_000451_03.jpg)"

# torchreid searches ([-\d]+)_c(\d) anywhere in the path; anchoring at the start of the name rejects
# "x0002_c1..." instead of half-matching it, and \d+ also reads two-digit cameras (market-format
# MSMT17 exports) where \d would silently read c14 as c1.
_NAME = re.compile(r"^(-1|\d+)_c(\d+)", re.ASCII)

JUNK_PID = -1
DISTRACTOR_PID = 0


def read_market_folder(folder: Path, subset: str, skipped: Counter[str], max_camera: int | None) -> list[Sample]:
    """Samples of one Market-style folder; ``subset`` decides whether distractors are allowed.

    A folder with no usable image (empty, or junk only) is a DataError naming it.
    """
    samples = []
    images = list_images(folder, skipped)
    for path in images:
        match = _NAME.match(path.name)
        if match is None:
            raise DataError(path, "file name does not start with PID_cCAM (e.g. 0002_c1s1_000451_03.jpg)")
        pid, cam = int(match[1]), int(match[2])
        if pid == JUNK_PID:
            skipped["junk"] += 1
            continue
        if pid == DISTRACTOR_PID and subset != "gallery":
            raise DataError(path, f"pid 0 (distractor) in the {subset} set; distractors belong in the gallery only")
        if cam < 1 or (max_camera is not None and cam > max_camera):
            limit = f"c1..c{max_camera}" if max_camera is not None else "c1 or above"
            raise DataError(path, f"camera c{cam} out of range ({limit})")
        samples.append(Sample(path, pid, cam - 1))
    if not samples:
        left_out = len(images)
        raise DataError(folder, "no images in this folder" if not left_out else
                        f"no usable images in this folder ({left_out} junk, pid -1)")
    return samples


def load_market_layout(
    root: Path, name: str, *, max_camera: int | None = None, wrappers: tuple[str, ...] = ()
) -> ReidDataset:
    """A Market-style dataset under ``root`` (or under ``root/<wrapper>`` for a known wrapper)."""
    base = find_base(root, tuple(SUBSETS.values()), wrappers, LAYOUT)
    skipped: Counter[str] = Counter()
    parts = {subset: read_market_folder(base / folder, subset, skipped, max_camera)
             for subset, folder in SUBSETS.items()}
    if reason := unusable_reason(parts["train"], parts["query"], parts["gallery"]):
        raise DataError(base / SUBSETS["query"], f"{reason} (gallery: {SUBSETS['gallery']}/)")
    return ReidDataset(name, parts["train"], parts["query"], parts["gallery"], dict(skipped))


def load_market1501(root: Path) -> ReidDataset:
    """Market-1501, or any folder in its format (the synthetic domains are written in it)."""
    return load_market_layout(root, "market1501", wrappers=("Market-1501-v15.09.15",))


def load_dukemtmc(root: Path) -> ReidDataset:
    """DukeMTMC-reID: Market layout, cameras c1..c8 (``0001_c2_f0046182.jpg``)."""
    return load_market_layout(root, "dukemtmc", max_camera=8, wrappers=("DukeMTMC-reID",))


def load_cuhk03np(root: Path, kind: str) -> ReidDataset:
    """CUHK03-NP (Zhong et al.'s new protocol, 767/700 ids), ``labeled`` or ``detected`` boxes.

    ``root`` holds ``labeled/`` and ``detected/``, each in the Market layout; a folder that is
    itself in the Market layout (FedReIDBench's ``cuhk03-np-detected``) is taken as ``kind``.
    """
    name = f"cuhk03np-{kind}"
    if (root / SUBSETS["train"]).is_dir():
        return load_market_layout(root, name, max_camera=2)
    base = find_base(root, (kind,), ("cuhk03-np", "CUHK03-NP"), f"ROOT/{{labeled,detected}}/ each with {LAYOUT}")
    return load_market_layout(base / kind, name, max_camera=2)
