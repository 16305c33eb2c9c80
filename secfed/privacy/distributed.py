"""Distributed DP under secure aggregation: the distributed Skellam mechanism
(Agarwal, Kairouz & Liu 2021), so that the server never sees a noise-free sum.

Client (before masking), for its float update x:

    1. clip      x ← x · min(1, C/‖x‖₂)                                  (‖x‖₂ ≤ C)
    2. rotate    y ← H·D·[x, 0…]  randomised Hadamard, public per-round seed  (‖y‖₂ = ‖x‖₂);
                 only when it buys resolution (small rings), see :func:`skellam_params`
    3. scale     y ← s·y
    4. round     conditional randomised rounding: stochastic rounding, redrawn until
                 ‖ỹ‖₂ ≤ B  (Kairouz, Liu & Steinke 2021) — B is the ℓ2 sensitivity, deterministically
    5. noise     ỹ + Sk(μ_c) per coordinate                              → int64 vector
    the caller maps it into Z_{2^b} (:func:`to_ring`) and masks it (``secfed.protocols.simulate``
    takes such uint32 ring vectors as they are, with ``ring_bits=b``).

Server, for the unmasked ring sum u = Σ_k (ỹ_k + noise_k) mod 2^b:

    centred lift of u into [−2^{b−1}, 2^{b−1})  (modular clipping), ÷ s, inverse rotation, drop the
    padding → an estimate of Σ_k x_k carrying Gaussian-like noise of variance n·μ_c/s² per coordinate.
    The caller divides by the fixed denominator (the planned cohort size), never by the head count.

Privacy. The sum of n independent Sk(μ_c) is exactly Sk(n·μ_c), so the released integer sum is one
Skellam mechanism with ℓ2 sensitivity B and ℓ1 sensitivity min(√d·B, B²) (an integer vector's ℓ1
norm is at most its squared ℓ2 norm), accounted by :class:`~secfed.privacy.skellam.SkellamAccountant`.
Adjacency is zero-out: one client's clipped update replaced by zero, the client still present and
still adding its noise share. Rounds compose without any amplification by sampling (valid for fixed
K-of-N and for Poisson selection alike, just conservative). The accounted noise is that of the clients
whose input actually reached the sum, less the shares of the c clients that may collude with the
server (:func:`honest_shares`); a target ε is calibrated for the fewest honest shares any released sum
can hold (:func:`fewest_honest_shares`), so dropouts and colluders never push ε past it. Modular
reduction, lifting and unrotation are post-processing.

Wrap-around (a coordinate of the integer sum leaving the ring) only costs accuracy, never privacy.
:func:`skellam_params` picks the largest scale s whose wrap-around probability, bounded rigorously
(Hoeffding for the rotated signal, a Chernoff bound with the Skellam moment generating function for
the noise, |rounding error| < 1 per client and coordinate, union over coordinates), stays below a
target — capped where numpy's Poisson sampler would lose accuracy — and refuses a ring too small.

Randomness. The rotation seed is public by design. Rounding and noise are drawn from the numpy
Generator the caller passes: secfed passes one from the client's
:class:`~secfed.privacy.noise.NoiseSource` (AES-CTR keyed with fresh OS entropy for each client and
round, in-process and on Flower alike), so nothing in the run directory, the run seed included,
regenerates it. Only `privacy.reproducible_noise` keys it from the run seed, and such a run says it
is NOT PRIVATE.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from secfed.privacy.rotation import padded_size, rotate, unrotate
from secfed.privacy.skellam import SkellamAccountant, skellam_noise
from secfed.seeding import derive_seed

ROUNDING_BETA = math.exp(-0.5)  # conditional-rounding failure rate used by Kairouz et al.; affects only retries
MAX_ROUNDING_TRIES = 1000
MAX_RING_BITS = 62  # int64 arithmetic holds the centred lift up to here
# numpy's Poisson sampler loses accuracy for huge means (its variance is measurably off from ~1e12 on,
# by 40 % at 1e16). Cap each Poisson mean here; beyond it a larger scale buys nothing anyway, because
# the privacy noise (std ≳ 10⁵ integer units there) already dwarfs the rounding error (std ≤ 1/2 per client).
MAX_POISSON_MEAN = 2.0**32
_BISECTION_STEPS = 80


class RingTooSmall(ValueError):
    """The ring Z_{2^b} cannot hold the noisy integer sum at the requested parameters."""

    def __init__(self, message: str, bits_needed: int | None) -> None:
        self.bits_needed = bits_needed
        super().__init__(message)


def rotation_seed(run_seed: int, round_index: int) -> int:
    """The public seed of round ``round_index``'s rotation (the same for every client and the server)."""
    return derive_seed(run_seed, "dp-distributed/rotation", round_index)


def rounded_norm_bound(norm: float, dim: int, beta: float = ROUNDING_BETA) -> float:
    """B: the ℓ2 norm that conditional randomised rounding of a vector of norm ≤ ``norm`` never exceeds.

    Stochastic rounding moves each coordinate by less than 1, so ‖x̃‖ ≤ ‖x‖ + √d always; and with
    probability ≥ 1 − β, ‖x̃‖² ≤ ‖x‖² + d/4 + √(2·ln(1/β))·(‖x‖ + √d/2) (Kairouz, Liu & Steinke 2021).
    The rounding loop enforces B by rejection, so B holds deterministically; β only sets how often a
    draw is rejected.
    """
    if not 0 < beta < 1:
        raise ValueError(f"rounding β must lie in (0, 1), got {beta}")
    root_d = math.sqrt(dim)
    squared = norm**2 + dim / 4 + math.sqrt(2 * math.log(1 / beta)) * (norm + root_d / 2)
    return min(norm + root_d, math.sqrt(squared))


@dataclass(frozen=True)
class SkellamParams:
    """Everything client and server agree on for one run of the distributed Skellam mechanism."""

    dim: int  # length of the float update
    padded_dim: int  # length of the integer vector (a power of two when rotating)
    rotate: bool
    clip: float  # C: ℓ2 bound of a client's float update
    noise_multiplier: float  # z: noise std on the float sum of the planned cohort is z·C
    ring_bits: int  # b: the sum lives in Z_{2^b}
    scale: float  # s: float → integer units
    contributors: int  # n: planned noise shares per round (the fixed denominator)
    max_contributors: int  # most inputs a round's sum can hold (wrap-around is bounded for this many)
    client_variance: float  # μ_c: each client's per-coordinate Skellam variance (integer units)
    l2_sensitivity: float  # Δ2 = B: ℓ2 norm bound of a rounded scaled update (integer units)
    l1_sensitivity: float  # Δ1 = min(√d·B, B²)
    wrap_probability: float  # bound on P(any coordinate wraps) in one round at max_contributors

    def central_variance(self, contributors: int) -> float:
        """Per-coordinate Skellam variance of a sum holding ``contributors`` noise shares (integer units)."""
        return contributors * self.client_variance

    def sum_noise_std(self, contributors: int) -> float:
        """Std of the privacy noise per coordinate of the decoded float sum (z·C at the planned cohort)."""
        return math.sqrt(self.central_variance(contributors)) / self.scale

    def quantisation_std(self, contributors: int) -> float:
        """Upper bound on the std of the rounding error per coordinate of the decoded float sum."""
        return math.sqrt(contributors / 4) / self.scale

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _chernoff_log_tail(a: float, subgaussian_var: float, skellam_var: float) -> float:
    """log P(S + N ≥ a) ≤ min_t [v·t²/2 + μ·(cosh t − 1) − a·t], S sub-Gaussian(v), N ~ Sk(μ) independent."""
    if a <= 0:
        return 0.0
    v, mu = subgaussian_var, skellam_var
    hi = math.inf
    if v > 0:
        hi = a / v
    if mu > 0:
        hi = min(hi, math.asinh(a / mu))
    if not math.isfinite(hi):  # no randomness at all and a > 0: the event is impossible
        return -math.inf
    lo = 0.0
    for _ in range(_BISECTION_STEPS):  # root of the increasing derivative v·t + μ·sinh t − a
        t = (lo + hi) / 2
        if v * t + mu * math.sinh(t) < a:
            lo = t
        else:
            hi = t
    t = (lo + hi) / 2
    return v * t * t / 2 + mu * (math.cosh(t) - 1) - a * t


def _log_wrap_probability(
    scale: float, *, dim: int, padded_dim: int, rotate: bool, clip: float, noise_multiplier: float,
    ring_bits: int, contributors: int, max_contributors: int,
) -> float:
    """log of a bound on P(some coordinate of one round's integer sum leaves [−2^{b−1}, 2^{b−1}))."""
    margin = 2.0 ** (ring_bits - 1) - 1 - max_contributors  # each client's rounding error is < 1
    noise_var = max_contributors * (scale * noise_multiplier * clip) ** 2 / contributors
    signal_bound = scale * max_contributors * clip  # ‖Σ_k s·x_k‖₂ ≤ s·n·C
    if rotate:
        # (H·D·u)_j is a Rademacher sum with weights |u_i|/√d: sub-Gaussian, variance proxy ‖u‖²/d.
        log_tail = _chernoff_log_tail(margin, signal_bound**2 / padded_dim, noise_var)
    else:
        log_tail = _chernoff_log_tail(margin - signal_bound, 0.0, noise_var)
    return math.log(2 * padded_dim) + log_tail


def _choose_scale(max_wrap_probability: float, **shape: Any) -> float:
    """The largest scale whose wrap-around bound is ≤ the target (the bound grows with the scale),
    capped where a client's Poisson means would exceed :data:`MAX_POISSON_MEAN`; 0.0 if none fits."""
    target = math.log(max_wrap_probability)
    lo, hi = math.log(1e-12), math.log(2.0 ** (shape["ring_bits"] + 1) / shape["clip"])
    if _log_wrap_probability(math.exp(lo), **shape) > target:
        return 0.0
    for _ in range(_BISECTION_STEPS):
        mid = (lo + hi) / 2
        if _log_wrap_probability(math.exp(mid), **shape) <= target:
            lo = mid
        else:
            hi = mid
    # μ_c / 2 = (s·z·C)² / (2n) ≤ MAX_POISSON_MEAN
    sampler_cap = math.sqrt(2 * MAX_POISSON_MEAN * shape["contributors"]) / (shape["noise_multiplier"] * shape["clip"])
    return min(math.exp(lo), sampler_cap)


def skellam_params(
    *,
    dim: int,
    clip: float,
    noise_multiplier: float,
    ring_bits: int,
    contributors: int,
    max_contributors: int | None = None,
    rotate: bool | None = None,
    max_wrap_probability: float = 1e-9,
) -> SkellamParams:
    """Choose the scale s for a ring of ``ring_bits`` bits and derive the per-client noise and sensitivities.

    ``contributors`` is the planned number of noise shares per round (K, or the expected Poisson
    cohort q·N); each client adds μ_c = (s·z·C)²/n so the planned sum carries noise std z·C in float
    units. ``max_contributors`` (default: ``contributors``) is the largest cohort a round can have —
    N under Poisson sampling — and the wrap-around bound holds for it.

    ``rotate=None`` rotates only when that buys a larger scale: in a roomy ring (32 bits) the scale is
    capped by the noise sampler either way, and rotating would only pad the upload to a power of two
    and cost two Hadamard transforms.

    Raises :class:`RingTooSmall` (naming the bits that would do) when the ring cannot hold the sum
    with wrap-around probability ≤ ``max_wrap_probability``, or when it could only by making the
    rounding error larger than the privacy noise.
    """
    if rotate is None:
        rotated = skellam_params(
            dim=dim, clip=clip, noise_multiplier=noise_multiplier, ring_bits=ring_bits, contributors=contributors,
            max_contributors=max_contributors, rotate=True, max_wrap_probability=max_wrap_probability,
        )
        try:
            plain = skellam_params(
                dim=dim, clip=clip, noise_multiplier=noise_multiplier, ring_bits=ring_bits, contributors=contributors,
                max_contributors=max_contributors, rotate=False, max_wrap_probability=max_wrap_probability,
            )
        except RingTooSmall:
            return rotated
        return rotated if rotated.scale > plain.scale * (1 + 1e-9) else plain
    max_contributors = contributors if max_contributors is None else max_contributors
    _check_skellam_inputs(dim, clip, noise_multiplier, ring_bits, contributors, max_contributors, max_wrap_probability)
    padded = padded_size(dim) if rotate else dim
    shape = dict(
        dim=dim, padded_dim=padded, rotate=rotate, clip=clip, noise_multiplier=noise_multiplier,
        contributors=contributors, max_contributors=max_contributors,
    )
    problem = _ring_problem(ring_bits, max_wrap_probability, shape)
    if problem:
        needed = next(
            (b for b in range(ring_bits + 1, MAX_RING_BITS + 1) if not _ring_problem(b, max_wrap_probability, shape)),
            None,
        )
        hint = f"; at least {needed} bits would" if needed else ""
        raise RingTooSmall(f"a {ring_bits}-bit ring cannot hold the noisy sum of {max_contributors} clients: {problem}{hint}", needed)
    scale = _choose_scale(max_wrap_probability, ring_bits=ring_bits, **shape)
    client_variance = (scale * noise_multiplier * clip) ** 2 / contributors
    l2 = rounded_norm_bound(scale * clip, padded)
    return SkellamParams(
        dim=dim,
        padded_dim=padded,
        rotate=rotate,
        clip=clip,
        noise_multiplier=noise_multiplier,
        ring_bits=ring_bits,
        scale=scale,
        contributors=contributors,
        max_contributors=max_contributors,
        client_variance=client_variance,
        l2_sensitivity=l2,
        l1_sensitivity=min(math.sqrt(padded) * l2, l2**2),
        wrap_probability=math.exp(_log_wrap_probability(scale, ring_bits=ring_bits, **shape)),
    )


def _check_skellam_inputs(dim: int, clip: float, noise_multiplier: float, ring_bits: int, contributors: int,
                          max_contributors: int, max_wrap_probability: float) -> None:
    """ValueError naming the first input of :func:`skellam_params` outside its domain."""
    if dim < 1:
        raise ValueError(f"dimension must be ≥ 1, got {dim}")
    if not (math.isfinite(clip) and clip > 0):
        raise ValueError(f"clip norm must be a positive finite number, got {clip}")
    if not (math.isfinite(noise_multiplier) and noise_multiplier > 0):
        raise ValueError(f"noise multiplier must be a positive finite number, got {noise_multiplier}")
    if contributors < 1:
        raise ValueError(f"contributors must be ≥ 1, got {contributors}")
    if max_contributors < contributors:
        raise ValueError(f"max_contributors ({max_contributors}) < contributors ({contributors})")
    if not 0 < max_wrap_probability < 1:
        raise ValueError(f"max wrap-around probability must lie in (0, 1), got {max_wrap_probability}")
    if not 2 <= ring_bits <= MAX_RING_BITS:
        raise ValueError(f"ring bits must lie in [2, {MAX_RING_BITS}], got {ring_bits}")


def _ring_problem(ring_bits: int, max_wrap_probability: float, shape: dict[str, Any]) -> str | None:
    """Why ``ring_bits`` will not do (None if it will)."""
    if 2.0 ** (ring_bits - 1) - 1 <= shape["max_contributors"]:
        return "no room even for the rounding errors"
    scale = _choose_scale(max_wrap_probability, ring_bits=ring_bits, **shape)
    privacy_var = (scale * shape["noise_multiplier"] * shape["clip"]) ** 2
    if scale == 0.0 or shape["contributors"] / 4 > privacy_var:
        return "the rounding error would exceed the privacy noise"
    return None


def _clip_float64(update: np.ndarray, clip: float) -> np.ndarray:
    x = np.asarray(update, dtype=np.float64).reshape(-1)
    norm = float(np.linalg.norm(x))
    if not math.isfinite(norm):
        raise ValueError("update contains NaN or infinite values")
    return x * (clip / norm) if norm > clip else x.copy()


def _conditional_round(y: np.ndarray, bound: float, rng: np.random.Generator) -> np.ndarray:
    """Unbiased stochastic rounding to integers, redrawn until the ℓ2 norm is ≤ ``bound``."""
    floor = np.floor(y)
    frac = y - floor
    base = floor.astype(np.int64)
    for _ in range(MAX_ROUNDING_TRIES):
        rounded = base + (rng.random(y.shape[0]) < frac)
        if float(np.linalg.norm(rounded.astype(np.float64))) <= bound:
            return rounded
    raise RuntimeError(f"conditional rounding found no draw within norm {bound} in {MAX_ROUNDING_TRIES} tries")


def encode(update: np.ndarray, params: SkellamParams, *, rotation_seed: int, rng: np.random.Generator) -> np.ndarray:
    """A client's share: clip → rotate → scale → conditional rounding → + Sk(μ_c); int64 of ``padded_dim``.

    ``update`` is the float update (numpy, or a CPU torch tensor) of length ``params.dim``. ``rng``
    draws the rounding and the noise and must be unpredictable to the server (module docstring).
    """
    size = int(np.asarray(update).size)
    if size != params.dim:
        raise ValueError(f"update has {size} values, the mechanism was set up for {params.dim}")
    x = _clip_float64(update, params.clip)
    y = rotate(x, rotation_seed) if params.rotate else x
    rounded = _conditional_round(params.scale * y, params.l2_sensitivity, rng)
    return rounded + skellam_noise(params.padded_dim, params.client_variance, rng)


def to_ring(values: np.ndarray, ring_bits: int) -> np.ndarray:
    """Integers → their residues in Z_{2^b} (uint32 for b ≤ 32, else uint64); negative values wrap."""
    if not 1 <= ring_bits <= MAX_RING_BITS:
        raise ValueError(f"ring bits must lie in [1, {MAX_RING_BITS}], got {ring_bits}")
    residues = np.asarray(values, dtype=np.int64) & np.int64((1 << ring_bits) - 1)
    return residues.astype(np.uint32 if ring_bits <= 32 else np.uint64)


def centred_lift(ring_sum: np.ndarray, ring_bits: int) -> np.ndarray:
    """Residues mod 2^b → the representatives in [−2^{b−1}, 2^{b−1}) (int64)."""
    modulus = 1 << ring_bits
    values = np.asarray(ring_sum).astype(np.int64) & np.int64(modulus - 1)
    values[values >= modulus // 2] -= modulus
    return values


def decode_sum(ring_sum: np.ndarray, params: SkellamParams, *, rotation_seed: int) -> np.ndarray:
    """The server's estimate (float64, length ``params.dim``) of Σ_k clip(x_k), from the unmasked ring sum."""
    ring_sum = np.asarray(ring_sum)
    if ring_sum.shape != (params.padded_dim,):
        raise ValueError(f"ring sum has shape {ring_sum.shape}, expected ({params.padded_dim},)")
    y = centred_lift(ring_sum, params.ring_bits).astype(np.float64) / params.scale
    return unrotate(y, rotation_seed, params.dim) if params.rotate else y


def account_round(accountant: SkellamAccountant, params: SkellamParams, contributors: int) -> None:
    """Record one round whose sum held ``contributors`` noise shares (none: nothing was released about anyone)."""
    if contributors < 0:
        raise ValueError(f"contributors must be ≥ 0, got {contributors}")
    if contributors == 0:
        return
    accountant.step(
        variance=params.central_variance(contributors),
        l2_sensitivity=params.l2_sensitivity,
        l1_sensitivity=params.l1_sensitivity,
    )


def collusion_bound(session: int, corrupt_fraction: float) -> int:
    """c = ⌊γ·n⌋: the clients of a secure-aggregation session of n that may collude with the server —
    the bound :func:`secfed.protocols.choose_params` dimensions the protocol for (``corrupt_bound``).
    Colluders can hand the server their noise shares, so those shares protect nobody."""
    if session < 0 or not 0 <= corrupt_fraction < 1:
        raise ValueError(f"need session ≥ 0 and corrupt fraction in [0, 1), got {session}, {corrupt_fraction}")
    return math.floor(corrupt_fraction * session)


def fewest_honest_shares(max_session: int, *, colluders: int, corrupt_fraction: float, authenticated: bool,
                         min_cohort: int = 2) -> int:
    """The fewest honest noise shares any released sum can hold, whatever the dropouts.

    A round may (re)start a session with any n ∈ [``min_cohort``, ``max_session``] clients still online
    (a malicious server may claim the others dropped). A session of n releases a sum of at least
    ``min_cohort`` inputs and, in authenticated mode, of at least the ⌊(n + c_n)/2⌋ + 1 survivors whose
    signatures an unmask request needs (c_n = ⌊γ·n⌋, the bound the session's quorum is sized for).
    Unauthenticated, only ``min_cohort`` is assumed (a sparse graph's threshold may lie below c + 1).
    ``colluders`` is the absolute number of clients that may collude with the server: the server
    chooses whom it restarts a session with, so all of them may sit in the smallest one, and each
    hands its noise share over. Never below 1: the client whose privacy is measured is in the sum
    with its own share. (Before, the colluders of a session of n were taken as ⌊γ·n⌋ of *that*
    session — none in a restarted session of two, which then counted two honest shares although one
    of its two clients could be a colluder.)
    """
    if colluders < 0:
        raise ValueError(f"colluders must be ≥ 0, got {colluders}")
    fewest = min_cohort
    for n in range(min_cohort, max_session + 1):
        c = collusion_bound(n, corrupt_fraction)
        released = max(min_cohort, (n + c) // 2 + 1) if authenticated else min_cohort
        fewest = min(fewest, max(1, released - colluders))
    return fewest


def honest_shares(contributors: int, *, colluders: int, fewest: int) -> int:
    """Noise shares of a released sum of ``contributors`` inputs that the server cannot subtract: all
    but ``colluders``, and never fewer than the protocol's floor ``fewest`` (:func:`fewest_honest_shares`)."""
    return min(contributors, max(fewest, contributors - colluders))


def noise_for_target_epsilon(
    target_epsilon: float, delta: float, rounds: int, *, tolerance: float = 0.01, shares: int | None = None,
    **setup: Any,
) -> float:
    """The smallest noise multiplier z (to ``tolerance`` in ε) whose Skellam ε after ``rounds`` rounds,
    each releasing a sum of ``shares`` honest noise shares (default: the planned cohort), is
    ≤ ``target_epsilon``. ``setup``: the arguments of :func:`skellam_params` other than
    ``noise_multiplier``. Calibrating for the fewest shares a released sum can hold
    (:func:`fewest_honest_shares`) keeps ε ≤ target whoever drops out or colludes."""
    if not (math.isfinite(target_epsilon) and target_epsilon > 0):
        raise ValueError(f"target ε must be a positive finite number, got {target_epsilon}")
    if rounds < 1:
        raise ValueError(f"rounds must be ≥ 1, got {rounds}")

    skellam_params(noise_multiplier=1.0, **setup)  # a ring that cannot work at all is refused here, as such

    def epsilon(z: float) -> float:
        try:
            params = skellam_params(noise_multiplier=z, **setup)
        except RingTooSmall:  # this little noise drowns in rounding error: treat as too little noise
            return math.inf
        accountant = SkellamAccountant()
        for _ in range(rounds):
            account_round(accountant, params, params.contributors if shares is None else shares)
        return accountant.epsilon(delta)

    lo, hi = 0.0, 1.0
    eps_hi = epsilon(hi)
    while eps_hi > target_epsilon:
        lo, hi = hi, 2 * hi
        if hi > 1e6:
            raise ValueError(f"no noise multiplier up to 1e6 reaches ε = {target_epsilon}; the budget is too small")
        eps_hi = epsilon(hi)
    while target_epsilon - eps_hi > tolerance and hi - lo > 1e-6:
        mid = (lo + hi) / 2
        eps_mid = epsilon(mid)
        if eps_mid <= target_epsilon:
            hi, eps_hi = mid, eps_mid
        else:
            lo = mid
    return hi
