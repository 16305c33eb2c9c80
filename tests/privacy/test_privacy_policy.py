from __future__ import annotations

import dataclasses
import json
import re

import pytest
import torch
from opacus.accountants import RDPAccountant

from secfed.config import ConfigError, PrivacyConfig
from secfed.privacy.policy import FLAGS, default_delta, resolve

RUN = dict(num_clients=10, clients_per_round=4, rounds=5, aggregation="unweighted", secagg=True, bn_stats="local")


def _plan(run: dict | None = None, **privacy):
    return resolve(PrivacyConfig(**privacy), **{**RUN, **(run or {})})


def _opacus_eps(z: float, q: float, steps: int, delta: float) -> float:
    acc = RDPAccountant()
    for _ in range(steps):
        acc.step(noise_multiplier=z, sample_rate=q)
    return acc.get_epsilon(delta)


REFUSALS = [
    (dict(target_epsilon=2.0, delta=1e-5), {}, "--target-epsilon", "without clipping"),
    (dict(noise_multiplier=1.0), {}, "--noise-multiplier", "--clip"),
    (dict(clip=1.0, target_epsilon=2.0), {}, "--delta", "needs --delta"),
    (dict(clip=1.0, noise_multiplier=1.0, target_epsilon=2.0, delta=1e-5), {}, "--target-epsilon", "not both"),
    (dict(clip=1.0, noise_multiplier=1.0, sample_rate=0.4), {}, "--sample-rate", "Poisson"),
    (dict(clip=1.0, noise_multiplier=1.0), dict(aggregation="weighted"), "--aggregation", "aggregation weights"),
    (dict(clip=1.0, noise_multiplier=1.0), dict(bn_stats="shared"), "--bn-stats", "BatchNorm"),
    (dict(clip=1.0, noise_multiplier=1.0), dict(extra_uploads=("soft labels",)), "--algorithm", "soft labels"),
    (dict(clip=1.0, noise_multiplier=1.0, delta=0.2), {}, "--delta", "1/N"),
    (dict(clip=1.0, noise_multiplier=1.0, distributed=True), dict(secagg=False), "--dp-distributed", "secure aggregation"),
    (dict(noise_multiplier=1.0, distributed=True), {}, "--noise-multiplier", "--clip"),
    (dict(clip=1.0, distributed=True), {}, "--dp-distributed", "how much noise"),
    (dict(dp_beta=0.01, clip=1.0, distributed=True, noise_multiplier=1.0), {}, "--dp-beta", "give one"),
    (dict(dp_beta=0.01, clip=1.0, noise_multiplier=1.0), {}, "--dp-beta", "give one"),
    (dict(dp_beta_mode="double"), {}, "--dp-beta-mode", "is 0"),
    (dict(dp_beta=-0.1), {}, "--dp-beta", "≥ 0"),
    (dict(clip=0.0), {}, "--clip", "positive"),
    (dict(sampling="poisson"), dict(clients_per_round=0), "--sample-rate", "needs a rate"),
    (dict(sampling="poisson", sample_rate=0.5), {}, "--clients-per-round", "contradicts"),
    (dict(sampling="poisson", sample_rate=1.5), {}, "--sample-rate", "(0, 1]"),
    (dict(dp_sgd=True), {}, "--dp-sgd", "exactly one"),
    (dict(dp_sgd=True, dp_sgd_target_epsilon=3.0), {}, "--dp-sgd-delta", "needs"),
    (dict(dp_sgd_noise_multiplier=1.0), {}, "--dp-sgd-noise-multiplier", "without --dp-sgd"),
    (dict(dp_sgd=True, dp_sgd_noise_multiplier=1.0, dp_sgd_clip=-1.0), {}, "--dp-sgd-clip", "positive"),
]


@pytest.mark.parametrize("privacy, run, flag, words", REFUSALS)
def test_inconsistent_settings_are_refused_naming_the_flag(privacy: dict, run: dict, flag: str, words: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(words)) as caught:
        _plan(run, **privacy)
    assert caught.value.flag == flag
    assert str(caught.value).startswith(flag)


def test_clients_per_round_out_of_range_is_refused() -> None:
    with pytest.raises(ConfigError) as caught:
        _plan(dict(clients_per_round=11))
    assert caught.value.flag == FLAGS["clients_per_round"]


def test_beta_alone_says_it_is_not_dp() -> None:
    plan = _plan(dp_beta=0.0005)
    assert plan.mechanism == "beta" and not plan.claims_epsilon and plan.ledger() is None
    assert plan.aggregate_noise_std == 0.0005
    assert plan.denominator is None and not plan.unit_weights  # the method's own weights stay
    assert any("β noise alone is not differential privacy: nothing bounds a client's contribution" in s for s in plan.statements)


def test_beta_with_clip_is_a_gaussian_mechanism_with_z_k_beta_over_c() -> None:
    plan = _plan(dp_beta=0.05, clip=0.5, dp_beta_mode="double")
    assert plan.claims_epsilon and plan.unit_weights and plan.denominator == 4
    assert plan.noise_multiplier == pytest.approx(4 * 0.05 / 0.5)
    assert plan.aggregate_noise_std == pytest.approx(0.05)  # z·C/W = β
    assert plan.accounting_sample_rate == 1.0 and "zero-out" in plan.adjacency
    assert plan.delta == default_delta(10) == 1e-5
    assert any("post-processing" in s for s in plan.statements)
    ledger = plan.ledger()
    for _ in range(5):
        ledger.record_round(4)
    assert ledger.epsilon() == _opacus_eps(0.4, 1.0, 5, 1e-5)


@pytest.mark.parametrize(
    "run, why",
    [(dict(bn_stats="shared"), "BatchNorm"), (dict(aggregation="weighted"), "aggregation weights"),
     (dict(extra_uploads=("feature statistics",)), "feature statistics")],
)
def test_beta_with_clip_claims_nothing_when_something_escapes_the_noise(run: dict, why: str) -> None:
    plan = _plan(run, dp_beta=0.05, clip=0.5)
    assert not plan.claims_epsilon and plan.ledger() is None
    assert any("no ε is claimed" in s and why in s for s in plan.statements)


def test_dp_fedavg_with_poisson_sampling_uses_the_expected_cohort_and_amplification() -> None:
    plan = _plan(dict(clients_per_round=0), clip=2.0, noise_multiplier=1.2, sampling="poisson", sample_rate=0.3)
    assert plan.mechanism == "gaussian" and plan.sampling == "poisson" and plan.clients_per_round is None
    assert plan.denominator == pytest.approx(3.0)  # q·N, never the realised head count
    assert plan.aggregate_noise_std == pytest.approx(1.2 * 2.0 / 3.0)
    assert plan.accounting_sample_rate == 0.3 and "add/remove" in plan.adjacency
    ledger = plan.ledger()
    for contributors in (0, 5, 2):  # an empty Poisson cohort is still a (noised) release
        ledger.record_round(contributors)
    assert ledger.epsilon() == _opacus_eps(1.2, 0.3, 3, 1e-5)


def test_poisson_rate_can_come_from_the_expected_cohort() -> None:
    plan = _plan(clip=1.0, noise_multiplier=1.0, sampling="poisson")
    assert plan.sample_rate == pytest.approx(0.4) and plan.denominator == pytest.approx(4.0)


def test_target_epsilon_is_met_after_the_planned_rounds() -> None:
    plan = _plan(dict(rounds=8), clip=1.0, target_epsilon=3.0, delta=1e-4)
    ledger = plan.ledger()
    for _ in range(8):
        ledger.record_round(4)
    assert 3.0 - 0.02 <= ledger.epsilon() <= 3.0


def test_dp_sgd_alone_is_allowed_with_shared_bn_because_it_removes_batchnorm() -> None:
    plan = _plan(dict(bn_stats="shared"), dp_sgd=True, dp_sgd_noise_multiplier=1.1, dp_sgd_clip=0.7)
    assert plan.dp_sgd is not None and plan.dp_sgd.max_grad_norm == 0.7
    assert plan.dp_sgd.noise_multiplier_for(num_examples=500, batch_size=32, local_epochs=1, rounds=5) == 1.1
    assert plan.dp_sgd.delta_for(500) == default_delta(500)
    assert not plan.claims_epsilon and any("Example-level DP-SGD" in s for s in plan.statements)


def test_dp_sgd_target_is_calibrated_per_client_and_delta_checked_per_client() -> None:
    cfg = PrivacyConfig(dp_sgd=True, dp_sgd_target_epsilon=8.0)
    object.__setattr__(cfg, "dp_sgd_delta", 1e-3)  # the field the plan reads (see report)
    plan = resolve(cfg, **RUN)
    z = plan.dp_sgd.noise_multiplier_for(num_examples=200, batch_size=200, local_epochs=2, rounds=3)
    assert 8.0 - 0.02 <= _opacus_eps(z, 1.0, 2 * 3, 1e-3) <= 8.0  # full batches: q = 1, one step per epoch
    with pytest.raises(ConfigError) as caught:
        plan.dp_sgd.delta_for(2000)
    assert caught.value.flag == "--dp-sgd-delta"


def test_distributed_plan_and_ring_refusal() -> None:
    plan = _plan(dict(model_dim=5000, ring_bits=24), clip=1.0, noise_multiplier=0.8, distributed=True)
    assert plan.mechanism == "skellam" and plan.aggregate_noise_std == 0.0
    assert plan.skellam.contributors == 4 and plan.skellam.sum_noise_std(4) == pytest.approx(0.8)
    assert plan.denominator == 4 and plan.accounting_sample_rate == 1.0
    with pytest.raises(ConfigError, match="ring") as caught:
        _plan(dict(model_dim=5000, ring_bits=4), clip=1.0, noise_multiplier=0.8, distributed=True)
    assert caught.value.flag == "--dp-distributed"
    with pytest.raises(ValueError, match="model_dim"):
        _plan(clip=1.0, noise_multiplier=0.8, distributed=True)


def test_distributed_under_poisson_bounds_wraps_for_every_client() -> None:
    plan = _plan(dict(model_dim=5000, clients_per_round=0), clip=1.0, noise_multiplier=0.8, distributed=True,
                 sampling="poisson", sample_rate=0.3)
    assert plan.skellam.contributors == 3 and plan.skellam.max_contributors == 10
    assert plan.denominator == pytest.approx(3.0)


def test_noise_mask_must_cover_every_shared_coordinate_when_claiming() -> None:
    plan = _plan(clip=1.0, noise_multiplier=1.0)
    plan.check_noise_mask(torch.ones(10, dtype=torch.bool))
    with pytest.raises(ValueError, match="without noise"):
        plan.check_noise_mask(torch.tensor([True, False]))
    _plan(dp_beta=0.1).check_noise_mask(torch.tensor([True, False]))  # no claim, nothing to protect


def test_plan_summary_is_json() -> None:
    plan = _plan(dict(model_dim=100), clip=1.0, noise_multiplier=1.0, distributed=True, dp_sgd=True,
                 dp_sgd_noise_multiplier=1.0)
    summary = json.loads(json.dumps(plan.to_dict()))
    assert summary["mechanism"] == "skellam" and summary["skellam"]["ring_bits"] == 32
    assert summary["statements"] == list(plan.statements)
    assert dataclasses.is_dataclass(plan)


def test_quantised_channel_inflates_the_accounted_sensitivity() -> None:
    plan = _plan(clip=1.0, noise_multiplier=1.0)
    quantised = plan.for_quantised_channel(scale=100.0, dim=10_000)  # rounding adds up to √d/s = 1.0
    assert quantised.noise_multiplier == pytest.approx(0.5)
    assert quantised.aggregate_noise_std == plan.aggregate_noise_std  # the noise itself is unchanged
    assert len(quantised.statements) == len(plan.statements) + 1
    assert quantised.ledger().noise_multiplier == pytest.approx(0.5)
    beta_only = _plan(dp_beta=0.1)
    assert beta_only.for_quantised_channel(scale=100.0, dim=10) is beta_only
