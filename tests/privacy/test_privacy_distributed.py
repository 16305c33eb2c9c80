from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from secfed.privacy.distributed import (
    MAX_POISSON_MEAN,
    RingTooSmall,
    SkellamParams,
    _conditional_round,
    account_round,
    centred_lift,
    decode_sum,
    encode,
    noise_for_target_epsilon,
    rotation_seed,
    skellam_params,
    to_ring,
)
from secfed.privacy.skellam import SkellamAccountant

DIM, CLIENTS, CLIP = 1000, 5, 1.0


def _simulate_round(params: SkellamParams, updates: list[np.ndarray], seed: int, rng: np.random.Generator):
    """Every client encodes and maps into the ring; the (unmasked) ring sum is formed mod 2^b.

    Returns the decoded float sum and the exact integer sum before reduction (to detect wrap-around).
    """
    shares = [encode(u, params, rotation_seed=seed, rng=rng) for u in updates]
    modulus = 1 << params.ring_bits
    ring_sum = np.zeros(params.padded_dim, dtype=np.uint64)
    for share in shares:
        ring_sum = (ring_sum + to_ring(share, params.ring_bits).astype(np.uint64)) % np.uint64(modulus)
    return decode_sum(ring_sum, params, rotation_seed=seed), np.sum(shares, axis=0)


def _clipped(u: np.ndarray) -> np.ndarray:
    return u * min(1.0, CLIP / np.linalg.norm(u))


@pytest.mark.parametrize("ring_bits, rotate", [(32, True), (16, True), (16, False)])
def test_sum_of_encoded_updates_decodes_to_the_sum_with_the_intended_noise(ring_bits: int, rotate: bool) -> None:
    params = skellam_params(dim=DIM, clip=CLIP, noise_multiplier=0.5, ring_bits=ring_bits, contributors=CLIENTS, rotate=rotate)
    rng = np.random.default_rng(0)
    half = 2 ** (ring_bits - 1)
    errors = []
    for trial in range(24):
        # Aligned updates (the worst case for wrap-around), some beyond the clip norm.
        direction = rng.normal(size=DIM)
        updates = [direction * rng.uniform(0.2, 3.0) / np.linalg.norm(direction) for _ in range(CLIENTS)]
        decoded, exact = _simulate_round(params, updates, rotation_seed(11, trial), rng)
        assert np.all((exact >= -half) & (exact < half))  # no coordinate wrapped
        errors.append(decoded - sum(_clipped(u) for u in updates))
    error = np.concatenate(errors)
    target = params.sum_noise_std(CLIENTS) ** 2  # = (z·C)² = 0.25, plus a negligible rounding term
    assert params.sum_noise_std(CLIENTS) == pytest.approx(0.5 * CLIP)
    assert error.var() == pytest.approx(target + params.quantisation_std(CLIENTS) ** 2, rel=0.04)  # 24k samples
    assert abs(error.mean()) < 5 * math.sqrt(target / error.size)


def test_modular_reduction_is_what_makes_the_lift_necessary() -> None:
    """At 16 bits the integer sums do leave [0, 2^b): decoding works only through the centred lift."""
    params = skellam_params(dim=DIM, clip=CLIP, noise_multiplier=0.5, ring_bits=16, contributors=CLIENTS)
    rng = np.random.default_rng(5)
    updates = [rng.normal(size=DIM) for _ in range(CLIENTS)]
    decoded, exact = _simulate_round(params, updates, 3, rng)
    assert np.any(exact < 0)
    assert np.abs(decoded - sum(_clipped(u) for u in updates)).max() < 6 * params.sum_noise_std(CLIENTS)


def test_wrap_around_bound_holds_empirically() -> None:
    """With a deliberately loose target (30 %), the observed rate of rounds with any wrap stays below it."""
    params = skellam_params(
        dim=64, clip=CLIP, noise_multiplier=0.3, ring_bits=12, contributors=4, max_wrap_probability=0.3
    )
    assert params.wrap_probability <= 0.3
    rng = np.random.default_rng(2)
    half = 2 ** (params.ring_bits - 1)
    wrapped = 0
    for trial in range(300):
        direction = rng.normal(size=64)
        updates = [direction / np.linalg.norm(direction)] * 4
        shares = [encode(u, params, rotation_seed=trial, rng=rng) for u in updates]
        exact = np.sum(shares, axis=0)
        wrapped += bool(np.any((exact < -half) | (exact >= half)))
    assert wrapped / 300 <= 0.3


def test_rounded_share_respects_the_accounted_sensitivity() -> None:
    params = skellam_params(dim=DIM, clip=CLIP, noise_multiplier=1.0, ring_bits=12, contributors=CLIENTS)
    rng = np.random.default_rng(3)
    y = rng.normal(size=params.padded_dim)
    y *= params.scale * CLIP / np.linalg.norm(y)
    for _ in range(20):
        rounded = _conditional_round(y, params.l2_sensitivity, rng)
        assert np.linalg.norm(rounded) <= params.l2_sensitivity
        assert np.abs(rounded).sum() <= params.l1_sensitivity
        assert np.all(np.abs(rounded - y) < 1)


def test_encode_clips_and_accepts_torch() -> None:
    params = skellam_params(dim=8, clip=1.0, noise_multiplier=1e-3, ring_bits=40, contributors=1)
    update = torch.arange(1.0, 9.0)
    share = encode(update, params, rotation_seed=1, rng=np.random.default_rng(0))
    decoded = decode_sum(to_ring(share, 40), params, rotation_seed=1)
    assert np.allclose(decoded, update.numpy() / np.linalg.norm(update.numpy()), atol=1e-2)
    with pytest.raises(ValueError, match="set up for 8"):
        encode(np.ones(9), params, rotation_seed=1, rng=np.random.default_rng(0))
    with pytest.raises(ValueError, match="NaN"):
        encode(np.full(8, np.nan), params, rotation_seed=1, rng=np.random.default_rng(0))


def test_ring_maps_known_answers() -> None:
    assert to_ring(np.array([-1, 0, 5, 256 + 3]), 8).tolist() == [255, 0, 5, 3]
    assert to_ring(np.array([-1]), 32).dtype == np.uint32
    assert centred_lift(np.array([255, 128, 127, 0]), 8).tolist() == [-1, -128, 127, 0]


def test_small_ring_is_refused_naming_the_bits_that_would_do() -> None:
    with pytest.raises(RingTooSmall, match="at least") as caught:
        skellam_params(dim=DIM, clip=CLIP, noise_multiplier=1.0, ring_bits=4, contributors=10)
    needed = caught.value.bits_needed
    assert needed is not None and needed > 4
    skellam_params(dim=DIM, clip=CLIP, noise_multiplier=1.0, ring_bits=needed, contributors=10)


def test_larger_cohorts_get_a_smaller_scale() -> None:
    fixed = skellam_params(dim=DIM, clip=CLIP, noise_multiplier=1.0, ring_bits=20, contributors=10)
    poisson = skellam_params(dim=DIM, clip=CLIP, noise_multiplier=1.0, ring_bits=20, contributors=10, max_contributors=100)
    assert poisson.scale < fixed.scale
    assert poisson.sum_noise_std(10) == pytest.approx(1.0) == fixed.sum_noise_std(10)


def test_accounting_counts_noise_shares() -> None:
    params = skellam_params(dim=DIM, clip=CLIP, noise_multiplier=1.0, ring_bits=32, contributors=CLIENTS)
    full, short, empty = SkellamAccountant(), SkellamAccountant(), SkellamAccountant()
    account_round(full, params, CLIENTS)
    account_round(short, params, CLIENTS - 2)
    account_round(empty, params, 0)
    assert empty.steps == 0 and empty.epsilon(1e-5) == 0.0
    assert short.epsilon(1e-5) > full.epsilon(1e-5) > 0


def test_target_epsilon_calibration() -> None:
    setup = dict(dim=DIM, clip=CLIP, ring_bits=16, contributors=CLIENTS)
    z = noise_for_target_epsilon(6.0, 1e-5, 30, **setup)

    def eps(noise: float) -> float:
        params = skellam_params(noise_multiplier=noise, **setup)
        acc = SkellamAccountant()
        for _ in range(30):
            account_round(acc, params, CLIENTS)
        return acc.epsilon(1e-5)

    assert 6.0 - 0.02 <= eps(z) <= 6.0
    assert eps(z * 0.98) > 6.0


def test_rotation_is_chosen_only_when_it_buys_resolution() -> None:
    roomy = skellam_params(dim=DIM, clip=CLIP, noise_multiplier=1.0, ring_bits=32, contributors=CLIENTS)
    assert not roomy.rotate and roomy.padded_dim == DIM  # the sampler cap binds: padding would buy nothing
    assert roomy.client_variance / 2 <= MAX_POISSON_MEAN * (1 + 1e-12)
    tight = skellam_params(dim=DIM, clip=CLIP, noise_multiplier=1.0, ring_bits=14, contributors=CLIENTS)
    unrotated = skellam_params(dim=DIM, clip=CLIP, noise_multiplier=1.0, ring_bits=14, contributors=CLIENTS, rotate=False)
    assert tight.rotate and tight.padded_dim == 1024 and tight.scale > unrotated.scale


def test_full_path_through_secure_aggregation_with_a_dropout() -> None:
    """encode → ring → secfed.protocols.simulate (masks, a client vanishing) → decode: the survivors'
    sum with exactly the survivors' noise shares, accounted as such."""
    from secfed.protocols import simulate

    n, dim, bits, z = 5, 1000, 20, 0.5
    params = skellam_params(dim=dim, clip=CLIP, noise_multiplier=z, ring_bits=bits, contributors=n)
    rng = np.random.default_rng(9)
    errors = []
    for trial in range(4):
        updates = [rng.normal(size=dim) * 0.05 for _ in range(n)]
        seed = rotation_seed(3, trial)
        shares = [to_ring(encode(u, params, rotation_seed=seed, rng=rng), bits) for u in updates]
        out = simulate(shares, ring_bits=bits, dropouts={4: "masked_input"}, round=trial)
        assert out.survivors == (0, 1, 2, 3)
        decoded = decode_sum(out.ring_total, params, rotation_seed=seed)
        errors.append(decoded - sum(_clipped(updates[i]) for i in out.survivors))
    error = np.concatenate(errors)
    assert error.var() == pytest.approx(params.sum_noise_std(4) ** 2, rel=0.08)
    assert params.sum_noise_std(4) ** 2 == pytest.approx(4 / 5 * z**2)
    four, five = SkellamAccountant(), SkellamAccountant()
    account_round(four, params, len(out.survivors))
    account_round(five, params, n)
    assert four.epsilon(1e-5) > five.epsilon(1e-5)


def test_colluders_subtract_their_shares_and_the_ledger_counts_only_the_rest() -> None:
    """The attack behind issue 20 item 5: a colluding client hands the server its encoding (noise share
    included); the server subtracts it. What noise is left is that of the other n − c shares, and that is
    what the ledger accounts — not the n shares the plan was stated for."""
    from secfed.config import PrivacyConfig
    from secfed.privacy.policy import resolve

    n = 5
    plan = resolve(PrivacyConfig(clip=CLIP, noise_multiplier=1.0, distributed=True), num_clients=10,
                   clients_per_round=n, rounds=1, aggregation="unweighted", secagg=True, bn_stats="local",
                   model_dim=DIM)
    params, rng = plan.skellam, np.random.default_rng(4)
    assert plan.colluders == 1
    residuals = []
    for trial in range(4):
        seed = rotation_seed(9, trial)
        updates = [rng.normal(size=DIM) * 0.05 for _ in range(n)]
        shares = [encode(u, params, rotation_seed=seed, rng=rng) for u in updates]
        total = to_ring(sum(shares), params.ring_bits)
        known = shares[0]  # the colluder's whole encoding, handed to the server
        honest_sum = decode_sum(to_ring(centred_lift(total, params.ring_bits) - known, params.ring_bits), params,
                                rotation_seed=seed)
        residuals.append(honest_sum - sum(_clipped(u) for u in updates[1:]))
    left = np.concatenate(residuals).var()
    assert left == pytest.approx(params.sum_noise_std(n - 1) ** 2, rel=0.1)
    ledger = plan.ledger()
    ledger.record_round(n)
    truth = SkellamAccountant()
    account_round(truth, params, n - 1)
    assert ledger.epsilon() == pytest.approx(truth.epsilon(plan.delta))


def test_collusion_bound_is_the_secure_channels() -> None:
    """The accounting's c is the corrupt bound secure aggregation's parameters are chosen for."""
    from secfed.federation.secure_channel import SecureChannel
    from secfed.privacy.distributed import collusion_bound
    from secfed.privacy.policy import CORRUPT_FRACTION

    channel = SecureChannel(run_seed=0, num_clients=40, clip=1.0, authenticated=True, graph="auto", design_dropout=0.1)
    for n in (2, 3, 4, 5, 9, 10, 17, 40):
        assert channel.params(n).corrupt_bound == collusion_bound(n, CORRUPT_FRACTION)
