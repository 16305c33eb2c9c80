"""The server: picks the cohort, broadcasts the global shared weights, applies the method's server rule."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Literal

import torch

from secfed.federation.messages import Aggregate, Broadcast
from secfed.models.sharing import SharedLayout, model_hash
from secfed.seeding import numpy_rng

# Central post-processing of the new global weights (e.g. β noise), given (weights, round).
PostProcess = Callable[[torch.Tensor, int], torch.Tensor]


def select_clients(
    num_clients: int,
    round_index: int,
    run_seed: int,
    *,
    sampling: Literal["fixed", "poisson"] = "fixed",
    clients_per_round: int = 0,
    sample_rate: float = 1.0,
) -> list[int]:
    """The round's cohort, seeded by (run, round).

    ``fixed``: K of N uniformly without replacement (FedPav's Alg. 1; K = 0 means all N).
    ``poisson``: every client independently with probability q — the assumption under which the DP
    accountant's amplification by sampling holds; the cohort may be empty.
    """
    rng = numpy_rng(run_seed, "select", round_index)
    if sampling == "poisson":
        return [int(i) for i in (rng.random(num_clients) < sample_rate).nonzero()[0]]
    k = clients_per_round or num_clients
    return sorted(int(i) for i in rng.choice(num_clients, size=k, replace=False))


@dataclass
class Server:
    layout: SharedLayout
    weights: torch.Tensor  # the global shared weights, flat float32
    server_rule: Callable[[torch.Tensor, Aggregate], torch.Tensor]
    weight_scale: float  # public: 1 / Σ n_k over enrolled clients, so aggregation weights lie in (0, 1]
    postprocess: list[PostProcess] = field(default_factory=list)

    def broadcast(self, round_index: int) -> Broadcast:
        return Broadcast(
            round=round_index,
            weights=self.weights.clone(),
            layout_id=self.layout.fingerprint(),
            model_hash=model_hash(self.weights),
            weight_scale=self.weight_scale,
        )

    def apply(self, aggregate: Aggregate) -> None:
        """New global weights from the aggregate; a round nobody contributed to leaves them unchanged."""
        if not aggregate.contributors:
            return
        weights = self.server_rule(self.weights, aggregate)
        for step in self.postprocess:
            weights = step(weights, aggregate.round)
        self.weights = weights.to(torch.float32)
