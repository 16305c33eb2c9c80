from __future__ import annotations

import numpy as np
import pytest

from secfed.privacy.rotation import fwht, padded_size, random_signs, rotate, unrotate


@pytest.mark.parametrize("dim, padded", [(1, 1), (2, 2), (3, 4), (5, 8), (1024, 1024), (1025, 2048)])
def test_padded_size(dim: int, padded: int) -> None:
    assert padded_size(dim) == padded


def test_fwht_known_answer_is_the_normalised_sylvester_matrix() -> None:
    h2 = np.array([[1, 1], [1, -1]], dtype=np.float64)
    h8 = np.kron(np.kron(h2, h2), h2) / np.sqrt(8)
    x = np.arange(1.0, 9.0)
    assert np.allclose(fwht(x), h8 @ x)
    assert np.allclose(fwht(np.eye(8)[3]), h8[:, 3])


def test_fwht_is_orthonormal_and_its_own_inverse() -> None:
    x = np.random.default_rng(0).normal(size=4096)
    y = fwht(x)
    assert np.linalg.norm(y) == pytest.approx(np.linalg.norm(x), rel=1e-12)
    assert np.allclose(fwht(y), x)


def test_rotation_round_trip_with_padding_and_public_seed() -> None:
    x = np.random.default_rng(1).normal(size=1000)
    y = rotate(x, seed=42)
    assert y.shape == (1024,)
    assert np.linalg.norm(y) == pytest.approx(np.linalg.norm(x), rel=1e-12)
    assert np.allclose(unrotate(y, seed=42, dim=1000), x)
    assert not np.allclose(unrotate(y, seed=43, dim=1000), x)
    assert np.array_equal(random_signs(64, 9), random_signs(64, 9))
    assert set(np.unique(random_signs(64, 9))) == {-1.0, 1.0}


def test_rotation_spreads_a_spike_evenly() -> None:
    spike = np.zeros(1 << 12)
    spike[7] = 1.0
    y = rotate(spike, seed=3)
    assert np.allclose(np.abs(y), 1 / 64)  # every coordinate gets exactly 1/√d of the energy


def test_fwht_refuses_other_lengths() -> None:
    with pytest.raises(ValueError, match="power-of-two"):
        fwht(np.ones(6))
