"""Shamir sharing over GF(2^31 − 1) in five limbs: known answers computed with Python integers,
the seed encoding, thresholds, one share per holder, and bad-share handling."""

from __future__ import annotations

import itertools
import os

import numpy as np
import pytest

from secfed.protocols.errors import BelowThreshold, InconsistentShares
from secfed.protocols.shamir import (
    LIMBS,
    PRIME,
    SHARE_BYTES,
    Share,
    combine,
    evaluate,
    from_digits,
    recover,
    split,
    to_digits,
)

SECRET = bytes.fromhex("00112233445566778899aabbccddeeff")
P = 2**31 - 1


def digits_of(secret: bytes) -> list[int]:
    """Base-2^26 digits of the secret read as a big-endian integer, least significant first."""
    s = int.from_bytes(secret, "big")
    return [(s >> (26 * i)) % 2**26 for i in range(5)]


def share_bytes(values: list[int]) -> bytes:
    return b"".join(v.to_bytes(4, "little") for v in values)


class Counter:
    """Deterministic 'randomness': consecutive little-endian 32-bit words 1, 2, 3, …"""

    def __init__(self) -> None:
        self.next = 1

    def __call__(self, n: int) -> bytes:
        out = b"".join((self.next + i).to_bytes(4, "little") for i in range(n // 4))
        self.next += n // 4
        return out


def test_field_and_share_layout():
    assert PRIME == P and LIMBS == 5 and SHARE_BYTES == 20


def test_secret_to_digits_is_a_bijection_onto_the_digit_ranges():
    """128 bits in, 128 bits out: four 26-bit digits and one 24-bit digit, all below p."""
    assert to_digits(SECRET).tolist() == digits_of(SECRET)
    assert to_digits(bytes(16)).tolist() == [0] * 5
    assert to_digits(b"\xff" * 16).tolist() == [2**26 - 1] * 4 + [2**24 - 1]
    for secret in (SECRET, b"\xff" * 16, os.urandom(16), bytes(15) + b"\x01"):
        assert from_digits(to_digits(secret)) == secret
    with pytest.raises(InconsistentShares, match="encode no 16-byte secret"):
        from_digits(np.array([0, 0, 0, 0, 2**24], dtype=np.uint64))  # 2^128: one past the top
    with pytest.raises(InconsistentShares):
        from_digits(np.array([2**26, 0, 0, 0, 0], dtype=np.uint64))


def test_combine_known_answer_for_a_degree_one_polynomial():
    """f_j(x) = a_j·x + s_j mod p per digit, evaluated by hand; any two of three shares give SECRET."""
    a = [123456789, 2**31 - 2, 0, 42, 987654321]
    s = digits_of(SECRET)
    at = {x: share_bytes([(a[j] * x + s[j]) % P for j in range(5)]) for x in (1, 2, 3)}
    for i, j in [(1, 2), (1, 3), (2, 3)]:
        assert combine([Share(i, at[i]), Share(j, at[j])]) == SECRET


def test_split_known_answer_with_fixed_randomness():
    """With coefficients drawn from a counter (words 1, 2, …: digit j's coefficient of x^i is word
    5(i − 1) + j + 1), the shares are the polynomials evaluated with Python integers."""
    t, count = 3, 7
    shares = split(SECRET, t, count, random_bytes=Counter())
    coefficients = [digits_of(SECRET)] + [[5 * (i - 1) + j + 1 for j in range(5)] for i in range(1, t)]
    for share in shares:
        x = share.index
        expected = [sum(coefficients[i][j] * x**i for i in range(t)) % P for j in range(5)]
        assert share.value == share_bytes(expected)
    assert [s.index for s in shares] == list(range(1, count + 1))  # one share per holder, indices 1…count


def test_evaluate_agrees_with_python_integers_at_large_degree():
    rng = np.random.default_rng(0)
    c = rng.integers(0, P, (60, LIMBS), dtype=np.uint64)
    y = evaluate(c, 300)
    for x in (1, 2, 150, 300):
        expected = [sum(int(c[i, j]) * pow(x, i, P) for i in range(60)) % P for j in range(LIMBS)]
        assert y[x - 1].tolist() == expected


def test_coefficients_equal_to_p_are_drawn_again():
    """31-bit words are uniform on [0, 2^31); the one value that is not a field element (p itself)
    is redrawn, so coefficients are exactly uniform on [0, p)."""
    words = iter([P] * 5 + list(range(100, 200)))

    def all_p_first(n: int) -> bytes:
        return b"".join(next(words).to_bytes(4, "little") for _ in range(n // 4))

    shares = split(SECRET, 2, 3, random_bytes=all_p_first)
    s = digits_of(SECRET)
    assert shares[0].value == share_bytes([(s[j] + 100 + j) % P for j in range(5)])


def test_any_threshold_subset_reconstructs():
    secret = os.urandom(16)
    shares = split(secret, 3, 6)
    for subset in itertools.combinations(shares, 3):
        assert combine(subset) == secret
    assert combine(split(secret, 1, 4)[2:3]) == secret  # t = 1: every share is the secret


def test_fewer_than_threshold_shares_do_not_give_the_secret():
    for _ in range(20):
        secret = os.urandom(16)
        shares = split(secret, 4, 6)
        try:
            assert combine(shares[:3]) != secret
        except InconsistentShares:
            pass  # interpolated to values that encode no secret: also not the secret


def test_t_minus_one_shares_are_independent_of_the_secret():
    """For t = 2, one share's limb j is s_j + a_j with a_j uniform on [0, p): its distribution does
    not depend on the secret. Check the low byte of each limb of share 1 over two fixed secrets."""
    counts = []
    for secret in (bytes(16), b"\xff" * 16):
        # a seeded stream for the polynomials' randomness: the same draws for both secrets, and no
        # run-to-run chance of a cell outside the band (os.urandom put one 4.9 σ out, 2026-11-27)
        rng = np.random.default_rng(131)
        values = np.array([np.frombuffer(split(secret, 2, 2, random_bytes=rng.bytes)[0].value, "<u4")
                           for _ in range(1000)])
        counts.append(np.bincount((values & 0xF).ravel(), minlength=16))
    # both close to uniform over 16 cells (5,000 draws each, ~312 per cell): none off by more than 25 %
    for c in counts:
        assert c.min() > 0.75 * c.mean() and c.max() < 1.25 * c.mean()


def test_recover_routes_around_a_bad_share_when_spares_exist():
    secret = os.urandom(16)
    shares = split(secret, 3, 5)
    bad = Share(shares[1].index, bytes(SHARE_BYTES))
    got = recover([shares[0], bad, *shares[2:]], 3, lambda s: s == secret, what="seed of client 4")
    assert got == secret


def test_recover_with_exactly_threshold_and_one_bad_share_raises():
    secret = os.urandom(16)
    shares = split(secret, 3, 5)
    tampered = [shares[0], Share(shares[1].index, os.urandom(SHARE_BYTES)), shares[2]]
    with pytest.raises(InconsistentShares, match="seed of client 4"):
        recover(tampered, 3, lambda s: s == secret, what="seed of client 4")


def test_a_shifted_share_that_still_encodes_a_secret_is_caught_by_the_commitment():
    """Adding δ to one limb of one share shifts the reconstructed limb by λ·δ; choose δ so the
    result stays a valid secret — only the commitment check (``matches``) can refuse it."""
    secret = bytes(16)  # all-zero digits: a small shift stays in range
    shares = split(secret, 2, 2)
    lam = 2  # λ_1 for points {1, 2}: 2 / (2 − 1)
    delta = pow(lam, P - 2, P)  # λ·δ = 1: digit 0 becomes 1
    values = np.frombuffer(shares[0].value, "<u4").astype(np.int64)
    values[0] = (values[0] + delta) % P
    shifted = Share(1, share_bytes([int(v) for v in values]))
    assert combine([shifted, shares[1]]) == (1).to_bytes(16, "big")
    with pytest.raises(InconsistentShares):
        recover([shifted, shares[1]], 2, lambda s: s == secret, what="seed")


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
        combine([Share(1, bytes(SHARE_BYTES)), Share(1, bytes(SHARE_BYTES))])
    with pytest.raises(ValueError, match="index"):
        Share(0, bytes(SHARE_BYTES))
    with pytest.raises(ValueError, match="20 bytes"):
        Share(1, bytes(16))  # a GF(2^128) share of protocol v2
