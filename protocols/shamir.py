"""Shamir t-of-n secret sharing of 16-byte secrets over GF(2^128), via pycryptodome.

pycryptodome does the field arithmetic; this module adds types, the share indices the protocol
uses (1-based position of the holder in the owner's neighbour list), and :func:`recover`, which
reconstructs from exactly ``threshold`` shares, checks the result against a commitment, and, when
more shares are at hand, searches for a consistent subset — so a bad share is either routed around
or reported as :class:`InconsistentShares`, never turned into a silently wrong sum.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from Crypto.Protocol.SecretSharing import Shamir

from .errors import BelowThreshold, InconsistentShares

SECRET_BYTES = 16


@dataclass(frozen=True)
class Share:
    """The share held by the party at 1-based ``index``: a 16-byte GF(2^128) element."""

    index: int
    value: bytes

    def __post_init__(self) -> None:
        if self.index < 1:
            raise ValueError(f"share index must be >= 1, got {self.index}")
        if len(self.value) != SECRET_BYTES:
            raise ValueError(f"share value must be {SECRET_BYTES} bytes, got {len(self.value)}")


def split(secret: bytes, threshold: int, count: int) -> list[Share]:
    """``count`` shares of ``secret``, any ``threshold`` of which reconstruct it."""
    if len(secret) != SECRET_BYTES:
        raise ValueError(f"secret must be {SECRET_BYTES} bytes, got {len(secret)}")
    if not 1 <= threshold <= count:
        raise ValueError(f"need 1 <= threshold <= count, got threshold={threshold}, count={count}")
    return [Share(i, v) for i, v in Shamir.split(threshold, count, secret)]


def combine(shares: Sequence[Share]) -> bytes:
    """Interpolate the secret from exactly these shares (their number is the threshold)."""
    indices = [s.index for s in shares]
    if len(set(indices)) != len(indices):
        raise ValueError(f"share indices repeat: {sorted(indices)}")
    return Shamir.combine([(s.index, s.value) for s in shares])


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
        secret = combine(chosen)
        if matches(secret):
            return secret
    raise InconsistentShares(
        f"{what}: no {threshold} of the {len(shares)} shares reconstruct the committed value "
        f"(tried {min(attempt + 1, max_attempts)} subsets); at least one share holder sent a bad share"
    )
