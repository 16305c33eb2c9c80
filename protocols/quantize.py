"""Floats ↔ ring: clipping, fixed-point scale and stochastic rounding into Z_{2^b}.

A client value x becomes the integer round_stoch(clip(x, −c, c)·s), stored mod 2^b as uint32.
Clipping is done in float64 whatever the input dtype (in the input's own precision, float32(0.1)
lies above 0.1 and would escape the range). Stochastic rounding gives ⌊v⌋ + 1 with probability
v − ⌊v⌋, else ⌊v⌋ — mean v, and never beyond ⌈v⌉ — so every integer lies in [−M, M], M = ⌈c·s⌉.
A sum of n such integers lies in [−nM, nM] and is recovered from its residue mod 2^b (read as a
signed b-bit number) exactly when nM ≤ 2^(b−1) − 1: that is the bit width :func:`ring_bits`
returns, and a configuration needing more than 32 bits is refused (:class:`OverflowRefused`)
before anything is masked.

Rounding randomness is not cryptographic: the caller passes a ``numpy.random.Generator`` seeded
from its run seed, which makes the aggregate reproducible bit for bit (the masks cancel exactly).
"""

from __future__ import annotations

import math
import operator
from dataclasses import dataclass

import numpy as np

from . import parallel
from .errors import OverflowRefused

MAX_RING_BITS = 32
# Elements per step: the six work buffers (≈ 1.2 MiB) stay in a core's L2. Measured on the 2-core
# dev VM at d = 11.5M: 32–64 Ki elements 2.4× faster than 1 Mi, 8 Ki slower again (call overhead).
_CHUNK = 1 << 15
# Values per rounding stream above which a vector is split into independent blocks (threads share them).
BLOCK = 1 << 18


def integer(value: object, name: str) -> int:
    """``value`` as a Python int — numpy integers included, bools and floats not (TypeError naming ``name``)."""
    if not isinstance(value, bool):
        try:
            return operator.index(value)
        except TypeError:
            pass
    raise TypeError(f"{name} must be an integer, got {value!r} ({type(value).__name__})")


def ring_bits(n_clients: int, max_abs: int) -> int:
    """Smallest b such that any sum of ``n_clients`` integers in [−max_abs, max_abs] survives mod 2^b.

    Integrators adding their own integers (e.g. discrete noise with a tail bound) call this with
    their per-client bound. Raises :class:`OverflowRefused` when b would exceed 32, naming the
    largest cohort that fits at this bound.
    """
    n_clients, max_abs = integer(n_clients, "n_clients"), integer(max_abs, "max_abs")
    if n_clients < 1:
        raise ValueError(f"n_clients must be >= 1, got {n_clients}")
    if max_abs < 0:
        raise ValueError(f"max_abs must be >= 0, got {max_abs}")
    bits = max(1, (n_clients * max_abs).bit_length() + 1)  # n·M ≤ 2^(b−1) − 1
    if bits > MAX_RING_BITS:
        raise OverflowRefused(
            f"a sum of {n_clients} values of magnitude up to {max_abs} needs {bits} bits; the ring has at most "
            f"{MAX_RING_BITS}: the largest safe cohort at this bound is {largest_cohort(max_abs):,} clients "
            "(lower the scale or the clip, or split the cohort)"
        )
    return bits


def largest_cohort(max_abs: int, bits: int = MAX_RING_BITS) -> int:
    """The most clients whose sum of values in [−max_abs, max_abs] cannot wrap Z_{2^bits}:
    ⌊(2^(bits−1) − 1) / max_abs⌋. (At bound 0 every cohort fits; ``max_abs`` must be ≥ 1 here.)"""
    max_abs, bits = integer(max_abs, "max_abs"), integer(bits, "bits")
    if not 1 <= bits <= MAX_RING_BITS:
        raise ValueError(f"bits must be in [1, {MAX_RING_BITS}], got {bits}")
    if max_abs < 1:
        raise ValueError(f"max_abs must be >= 1 for a cohort limit, got {max_abs}")
    return ((1 << (bits - 1)) - 1) // max_abs


@dataclass(frozen=True)
class Quantizer:
    """Maps float vectors into Z_{2^bits} and ring sums of up to ``n_clients`` vectors back.

    ``clip``: values are clipped to [−clip, clip]. ``scale``: ring units per 1.0. The bit width is
    derived (:attr:`bits`); constructing a quantizer whose sum could wrap raises OverflowRefused.
    Use :meth:`for_cohort` to get the finest scale that fits.
    """

    clip: float
    scale: float
    n_clients: int

    def __post_init__(self) -> None:
        object.__setattr__(self, "n_clients", integer(self.n_clients, "n_clients"))  # numpy integers too
        if not (math.isfinite(self.clip) and self.clip > 0):
            raise ValueError(f"clip must be a positive finite number, got {self.clip}")
        if not (math.isfinite(self.scale) and self.scale > 0):
            raise ValueError(f"scale must be a positive finite number, got {self.scale}")
        if not math.isfinite(self.clip * self.scale):  # max_abs would be infinite: no ring holds it
            raise OverflowRefused(
                f"clip {self.clip:g} × scale {self.scale:g} overflows float64: one value alone is beyond the "
                f"{MAX_RING_BITS}-bit ring (Quantizer.for_cohort picks the finest scale that fits a cohort)"
            )
        try:
            ring_bits(self.n_clients, self.max_abs)  # refuses an overflowing configuration now
        except OverflowRefused:
            needed = (self.n_clients * self.max_abs).bit_length() + 1
            largest = largest_cohort(self.max_abs)
            reach = (f"the largest safe cohort for this clip and scale is {largest:,}" if largest
                     else "no cohort fits: one value alone is beyond the ring")
            raise OverflowRefused(
                f"a sum over {self.n_clients:,} clients at clip {self.clip:g} and scale {self.scale:g} (values up to "
                f"{self.max_abs:,} ring units) needs {needed} bits, more than the ring's {MAX_RING_BITS}: {reach} "
                "(Quantizer.for_cohort picks the finest scale that fits a cohort)"
            ) from None

    @classmethod
    def for_cohort(cls, n_clients: int, clip: float, *, bits: int = MAX_RING_BITS) -> Quantizer:
        """The quantizer with the largest scale whose sum over ``n_clients`` fits ``bits`` bits."""
        n_clients, bits = integer(n_clients, "n_clients"), integer(bits, "bits")
        if not 1 <= bits <= MAX_RING_BITS:
            raise ValueError(f"bits must be in [1, {MAX_RING_BITS}], got {bits}")
        if not (math.isfinite(clip) and clip > 0):
            raise ValueError(f"clip must be a positive finite number, got {clip}")
        if n_clients < 1:
            raise ValueError(f"n_clients must be >= 1, got {n_clients}")
        max_abs = ((1 << (bits - 1)) - 1) // n_clients
        if max_abs < 1:
            raise OverflowRefused(
                f"{n_clients:,} clients cannot share a {bits}-bit ring at clip {clip:g}: the largest safe cohort is "
                f"{largest_cohort(1, bits):,}, and only at one ring unit per clip"
            )
        scale = max_abs / clip
        if not math.isfinite(scale):  # a subnormal clip: no float64 scale reaches the ring's bound
            raise ValueError(f"clip {clip:g} is too small: the scale that fills the ring ({max_abs:,} / clip) "
                             "overflows float64")
        while math.ceil(clip * scale) > max_abs:  # float rounding may push clip·scale just past
            scale = math.nextafter(scale, 0.0)
        return cls(clip=clip, scale=scale, n_clients=n_clients)

    @property
    def max_abs(self) -> int:
        """Largest magnitude of one quantized value: ⌈clip·scale⌉."""
        return math.ceil(self.clip * self.scale)

    @property
    def bits(self) -> int:
        return ring_bits(self.n_clients, self.max_abs)

    def to_ring(self, x: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """Clip, scale and stochastically round a 1-D numeric vector; returns uint32 values mod 2^bits.

        Accepts every real dtype numpy holds: float16/32/64, extended precision and signed or
        unsigned integers. Clipping happens in float64 (extended precision for longdouble input),
        never in the input's own precision: float32(0.1) is slightly above 0.1, and clipping in
        float32 would let it through above the range the ring was sized for. Booleans, complex
        numbers and non-numeric dtypes are refused (TypeError); NaN and ±inf are refused
        (ValueError naming the index).
        """
        out = parallel.zeros(np.size(x))
        self.quantize_into(out, x, rng)
        return out

    def quantize_into(self, out: np.ndarray, x: np.ndarray, rng: np.random.Generator, *, weight: float = 1.0) -> int:
        """:meth:`to_ring` of ``weight·x`` (product and clip in float64) written into ``out`` (a uint32
        vector of x's length); returns how many values lay beyond the clip (a finite x whose
        weighted value overflows float64 is one of them: clipped with its sign, not refused).

        Up to ``BLOCK`` values round with draws from ``rng`` itself. A longer vector is cut into
        blocks of ``BLOCK`` values, each rounded with its own generator spawned from one draw of
        ``rng``, and the blocks are shared among threads (:mod:`.parallel`): the result depends on
        ``rng`` alone, never on the number of threads."""
        x = np.asarray(x)
        if x.ndim != 1:
            raise TypeError(f"to_ring takes a 1-D vector, got shape {x.shape}")
        _check_real_dtype(x.dtype)
        if not isinstance(rng, np.random.Generator):
            raise TypeError("to_ring needs a numpy.random.Generator (seed it from the run seed)")
        if out.dtype != np.uint32 or out.shape != x.shape:
            raise ValueError(f"out must be a uint32 vector of {x.size} values")
        if not math.isfinite(weight):
            raise ValueError(f"weight must be a finite number, got {weight}")
        if x.size <= BLOCK:
            return self._quantize_range(out, x, rng, weight, 0, x.size)
        streams = np.random.SeedSequence(rng.integers(0, 1 << 63, size=4).tolist()).spawn(-(-x.size // BLOCK))

        def job(lo: int, hi: int) -> int:  # whole blocks, each with its own generator
            return sum(self._quantize_range(out, x, np.random.Generator(np.random.PCG64(streams[at // BLOCK])),
                                            weight, at, min(at + BLOCK, hi)) for at in range(lo, hi, BLOCK))

        return sum(parallel.run_all([lambda lo=lo, hi=hi: job(lo, hi) for lo, hi in parallel.ranges(x.size, BLOCK)]))

    def _quantize_range(self, out: np.ndarray, x: np.ndarray, rng: np.random.Generator, weight: float,
                        lo: int, hi: int) -> int:
        """The rounding of ``x[lo:hi]`` into ``out[lo:hi]``, chunk by chunk; returns the clipped count."""
        low = (1 << self.bits) - 1
        clip, scale, clipped = self.clip, self.scale, 0
        extended = np.issubdtype(x.dtype, np.floating) and x.dtype.itemsize > 8
        # float64 work buffers, preallocated and small enough to stay in cache: clip·scale reaches
        # 2^31 / n, beyond float32's 24-bit mantissa, and the fractional part decides the rounding.
        m = min(_CHUNK, hi - lo)
        value, floor, noise = np.empty(m), np.empty(m), np.empty(m)
        above = np.empty(m, dtype=bool)
        for start in range(lo, hi, _CHUNK):
            part = x[start : min(start + _CHUNK, hi)]
            m = part.size
            v, f, u, b = value[:m], floor[:m], noise[:m], above[:m]
            if extended:  # weigh and clip where the input is exact; the result then rounds into [−clip, clip]
                _refuse_non_finite(part, start)
                with np.errstate(over="ignore"):  # an overflow to ±inf is clipped below
                    part = part * weight if weight != 1.0 else part
                clipped += int(np.count_nonzero(np.abs(part) > clip))
                part = np.clip(part, -clip, clip)
            # Exact for float16/32/64 and integers up to 32 bits; 64-bit integers round to nearest,
            # which is monotone, so a value beyond the clip stays beyond it.
            if weight == 1.0 or extended:
                np.copyto(v, part, casting="same_kind")
            else:
                with np.errstate(over="ignore"):  # the product in float64, not the input's precision; ±inf is clipped
                    np.multiply(part, weight, out=v, dtype=np.float64)
            lowest, highest = v.min(), v.max()  # NaN propagates through both
            if not (math.isfinite(lowest) and math.isfinite(highest)):
                # A finite input whose weighted value overflows float64 to ±inf lies beyond the
                # clip like any large value (np.clip maps ±inf to ±clip); only the input is judged.
                _refuse_non_finite(part, start)
            if lowest < -clip or highest > clip:  # most chunks of a clipped update need no clipping
                clipped += int(np.count_nonzero(v > clip)) + int(np.count_nonzero(v < -clip))
                np.clip(v, -clip, clip, out=v)
            # |v·scale| ≤ fl(clip·scale) ≤ max_abs: rounding is monotone and max_abs is an integer.
            v *= scale
            # Stochastic rounding: ⌊v⌋ + 1 with probability frac(v), else ⌊v⌋. The fraction v − ⌊v⌋
            # is exact in float64, so ⌊v⌋ + 1 only happens when v is not an integer: the result
            # never exceeds ⌈v⌉ (adding U[0,1) to v and flooring could round up to v + 1).
            np.floor(v, out=f)
            v -= f
            rng.random(out=u)
            np.less(u, v, out=b)
            f += b  # an integer in [−max_abs, max_abs], max_abs < 2^31: exact in float64 and in int32
            ring = out[start : start + m]
            np.copyto(ring.view(np.int32), f, casting="unsafe")  # two's complement: the value mod 2^32
            if low != 0xFFFFFFFF:
                ring &= np.uint32(low)
        return clipped

    def from_ring(self, total: np.ndarray, *, dtype: type = np.float64) -> np.ndarray:
        """Decode a ring sum of at most ``n_clients`` quantized vectors: float64 values, or
        ``dtype`` (float32: each value computed in float64, then rounded once)."""
        total = np.asarray(total)
        if total.ndim != 1 or total.dtype != np.uint32:
            raise TypeError(f"from_ring takes a 1-D uint32 ring vector, got {total.shape} {total.dtype}")
        bits = self.bits
        out = np.empty(total.size, dtype=dtype)
        for start in range(0, total.size, _CHUNK):
            part = total[start : start + _CHUNK]
            if bits == MAX_RING_BITS:
                signed = part.view(np.int32)  # the ring's upper half is the negatives: two's complement
            else:  # move bit b − 1 to the sign bit, then an arithmetic shift back sign-extends
                shift = MAX_RING_BITS - bits
                signed = np.left_shift(part, np.uint32(shift)).view(np.int32)
                np.right_shift(signed, shift, out=signed)
            np.divide(signed, self.scale, out=out[start : start + part.size], dtype=np.float64)
        return out


def _check_real_dtype(dtype: np.dtype) -> None:
    if dtype == np.bool_:
        raise TypeError("to_ring does not take booleans; cast them to the numbers you mean (e.g. .astype(np.uint8))")
    if not (np.issubdtype(dtype, np.floating) or np.issubdtype(dtype, np.integer)):
        raise TypeError(f"to_ring takes real numbers (float or integer dtypes), got dtype {dtype}")


def _refuse_non_finite(values: np.ndarray, offset: int) -> None:
    finite = np.isfinite(values)
    if not finite.all():
        bad = int(np.flatnonzero(~finite)[0])
        raise ValueError(f"to_ring input has a non-finite value at index {offset + bad}: {values[bad]}")
