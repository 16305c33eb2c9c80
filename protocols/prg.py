"""Mask expansion and the other bulk passes over ring vectors: AES-128-CTR keystreams from
``cryptography``, added straight into a uint32 vector, on every core.

A mask is the keystream of AES-128-CTR (counter block starting at ``iv``, all-zero by default)
read as little-endian 32-bit words; mask element ``i`` is word ``i``. In Z_{2^b} with b ≤ 32 the
mask is the word's low b bits — uniform, because the keystream is. Masks are never materialised:
a pass walks the vector in chunks small enough to stay in L2 cache and, for each chunk, runs every
stream over it, so the vector is read and written once per chunk whatever the number of masks.

Parallel: the vector is cut into one contiguous range per worker thread (:mod:`.parallel`),
aligned to leaves of the vector digest; each thread starts every stream's counter at its range's
first block (block = 4 words), so the result is bit-identical to one thread's. Streams are taken
``STREAM_GROUP`` at a time (the server unmasking a large cohort regenerates tens of thousands):
only a group's cipher contexts exist at once.

:func:`mask_into` is the client's pass (input bound check, masks, reduction and the vector's
digest, fused); :func:`accumulate` the server's on arrival (digest and sum, fused);
:func:`apply_masks` the server's unmasking.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

from . import parallel
from .crypto import VECTOR_LEAF_WORDS, digest_of_leaves, leaf_digest, leaf_hasher

MASK_KEY_BYTES = 16
_ZERO_IV = bytes(16)
# 64 Ki words = 256 KiB of keystream and 256 KiB of vector per step: both stay in L2.
# (Measured on the 2-core dev VM, d = 1M, 10 streams: 16 Ki–128 Ki words within 2 % of each other;
# 4 Ki words doubles the time in call overhead.)
CHUNK_WORDS = 1 << 16
_ZEROS = memoryview(bytes(4 * CHUNK_WORDS))
STREAM_GROUP = 256
MIN_WORDS_PER_WORKER = parallel.MIN_WORDS_PER_WORKER

assert VECTOR_LEAF_WORDS % CHUNK_WORDS == 0  # a chunk never straddles two leaves


class LeafHasher(Protocol):
    """What :func:`mask_into` feeds each leaf of the vector to (BLAKE3 by default)."""

    def update(self, data: memoryview, /) -> object: ...

    def digest(self) -> bytes: ...


@dataclass(frozen=True)
class MaskStream:
    """One mask to apply: the 16-byte AES key it expands from, and whether to add (+1) or subtract (-1)."""

    key: bytes
    sign: int
    iv: bytes = _ZERO_IV

    def __post_init__(self) -> None:
        if len(self.key) != MASK_KEY_BYTES:
            raise ValueError(f"mask key must be {MASK_KEY_BYTES} bytes, got {len(self.key)}")
        if self.sign not in (1, -1):
            raise ValueError(f"mask sign must be +1 or -1, got {self.sign}")
        if len(self.iv) != 16:
            raise ValueError(f"mask iv must be 16 bytes, got {len(self.iv)}")


class BoundExceeded(ValueError):
    """An input value beyond the declared bound: ``index`` and its ring ``value``."""

    def __init__(self, index: int, value: int) -> None:
        super().__init__(f"input at index {index} (ring value {value}) is beyond the bound")
        self.index, self.value = index, value


def ring_mask(bits: int) -> int:
    """2^bits − 1, the mask that reduces a uint32 word into Z_{2^bits}."""
    if not 1 <= bits <= 32:
        raise ValueError(f"ring bit width must be in [1, 32], got {bits}")
    return (1 << bits) - 1


def counter_block(iv: bytes, word: int) -> bytes:
    """The CTR counter block at which word ``word`` (a multiple of 4) of the keystream starts:
    ``iv`` plus ``word / 4`` as a 128-bit big-endian integer (how OpenSSL's CTR mode counts)."""
    if word % 4:
        raise ValueError(f"a keystream range must start on a 16-byte block, got word {word}")
    return ((int.from_bytes(iv, "big") + word // 4) % (1 << 128)).to_bytes(16, "big")


def apply_masks(acc: np.ndarray, streams: Sequence[MaskStream], *, bits: int) -> None:
    """In place: ``acc ← (acc + Σ sign·mask(key)) mod 2^bits``.

    ``acc`` is a writable, contiguous 1-D ``uint32`` array. Words wrap mod 2^32 while streams are
    added; because 2^bits divides 2^32 one final reduction gives the result mod 2^bits.
    """
    low = ring_mask(bits)
    _check_accumulator(acc)
    ranges = _ranges(acc.size)
    parallel.run_all([lambda lo=lo, hi=hi: _stream_range(acc, streams, lo, hi, low) for lo, hi in ranges])


def mask_into(
    out: np.ndarray, source: np.ndarray, streams: Sequence[MaskStream], *, bits: int, bound: int | None,
    hasher: Callable[[], LeafHasher] = leaf_hasher,
) -> bytes:
    """``out ← (source + Σ sign·mask(key)) mod 2^bits``; returns :func:`~.crypto.vector_digest` of ``out``.

    ``source`` is a uint32 vector of the same length. Its values are checked to lie in the ring
    (ValueError naming the first index outside) and, with ``bound`` M, to be at most M in
    magnitude read as signed ring integers, ``(v + M) mod 2^bits ≤ 2M`` (:class:`BoundExceeded`
    for the first beyond). One pass: each chunk is checked,
    copied, masked, reduced and hashed while it is in cache.

    ``hasher`` makes a fresh hasher per leaf; the default (:func:`~.crypto.leaf_hasher`) gives the
    vector digest the protocol signs. Anything else is for measuring the pass without its digest
    (bench/secagg/keystream.py): the returned value is then not the vector's digest.
    """
    low = ring_mask(bits)
    _check_accumulator(out)
    if source.dtype != np.uint32 or source.shape != out.shape:
        raise ValueError("source must be a uint32 vector of the accumulator's length")
    if bound is not None and not 0 <= bound <= low:
        raise ValueError(f"bound {bound} is outside the ring Z_2^{bits}")
    ranges = _ranges(out.size)
    leaves = parallel.run_all([
        lambda lo=lo, hi=hi: _mask_range(out, source, streams, lo, hi, low, bound, hasher) for lo, hi in ranges
    ])
    return digest_of_leaves(out.size, (leaf for part in leaves for leaf in part))


def accumulate(acc: np.ndarray, vector: np.ndarray) -> bytes:
    """``acc ← acc + vector`` (mod 2^32) and :func:`~.crypto.vector_digest` of ``vector``, in one pass."""
    _check_accumulator(acc)
    vector = np.ascontiguousarray(vector, dtype="<u4")
    if vector.shape != acc.shape:
        raise ValueError(f"vector has {vector.size} words, the accumulator {acc.size}")
    ranges = _ranges(acc.size)
    leaves = parallel.run_all([lambda lo=lo, hi=hi: _add_range(acc, vector, lo, hi) for lo, hi in ranges])
    return digest_of_leaves(acc.size, (leaf for part in leaves for leaf in part))


def mask_words(key: bytes, count: int, *, iv: bytes = _ZERO_IV) -> np.ndarray:
    """The first ``count`` words of the mask expanded from ``key`` (for tests and audits)."""
    out = parallel.zeros(count)
    apply_masks(out, [MaskStream(key, 1, iv)], bits=32)
    return out


# ---- the passes, one contiguous range [lo, hi) each ----------------------------------------------


def _check_accumulator(acc: np.ndarray) -> None:
    if acc.dtype != np.uint32 or acc.ndim != 1 or not acc.flags.c_contiguous or not acc.flags.writeable:
        raise ValueError("accumulator must be a writable, contiguous 1-D uint32 array")


def _ranges(size: int) -> list[tuple[int, int]]:
    """One range per worker, whole leaves each, none shorter than MIN_WORDS_PER_WORKER."""
    return parallel.ranges(size, VECTOR_LEAF_WORDS, MIN_WORDS_PER_WORKER)


def _groups(streams: Sequence[MaskStream]) -> Iterator[Sequence[MaskStream]]:
    for start in range(0, len(streams), STREAM_GROUP):
        yield streams[start : start + STREAM_GROUP]


def _encryptors(group: Sequence[MaskStream], lo: int) -> list[tuple[object, bool]]:
    return [
        (Cipher(algorithms.AES(s.key), modes.CTR(counter_block(s.iv, lo))).encryptor(), s.sign > 0) for s in group
    ]


def _add_streams(part: np.ndarray, encryptors, buf: bytearray, words: np.ndarray,
                 source: np.ndarray | None = None) -> None:
    """``part ← (source or part) ± each stream``; reading ``source`` in the first addition saves
    the pass that would copy it into ``part``."""
    n = part.size
    mask, zeros = words[:n], _ZEROS[: 4 * n]
    first = part if source is None else source
    for encryptor, add in encryptors:
        # CTR over zeros yields the raw keystream, written into `buf` without allocation.
        encryptor.update_into(zeros, buf)
        if add:
            np.add(first, mask, out=part)
        else:
            np.subtract(first, mask, out=part)
        first = part
    if first is not part:  # no streams at all
        np.copyto(part, first)


def _stream_range(acc: np.ndarray, streams: Sequence[MaskStream], lo: int, hi: int, low: int) -> None:
    buf = bytearray(4 * min(CHUNK_WORDS, hi - lo))  # a short vector gets a short buffer
    words = np.frombuffer(buf, dtype="<u4")
    for group in _groups(streams):
        encryptors = _encryptors(group, lo)
        for start in range(lo, hi, CHUNK_WORDS):
            _add_streams(acc[start : min(start + CHUNK_WORDS, hi)], encryptors, buf, words)
    if low != 0xFFFFFFFF:
        np.bitwise_and(acc[lo:hi], low, out=acc[lo:hi])


def _mask_range(
    out: np.ndarray, source: np.ndarray, streams: Sequence[MaskStream], lo: int, hi: int, low: int,
    bound: int | None, hasher: Callable[[], LeafHasher],
) -> list[bytes]:
    buf = bytearray(4 * min(CHUNK_WORDS, hi - lo))
    words = np.frombuffer(buf, dtype="<u4")
    scratch = np.empty(min(CHUNK_WORDS, hi - lo), dtype=np.uint32)
    single_group = len(streams) <= STREAM_GROUP
    encryptors = _encryptors(streams, lo) if single_group else []
    leaves, leaf = [], hasher()
    for start in range(lo, hi, CHUNK_WORDS):
        stop = min(start + CHUNK_WORDS, hi)
        x, part = source[start:stop], out[start:stop]
        _check_chunk(x, scratch[: x.size], start, low, bound)
        if single_group:
            _add_streams(part, encryptors, buf, words, source=x)
            if low != 0xFFFFFFFF:
                np.bitwise_and(part, low, out=part)
            leaf.update(memoryview(part).cast("B"))
            if (stop - lo) % VECTOR_LEAF_WORDS == 0 or stop == hi:
                leaves.append(leaf.digest())
                leaf = hasher()
        else:
            np.copyto(part, x)
    if not single_group:  # many streams (a complete graph's client): mask group by group, then hash
        _stream_range(out, streams, lo, hi, low)
        leaves = [_hashed(hasher, out[s : min(s + VECTOR_LEAF_WORDS, hi)]) for s in range(lo, hi, VECTOR_LEAF_WORDS)]
    return leaves


def _hashed(hasher: Callable[[], LeafHasher], words: np.ndarray) -> bytes:
    """One leaf's digest by a fresh ``hasher`` (the default's equals :func:`~.crypto.leaf_digest`)."""
    leaf = hasher()
    leaf.update(memoryview(words).cast("B"))
    return leaf.digest()


def _check_chunk(x: np.ndarray, scratch: np.ndarray, offset: int, low: int, bound: int | None) -> None:
    if low != 0xFFFFFFFF and int(x.max()) > low:
        i = int(np.flatnonzero(x > low)[0])
        raise ValueError(f"client input values must lie in [0, {low + 1}); index {offset + i} is {int(x[i])}")
    if bound is not None:
        # Read as signed ring integers, values must lie in [−M, M]: (v + M) mod 2^b ≤ 2M.
        np.add(x, np.uint32(bound), out=scratch)
        if low != 0xFFFFFFFF:
            np.bitwise_and(scratch, low, out=scratch)
        if int(scratch.max()) > 2 * bound:
            i = int(np.flatnonzero(scratch > 2 * bound)[0])
            raise BoundExceeded(offset + i, int(x[i]))


def _add_range(acc: np.ndarray, vector: np.ndarray, lo: int, hi: int) -> list[bytes]:
    leaves = []
    for start in range(lo, hi, VECTOR_LEAF_WORDS):
        stop = min(start + VECTOR_LEAF_WORDS, hi)
        part = vector[start:stop]
        leaves.append(leaf_digest(part))
        np.add(acc[start:stop], part, out=acc[start:stop])
    return leaves
