"""Every sample an amplification argument rests on is secret: Poisson cohorts and DP-SGD's Poisson
batches come from the CSPRNG noise source, so the run directory (config.json's seed) does not
reproduce them. The attacks below are the old derivations an auditor with the run directory would run."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from secfed.algorithms.base import Schedule
from secfed.config import PrivacyConfig, RunConfig, RunSection
from secfed.federation.runtime import train_seed
from secfed.privacy.accountant import SampledGaussianAccountant, gaussian_epsilon
from secfed.privacy.dpsgd import ClientDpSgd, LocalDpSgd, poisson_schedule
from secfed.privacy.noise import NoiseSource
from secfed.privacy.policy import resolve
from secfed.privacy.round import ServerPrivacy
from secfed.privacy.sampling import poisson_batches, poisson_subset
from secfed.seeding import derive_seed, numpy_rng

SEED, CLIENTS, ROUNDS = 11, 40, 6


def _server(seed: int, *, reproducible: bool) -> ServerPrivacy:
    plan = resolve(PrivacyConfig(clip=1.0, noise_multiplier=1.0, sampling="poisson", sample_rate=0.25,
                                 reproducible_noise=reproducible),
                   num_clients=CLIENTS, clients_per_round=0, rounds=ROUNDS, aggregation="unweighted",
                   secagg=False, bn_stats="local")
    source = NoiseSource(derive_seed(seed, "server-noise"), reproducible=reproducible)  # as the builder makes it
    return ServerPrivacy.from_plan(plan, torch.ones(4, dtype=torch.bool), seed, source)


def _cohorts(server: ServerPrivacy) -> list[list[int]]:
    return [server.cohort(t, CLIENTS, []) for t in range(ROUNDS)]


def test_poisson_cohorts_are_not_recomputable_from_the_run_seed() -> None:
    """The old rule drew cohorts from numpy_rng(seed, "select/poisson", t): whoever held config.json
    knew every cohort, and the amplified ε (2.10 → 19.1 at N = 10⁴, q = 0.01, T = 10³, z = 1, δ = 10⁻⁵:
    the ≈ 10 rounds a client takes part in, known, are ten unamplified releases) was false."""
    assert gaussian_epsilon(1.0, 0.01, 1000, 1e-5) == pytest.approx(2.10, abs=0.005)  # SECURITY.md's figures
    assert gaussian_epsilon(1.0, 1.0, 10, 1e-5) == pytest.approx(19.05, abs=0.05)
    attack = [[int(k) for k in poisson_subset(CLIENTS, 0.25, numpy_rng(SEED, "select/poisson", t))]
              for t in range(ROUNDS)]
    first, second = _cohorts(_server(SEED, reproducible=False)), _cohorts(_server(SEED, reproducible=False))
    assert sum(a == c for a, c in zip(attack, first)) == 0  # 6 cohorts of ~10 of 40: a match is ~1e-9 likely
    assert first != second  # the same seed samples different cohorts


def test_reproducible_noise_reproduces_cohorts_and_says_not_private() -> None:
    a, b = _server(SEED, reproducible=True), _server(SEED, reproducible=True)
    assert _cohorts(a) == _cohorts(b)
    assert any(s.startswith("NOT PRIVATE") for s in a.plan.statements)


class _Linear(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(3, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x)


def _batches(training_seed: int, noise: NoiseSource, examples: int, schedule: Schedule) -> list[list[int]]:
    """The Poisson batches one client's DP-SGD round draws, as the framework hands them to the loop."""
    model = _Linear()
    dp = ClientDpSgd(1.0, 1.0, 1e-5, SampledGaussianAccountant(), noise, examples)
    loop = LocalDpSgd(dp, examples, schedule, "fedpav").privatise(
        model, torch.optim.SGD(model.parameters(), lr=0.1), torch.Generator().manual_seed(training_seed))
    return [b.tolist() for b in loop.batches]


def test_dp_sgd_batches_are_not_recomputable_from_the_run_seed() -> None:
    """The old DP-SGD loop seeded the batches from the training generator, train_seed(cfg, t, k):
    with the batches known, the printed ε 7.96 (n = 474, B = 32, 16 rounds, z = 1) was ≈ 26."""
    examples, schedule = 200, Schedule(0.1, 0.1, epochs=1, batch_size=16)
    training_seed = train_seed(RunConfig(run=RunSection(seed=SEED)), 3, 1)  # what anyone with the seed computes
    generator = torch.Generator().manual_seed(training_seed)
    rate, steps = poisson_schedule(examples, schedule.batch_size)
    rng = np.random.default_rng(int(torch.randint(0, 2**62, (1,), generator=generator)))
    attack = [b.tolist() for b in poisson_batches(examples, rate, steps, rng)]
    noise = NoiseSource(derive_seed(SEED, "client-noise", 1))
    first = _batches(training_seed, noise, examples, schedule)
    second = _batches(training_seed, noise, examples, schedule)
    assert len(first) == len(attack) == steps
    assert sum(a == f for a, f in zip(attack, first)) == 0
    assert first != second
    reproducible = NoiseSource(derive_seed(SEED, "client-noise", 1), reproducible=True)
    assert _batches(training_seed, reproducible, examples, schedule) == \
        _batches(training_seed, reproducible, examples, schedule)
    assert _batches(training_seed + 1, reproducible, examples, schedule) != \
        _batches(training_seed, reproducible, examples, schedule)  # not the same batches every round
