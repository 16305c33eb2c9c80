"""Quantization into Z_2^b: bit widths at the overflow boundary, unbiased rounding, exact decoding."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from secfed.protocols import OverflowRefused, Quantizer, SessionConfig, choose_params, largest_cohort, ring_bits, simulate

REAL_DTYPES = [np.float16, np.float32, np.float64, np.longdouble,
               np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64]


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


def test_an_overflowing_cohort_is_refused_naming_the_largest_safe_cohort():
    """The refusal says how far the configuration reaches: at the clip and scale sized for 1,000
    clients, 1,000 is the largest cohort whose sum cannot wrap 32 bits (1,001 could)."""
    q = Quantizer.for_cohort(1000, clip=1.0)
    assert largest_cohort(q.max_abs) == 1000 and 1001 * q.max_abs > 2**31 - 1
    with pytest.raises(OverflowRefused, match="largest safe cohort for this clip and scale is 1,000"):
        Quantizer(clip=1.0, scale=q.scale, n_clients=1001)
    with pytest.raises(OverflowRefused, match="largest safe cohort at this bound is 1,000 clients"):
        ring_bits(1001, q.max_abs)
    params = choose_params(11, authenticated=False)
    with pytest.raises(OverflowRefused, match="largest safe cohort at this bound is 5 "):
        SessionConfig(bytes(16), 0, params, dimension=4, ring_bits=10, input_bound=100, server_key=bytes(32),
                      authenticated=False)
    with pytest.raises(OverflowRefused, match="largest safe cohort is 2,147,483,647"):
        Quantizer.for_cohort(2**31, clip=1.0)
    with pytest.raises(OverflowRefused, match="largest safe cohort is 127"):
        Quantizer.for_cohort(128, clip=0.5, bits=8)


def test_cohorts_up_to_100_000_quantize_at_the_finest_scale_that_fits():
    for n in (10_000, 100_000):
        q = Quantizer.for_cohort(n, clip=1.0)
        assert q.bits == 32 and largest_cohort(q.max_abs) >= n > largest_cohort(q.max_abs + 1)
        assert q.scale >= 21_474  # resolution 1/scale: ≤ 4.7e-5 of the clip at n = 100,000


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
    with pytest.raises(ValueError, match="index 1"):
        q.to_ring(np.array([0.0, -np.inf]), np.random.default_rng(0))  # not silently clipped
    with pytest.raises(ValueError, match="index 0"):
        q.to_ring(np.array([np.inf], dtype=np.longdouble), np.random.default_rng(0))
    with pytest.raises(TypeError, match="booleans"):
        q.to_ring(np.zeros(3, dtype=bool), np.random.default_rng(0))
    with pytest.raises(TypeError, match="real numbers"):
        q.to_ring(np.zeros(3, dtype=np.complex64), np.random.default_rng(0))
    with pytest.raises(TypeError, match="real numbers"):
        q.to_ring(np.array(["1.0"]), np.random.default_rng(0))
    with pytest.raises(TypeError, match="uint32"):
        q.from_ring(np.zeros(3, dtype=np.int64))


def test_issue_reproducer_float32_at_the_clip_does_not_wrap():
    """float32(0.1) > 0.1: clipped in float32 it escaped the range and the n = 2 sum wrapped to −0.2."""
    q = Quantizer.for_cohort(2, clip=0.1)
    total = simulate([np.full(8, 5.0, np.float32)] * 2, quantizer=q, rng=np.random.default_rng(1)).total
    assert np.allclose(total, 0.2, atol=2 / q.scale)


def _signed(ring: np.ndarray, bits: int) -> np.ndarray:
    v = ring.astype(np.int64)
    v[v >= 1 << (bits - 1)] -= 1 << bits
    return v


@st.composite
def cohorts_of_any_dtype(draw):
    dtype = np.dtype(draw(st.sampled_from(REAL_DTYPES)))
    clip = draw(st.sampled_from([0.1, 1 / 3, 1.0, 5.0, 2.0**-20, 1e9]) | st.floats(1e-6, 1e12))
    n = draw(st.integers(2, 6))
    # values near the clip (on either side, in the input's precision), the dtype's extremes, and anything
    bits = draw(st.integers(max(2, n.bit_length() + 1), 32))
    if dtype.kind == "f":
        info, kind = np.finfo(dtype), dtype.type
        with np.errstate(over="ignore"):
            near = [v for c in (kind(clip), kind(-clip), kind(2 * clip))
                    for v in (c, np.nextafter(c, kind(np.inf)), np.nextafter(c, kind(-np.inf)))]
        values = [v for v in near + [info.max, info.min, kind(0)] if np.isfinite(v)]
    else:
        info = np.iinfo(dtype)
        values = [int(v) for v in (clip, -clip, 2 * clip, -2 * clip) if info.min <= int(v) <= info.max]
        values += [info.max, info.min, 0]
    specials = st.sampled_from(values).map(lambda v: np.array(v).astype(dtype))
    elements = hnp.from_dtype(dtype, allow_nan=False, allow_infinity=False) if dtype.itemsize <= 8 else \
        st.floats(allow_nan=False, allow_infinity=False).map(lambda v: np.longdouble(v))
    d = draw(st.integers(1, 12))
    inputs = [np.array([draw(specials | elements) for _ in range(d)], dtype=dtype) for _ in range(n)]
    return dtype, clip, bits, inputs


@settings(max_examples=400, deadline=None)
@given(cohorts_of_any_dtype(), st.integers(0, 2**32 - 1))
def test_every_real_dtype_gives_the_clipped_sum_without_wrapping(case, seed):
    """Each client's integer lies in [−M, M] and is ⌊·⌋ or ⌈·⌉ of its clipped, scaled value, so the
    ring sum of n clients decodes to the exact clipped sum within n quantization steps."""
    dtype, clip, bits, inputs = case
    n = len(inputs)
    try:
        q = Quantizer.for_cohort(n, clip, bits=bits)
    except OverflowRefused:
        return  # a typed refusal: n clients cannot share this small a ring
    rng = np.random.default_rng(seed)
    rings = [q.to_ring(x, rng) for x in inputs]
    exact = [np.clip(x.astype(np.longdouble), -clip, clip) * np.longdouble(q.scale) for x in inputs]
    for ring, value in zip(rings, exact):
        ints = _signed(ring, q.bits)
        assert np.abs(ints).max() <= q.max_abs
        assert np.all(np.abs(ints - value) < 1 + 1e-6), (dtype, clip, ints, value)
    total = np.bitwise_and(sum(r.astype(np.uint64) for r in rings), (1 << q.bits) - 1).astype(np.uint32)
    reference = sum(np.clip(x.astype(np.longdouble), -clip, clip) for x in inputs)
    assert np.all(np.abs(q.from_ring(total) - reference) <= n / q.scale * (1 + 1e-6))


def test_a_long_vector_rounds_the_same_on_any_number_of_threads():
    from secfed.protocols import parallel
    from secfed.protocols.quantize import BLOCK

    q = Quantizer.for_cohort(4, clip=1.0)
    x = np.random.default_rng(1).standard_normal(3 * BLOCK + 123) * 0.5  # ≈ 5 % beyond the clip
    before = parallel.workers()
    try:
        results = []
        for threads in (1, 2, 3):
            parallel.set_workers(threads)
            out = np.empty(x.size, np.uint32)
            clipped = q.quantize_into(out, x, np.random.default_rng(9), weight=2.0)
            results.append((out, clipped))
    finally:
        parallel.set_workers(before)
    assert all(np.array_equal(out, results[0][0]) and c == results[0][1] for out, c in results)
    assert results[0][1] == np.count_nonzero(np.abs(2.0 * x) > 1.0)
    # every block rounds without bias and within one ring unit of the clipped, weighted value
    exact = np.clip(2.0 * x, -1.0, 1.0) * q.scale
    decoded = q.from_ring(results[0][0]) * q.scale
    assert np.all(np.abs(decoded - exact) < 1.0)
    assert abs(np.mean(decoded - exact)) < 5 / np.sqrt(x.size)


def test_quantize_into_refuses_a_wrong_output_or_weight():
    q = Quantizer.for_cohort(4, clip=1.0)
    with pytest.raises(ValueError, match="uint32 vector of 3"):
        q.quantize_into(np.empty(3, np.int64), np.zeros(3), np.random.default_rng(0))
    with pytest.raises(ValueError, match="weight must be a finite"):
        q.quantize_into(np.empty(3, np.uint32), np.zeros(3), np.random.default_rng(0), weight=math.inf)


def test_a_scale_whose_product_with_the_clip_overflows_is_refused_typed():
    """clip·scale = inf has no ring: refused as OverflowRefused, not a bare OverflowError."""
    with pytest.raises(OverflowRefused, match="overflows float64"):
        Quantizer(1e200, 1e200, 2)


def test_numpy_integers_are_counts_and_other_types_are_refused_typed():
    """Integrators pass their own bounds and cohort sizes, often as numpy integers: they count like
    ints (before: AttributeError on ``.bit_length``); a float or bool count is a TypeError naming the
    argument, and a clip so small that no float64 scale fills the ring a ValueError naming the clip
    (before: OverflowError from ``math.ceil(inf)``)."""
    assert ring_bits(np.int64(10), np.int64(100)) == ring_bits(10, 100)
    assert largest_cohort(np.uint32(7), np.int8(20)) == largest_cohort(7, 20)
    q = Quantizer(1.0, 100.0, np.int64(10))
    assert type(q.n_clients) is int and q == Quantizer(1.0, 100.0, 10)
    assert Quantizer.for_cohort(np.int32(3), 1.0, bits=np.int64(16)) == Quantizer.for_cohort(3, 1.0, bits=16)
    for call, name in ((lambda: Quantizer(1.0, 100.0, 10.0), "n_clients"), (lambda: ring_bits(True, 3), "n_clients"),
                       (lambda: ring_bits(3, 2.5), "max_abs"), (lambda: Quantizer.for_cohort(3, 1.0, bits=16.0), "bits")):
        with pytest.raises(TypeError, match=f"{name} must be an integer"):
            call()
    with pytest.raises(ValueError, match="clip 1e-310 is too small"):
        Quantizer.for_cohort(3, clip=1e-310)


@pytest.mark.parametrize("dtype", [np.float64, np.float32, np.longdouble])
def test_a_weighted_value_beyond_float_range_is_clipped_not_called_non_finite(dtype):
    """weight·x may overflow float64 (or the input's precision) for a finite x: it lies beyond the
    clip like any large value, so it is clipped and counted, with its sign."""
    q = Quantizer.for_cohort(4, clip=1.0)
    big = np.finfo(dtype).max
    x = np.array([big, -big, 0.25], dtype=dtype)
    out = np.empty(3, np.uint32)
    assert q.quantize_into(out, x, np.random.default_rng(0), weight=3.0) == 2
    decoded = q.from_ring(out)
    assert decoded[0] == pytest.approx(1.0, abs=1 / q.scale) and decoded[1] == pytest.approx(-1.0, abs=1 / q.scale)
    with pytest.raises(ValueError, match="non-finite value at index 1"):  # a real inf is still refused
        q.quantize_into(out, np.array([big, np.inf, 0.0], dtype=dtype), np.random.default_rng(0), weight=3.0)
