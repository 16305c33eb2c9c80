"""Errors raised for bad data on disk. Each names the offending path."""

from __future__ import annotations

import os
from pathlib import Path


def printable(path: Path | str) -> str:
    """``path`` as it can be shown on a terminal: bytes that are not UTF-8 and control characters
    escaped (a file name could otherwise forge lines or colours in an error message: found by review)."""
    raw = os.fsencode(path).decode("utf-8", "backslashreplace")
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in raw)


class DataError(Exception):
    """A dataset on disk is missing, malformed or unreadable. ``path`` names what is wrong."""

    def __init__(self, path: Path | str, reason: str) -> None:
        self.path = Path(path)
        self.reason = reason
        super().__init__(f"{printable(self.path)}: {reason}")
