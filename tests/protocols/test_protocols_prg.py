"""Mask expansion: NIST known answers, streaming across chunks, ring reduction, uniformity."""

from __future__ import annotations

import numpy as np
import pytest
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from scipy import stats

from secfed.protocols.prg import CHUNK_WORDS, MaskStream, apply_masks, mask_words

# NIST SP 800-38A F.5.1 (CTR-AES128.Encrypt), first two blocks.
NIST_KEY = bytes.fromhex("2b7e151628aed2a6abf7158809cf4f3c")
NIST_IV = bytes.fromhex("f0f1f2f3f4f5f6f7f8f9fafbfcfdfeff")
NIST_PT = bytes.fromhex("6bc1bee22e409f96e93d7e117393172aae2d8a571e03ac9c9eb76fac45af8e51")
NIST_CT = bytes.fromhex("874d6191b620e3261bef6864990db6ce9806f66b7970fdff8617187bb9fffdff")


def test_mask_is_the_aes_ctr_keystream_as_little_endian_words():
    keystream = bytes(p ^ c for p, c in zip(NIST_PT, NIST_CT))
    expected = np.frombuffer(keystream, dtype="<u4")
    assert np.array_equal(mask_words(NIST_KEY, 8, iv=NIST_IV), expected)
    assert mask_words(NIST_KEY, 8, iv=NIST_IV)[0] == int.from_bytes(keystream[:4], "little")


def test_streaming_across_chunks_equals_one_keystream():
    n = 2 * CHUNK_WORDS + 12345
    key = bytes(range(16))
    whole = Cipher(algorithms.AES(key), modes.CTR(bytes(16))).encryptor().update(bytes(4 * n))
    assert np.array_equal(mask_words(key, n), np.frombuffer(whole, dtype="<u4"))


def test_add_and_subtract_cancel_and_reduce_into_the_ring():
    rng = np.random.default_rng(1)
    x = rng.integers(0, 1 << 20, CHUNK_WORDS + 7, dtype=np.uint32)
    acc = x.copy()
    streams = [MaskStream(bytes([i]) * 16, 1) for i in range(3)]
    apply_masks(acc, streams, bits=20)
    assert acc.max() < 1 << 20 and not np.array_equal(acc, x)
    expected = (x.astype(np.uint64) + sum(mask_words(s.key, x.size).astype(np.uint64) for s in streams)) % (1 << 20)
    assert np.array_equal(acc, expected)
    apply_masks(acc, [MaskStream(s.key, -1) for s in streams], bits=20)
    assert np.array_equal(acc, x)


def test_apply_masks_refuses_bad_accumulators_and_streams():
    with pytest.raises(ValueError, match="uint32"):
        apply_masks(np.zeros(4, dtype=np.int64), [], bits=32)
    with pytest.raises(ValueError, match="writable"):
        apply_masks(np.zeros(8, dtype=np.uint32)[::2], [], bits=32)
    with pytest.raises(ValueError, match="bit width"):
        apply_masks(np.zeros(4, dtype=np.uint32), [], bits=33)
    with pytest.raises(ValueError, match="16 bytes"):
        MaskStream(b"short", 1)
    with pytest.raises(ValueError, match="sign"):
        MaskStream(bytes(16), 2)


@pytest.mark.parametrize("bits", [32, 13])
def test_masked_constant_vector_is_uniform(bits):
    """A constant input plus one mask must look uniform in Z_2^bits (chi-square over 256 bins)."""
    n = 1 << 18
    acc = np.full(n, 12345 % (1 << bits), dtype=np.uint32)
    apply_masks(acc, [MaskStream(bytes.fromhex("000102030405060708090a0b0c0d0e0f"), 1)], bits=bits)
    for shift in (0, bits - 8):  # low byte and top byte of the ring element
        counts = np.bincount((acc >> shift) & 0xFF, minlength=256)
        assert stats.chisquare(counts).pvalue > 1e-4
    # neighbouring elements are independent: pairs of top bits spread evenly over 16 cells
    top = acc >> (bits - 2)
    pairs = np.bincount(4 * top[:-1:2] + top[1::2], minlength=16)
    assert stats.chisquare(pairs).pvalue > 1e-4
