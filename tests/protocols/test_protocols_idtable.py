"""IdTable: a cohort-sized (id, value) list held as its wire bytes behaves as the tuple it stands for
and refuses what the per-entry checks refused."""

from __future__ import annotations

import struct

import numpy as np
import pytest

from secfed.protocols.secagg.idtable import IdTable, as_table, not_in


def test_a_table_is_its_tuple_of_pairs():
    pairs = ((1, b"a" * 4), (5, b"b" * 4), (9, b"c" * 4))
    table = IdTable.from_pairs(pairs, 4)
    assert table == pairs and pairs == table and tuple(table) == pairs and len(table) == 3
    assert table[1] == (5, b"b" * 4) and table[-1] == (9, b"c" * 4) and table[:2] == pairs[:2]
    assert table.raw == b"".join(struct.pack("<I4s", *p) for p in pairs)
    assert table.ids.tolist() == [1, 5, 9] and bytes(table.values[2]) == b"c" * 4
    assert table.value_of(5) == b"b" * 4 and table.value_of(6) is None and table.position(9) == 2
    assert IdTable(table.raw, 4) == table and as_table(pairs, 4) == table and as_table(table, 4) is table
    assert table != pairs[:2] and table != ((1, b"a" * 4), (5, b"x" * 4), (9, b"c" * 4))
    with pytest.raises(IndexError):
        table[3]


@pytest.mark.parametrize("ids", [(1, 1), (3, 2), (0, 5, 5, 7)])
def test_ids_must_increase_strictly(ids):
    raw = b"".join(struct.pack("<I2s", i, b"xy") for i in ids)
    with pytest.raises(ValueError, match="strictly increasing"):
        IdTable(raw, 2)


def test_sizes_and_ids_are_checked():
    with pytest.raises(ValueError, match="whole number"):
        IdTable(b"\x00" * 7, 2)
    with pytest.raises(ValueError, match="has 3 bytes"):
        IdTable.from_pairs(((1, b"abc"),), 2)
    with pytest.raises(struct.error):
        IdTable.from_pairs(((2**32, b"ab"),), 2)
    assert len(IdTable(b"", 64)) == 0 and IdTable(b"", 64) == ()


def test_a_large_table_is_checked_without_a_python_step_per_entry():
    n = 100_000
    rec = np.zeros(n, dtype=[("id", "<u4"), ("value", "V16")])
    rec["id"] = np.arange(n) * 3
    table = IdTable(rec.tobytes(), 16)
    assert len(table) == n and table.value_of(3 * 77_777) == bytes(16)
    rec["id"][60_000] = rec["id"][59_999]
    with pytest.raises(ValueError, match="saw 179997 then 179997"):
        IdTable(rec.tobytes(), 16)


def test_not_in_is_the_sorted_difference():
    rng = np.random.default_rng(0)
    for _ in range(50):
        a = np.unique(rng.integers(0, 60, rng.integers(0, 30)))
        b = np.unique(rng.integers(0, 60, rng.integers(0, 30)))
        assert not_in(a, b).tolist() == sorted(set(a.tolist()) - set(b.tolist()))
