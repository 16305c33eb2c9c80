"""Write-then-rename: a crash or a concurrent reader sees the old file or the new one, never half.

The one place secfed writes files that must survive a crash: run-directory files and checkpoints,
plots, and the seeded split files beside a dataset.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO


def write_bytes(path: str | os.PathLike[str], data: bytes, *, mode: int | None = None) -> Path:
    """Replace ``path`` with ``data`` atomically and durably (file and folder fsynced).

    The folder must exist. ``mode`` sets the file's permissions; without it the file keeps
    ``mkstemp``'s 0600 (run directories are private by default). Raises ``OSError`` with the
    old file, if any, left untouched and no temporary file behind.
    """
    return write_with(path, lambda fh: fh.write(data), mode=mode)


TEMPORARY_SUFFIX = ".tmp"


def temporaries(path: str | os.PathLike[str]) -> Iterator[Path]:
    """The temporary files of writes of ``path`` (one being written, or one a kill left behind)."""
    path = Path(path)
    return path.parent.glob(f".{path.name}.*{TEMPORARY_SUFFIX}")


def write_with(path: str | os.PathLike[str], write: Callable[[BinaryIO], object], *,
               mode: int | None = None) -> Path:
    """:func:`write_bytes` of what ``write(file)`` writes: large contents (a checkpoint) stream
    into the file instead of being built in memory first. If ``write`` raises, the old file stays."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=TEMPORARY_SUFFIX)
    try:
        with os.fdopen(fd, "wb") as fh:
            if mode is not None:
                os.fchmod(fh.fileno(), mode)
            write(fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)  # the rename itself must reach the disk
    finally:
        os.close(dir_fd)
    return path


def write_text(path: str | os.PathLike[str], text: str, *, mode: int | None = None) -> Path:
    """:func:`write_bytes` of ``text`` encoded as UTF-8."""
    return write_bytes(path, text.encode("utf-8"), mode=mode)
