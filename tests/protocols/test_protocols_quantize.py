"""Quantization into Z_2^b: bit widths at the overflow boundary, unbiased rounding, exact decoding."""

from __future__ import annotations

import math

import numpy as np
import pytest

from secfed.protocols import OverflowRefused, Quantizer, ring_bits


def test_ring_bits_is_tight_at_the_boundary():
    # n·M ≤ 2^(b−1) − 1 fits in b bits; one more unit needs b + 1.
    assert ring_bits(1, 127) == 8
    assert ring_bits(1, 128) == 9
    assert ring_bits(10, (2**31 - 1) // 10) == 32
    assert ring_bits(4, 0) == 1
    with pytest.raises(OverflowRefused, match="33 bits"):
        ring_bits(2, 2**30)


def test_quantizer_refuses_an_overflowing_configuration_at_construction():
    with pytest.raises(OverflowRefused, match="needs"):
        Quantizer(clip=1.0, scale=2.0**31, n_clients=2)
    with pytest.raises(ValueError, match="clip"):
        Quantizer(clip=float("nan"), scale=1.0, n_clients=2)


@pytest.mark.parametrize("n, clip", [(2, 1.0), (10, 0.05), (100, 3.0), (1000, 1e-3)])
def test_for_cohort_picks_the_largest_scale_that_fits(n, clip):
    q = Quantizer.for_cohort(n, clip)
    assert q.bits == 32
    assert n * math.ceil(clip * q.scale) <= 2**31 - 1
    with pytest.raises(OverflowRefused):
        Quantizer(clip=clip, scale=q.scale * (1 + 1e-6) + 1.0 / clip, n_clients=n)


def test_worst_case_sums_decode_exactly_without_wrapping():
    n, clip = 7, 0.5
    q = Quantizer.for_cohort(n, clip, bits=20)
    rng = np.random.default_rng(0)
    for value in (clip, -clip, 10.0, -10.0):  # beyond the clip too
        ring = [q.to_ring(np.full(5, value), rng) for _ in range(n)]
        total = np.bitwise_and(sum(r.astype(np.uint64) for r in ring), (1 << q.bits) - 1).astype(np.uint32)
        expected = n * math.copysign(clip, value)
        assert np.allclose(q.from_ring(total), expected, atol=n / q.scale)


def test_stochastic_rounding_is_unbiased_and_reproducible():
    q = Quantizer(clip=1.0, scale=4.0, n_clients=1)
    x = np.full(200_000, 0.3)  # 1.2 ring units: rounds to 1 or 2
    ring = q.to_ring(x, np.random.default_rng(5))
    assert set(np.unique(ring)) == {1, 2}
    assert abs(ring.mean() - 1.2) < 0.005
    assert np.array_equal(ring, q.to_ring(x, np.random.default_rng(5)))


def test_negative_values_wrap_into_the_ring_and_back():
    q = Quantizer(clip=2.0, scale=8.0, n_clients=3)
    x = np.array([-2.0, -0.5, 0.0, 0.25, 2.0])
    ring = q.to_ring(x, np.random.default_rng(0))
    assert ring.dtype == np.uint32 and ring.max() < 1 << q.bits
    assert np.array_equal(q.from_ring(ring), x)  # exactly representable values round exactly


def test_bad_inputs_are_refused_with_their_location():
    q = Quantizer.for_cohort(4, 1.0)
    with pytest.raises(ValueError, match="index 2"):
        q.to_ring(np.array([0.0, 1.0, np.nan]), np.random.default_rng(0))
    with pytest.raises(TypeError, match="Generator"):
        q.to_ring(np.zeros(3), np.random.RandomState(0))
    with pytest.raises(TypeError, match="float"):
        q.to_ring(np.zeros(3, dtype=np.int32), np.random.default_rng(0))
    with pytest.raises(TypeError, match="uint32"):
        q.from_ring(np.zeros(3, dtype=np.int64))
