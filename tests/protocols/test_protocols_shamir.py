"""Shamir sharing over GF(2^128): a hand-computed known answer, thresholds, and bad-share handling."""

from __future__ import annotations

import itertools
import os

import pytest

from secfed.protocols.errors import BelowThreshold, InconsistentShares
from secfed.protocols.shamir import Share, combine, recover, split

SECRET = bytes.fromhex("00112233445566778899aabbccddeeff")
COEFF = 0x0123456789ABCDEF0F1E2D3C4B5A6978  # top bit clear, so multiplying by x is a plain shift


def gf(value: int) -> bytes:
    return value.to_bytes(16, "big")


def test_combine_known_answer_for_a_degree_one_polynomial():
    """f(x) = COEFF·x + SECRET in GF(2^128); elements are polynomials, x=1 ↦ 1, x=2 ↦ X, x=3 ↦ X+1."""
    s = int.from_bytes(SECRET, "big")
    at1, at2, at3 = COEFF ^ s, (COEFF << 1) ^ s, (COEFF << 1) ^ COEFF ^ s
    for a, b in [(1, 2), (1, 3), (2, 3)]:
        values = {1: at1, 2: at2, 3: at3}
        assert combine([Share(a, gf(values[a])), Share(b, gf(values[b]))]) == SECRET


def test_any_threshold_subset_reconstructs():
    secret = os.urandom(16)
    shares = split(secret, 3, 6)
    assert [s.index for s in shares] == [1, 2, 3, 4, 5, 6]
    for subset in itertools.combinations(shares, 3):
        assert combine(subset) == secret


def test_fewer_than_threshold_shares_give_a_different_value():
    secret = os.urandom(16)
    shares = split(secret, 4, 6)
    assert combine(shares[:3]) != secret


def test_recover_routes_around_a_bad_share_when_spares_exist():
    secret = os.urandom(16)
    shares = split(secret, 3, 5)
    bad = Share(shares[1].index, bytes(16))
    got = recover([shares[0], bad, *shares[2:]], 3, lambda s: s == secret, what="seed of client 4")
    assert got == secret


def test_recover_with_exactly_threshold_and_one_bad_share_raises():
    secret = os.urandom(16)
    shares = split(secret, 3, 5)
    tampered = [shares[0], Share(shares[1].index, os.urandom(16)), shares[2]]
    with pytest.raises(InconsistentShares, match="seed of client 4"):
        recover(tampered, 3, lambda s: s == secret, what="seed of client 4")


def test_recover_below_threshold_raises():
    shares = split(os.urandom(16), 3, 5)
    with pytest.raises(BelowThreshold, match="2 shares, 3 needed"):
        recover(shares[:2], 3, lambda s: True, what="seed")


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="16 bytes"):
        split(b"short", 2, 3)
    with pytest.raises(ValueError, match="threshold"):
        split(bytes(16), 4, 3)
    with pytest.raises(ValueError, match="repeat"):
        combine([Share(1, bytes(16)), Share(1, bytes(16))])
    with pytest.raises(ValueError, match="index"):
        Share(0, bytes(16))
