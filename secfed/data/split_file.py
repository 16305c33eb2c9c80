"""Seeded train/query/gallery splits for sets that ship none, drawn in memory or kept in a JSON file.

A split is drawn per seed (from ``secfed.seeding``, purpose ``split/<format>``) over the images
sorted by name, so the same folder gives the same split on every machine. With no ``split_path``
that is all: nothing is written, and the user's dataset folder (often read-only, often shared) is
never touched. With a ``split_path`` the split is kept there: drawn and written on first use, read
back later, so it survives new files appearing in the folder and can be inspected and diffed.
``secfed train`` keeps it in the run directory; ``--split-file`` names another place.

One file holds the splits of several datasets, by dataset name, one entry per seed::

    {"version": 2, "datasets": {"viper": {"format": "viper", "protocol": "...",
        "splits": {"0": {"seed": 0, "train": [["VIPeR/cam_a/000_45.bmp", 0, 0], ...], "query": [...], "gallery": [...]}}}}}

Each sample is ``[path relative to the dataset root, pid, camid]``. Images of the folder that the
split does not use are counted in ``skipped["not_in_split"]``. A split that cannot be trained on
or evaluated (:mod:`secfed.data.usable`) is refused before anything is written.

Version 1 (one dataset per file, ``ROOT/splits.json`` by default) is refused: its PRID2011 splits
paired different people (ids above 200 are not the same person in both cameras).
"""

from __future__ import annotations

import json
import os
import re
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from secfed import atomic_file
from secfed.data.errors import DataError
from secfed.data.types import Sample
from secfed.data.usable import overlap_reason, unusable_reason
from secfed.seeding import numpy_rng

SPLIT_FILE_VERSION = 2
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
    name: str,
    skipped: Counter[str],
) -> Subsets:
    """The split of ``pool`` for ``seed``: read from ``split_path``, or drawn (and written there).

    ``pool`` is every image the loader found (camid -1 where the protocol assigns views);
    ``draw`` builds the split from a seeded generator. ``name`` is the dataset's entry in the
    split file. With ``split_path`` None the split is drawn in memory and nothing is written.
    """
    path = None if split_path is None else Path(split_path)
    doc = read_split_file(path) if path is not None and path.exists() else _empty()
    entry = doc["datasets"].get(name)
    key = str(int(seed))
    if path is not None and entry is not None:
        if entry.get("format") != fmt:
            raise DataError(path, f"dataset {name!r} was recorded as format {entry.get('format')!r}, not {fmt!r}")
        if key in entry["splits"]:
            subsets = _decode(entry["splits"][key], root, pool, path, f"{name}, seed {key}")
            if reason := unusable_reason(*subsets):
                raise DataError(path, f"{name}, seed {key}: {reason}; remove that entry to draw the split again")
            _count_unused(pool, subsets, skipped)
            return subsets
    subsets = draw(numpy_rng(seed, f"split/{fmt}"))
    if reason := unusable_reason(*subsets):
        ids = len({s.pid for s in pool})
        raise DataError(root, f"{reason} after the split of its {ids} identities ({protocol}); "
                              "too few usable identities for a train and a test part")
    if path is not None:
        entry = doc["datasets"].setdefault(name, {"format": fmt, "splits": {}})
        entry["protocol"] = protocol
        entry["splits"][key] = {"seed": int(seed), **{
            part: [[s.path.relative_to(root).as_posix(), s.pid, s.camid] for s in samples]
            for part, samples in zip(SUBSETS, subsets)}}
        _write(path, doc)
    _count_unused(pool, subsets, skipped)
    return subsets


def inside(path: Path, folder: Path) -> bool:
    """Whether ``path`` lies in ``folder``, links resolved on both sides; a path caught in a link loop
    (found by review: a traceback) is checked as written."""
    def resolved(p: Path | str) -> Path:
        try:
            return Path(p).expanduser().resolve()
        except (RuntimeError, OSError):
            return Path(os.path.abspath(p))

    return resolved(path).is_relative_to(resolved(folder))


def _count_unused(pool: Sequence[Sample], subsets: Subsets, skipped: Counter[str]) -> None:
    used = len({s.path for part in subsets for s in part})
    if len(pool) > used:
        skipped["not_in_split"] += len(pool) - used


def _empty() -> dict:
    return {"version": SPLIT_FILE_VERSION, "datasets": {}}


def read_split_file(path: Path) -> dict:
    """The split file at ``path``, checked (a regular file, JSON, this version, datasets of splits); a
    DataError naming what is wrong."""
    if not path.is_file():  # a FIFO would hang the reader (found by review)
        raise DataError(path, "the split file is not a regular file")
    try:
        doc = json.loads(path.read_text())
    except OSError as err:
        raise DataError(path, f"cannot read the split file: {err.strerror}") from None
    except (ValueError, UnicodeDecodeError, RecursionError) as err:  # ValueError: JSON's, and 5,000-digit ints
        raise DataError(path, f"split file is not valid JSON: {type(err).__name__}: {str(err)[:200]}") from None
    if not isinstance(doc, dict):
        raise DataError(path, "split file does not hold a JSON object")
    if doc.get("version") != SPLIT_FILE_VERSION:
        older = " (written by an older secfed; delete it and the splits are drawn again)" \
            if doc.get("version") == 1 else ""
        raise DataError(path, f"split file version {doc.get('version')!r}; this secfed reads version "
                              f"{SPLIT_FILE_VERSION}{older}")
    datasets = doc.get("datasets")
    if not isinstance(datasets, dict) or not all(
            isinstance(e, dict) and isinstance(e.get("splits"), dict) for e in datasets.values()):
        raise DataError(path, "split file has no 'datasets' object of {'format', 'splits'} entries")
    return doc


def _decode(entry: object, root: Path, pool: Sequence[Sample], path: Path, where: str) -> Subsets:
    by_path = {s.path.relative_to(root).as_posix(): s for s in pool}
    if not isinstance(entry, dict) or any(not isinstance(entry.get(name), list) for name in SUBSETS):
        raise DataError(path, f"{where}: the split must hold lists 'train', 'query' and 'gallery'")
    parts = []
    for name in SUBSETS:
        part = []
        for item in entry[name]:
            if not (isinstance(item, list) and len(item) == 3 and isinstance(item[0], str)
                    and all(isinstance(v, int) and not isinstance(v, bool) for v in item[1:])):
                raise DataError(path, f"{where}, {name}: entry {item!r} is not [path, pid, camid]")
            rel, pid, camid = item
            found = by_path.get(rel)
            if found is None:
                raise DataError(path, f"{where} lists {rel}, which is not among the dataset's images; "
                                      "remove that entry to draw the split again")
            if found.pid != pid or found.camid not in (-1, camid):
                raise DataError(path, f"{where}: {rel} is recorded as pid {pid}, camera {camid}, "
                                      f"but its name says pid {found.pid}, camera {found.camid}")
            part.append(Sample(found.path, pid, camid))
        parts.append(part)
    if reason := overlap_reason(*parts):
        raise DataError(path, f"{where}: {reason}")
    return parts[0], parts[1], parts[2]


# json.dumps(indent=1) puts every number of a [path, pid, camid] triple on its own line; one
# sample per line keeps the file short and readable.
_TRIPLE = re.compile(r'\[\s+("(?:[^"\\]|\\.)*"),\s+(-?\d+),\s+(-?\d+)\s+\]')


def _write(path: Path, doc: dict) -> None:
    text = _TRIPLE.sub(r"[\1, \2, \3]", json.dumps(doc, indent=1, sort_keys=True)) + "\n"
    try:
        atomic_file.write_text(path, text, mode=0o644)  # 0644: the split is for every user of the data
    except OSError as err:
        raise DataError(path, f"cannot write the split file ({err.strerror}); give another location "
                              "with split_path= (secfed: --split-file)") from None
