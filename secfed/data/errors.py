"""Errors raised for bad data on disk. Each names the offending path."""

from __future__ import annotations

from pathlib import Path

from secfed.errors import printable


class DataError(Exception):
    """A dataset on disk is missing, malformed or unreadable. ``path`` names what is wrong."""

    def __init__(self, path: Path | str, reason: str) -> None:
        self.path = Path(path)
        self.reason = reason
        super().__init__(f"{printable(self.path)}: {printable(reason)}")  # reasons name files too
