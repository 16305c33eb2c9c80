"""A PrivacyPlan applied to federated rounds: the recipe behind ``secfed train``'s privacy flags.

The round loop calls, in order: :meth:`RoundPrivacy.cohort` (who takes part),
:meth:`~RoundPrivacy.received` (Eq. 15 broadcast noise), :meth:`~RoundPrivacy.client_update`
(clip, weight), :meth:`~RoundPrivacy.server_update` (fixed denominator, Eq. 15 correction, central
noise) and :meth:`~RoundPrivacy.account` (the ledger). Distributed noise lives in the channel, which
reads :attr:`PrivacyPlan.skellam` itself.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import torch

from secfed.privacy.beta import BetaNoise
from secfed.privacy.clipping import clip_l2
from secfed.privacy.ledger import PrivacyLedger
from secfed.privacy.policy import PrivacyPlan
from secfed.privacy.sampling import poisson_subset
from secfed.seeding import numpy_rng


@dataclasses.dataclass
class RoundPrivacy:
    plan: PrivacyPlan
    run_seed: int
    noise: BetaNoise | None  # the server's Gaussian noise on trainable coordinates (β or DP-FedAvg)
    ledger: PrivacyLedger | None

    @classmethod
    def from_plan(cls, plan: PrivacyPlan, trainable_mask: torch.Tensor, run_seed: int) -> RoundPrivacy:
        plan.check_noise_mask(trainable_mask)
        noise = None
        if plan.aggregate_noise_std > 0 or plan.beta_mode == "double":
            # std is β (β noise), or z·C/W on the mean (DP-FedAvg); "double" only ever comes with β.
            noise = BetaNoise(plan.aggregate_noise_std, plan.beta_mode, trainable_mask, run_seed)
        return cls(plan, run_seed, noise, plan.ledger())

    # -- who, and what they receive ------------------------------------------------------------

    def cohort(self, round_index: int, num_clients: int, fixed: list[int]) -> list[int]:
        """Poisson sampling when the plan accounts with it (the cohort may be empty), else ``fixed``."""
        if self.plan.sampling != "poisson":
            return fixed
        rng = numpy_rng(self.run_seed, "select/poisson", round_index)
        return [int(k) for k in poisson_subset(num_clients, self.plan.sample_rate, rng)]

    def received(self, weights: torch.Tensor, round_index: int, client_id: int) -> torch.Tensor:
        """What a client starts from: θ, or θ + fresh β noise under Eq. 15 (``--dp-beta-mode double``)."""
        if self.noise is None or self.plan.beta_mode != "double":
            return weights
        return self.noise.broadcast(weights, round_index, client_id)

    # -- client side -----------------------------------------------------------------------------

    def client_update(self, update: torch.Tensor) -> torch.Tensor:
        """Clip the whole shared update to L2 ≤ C when the plan clips (under DP its weight is 1:
        :attr:`PrivacyPlan.unit_weights`)."""
        if self.plan.clip is not None:
            update, _ = clip_l2(update, self.plan.clip)
        return update

    # -- server side -----------------------------------------------------------------------------

    @property
    def denominator(self) -> float | None:
        """Fixed W the sum is divided by under DP (None: Σ weights, the method's own rule)."""
        return self.plan.denominator

    def server_update(
        self, weights: torch.Tensor, round_index: int, contributors: Mapping[int, float], weight_sum: float
    ) -> torch.Tensor:
        """After the method's rule: undo the offset Eq. 15 put into the updates, then central noise.

        In ``double`` mode client i trained from θ + n_i, so its update is measured from there;
        Eq. 14 averages the clients' weights themselves, so the weighted mean of the n_i
        (regenerated: the server drew them) is added back. ``contributors`` maps client id → weight.
        """
        if self.noise is None:
            return weights
        if self.plan.beta_mode == "double" and contributors and weight_sum > 0:
            offset = torch.zeros_like(weights, dtype=torch.float64)
            for client_id, w in contributors.items():
                offset += w * self.noise.broadcast_noise(round_index, client_id).to(torch.float64)
            weights = weights + (offset / weight_sum).to(weights.dtype)
        return self.noise.aggregate(weights, round_index)

    def account(self, contributors: int) -> dict[str, Any] | None:
        """Step the ledger once for the round; the metrics line's ``privacy`` entry (None: no ε claimed)."""
        if self.ledger is None:
            return None
        self.ledger.record_round(contributors)
        return self.ledger.metrics()

    def state_dict(self) -> dict[str, Any] | None:
        return None if self.ledger is None else self.ledger.state_dict()

    def load_state_dict(self, state: dict[str, Any] | None) -> None:
        if (state is None) != (self.ledger is None):
            raise ValueError("the checkpoint's privacy accounting does not match this run's privacy settings")
        if self.ledger is not None:
            self.ledger.load_state_dict(state)
