"""Mask expansion: NIST known answers, streaming across chunks, ring reduction, uniformity; counter
offsets, threads and the fused passes (mask + bound + digest, sum + digest)."""

from __future__ import annotations

import numpy as np
import pytest
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from scipy import stats

from secfed.protocols import parallel, prg
from secfed.protocols.crypto import vector_digest
from secfed.protocols.prg import (
    CHUNK_WORDS,
    MIN_WORDS_PER_WORKER,
    MaskStream,
    accumulate,
    apply_masks,
    counter_block,
    mask_into,
    mask_words,
)

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


# ---- ranges, threads, fused passes -----------------------------------------------------------------


def test_counter_block_adds_the_block_offset_as_a_128_bit_big_endian_integer():
    assert counter_block(bytes(16), 0) == bytes(16)
    assert counter_block(bytes(16), 4 * 258) == bytes(14) + b"\x01\x02"
    assert counter_block(b"\xff" * 16, 4) == bytes(16)  # wraps like OpenSSL's counter
    with pytest.raises(ValueError, match="16-byte block"):
        counter_block(bytes(16), 6)


def test_a_keystream_started_mid_vector_is_the_slice_of_the_whole_one():
    """What lets each thread start every stream at its own range: the keystream from word w (a
    multiple of 4) is AES-CTR from counter block iv + w/4 — checked against OpenSSL's own stream."""
    key, n, offset = bytes(range(16)), 3 * CHUNK_WORDS, CHUNK_WORDS + 4
    whole = np.frombuffer(Cipher(algorithms.AES(key), modes.CTR(NIST_IV)).encryptor().update(bytes(4 * n)), "<u4")
    tail = mask_words(key, n - offset, iv=counter_block(NIST_IV, offset))
    assert np.array_equal(tail, whole[offset:])


@pytest.fixture
def two_workers():
    before = parallel.workers()
    parallel.set_workers(2)
    yield
    parallel.set_workers(before)


def test_every_pass_is_bit_identical_on_one_thread_and_on_two(two_workers):
    n = 2 * MIN_WORDS_PER_WORKER + 3 * CHUNK_WORDS + 17  # two ranges, the second ragged
    assert len(prg._ranges(n)) == 2
    rng = np.random.default_rng(3)
    x = rng.integers(0, 1 << 20, n, dtype=np.uint32)
    streams = [MaskStream(bytes([i]) * 16, (-1) ** i) for i in range(5)]
    results = []
    for workers in (1, 2):
        parallel.set_workers(workers)
        acc = x.copy()
        apply_masks(acc, streams, bits=20)
        out = np.empty_like(x)
        digest = mask_into(out, x, streams, bits=20, bound=None)
        total = np.ones(n, dtype=np.uint32)
        added = accumulate(total, out)
        results.append((acc, out, digest, total, added))
    (acc1, out1, d1, t1, a1), (acc2, out2, d2, t2, a2) = results
    expected = (x.astype(np.int64) + sum(s.sign * mask_words(s.key, n).astype(np.int64) for s in streams)) % (1 << 20)
    assert np.array_equal(acc1, expected) and np.array_equal(acc2, expected)
    assert np.array_equal(out1, expected) and np.array_equal(out2, expected)
    assert d1 == d2 == a1 == a2 == vector_digest(expected.astype(np.uint32))
    assert np.array_equal(t1, t2) and np.array_equal(t1, (expected + 1).astype(np.uint32))


def test_more_streams_than_a_group_are_all_applied():
    streams = [MaskStream(i.to_bytes(16, "little"), 1) for i in range(prg.STREAM_GROUP + 3)]
    acc = np.zeros(40, dtype=np.uint32)
    apply_masks(acc, streams, bits=32)
    expected = sum(mask_words(s.key, 40).astype(np.uint64) for s in streams) % (1 << 32)
    assert np.array_equal(acc, expected)
    out = np.full(40, 12345, dtype=np.uint32)  # whatever the output held before is overwritten
    source = np.arange(40, dtype=np.uint32)
    masked = (acc.astype(np.uint64) + source) % (1 << 32)
    assert mask_into(out, source, streams, bits=32, bound=None) == vector_digest(masked.astype(np.uint32))
    assert np.array_equal(out, masked)


def test_mask_into_checks_the_ring_and_the_bound_and_names_the_first_index(two_workers):
    n = 2 * MIN_WORDS_PER_WORKER + 5
    x = np.zeros(n, dtype=np.uint32)
    x[n - 3] = (1 << 10) - 101  # −101 in Z_2^10: beyond a bound of 100, in the second thread's range
    out = np.empty_like(x)
    with pytest.raises(prg.BoundExceeded) as caught:
        mask_into(out, x, [], bits=10, bound=100)
    assert (caught.value.index, caught.value.value) == (n - 3, (1 << 10) - 101)
    x[n - 3] = (1 << 10) - 100  # −100: allowed
    mask_into(out, x, [], bits=10, bound=100)
    x[7] = 1 << 10  # outside Z_2^10
    with pytest.raises(ValueError, match="index 7"):
        mask_into(out, x, [], bits=10, bound=None)


class _Recorder:
    """A leaf hasher that keeps the bytes it is fed (and hashes nothing)."""

    fed: list[bytes] = []

    def update(self, data) -> None:
        _Recorder.fed.append(bytes(data))

    def digest(self) -> bytes:
        return b"leaf"


@pytest.mark.parametrize("streams", [3, prg.STREAM_GROUP + 1])
def test_mask_into_feeds_every_masked_byte_to_the_hasher_it_is_given(streams):
    """``hasher=`` replaces the leaf digest in both paths (few streams: fused per chunk; many: per
    leaf after masking): it sees exactly the masked output, in order, and the masking is unchanged."""
    keys = [MaskStream(i.to_bytes(16, "little"), (-1) ** i) for i in range(streams)]
    x = np.arange(CHUNK_WORDS + 9, dtype=np.uint32)
    reference = np.empty_like(x)
    digest = mask_into(reference, x, keys, bits=32, bound=None)
    assert digest == vector_digest(reference)  # the default hasher gives the signed digest
    _Recorder.fed = []
    out = np.empty_like(x)
    assert mask_into(out, x, keys, bits=32, bound=None, hasher=_Recorder) != digest
    assert np.array_equal(out, reference)
    assert b"".join(_Recorder.fed) == reference.tobytes()
