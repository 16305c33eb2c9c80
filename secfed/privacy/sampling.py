"""Poisson sampling: every unit joins independently with probability q.

This is the sampling the amplification theorems behind Opacus' RDP accountant assume — for clients
in a round (DP-FedAvg) and for examples in a batch (DP-SGD). A Poisson cohort or batch may be empty
and its size varies; the mechanisms therefore normalise by the *expected* size q·N, never by the
realised one, and an empty round still releases (noise only) and is still accounted.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np


def _check_rate(rate: float) -> None:
    if not 0 < rate <= 1:
        raise ValueError(f"sampling rate must lie in (0, 1], got {rate}")


def poisson_subset(population: int, rate: float, rng: np.random.Generator) -> np.ndarray:
    """Indices in ``range(population)`` each kept independently with probability ``rate`` (sorted int64)."""
    _check_rate(rate)
    if population < 0:
        raise ValueError(f"population must be ≥ 0, got {population}")
    return np.flatnonzero(rng.random(population) < rate).astype(np.int64)


def poisson_batches(num_examples: int, rate: float, steps: int, rng: np.random.Generator) -> Iterator[np.ndarray]:
    """``steps`` independent Poisson batches over ``num_examples`` examples (some may be empty).

    With rate q = B/n and steps = round(1/q) per epoch this is Opacus' ``DPDataLoader`` semantics:
    batches of expected size B, each example used once per epoch in expectation.
    """
    _check_rate(rate)
    if steps < 0:
        raise ValueError(f"steps must be ≥ 0, got {steps}")
    for _ in range(steps):
        yield poisson_subset(num_examples, rate, rng)
