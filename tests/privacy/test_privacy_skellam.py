from __future__ import annotations

import json

import numpy as np
import pytest
from opacus.accountants import RDPAccountant
from scipy.special import logsumexp
from scipy.stats import skellam as scipy_skellam

from secfed.privacy.skellam import SKELLAM_ORDERS, SkellamAccountant, skellam_noise, skellam_rdp


def _exact_renyi(alpha: int, variance: float, shift: int) -> float:
    """D_α(Sk shifted by Δ ‖ Sk) computed from the pmf (1-D, so Δ1 = Δ2 = Δ)."""
    width = int(12 * np.sqrt(variance)) + 30 + shift  # the mass beyond 12σ is far below float precision
    k = np.arange(-width, width + 1)
    log_p = scipy_skellam.logpmf(k - shift, variance / 2, variance / 2)
    log_q = scipy_skellam.logpmf(k, variance / 2, variance / 2)
    assert np.all(np.isfinite(log_p) & np.isfinite(log_q))
    return float(logsumexp(alpha * log_p + (1 - alpha) * log_q) / (alpha - 1))


@pytest.mark.parametrize("variance", [2.0, 10.0, 50.0, 400.0])
@pytest.mark.parametrize("shift", [1, 3])
def test_rdp_bound_dominates_the_exact_divergence_and_is_tight_for_large_noise(variance: float, shift: int) -> None:
    orders = (2, 5, 20)
    bound = skellam_rdp(orders, variance=variance, l2_sensitivity=shift, l1_sensitivity=shift)
    exact = np.array([_exact_renyi(a, variance, shift) for a in orders])
    assert np.all(exact <= bound + 1e-12)
    if variance >= 400:
        assert np.all(bound <= exact * 1.02)


def test_rdp_tends_to_the_gaussian_mechanism() -> None:
    orders = np.array(SKELLAM_ORDERS)
    rdp = skellam_rdp(SKELLAM_ORDERS, variance=1e12, l2_sensitivity=1e6, l1_sensitivity=1e9)
    assert np.allclose(rdp, orders * 1e12 / (2 * 1e12), rtol=1e-5)


def test_noise_is_skellam_with_the_requested_variance() -> None:
    rng = np.random.default_rng(0)
    draws = skellam_noise(200_000, 3.0, rng)
    assert draws.dtype == np.int64
    assert draws.var() == pytest.approx(3.0, rel=0.02)
    assert abs(draws.mean()) < 0.02
    values, counts = np.unique(draws, return_counts=True)
    expected = scipy_skellam.pmf(values, 1.5, 1.5)
    common = expected > 1e-3
    assert np.allclose(counts[common] / draws.size, expected[common], atol=3e-3)


def test_sum_of_shares_has_the_summed_variance() -> None:
    rng = np.random.default_rng(1)
    total = sum(skellam_noise(100_000, 40.0, rng) for _ in range(5))
    assert total.var() == pytest.approx(200.0, rel=0.02)


def _accountant(steps: int, variance: float = 1e4, l2: float = 100.0) -> SkellamAccountant:
    acc = SkellamAccountant()
    for _ in range(steps):
        acc.step(variance=variance, l2_sensitivity=l2, l1_sensitivity=l2 * 10)
    return acc


@pytest.mark.filterwarnings("ignore:Optimal order")
def test_accountant_is_monotone_and_matches_gaussian_for_large_scale() -> None:
    eps = [_accountant(t).epsilon(1e-5) for t in (1, 10, 100)]
    assert eps == sorted(eps) and eps[0] > 0
    assert _accountant(10, variance=4e4).epsilon(1e-5) < _accountant(10).epsilon(1e-5)
    assert SkellamAccountant().epsilon(1e-5) == 0.0
    # z = σ/Δ = 1 at a huge scale: the Skellam ε is the Gaussian one at the same (integer) orders.
    big = _accountant(50, variance=1e16, l2=1e8)
    gaussian = RDPAccountant()
    gaussian.history = [(1.0, 1.0, 50)]
    assert big.epsilon(1e-5) == pytest.approx(gaussian.get_epsilon(1e-5, alphas=list(SKELLAM_ORDERS)), rel=1e-6)
    assert big.epsilon(1e-5) >= gaussian.get_epsilon(1e-5, alphas=list(SKELLAM_ORDERS))


def test_accountant_merges_equal_steps_and_round_trips() -> None:
    acc = _accountant(7)
    assert acc.history == [[1e4, 100.0, 1000.0, 7]] and acc.steps == 7
    resumed = SkellamAccountant()
    resumed.load_state_dict(json.loads(json.dumps(acc.state_dict())))
    for _ in range(3):
        acc.step(variance=1e4, l2_sensitivity=100.0, l1_sensitivity=1000.0)
        resumed.step(variance=1e4, l2_sensitivity=100.0, l1_sensitivity=1000.0)
    assert resumed.state_dict() == acc.state_dict() and resumed.epsilon(1e-6) == acc.epsilon(1e-6)
    with pytest.raises(ValueError, match="skellam-rdp"):
        resumed.load_state_dict({"version": 1, "mechanism": "rdp", "history": []})
    with pytest.raises(ValueError, match="entry 0"):
        resumed.load_state_dict({"version": 1, "mechanism": "skellam-rdp", "history": [[1.0, 1.0, 1.0, 0]]})
