"""Finding a dataset's folders and image files on disk, with errors that name what is missing.

Loaders only list files (fast, no decoding); whether an image is readable is checked when it is
decoded (:mod:`secfed.data.images`). Anything a loader leaves out is counted by reason in a
``Counter`` that becomes :attr:`ReidDataset.skipped`.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar

from secfed.data.errors import DataError

T = TypeVar("T")

# What the standard ReID sets ship. Anything else in an image folder (Thumbs.db, .DS_Store, readme
# files, sub-folders) is counted as skipped["not_image"], never silently dropped.
IMAGE_SUFFIXES = frozenset({".jpg", ".jpeg", ".png", ".bmp"})


class Resolver:
    """``path.resolve()`` for the many files of a few folders: each folder is resolved once, and a
    file is its resolved folder joined with its name unless the file itself is a symbolic link.
    The same paths as ``Path.resolve()`` (``os.path.realpath``, which resolves symbolic links left
    to right) at one ``lstat`` per file instead of one per path component — a Flower node
    fingerprints every image of the run in every message."""

    def __init__(self) -> None:
        self._folders: dict[Path, str] = {}

    def __call__(self, path: Path) -> Path:
        if path.name in ("", ".", ".."):
            return path.resolve()
        folder = self._folders.get(path.parent)
        if folder is None:
            folder = self._folders[path.parent] = os.path.realpath(path.parent)
        joined = os.path.join(folder, path.name)
        return Path(os.path.realpath(joined) if os.path.islink(joined) else joined)


def require_dir(path: Path, layout: str) -> Path:
    """``path`` if it is a folder, else a DataError saying what was expected there."""
    if not path.is_dir():
        what = "not a folder" if path.exists() else "missing folder"
        raise DataError(path, f"{what}; expected layout: {layout}")
    return path


def find_base(root: Path, markers: tuple[str, ...], wrappers: tuple[str, ...], layout: str) -> Path:
    """The folder under which all ``markers`` exist: ``root`` itself or ``root/<wrapper>``.

    Datasets unpack into a wrapper folder (``market1501/Market-1501-v15.09.15/...``); both the
    outer and the inner folder are accepted, as torchreid does. Only the named wrappers are tried.
    """
    require_dir(root, layout)
    for base in (root, *(root / w for w in wrappers)):
        if all((base / m).is_dir() for m in markers):
            return base
    # Name the missing folder where the user evidently put the data: inside a wrapper if one exists.
    where = next((root / w for w in wrappers if (root / w).is_dir()), root)
    missing = next(m for m in markers if not (where / m).is_dir())
    tried = ", ".join(f"{w}/" for w in wrappers)
    extra = f" (also looked inside {tried})" if wrappers else ""
    raise DataError(where / missing, f"missing folder{extra}; expected layout: {layout}")


def list_images(folder: Path, skipped: Counter[str]) -> list[Path]:
    """Image files directly inside ``folder``, sorted by name; other entries counted as ``not_image``.

    A link to an image that is not there is an error, not a skip: the image was meant to be used.
    """
    images: list[Path] = []
    with scan(folder) as entries:
        for entry in entries:
            is_image = os.path.splitext(entry.name)[1].lower() in IMAGE_SUFFIXES
            try:
                is_file = is_image and entry.is_file()
            except OSError as exc:  # a link to itself, a mount that is gone
                raise DataError(Path(entry.path), f"cannot be read ({exc.strerror or exc})") from None
            if is_file:
                images.append(Path(entry.path))
            elif is_image and entry.is_symlink() and not os.path.exists(entry.path):
                raise DataError(Path(entry.path), f"broken symbolic link (to {os.readlink(entry.path)})")
            else:
                skipped["not_image"] += 1
    images.sort(key=lambda p: p.name)
    return images


def list_tree(root: Path, skipped: Counter[str]) -> list[Path]:
    """Image files anywhere under ``root``, sub-folders included (a folder reached twice through a link
    is read once), sorted by path; other entries counted as ``not_image`` — what a public set is read as,
    by `data inspect` and by distillation alike (found by review: one read the top folder, the other
    every sub-folder)."""
    images: list[Path] = []
    seen: set[tuple[int, int]] = set()
    pending = [root]
    while pending:
        folder = pending.pop()
        try:
            st = folder.stat()
        except OSError as exc:
            raise DataError(folder, f"cannot be read ({exc.strerror or exc})") from None
        if (st.st_dev, st.st_ino) in seen:
            continue
        seen.add((st.st_dev, st.st_ino))
        inside: Counter[str] = Counter()
        images += list_images(folder, inside)
        folders = list_subdirs(folder, Counter())
        pending += folders
        skipped["not_image"] += inside["not_image"] - len(folders)  # list_images counts the sub-folders too
    return sorted(images)


def list_subdirs(folder: Path, skipped: Counter[str]) -> list[Path]:
    """Sub-folders of ``folder``, sorted by name; loose files there are counted as ``not_image``."""
    dirs: list[Path] = []
    with scan(folder) as entries:
        for entry in entries:
            try:
                is_dir = entry.is_dir()
            except OSError as exc:  # a link to itself (found by review: ELOOP traceback), a mount that is gone
                raise DataError(Path(entry.path), f"cannot be read ({exc.strerror or exc})") from None
            if is_dir:
                dirs.append(Path(entry.path))
            else:
                skipped["not_image"] += 1
    dirs.sort(key=lambda p: p.name)
    return dirs


@contextmanager
def scan(folder: Path) -> Iterator[Iterator[os.DirEntry[str]]]:
    """``os.scandir(folder)``, a folder that cannot be listed a DataError naming it (found by review: an
    unreadable `query/` stopped `data inspect` and `train` with a PermissionError traceback)."""
    try:
        entries = os.scandir(folder)
    except OSError as exc:
        raise DataError(folder, f"cannot be listed ({exc.strerror or exc})") from None
    with entries:
        try:
            yield entries
        except OSError as exc:  # the listing itself failed part-way (a mount gone)
            raise DataError(folder, f"cannot be listed ({exc.strerror or exc})") from None


def require_some(items: list[T], where: Path, what: str = "images in this folder") -> list[T]:
    """``items`` if there are any, else a DataError naming ``where``: an empty folder (or list) is a
    broken copy, never a subset, a camera or a domain to leave out without a word."""
    if not items:
        raise DataError(where, f"no {what}")
    return items
