"""The server: picks the cohort, broadcasts the global shared weights, applies the method's server rule."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable

import torch

from secfed.federation.messages import Aggregate, Broadcast
from secfed.models.sharing import SharedLayout
from secfed.privacy.round import RoundPrivacy
from secfed.seeding import numpy_rng


def select_clients(num_clients: int, round_index: int, run_seed: int, clients_per_round: int = 0) -> list[int]:
    """The round's cohort: K of N uniformly without replacement, seeded by (run, round) — FedPav's
    Alg. 1 (K = 0 means all N). Poisson sampling, which DP accounting may need, is
    :meth:`secfed.privacy.round.RoundPrivacy.cohort`."""
    rng = numpy_rng(run_seed, "select", round_index)
    k = clients_per_round or num_clients
    return sorted(int(i) for i in rng.choice(num_clients, size=k, replace=False))


@dataclass
class Server:
    layout: SharedLayout
    weights: torch.Tensor  # the global shared weights, flat float32
    server_rule: Callable[[torch.Tensor, Aggregate], torch.Tensor]
    aggregation_weight: Callable[[int], float]  # the method's weight of a client with n_k examples
    weight_scale: float  # public: 1 / Σ n_k over enrolled clients, so aggregation weights lie in (0, 1]
    enrolled: dict[int, int]  # client id → number of training examples, registered at enrolment
    weighted: bool  # the method's n_k weighting (else every client weighs 1)
    privacy: RoundPrivacy

    def broadcast(self, round_index: int) -> Broadcast:
        return Broadcast(round_index, self.weights.clone(), self.layout.fingerprint(), self.weight_scale)

    def weight_of(self, client_id: int) -> float:
        """The aggregation weight of a client's update, a public function of its enrolment: n_k·scale
        under the method's weighting, 1 for a plain mean and under DP (unit weights)."""
        if self.privacy.plan.unit_weights or not self.weighted:
            return 1.0
        return self.aggregation_weight(self.enrolled[client_id]) * self.weight_scale

    def apply(self, aggregate: Aggregate) -> None:
        """New global weights: the method's rule, then the privacy plan's server step.

        Under DP the sum is divided by the plan's fixed denominator and the round is released (noise
        only) even when nobody contributed; otherwise an empty round leaves the weights unchanged.
        """
        denominator = self.privacy.denominator
        if not aggregate.contributors and denominator is None:
            return
        if denominator is not None:
            aggregate = dataclasses.replace(aggregate, weight=denominator)
        weights = self.server_rule(self.weights, aggregate)
        contributors = {k: self.weight_of(k) for k in aggregate.contributors}
        weights = self.privacy.server_update(weights, aggregate.round, contributors, aggregate.weight)
        self.weights = weights.to(torch.float32)
