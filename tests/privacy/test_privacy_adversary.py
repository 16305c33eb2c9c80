"""Whom each ε protects against: the server sees who uploads (no amplification by client sampling
holds against it) and, with central noise, the noise-free sum; under reproducible noise every ε says
NOT PRIVATE."""

from __future__ import annotations

import re

import pytest

from secfed.config import PrivacyConfig
from secfed.privacy import adversary
from secfed.privacy.accountant import gaussian_epsilon
from secfed.privacy.policy import PrivacyPlan, resolve

CLIENTS, ROUNDS = 20, 30


def _plan(secagg: bool = False, dfs: tuple[float, float] | None = None, **privacy: object) -> PrivacyPlan:
    extra = {"model_dim": 64, "quantiser_scale": 1e4} if secagg else {}
    return resolve(PrivacyConfig(**privacy), num_clients=CLIENTS, clients_per_round=0, rounds=ROUNDS,
                   aggregation="unweighted", secagg=secagg, bn_stats="local", dfs=dfs, **extra)


def _epsilon(plan: PrivacyPlan) -> float:
    ledger = plan.ledger()
    for _ in range(ROUNDS):
        ledger.record_round(5)
    return ledger.epsilon()


@pytest.mark.parametrize("mechanism", ["gaussian", "skellam"])
def test_the_server_epsilon_is_never_below_the_released_models_epsilon_under_poisson(mechanism: str) -> None:
    """The server sees every cohort: Poisson amplification must not reach the figure stated against it."""
    settings = dict(clip=1.0, noise_multiplier=1.0, sampling="poisson", sample_rate=0.25, delta=1e-3)
    plan = _plan(secagg=mechanism == "skellam", distributed=mechanism == "skellam", **settings)
    eps = _epsilon(plan)
    guarantee = adversary.client_level(plan, eps)
    assert guarantee.released_models == eps
    if mechanism == "gaussian":
        # the amplified ε is far below what the same noise gives without amplification ...
        assert eps < gaussian_epsilon(plan.accounting_noise_multiplier, 1.0, ROUNDS, plan.accounted_delta)
        assert guarantee.server is None and guarantee.server_note.startswith("none: central DP trusts the server")
        assert "amplified by Poisson client sampling" in guarantee.released_note
    else:  # ... and the Skellam ε claims no amplification, so it holds against the server as printed
        assert guarantee.server is not None and guarantee.server >= guarantee.released_models
        assert "no amplification" in guarantee.released_note
    statement = adversary.statement(plan.mechanism, plan.sampling)
    assert statement in plan.statements and "Against the server" in statement


def test_the_sentence_names_both_adversaries() -> None:
    plan = _plan(clip=1.0, noise_multiplier=1.0, sampling="poisson", sample_rate=0.25, delta=1e-3)
    line = adversary.client_level(plan, 1.5).sentence()
    assert "ε = 1.5 against those who see only the released models" in line
    assert "against the server: none: central DP trusts the server" in line
    assert not line.startswith("NOT PRIVATE")


def _states_epsilon(statement: str) -> bool:
    return bool(re.search(r"ε = \d", statement))


@pytest.mark.parametrize("settings", [
    {"dfs": (1.0, 4.0)},  # DFH's identity-level ε alone: it used to be printed without NOT PRIVATE
    {"dfs": (1.0, 4.0), "clip": 1.0, "noise_multiplier": 1.0, "delta": 1e-3},
    {"clip": 1.0, "noise_multiplier": 1.0, "sampling": "poisson", "sample_rate": 0.25, "delta": 1e-3},
])
def test_every_stated_epsilon_says_not_private_under_reproducible_noise(settings: dict) -> None:
    plan = _plan(reproducible_noise=True, **settings)
    assert any(s.startswith("NOT PRIVATE") for s in plan.statements)
    for statement in plan.statements:
        if _states_epsilon(statement):
            assert "NOT PRIVATE" in statement, statement
    guarantees = [adversary.dfs(plan.dfs, reproducible=True)]
    if plan.claims_epsilon:
        guarantees.append(adversary.client_level(plan, 1.0))
    for guarantee in filter(None, guarantees):
        assert guarantee.not_private and guarantee.sentence().startswith("NOT PRIVATE")
    secure = _plan(**settings)
    assert not any("NOT PRIVATE" in s for s in secure.statements)
