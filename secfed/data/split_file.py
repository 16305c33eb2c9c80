"""Seeded train/query/gallery splits for sets that ship none, kept in a JSON file next to the data.

A split is drawn once per seed (from ``secfed.seeding``, purpose ``split/<format>``) and written to
``ROOT/splits.json``; later loads read it back, so the split survives new files appearing in the
folder, can be inspected and diffed, and is the same on every machine. The file holds one entry per
seed::

    {"format": "viper", "version": 1, "protocol": "...",
     "splits": {"0": {"seed": 0, "train": [["cam_a/000_45.bmp", 0, 0], ...], "query": [...], "gallery": [...]}}}

Each sample is ``[path relative to ROOT, pid, camid]``. Images of the folder that the split does not
use are counted in ``skipped["not_in_split"]``.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from secfed import atomic_file
from secfed.data.errors import DataError
from secfed.data.types import Sample
from secfed.seeding import numpy_rng

SPLIT_FILE_NAME = "splits.json"
SPLIT_FILE_VERSION = 1
SUBSETS = ("train", "query", "gallery")

Subsets = tuple[list[Sample], list[Sample], list[Sample]]
Draw = Callable[[np.random.Generator], Subsets]


def seeded_split(
    root: Path,
    fmt: str,
    protocol: str,
    pool: Sequence[Sample],
    draw: Draw,
    *,
    seed: int,
    split_path: Path | None,
    skipped: Counter[str],
) -> Subsets:
    """The split of ``pool`` for ``seed``: read from the split file, or drawn and written to it.

    ``pool`` is every image the loader found (camid -1 where the protocol assigns views);
    ``draw`` builds the split from a seeded generator. ``split_path`` defaults to ROOT/splits.json.
    """
    path = split_path if split_path is not None else root / SPLIT_FILE_NAME
    doc = _read(path, fmt) if path.exists() else {"format": fmt, "version": SPLIT_FILE_VERSION, "splits": {}}
    key = str(int(seed))
    if key in doc["splits"]:
        subsets = _decode(doc["splits"][key], root, pool, path, key)
    else:
        subsets = draw(numpy_rng(seed, f"split/{fmt}"))
        doc["protocol"] = protocol
        entry: dict = {name: [[s.path.relative_to(root).as_posix(), s.pid, s.camid] for s in part]
                       for name, part in zip(SUBSETS, subsets)}
        doc["splits"][key] = {"seed": int(seed), **entry}
        _write(path, doc)
    used = len({s.path for part in subsets for s in part})
    if len(pool) > used:
        skipped["not_in_split"] += len(pool) - used
    return subsets


def _read(path: Path, fmt: str) -> dict:
    try:
        doc = json.loads(path.read_text())
    except OSError as err:
        raise DataError(path, f"cannot read the split file: {err.strerror}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise DataError(path, f"split file is not valid JSON: {err}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("splits"), dict):
        raise DataError(path, "split file has no 'splits' object")
    if doc.get("version") != SPLIT_FILE_VERSION:
        raise DataError(path, f"split file version {doc.get('version')!r}; "
                              f"this secfed reads version {SPLIT_FILE_VERSION}")
    if doc.get("format") != fmt:
        raise DataError(path, f"split file was written for format {doc.get('format')!r}, not {fmt!r}")
    return doc


def _decode(entry: object, root: Path, pool: Sequence[Sample], path: Path, key: str) -> Subsets:
    by_path = {s.path.relative_to(root).as_posix(): s for s in pool}
    if not isinstance(entry, dict) or any(not isinstance(entry.get(name), list) for name in SUBSETS):
        raise DataError(path, f"split for seed {key} must hold lists 'train', 'query' and 'gallery'")
    parts = []
    for name in SUBSETS:
        part = []
        for item in entry[name]:
            if not (isinstance(item, list) and len(item) == 3 and isinstance(item[0], str)
                    and all(isinstance(v, int) and not isinstance(v, bool) for v in item[1:])):
                raise DataError(path, f"seed {key}, {name}: entry {item!r} is not [path, pid, camid]")
            rel, pid, camid = item
            found = by_path.get(rel)
            if found is None:
                raise DataError(path, f"seed {key} lists {rel}, which is not among the dataset's images; "
                                      f"delete {path.name} to draw the split again")
            if found.pid != pid or found.camid not in (-1, camid):
                raise DataError(path, f"seed {key}: {rel} is recorded as pid {pid}, camera {camid}, "
                                      f"but its name says pid {found.pid}, camera {found.camid}")
            part.append(Sample(found.path, pid, camid))
        parts.append(part)
    return parts[0], parts[1], parts[2]


# json.dumps(indent=1) puts every number of a [path, pid, camid] triple on its own line; one
# sample per line keeps the file short and readable.
_TRIPLE = re.compile(r'\[\s+("(?:[^"\\]|\\.)*"),\s+(-?\d+),\s+(-?\d+)\s+\]')


def _write(path: Path, doc: dict) -> None:
    text = _TRIPLE.sub(r"[\1, \2, \3]", json.dumps(doc, indent=1, sort_keys=True)) + "\n"
    hint = "give another location with split_path= (secfed: --split-file)"
    try:
        atomic_file.write_text(path, text, mode=0o644)  # 0644: the split is for every user of the data
    except OSError as err:
        raise DataError(path, f"cannot write the split file ({err.strerror}); {hint}") from None
