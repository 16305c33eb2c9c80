"""The server side of a round: who takes part, what they receive, and the new global state.

It talks to clients only through :class:`~secfed.federation.messages.Broadcast` (out) and the
channel's :class:`~secfed.federation.messages.Aggregate` (in), so it can live in another process
than the clients (in-process for ``secfed train``, Flower messages for ``secfed train --flower``).

    select → broadcast → … channel … → apply:
        decode (distributed DP) → absorb shared payloads → the weighted mean → Eq. 15 correction
        and central noise (privacy plan) → the method's refinement (KD)
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from secfed.algorithms.base import Method
from secfed.config import ConfigError
from secfed.federation.messages import MODEL, Aggregate, Broadcast
from secfed.models.sharing import SharedLayout
from secfed.privacy.round import ServerPrivacy
from secfed.seeding import numpy_rng


def select_clients(num_clients: int, round_index: int, run_seed: int, clients_per_round: int = 0) -> list[int]:
    """The round's cohort: K of N uniformly without replacement, seeded by (run, round) — FedPav's
    Alg. 1 (K = 0 means all N). Poisson sampling, which DP accounting may need, is
    :meth:`secfed.privacy.round.ServerPrivacy.cohort`."""
    rng = numpy_rng(run_seed, "select", round_index)
    k = clients_per_round or num_clients
    return sorted(int(i) for i in rng.choice(num_clients, size=k, replace=False))


def weighted_mean(weights: torch.Tensor, aggregate: Aggregate, denominator: float | None) -> torch.Tensor:
    """w ← w + Σ w_k·Δ_k / W, W = Σ w_k (the clients' weights, inside the sum) or the privacy plan's fixed one."""
    total = aggregate.weights.get(MODEL, 0.0) if denominator is None else denominator
    if total <= 0:  # clients contributed, yet their weights summed to zero: CDW's, rounded in a coarse ring
        raise ConfigError("secagg.clip", f"round {aggregate.round + 1}: the clients' aggregation weights summed to "
                          f"{total:g} in the secure sum: the ring is too coarse for them; lower it")
    return torch.add(weights, aggregate.sums[MODEL], alpha=1.0 / total)


@dataclass
class ServerSide:
    method: Method
    layout: SharedLayout
    weights: torch.Tensor  # the global shared weights, flat float32
    privacy: ServerPrivacy
    enrolled: dict[int, int]  # client id → number of training examples, registered at enrolment
    weight_scale: float  # public: 1 / Σ n_k, so a client's weight n_k·scale lies in (0, 1]
    state: dict[str, torch.Tensor] = field(default_factory=dict)  # what the method keeps (e.g. DFS)

    def cohort(self, round_index: int, clients_per_round: int, run_seed: int) -> list[int]:
        fixed = select_clients(len(self.enrolled), round_index, run_seed, clients_per_round)
        return self.privacy.cohort(round_index, len(self.enrolled), fixed)

    def broadcast(self, round_index: int) -> Broadcast:
        # No copy: apply() replaces self.weights with a new tensor and nothing writes into a broadcast.
        return Broadcast(round_index, self.weights, self.layout.fingerprint(), self.method.payloads(self.state))

    def received(self, broadcast: Broadcast, client_id: int) -> Broadcast:
        """What one client receives: the broadcast, its weights noised under Eq. 15 (``double``)."""
        weights = self.privacy.received(broadcast.weights, broadcast.round, client_id)
        if weights is broadcast.weights:
            return broadcast
        return Broadcast(broadcast.round, weights, broadcast.layout_id, broadcast.payloads)

    def apply(self, aggregate: Aggregate) -> None:
        """New global state from the round's aggregate.

        Under DP the sum is divided by the plan's fixed denominator and the round is released (noise
        only) even when nobody contributed; otherwise an empty round leaves the weights unchanged.
        """
        aggregate = self.privacy.decode(aggregate)
        self.method.absorb(self.state, aggregate)
        denominator = self.privacy.denominator
        if aggregate.empty and denominator is None:
            return
        weights = self.weights if aggregate.empty else weighted_mean(self.weights, aggregate, denominator)
        contributors = {k: self.public_weight(k) for k in aggregate.contributors}
        weights = self.privacy.finish(weights, aggregate.round, contributors)
        if not aggregate.empty:
            weights = self.method.refine(weights, aggregate)
        self.weights = weights.to(torch.float32)

    def public_weight(self, client_id: int) -> float:
        """A contributor's aggregation weight as far as the server can know it: 1 under DP, n_k·scale
        when the method's weights are the public enrolment sizes (Eq. 15 needs it)."""
        unit = self.privacy.plan.unit_weights or self.method.cfg.method.aggregation == "unweighted"
        if unit or not self.method.public_weights:
            return 1.0
        return self.enrolled[client_id] * self.weight_scale
