"""Cohort-sized lists of (client id, fixed-size value) kept in their wire layout.

A graph-commitment list, the revealed nonces and the quorum's signatures each have an entry per
client: 10,000 entries in a cohort of 10,000, sent to every client. As Python tuples each pass over
them — checking, encoding, decoding — costs a Python step per entry; :class:`IdTable` holds the
entries as the bytes the wire carries (per entry: u32 id, little-endian, then ``width`` bytes)
with the ids as a numpy view, so those passes are array operations. It is checked once, when it
is built (ids strictly increasing, sizes exact), and behaves as the tuple of (id, bytes) pairs it
holds: iteration, indexing, ``len``, ``==`` with such a tuple. Messages accept either form.
"""

from __future__ import annotations

import itertools
import struct
from collections.abc import Iterable, Iterator, Sequence

import numpy as np


class IdTable(Sequence):
    """Entries (client id, ``width``-byte value), ids strictly increasing and below 2^32."""

    __slots__ = ("raw", "width", "ids", "_entry")

    def __init__(self, raw: bytes, width: int) -> None:
        """From wire bytes. Raises ValueError naming the first problem (length, order)."""
        if not isinstance(raw, bytes):
            raise TypeError(f"IdTable takes bytes, got {type(raw).__name__}")
        size = 4 + width
        if len(raw) % size:
            raise ValueError(f"{len(raw)} bytes are not a whole number of {size}-byte entries")
        self.raw, self.width = raw, width
        self._entry = struct.Struct(f"<I{width}s")
        ids = np.ndarray(len(raw) // size, dtype="<u4", buffer=raw, strides=(size,))
        self.ids = ids
        first = first_repeat_or_decrease(ids)
        if first is not None:
            raise ValueError(f"ids must be strictly increasing (no repeats); saw {ids[first - 1]} then {ids[first]}")

    @classmethod
    def from_pairs(cls, pairs: Iterable[tuple[int, bytes]], width: int) -> IdTable:
        """From (id, value) pairs (ValueError for a value of another size, an id outside [0, 2^32)
        or out of order)."""
        entry = struct.Struct(f"<I{width}s")
        parts = []
        for client, value in pairs:
            if len(value) != width:
                raise ValueError(f"value of {client} has {len(value)} bytes; must be {width}")
            parts.append(entry.pack(client, value))  # struct refuses an id outside [0, 2^32)
        return cls(b"".join(parts), width)

    # ---- the tuple it stands for ---------------------------------------------------------------

    def __len__(self) -> int:
        return self.ids.size

    def __getitem__(self, index):
        if isinstance(index, slice):
            return tuple(self)[index]
        n = len(self)
        if index < 0:
            index += n
        if not 0 <= index < n:
            raise IndexError("IdTable index out of range")
        return self._entry.unpack_from(self.raw, index * self._entry.size)

    def __iter__(self) -> Iterator[tuple[int, bytes]]:
        return self._entry.iter_unpack(self.raw)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, IdTable):
            return self.width == other.width and self.raw == other.raw
        if isinstance(other, tuple):
            return len(other) == len(self) and all(itertools.starmap(_same_pair, zip(self, other)))
        return NotImplemented

    def __hash__(self) -> int:
        return hash((self.width, self.raw))

    def __repr__(self) -> str:
        return f"IdTable({len(self)} entries of {self.width} bytes)"

    @property
    def values(self) -> np.ndarray:
        """The values as a numpy view (dtype ``V{width}``), in id order."""
        return np.ndarray(len(self), dtype=f"V{self.width}", buffer=self.raw, offset=4, strides=(4 + self.width,))

    # ---- lookups -------------------------------------------------------------------------------

    def position(self, client: int) -> int | None:
        """Index of ``client``'s entry, or None."""
        at = int(np.searchsorted(self.ids, client))
        return at if at < self.ids.size and int(self.ids[at]) == client else None

    def value_of(self, client: int) -> bytes | None:
        at = self.position(client)
        return None if at is None else self[at][1]


def as_table(pairs: Sequence[tuple[int, bytes]], width: int) -> IdTable:
    """``pairs`` as an IdTable (itself when it is one)."""
    return pairs if isinstance(pairs, IdTable) and pairs.width == width else IdTable.from_pairs(pairs, width)


def not_in(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The elements of ``a`` that are not in ``b`` (both sorted, without repeats): a few array
    operations, where ``np.setdiff1d`` sorts again and costs tenths of a millisecond on short lists."""
    if not b.size:
        return a
    at = np.searchsorted(b, a)
    present = at < b.size
    present[present] = b[at[present]] == a[present]
    return a[~present]


def first_repeat_or_decrease(ids: np.ndarray) -> int | None:
    """Index of the first id not greater than the one before, or None."""
    if ids.size < 2:
        return None
    bad = np.flatnonzero(ids[1:] <= ids[:-1])
    return int(bad[0]) + 1 if bad.size else None


def _same_pair(a: tuple[int, bytes], b: object) -> bool:
    return isinstance(b, tuple) and len(b) == 2 and a[0] == b[0] and a[1] == b[1]
