from __future__ import annotations

import io
import json

import pytest
import torch

from secfed.config import PrivacyConfig
from secfed.privacy.ledger import PrivacyLedger
from secfed.privacy.policy import resolve

RUN = dict(num_clients=10, clients_per_round=4, rounds=6, aggregation="unweighted", secagg=True, bn_stats="local")


def _ledger(**privacy) -> PrivacyLedger:
    return resolve(PrivacyConfig(**privacy), model_dim=2000, **RUN).ledger()


@pytest.mark.parametrize(
    "privacy",
    [dict(clip=1.0, noise_multiplier=1.0, sampling="poisson"), dict(clip=1.0, noise_multiplier=1.0, distributed=True)],
)
def test_resume_continues_the_accountant(privacy: dict) -> None:
    cohorts = [4, 3, 4, 0, 2, 4]
    straight = _ledger(**privacy)
    for n in cohorts:
        straight.record_round(n)
    first = _ledger(**privacy)
    for n in cohorts[:3]:
        first.record_round(n)
    buffer = io.BytesIO()  # what a checkpoint does: torch.save, loaded back with weights_only=True
    torch.save({"privacy": first.state_dict()}, buffer)
    buffer.seek(0)
    saved = torch.load(buffer, weights_only=True)["privacy"]
    json.dumps(saved)
    resumed = _ledger(**privacy)
    resumed.load_state_dict(saved)
    for n in cohorts[3:]:
        resumed.record_round(n)
    assert resumed.rounds == straight.rounds == 6
    assert resumed.epsilon() == straight.epsilon() > first.epsilon() > 0
    assert resumed.metrics()["epsilon"] == straight.epsilon()


def test_a_checkpoint_from_other_settings_is_refused() -> None:
    gaussian = _ledger(clip=1.0, noise_multiplier=1.0)
    gaussian.record_round(4)
    with pytest.raises(ValueError, match="skellam"):
        _ledger(clip=1.0, noise_multiplier=1.0, distributed=True).load_state_dict(gaussian.state_dict())
    with pytest.raises(ValueError, match="δ"):
        _ledger(clip=1.0, noise_multiplier=1.0, delta=1e-3).load_state_dict(gaussian.state_dict())


def test_distributed_rounds_cost_more_with_fewer_noise_shares() -> None:
    full, thin = _ledger(clip=1.0, noise_multiplier=1.0, distributed=True), _ledger(clip=1.0, noise_multiplier=1.0, distributed=True)
    full.record_round(4)
    thin.record_round(2)
    assert thin.epsilon() > full.epsilon()
