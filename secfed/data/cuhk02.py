"""CUHK02 (Li & Wang, CVPR 2013): the public set FedReIDBench distils knowledge on, used unlabeled.

Layout (torchreid's)::

    ROOT/Dataset/P1..P5/cam1|cam2/PPP_N.png     (the file name starts with the id within its pair)

Five camera pairs, 1,816 ids, 7,264 images. Everything is returned as ``train``; query and gallery
are empty. Ids restart in every pair, so ``(pair, id)`` is relabelled to one running id (pair by
pair, ids in order) and the ten cameras are numbered ``2 * pair + camera`` (0..9). Distillation
ignores the labels, but they stay truthful for anyone who wants them.
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

from secfed.data.errors import DataError
from secfed.data.listing import find_base, list_images, require_dir, require_some, scan
from secfed.data.types import ReidDataset, Sample

PAIRS = ("P1", "P2", "P3", "P4", "P5")
LAYOUT = "ROOT/Dataset/{P1..P5}/{cam1,cam2}/PID_N.png"
_NAME = re.compile(r"^(\d+)_", re.ASCII)


def _not_in_layout(folder: Path, named: tuple[str, ...]) -> int:
    with scan(folder) as entries:
        return sum(entry.name not in named for entry in entries)


def load_cuhk02(root: Path) -> ReidDataset:
    base = find_base(root, PAIRS, ("Dataset",), LAYOUT)
    skipped: Counter[str] = Counter()
    # entries the layout does not name (a P6/, a cam3/, a loose file) are counted, never dropped without a
    # word (found by review); read by name only, so a stray link loop there stops nothing
    extra = _not_in_layout(base, PAIRS) + sum(_not_in_layout(base / pair, ("cam1", "cam2")) for pair in PAIRS)
    if extra:
        skipped["not_in_layout"] = extra
    found: list[tuple[int, int, int, Path]] = []  # (pair, id within pair, camera, path)
    for pair_index, pair in enumerate(PAIRS):
        for cam_index, cam in enumerate(("cam1", "cam2")):
            folder = require_dir(base / pair / cam, LAYOUT)
            for path in require_some(list_images(folder, skipped), folder):
                match = _NAME.match(path.name)
                if match is None:
                    raise DataError(path, "file name does not start with the person id (e.g. 001_1.png)")
                found.append((pair_index, int(match[1]), 2 * pair_index + cam_index, path))
    label = {key: n for n, key in enumerate(sorted({(pair, pid) for pair, pid, _, _ in found}))}
    train = [Sample(path, label[pair, pid], camid) for pair, pid, camid, path in found]
    return ReidDataset("cuhk02", train, [], [], dict(skipped))
