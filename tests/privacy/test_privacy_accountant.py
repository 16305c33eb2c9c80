from __future__ import annotations

import json
import math

import pytest
from opacus.accountants import RDPAccountant
from opacus.accountants.utils import get_noise_multiplier

from secfed.privacy.accountant import SampledGaussianAccountant, noise_for_target_epsilon

HISTORY = [(1.1, 0.1)] * 30 + [(2.0, 1.0)] * 3 + [(1.1, 0.1)] * 7  # Opacus merges runs of equal steps


def _ours(history) -> SampledGaussianAccountant:
    acc = SampledGaussianAccountant()
    for z, q in history:
        acc.step(z, q)
    return acc


def test_epsilon_equals_opacus_for_the_same_history() -> None:
    theirs = RDPAccountant()
    for z, q in HISTORY:
        theirs.step(noise_multiplier=z, sample_rate=q)
    ours = _ours(HISTORY)
    assert ours.steps == len(HISTORY)
    for delta in (1e-3, 1e-8):
        assert ours.epsilon(delta) == theirs.get_epsilon(delta=delta)


def test_state_round_trips_through_json_and_continues_identically() -> None:
    first, rest = HISTORY[:31], HISTORY[31:]
    interrupted = _ours(first)
    saved = json.loads(json.dumps(interrupted.state_dict()))
    resumed = SampledGaussianAccountant()
    resumed.load_state_dict(saved)
    for z, q in rest:
        resumed.step(z, q)
    straight = _ours(HISTORY)
    assert resumed.state_dict() == straight.state_dict()
    assert resumed.epsilon(1e-5) == straight.epsilon(1e-5)


def test_epsilon_grows_with_rounds_and_shrinks_with_noise() -> None:
    eps_by_rounds = [_ours([(1.0, 0.2)] * t).epsilon(1e-5) for t in (1, 10, 100)]
    assert eps_by_rounds == sorted(eps_by_rounds) and eps_by_rounds[0] < eps_by_rounds[-1]
    eps_by_noise = [_ours([(z, 1.0)] * 50).epsilon(1e-5) for z in (0.7, 1.0, 2.0)]
    assert eps_by_noise == sorted(eps_by_noise, reverse=True)
    assert _ours([]).epsilon(1e-5) == 0.0


def test_no_noise_means_no_privacy() -> None:
    assert math.isinf(_ours([(0.0, 0.5)]).epsilon(1e-5))


@pytest.mark.parametrize(
    "state, message",
    [
        ({"version": 1, "mechanism": "prv", "history": []}, "mechanism"),
        ({"version": 2, "mechanism": "rdp", "history": []}, "version"),
        ({"version": 1, "mechanism": "rdp"}, "history"),
        ({"version": 1, "mechanism": "rdp", "history": [[1.0, 0.1]]}, "entry 0"),
        ({"version": 1, "mechanism": "rdp", "history": [[1.0, 0.1, 0]]}, "positive integer"),
        ({"version": 1, "mechanism": "rdp", "history": [[1.0, 1.5, 3]]}, "sample rate"),
    ],
)
def test_malformed_state_is_refused(state: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        SampledGaussianAccountant().load_state_dict(state)


@pytest.mark.filterwarnings("ignore:Optimal order")
def test_calibration_is_opacus_own() -> None:
    z = noise_for_target_epsilon(10.0, 1e-5, 1.0, 20)
    assert z == get_noise_multiplier(target_epsilon=10.0, target_delta=1e-5, sample_rate=1.0, steps=20)


@pytest.mark.parametrize("q, rounds, target", [(0.1, 100, 4.0), (1.0, 20, 10.0)])
def test_calibration_hits_the_target(q: float, rounds: int, target: float) -> None:
    z = noise_for_target_epsilon(target, 1e-5, q, rounds)
    eps = _ours([(z, q)] * rounds).epsilon(1e-5)
    assert target - 0.02 <= eps <= target


def test_bad_arguments_are_refused() -> None:
    acc = SampledGaussianAccountant()
    with pytest.raises(ValueError, match="sample rate"):
        acc.step(1.0, 0.0)
    with pytest.raises(ValueError, match="noise multiplier"):
        acc.step(-1.0, 0.5)
    with pytest.raises(ValueError, match="δ"):
        acc.epsilon(1.0)
    with pytest.raises(ValueError, match="target ε"):
        noise_for_target_epsilon(0.0, 1e-5, 0.1, 10)
