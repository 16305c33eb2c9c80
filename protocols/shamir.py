"""Shamir t-of-n secret sharing of 16-byte secrets over the prime field GF(p), p = 2^31 − 1.

Written here because no maintained library shares over a prime field at array speed:
pycryptodome's GF(2^128) multiplication is pure Python (71 % of a round's time at n = 200).
numpy does the arithmetic: every field element is below 2^31, so a product of two fits a
uint64 exactly and one array operation serves all holders and all limbs at once.

Encoding (no entropy lost). The secret, read as a 128-bit big-endian integer s, is written in
base 2^26 as ``LIMBS`` = 5 digits s_0 … s_4, s = Σ s_i·2^(26·i): digits 0–3 below 2^26, digit 4
below 2^24, all below p. The map is a bijection between 16-byte strings and those digit vectors,
so the secret keeps its 128 bits. Each digit is shared with its own random polynomial of degree
t − 1 over GF(p) (coefficients uniform on [0, p) by rejection sampling of 31-bit words from
``os.urandom``); a share is the five values at the holder's index x ∈ [1, count], sent as five
little-endian uint32 (``SHARE_BYTES`` = 20). Any t − 1 shares are independent of every digit (the
usual argument per digit, p > count), so of the secret. Reconstruction interpolates each digit at
0 (Lagrange); a result outside the digit ranges is not a secret, and is reported as
:class:`InconsistentShares` — shares that interpolate to a valid secret are then checked against a
commitment by :func:`recover`.

Share indices are the protocol's: the 1-based position of the holder in the owner's neighbour
list, one share per neighbour. Splitting evaluates all shares at once by Horner's rule on a
(count × 5) array, one multiply-add-reduce per coefficient. :func:`recover` reconstructs from
exactly ``threshold`` shares, checks the result against a commitment and, when more shares are at
hand, searches for a consistent subset — so a bad share is either routed around or reported as
:class:`InconsistentShares`, never turned into a silently wrong sum.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from .errors import BelowThreshold, InconsistentShares

SECRET_BYTES = 16
PRIME = (1 << 31) - 1
LIMBS = 5
DIGIT_BITS = 26
SHARE_BYTES = 4 * LIMBS
# Largest value of each base-2^26 digit of a 128-bit integer (the top digit holds 128 − 104 bits).
_DIGIT_MAX = np.array([(1 << DIGIT_BITS) - 1] * (LIMBS - 1) + [(1 << (128 - DIGIT_BITS * (LIMBS - 1))) - 1],
                      dtype=np.uint64)
_P = np.uint64(PRIME)


@dataclass(frozen=True)
class Share:
    """The share held by the party at 1-based ``index``: five GF(p) values, 20 bytes little-endian."""

    index: int
    value: bytes

    def __post_init__(self) -> None:
        if not 1 <= self.index < PRIME:
            raise ValueError(f"share index must be in [1, {PRIME}), got {self.index}")
        if len(self.value) != SHARE_BYTES:
            raise ValueError(f"share value must be {SHARE_BYTES} bytes, got {len(self.value)}")


def to_digits(secret: bytes) -> np.ndarray:
    """The five base-2^26 digits of a 16-byte secret (least significant first), as uint64."""
    if len(secret) != SECRET_BYTES:
        raise ValueError(f"secret must be {SECRET_BYTES} bytes, got {len(secret)}")
    s = int.from_bytes(secret, "big")
    return np.array([(s >> (DIGIT_BITS * i)) & ((1 << DIGIT_BITS) - 1) for i in range(LIMBS)], dtype=np.uint64)


def from_digits(digits: np.ndarray) -> bytes:
    """Inverse of :func:`to_digits`; raises InconsistentShares for a vector that encodes no secret."""
    if np.any(digits > _DIGIT_MAX):
        raise InconsistentShares("the shares interpolate to field values that encode no 16-byte secret")
    return sum(int(d) << (DIGIT_BITS * i) for i, d in enumerate(digits)).to_bytes(SECRET_BYTES, "big")


def split(
    secret: bytes, threshold: int, count: int, *, random_bytes: Callable[[int], bytes] = os.urandom
) -> list[Share]:
    """``count`` shares of ``secret``, any ``threshold`` of which reconstruct it.

    ``random_bytes`` supplies the polynomials' randomness (``os.urandom``; tests pass a fixed one).
    """
    if not 1 <= threshold <= count:
        raise ValueError(f"need 1 <= threshold <= count, got threshold={threshold}, count={count}")
    if count >= PRIME:
        raise ValueError(f"at most {PRIME - 1} shares, got {count}")
    coefficients = np.empty((threshold, LIMBS), dtype=np.uint64)
    coefficients[0] = to_digits(secret)
    coefficients[1:] = _uniform_elements((threshold - 1, LIMBS), random_bytes)
    values = evaluate(coefficients, count)
    raw = values.astype("<u4").tobytes()
    return [Share(i + 1, raw[SHARE_BYTES * i : SHARE_BYTES * (i + 1)]) for i in range(count)]


def evaluate(coefficients: np.ndarray, count: int) -> np.ndarray:
    """Polynomials (column j: coefficients of limb j, constant term first) at x = 1 … count.

    Horner's rule over the whole (count × limbs) array: y ← y·x + c mod p per coefficient, every
    intermediate below 2^62 + 2^31 in uint64.
    """
    x = np.arange(1, count + 1, dtype=np.uint64)[:, None]
    y = np.repeat(coefficients[-1:], count, axis=0)
    for c in coefficients[-2::-1]:
        y *= x
        y += c
        y %= _P
    return y


def combine(shares: Sequence[Share]) -> bytes:
    """Interpolate the secret from exactly these shares (their number is the threshold).

    Raises ValueError for repeated indices and InconsistentShares when the shares interpolate to
    field values that encode no secret (some share is wrong).
    """
    indices = [s.index for s in shares]
    if len(set(indices)) != len(indices):
        raise ValueError(f"share indices repeat: {sorted(indices)}")
    if not shares:
        raise ValueError("combine needs at least one share")
    lam = _lagrange_at_zero(indices)
    y = np.frombuffer(b"".join(s.value for s in shares), dtype="<u4").reshape(len(shares), LIMBS).astype(np.uint64)
    digits = (y * lam[:, None] % _P).sum(axis=0) % _P  # t products below 2^31 each: no overflow
    return from_digits(digits)


def recover(
    shares: Sequence[Share],
    threshold: int,
    matches: Callable[[bytes], bool],
    *,
    what: str,
    max_attempts: int = 64,
) -> bytes:
    """The secret behind ``shares``, reconstructed from exactly ``threshold`` of them.

    ``matches(secret)`` checks a candidate against its commitment. The first attempt uses the first
    ``threshold`` shares; if it fails and more shares exist, subsets leaving out different shares are
    tried (up to ``max_attempts`` interpolations). Raises :class:`BelowThreshold` with fewer than
    ``threshold`` shares and :class:`InconsistentShares` when no subset tried matches; ``what``
    names the secret in both messages.
    """
    if len(shares) < threshold:
        raise BelowThreshold(f"{what}: {len(shares)} shares, {threshold} needed")
    shares = sorted(shares, key=lambda s: s.index)
    spare = len(shares) - threshold
    # Exclusion sets in order of size-`spare` combinations: the first one leaves out the last
    # `spare` shares; the next ones swap each share out in turn, so one bad share is found after at
    # most len(shares) attempts.
    for attempt, left_out in enumerate(itertools.combinations(reversed(range(len(shares))), spare)):
        if attempt >= max_attempts:
            break
        chosen = [s for i, s in enumerate(shares) if i not in left_out]
        try:
            secret = combine(chosen)
        except InconsistentShares:
            continue
        if matches(secret):
            return secret
    raise InconsistentShares(
        f"{what}: no {threshold} of the {len(shares)} shares reconstruct the committed value "
        f"(tried {min(attempt + 1, max_attempts)} subsets); at least one share holder sent a bad share"
    )


def _uniform_elements(shape: tuple[int, ...], random_bytes: Callable[[int], bytes]) -> np.ndarray:
    """Uniform elements of GF(p): 31-bit words, each equal to p (probability 2^-31) drawn again."""
    count = int(np.prod(shape))
    out = np.frombuffer(random_bytes(4 * count), dtype="<u4").astype(np.uint64) & np.uint64(PRIME)
    while True:
        bad = np.flatnonzero(out == _P)
        if not bad.size:
            return out.reshape(shape)
        out[bad] = np.frombuffer(random_bytes(4 * bad.size), dtype="<u4").astype(np.uint64) & np.uint64(PRIME)


def _lagrange_at_zero(indices: Sequence[int]) -> np.ndarray:
    """λ_j = Π_{m≠j} x_m / (x_m − x_j) mod p for the points x = ``indices`` (distinct, in [1, p))."""
    x = np.array(indices, dtype=np.uint64)
    numerator = np.ones(len(x), dtype=np.uint64)
    denominator = np.ones(len(x), dtype=np.uint64)
    for m, xm in enumerate(x):
        factor = np.full(len(x), xm, dtype=np.uint64)
        factor[m] = 1
        numerator = numerator * factor % _P
        difference = (xm + _P - x) % _P
        difference[m] = 1
        denominator = denominator * difference % _P
    inverse = np.array([pow(int(d), PRIME - 2, PRIME) for d in denominator], dtype=np.uint64)
    return numerator * inverse % _P
