from __future__ import annotations

import numpy as np
import pytest

from secfed.privacy.dpsgd import poisson_schedule
from secfed.privacy.sampling import poisson_batches, poisson_subset


def test_poisson_subset_rate_and_independence() -> None:
    rng = np.random.default_rng(0)
    picks = np.zeros((2000, 50), dtype=bool)
    for row in picks:
        row[poisson_subset(50, 0.2, rng)] = True
    assert picks.mean() == pytest.approx(0.2, abs=0.005)
    sizes = picks.sum(1)
    assert sizes.var() == pytest.approx(50 * 0.2 * 0.8, rel=0.1)  # binomial, not fixed-size
    assert abs(np.corrcoef(picks[:, 0], picks[:, 1])[0, 1]) < 0.06


def test_poisson_subset_is_reproducible_and_can_be_empty() -> None:
    a = poisson_subset(100, 0.3, np.random.default_rng(5))
    b = poisson_subset(100, 0.3, np.random.default_rng(5))
    assert np.array_equal(a, b) and np.all(np.diff(a) > 0)
    empties = sum(len(poisson_subset(3, 0.1, np.random.default_rng(i))) == 0 for i in range(200))
    assert empties > 100  # 0.9³ ≈ 73 %
    assert len(poisson_subset(10, 1.0, np.random.default_rng(0))) == 10


def test_poisson_batches_and_schedule() -> None:
    batches = list(poisson_batches(64, 0.25, 7, np.random.default_rng(1)))
    assert len(batches) == 7 and all(b.max(initial=0) < 64 for b in batches)
    assert poisson_schedule(100, 32) == (0.32, 3)
    assert poisson_schedule(10, 32) == (1.0, 1)
    with pytest.raises(ValueError, match="rate"):
        poisson_subset(10, 0.0, np.random.default_rng(0))
