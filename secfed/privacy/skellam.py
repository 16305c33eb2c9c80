"""The Skellam mechanism (Agarwal, Kairouz & Liu, NeurIPS 2021, arXiv:2110.04995): noise, RDP,
and an accountant that composes it over rounds.

Sk(μ) is the difference of two independent Poisson(μ/2) variables: integer-valued, mean 0,
variance μ, and closed under summation — n clients each adding Sk(μ_c) put exactly Sk(n·μ_c) into a
secure-aggregation sum. All quantities here are in the integer units of the ring (scaled updates).

RDP (paper's Theorem 3.5, the multi-dimensional Skellam mechanism; integer orders α > 1): a query
with ℓ2 sensitivity Δ2 and ℓ1 sensitivity Δ1, released with per-coordinate Sk(μ) noise, is
(α, ε(α))-RDP with

    ε(α) = α·Δ2² / (2μ) + min( ((2α − 1)·Δ2² + 6·Δ1) / (4μ²),  3·Δ1 / (2μ) ).

The first term is the Gaussian mechanism's; the min{…} is the price of discreteness and vanishes as
μ grows. We evaluate it at integer orders only, compose by adding RDP over rounds, and convert to
(ε, δ) with Opacus' conversion (Balle et al. 2020, Thm. 21) — the same one the Gaussian accountant
uses. No amplification by subsampling is claimed for it (see :mod:`secfed.privacy.distributed`).
"""

from __future__ import annotations

import math
import warnings
from typing import Any

import numpy as np

SKELLAM_ORDERS: tuple[int, ...] = tuple(range(2, 65)) + (72, 80, 96, 112, 128, 160, 192, 256, 384, 512)
STATE_VERSION = 1


def skellam_rdp(
    orders: tuple[int, ...] | list[int], *, variance: float, l2_sensitivity: float, l1_sensitivity: float
) -> np.ndarray:
    """ε(α) of one Skellam release at each integer order (formula in the module docstring)."""
    if not (variance > 0 and math.isfinite(variance)):
        raise ValueError(f"Skellam variance must be positive and finite, got {variance}")
    if l2_sensitivity < 0 or l1_sensitivity < 0:
        raise ValueError("sensitivities must be ≥ 0")
    alpha = np.asarray(orders, dtype=np.float64)
    if np.any(alpha < 2) or np.any(alpha != np.floor(alpha)):
        raise ValueError("the Skellam RDP bound is used at integer orders ≥ 2 only")
    d2sq, d1, mu = l2_sensitivity**2, l1_sensitivity, variance
    gaussian = alpha * d2sq / (2 * mu)
    discrete = np.minimum(((2 * alpha - 1) * d2sq + 6 * d1) / (4 * mu**2), 3 * d1 / (2 * mu))
    return gaussian + discrete


def rdp_to_epsilon(orders: tuple[int, ...] | list[int], rdp: np.ndarray, delta: float) -> float:
    """ε at ``delta`` from an RDP curve, by Opacus' conversion.

    Every order gives a valid bound; Opacus warns when the best one sits at the edge of the range,
    which here only means "a tighter bound may exist" — not worth alarming a user over.
    """
    if not (0 < delta < 1):
        raise ValueError(f"δ must lie in (0, 1), got {delta}")
    from opacus.accountants.analysis.rdp import get_privacy_spent  # on use: see secfed.privacy.accountant

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        eps, _ = get_privacy_spent(orders=list(orders), rdp=rdp, delta=delta)
    return float(eps)


def skellam_noise(size: int, variance: float, rng: np.random.Generator) -> np.ndarray:
    """``size`` independent Sk(variance) draws as int64: Poisson(variance/2) − Poisson(variance/2)."""
    if not (variance > 0 and math.isfinite(variance)):
        raise ValueError(f"Skellam variance must be positive and finite, got {variance}")
    lam = variance / 2
    return rng.poisson(lam, size).astype(np.int64) - rng.poisson(lam, size).astype(np.int64)


class SkellamAccountant:
    """RDP composition of Skellam releases; history entries ``[variance, Δ2, Δ1, count]``.

    Same shape as :class:`~secfed.privacy.accountant.SampledGaussianAccountant`: ``step`` per
    release, ``epsilon(delta)``, plain-data ``state_dict``/``load_state_dict``.
    """

    def __init__(self) -> None:
        self.history: list[list[float]] = []

    def step(self, *, variance: float, l2_sensitivity: float, l1_sensitivity: float) -> None:
        """Record one release with per-coordinate noise variance ``variance`` (integer units)."""
        skellam_rdp((2,), variance=variance, l2_sensitivity=l2_sensitivity, l1_sensitivity=l1_sensitivity)
        entry = [float(variance), float(l2_sensitivity), float(l1_sensitivity)]
        if self.history and self.history[-1][:3] == entry:
            self.history[-1][3] += 1
        else:
            self.history.append(entry + [1])

    @property
    def steps(self) -> int:
        return sum(int(e[3]) for e in self.history)

    def rdp(self, orders: tuple[int, ...] = SKELLAM_ORDERS) -> np.ndarray:
        total = np.zeros(len(orders))
        for variance, l2, l1, count in self.history:
            total += count * skellam_rdp(orders, variance=variance, l2_sensitivity=l2, l1_sensitivity=l1)
        return total

    def epsilon(self, delta: float) -> float:
        """ε at ``delta`` of everything recorded (0.0 before the first release)."""
        if not self.history:
            if not (0 < delta < 1):
                raise ValueError(f"δ must lie in (0, 1), got {delta}")
            return 0.0
        return rdp_to_epsilon(SKELLAM_ORDERS, self.rdp(), delta)

    def state_dict(self) -> dict[str, Any]:
        return {
            "version": STATE_VERSION,
            "mechanism": "skellam-rdp",
            "history": [[float(v), float(l2), float(l1), int(n)] for v, l2, l1, n in self.history],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if not isinstance(state, dict) or state.get("mechanism") != "skellam-rdp":
            raise ValueError("not a Skellam accountant state (mechanism must be 'skellam-rdp')")
        if state.get("version") != STATE_VERSION:
            raise ValueError(f"Skellam accountant state version {state.get('version')!r}, expected {STATE_VERSION}")
        history = state.get("history")
        if not isinstance(history, list):
            raise ValueError("Skellam accountant state has no 'history' list")
        entries: list[list[float]] = []
        for i, entry in enumerate(history):
            if not (isinstance(entry, (list, tuple)) and len(entry) == 4 and isinstance(entry[3], int) and entry[3] >= 1):
                raise ValueError(f"Skellam history entry {i} is not [variance, l2, l1, positive count]")
            variance, l2, l1 = float(entry[0]), float(entry[1]), float(entry[2])
            skellam_rdp((2,), variance=variance, l2_sensitivity=l2, l1_sensitivity=l1)
            entries.append([variance, l2, l1, int(entry[3])])
        self.history = entries
