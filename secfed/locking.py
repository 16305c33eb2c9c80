"""One exclusive lock on a file, held while a block runs: a node's records, one site host per node,
one `secfed flower local` per deployment folder; a run directory held by the one process training in
it; and a lock that marks a folder as being written
(``data synth``'s temporary folder), so what a killed writer left can be told from a live one's.

``flock`` rather than a lock file's existence: the kernel drops the lock when its holder dies, so a
killed process never leaves a folder locked. Written here, not taken from a package: the standard
library's ``fcntl`` is the whole mechanism, and the two choices that matter are ours — the lock file
is this user's alone (0600: one any user could open, any user could hold), and how long to wait.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path


class Held(Exception):
    """Another process held the lock past the wait."""


@contextlib.contextmanager
def exclusive(path: Path, wait: float = 0.0, busy: Callable[[], Exception] | None = None) -> Iterator[None]:
    """Hold an exclusive lock on ``path`` (created 0600) while the block runs, waiting up to ``wait``
    seconds for another holder; past that, raise ``busy()`` (default :class:`Held` naming the file)."""
    held = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        os.fchmod(held, 0o600)  # a file another run created more widely
        deadline = time.monotonic() + wait
        while True:
            try:
                fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise (busy() if busy else Held(f"{path} is locked by another process")) from None
                time.sleep(0.05)
        yield
    finally:
        os.close(held)  # releases the lock


FOLDER_LOCK = ".lock"  # where a folder that cannot be locked itself is locked instead


@contextlib.contextmanager
def exclusive_folder(folder: Path, busy: Callable[[], Exception]) -> Iterator[None]:
    """Hold an exclusive lock on ``folder`` itself (its own inode: nothing is written into it, so a
    killed holder leaves nothing behind) while the block runs; held by another process: ``busy()``.
    Where a folder cannot be locked (NFS emulates flock with byte-range locks, which need a descriptor
    open for writing: review), a lock file in it, :data:`FOLDER_LOCK`, stands in."""
    held = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        try:
            fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise busy() from None
        except OSError:  # EBADF, ENOLCK, EINVAL: not lockable as a folder
            with exclusive(folder / FOLDER_LOCK, busy=busy):
                yield
            return
        yield
    finally:
        os.close(held)


def create_held(path: Path) -> int:
    """Create ``path`` already locked and return its descriptor, which holds the lock until closed. The
    file is made under another name, locked, then renamed: no one finds ``path`` unlocked while its
    maker lives (:func:`abandoned` would take a folder being written for a dead one's)."""
    draft = path.with_name(f"{path.name}.{os.getpid()}")
    held = os.open(draft, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        fcntl.flock(held, fcntl.LOCK_EX)
        os.rename(draft, path)
    except BaseException:
        os.close(held)
        raise
    return held


def abandoned(path: Path) -> bool:
    """True if ``path`` (made by :func:`create_held`) exists and its maker is gone: no one holds its lock."""
    try:
        probe = os.open(path, os.O_RDONLY)
    except OSError:  # none (a folder not made that way, or being made): not ours to judge
        return False
    try:
        fcntl.flock(probe, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False
    finally:
        os.close(probe)
