"""A PrivacyPlan applied to federated rounds: the visible privacy step on each side of the channel.

    client:  Contribution ──ClientPrivacy.upload──► Upload     clip the shared update (weight 1 under
                                                                DP); under distributed DP encode it with
                                                                the client's Skellam noise share; DFH:
                                                                IFS → DFS, clipped and noised (`.dfs`)
    server:  Aggregate ──ServerPrivacy.decode──► float sums     (distributed DP: decode the ring sum)
             mean ──ServerPrivacy.finish──► new weights         Eq. 15 correction, central noise
             ServerPrivacy.cohort / received / account           who takes part, Eq. 15 broadcast noise, ε

The Upload that leaves :meth:`ClientPrivacy.upload` is exactly what the channel carries and what
the audit attacks. Every noise is drawn from a :class:`~secfed.privacy.noise.NoiseSource`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from secfed.federation.messages import MODEL, Aggregate, Contribution, Summand, Upload
from secfed.privacy import adversary
from secfed.privacy.beta import BetaNoise
from secfed.privacy.clipping import clip_l2
from secfed.privacy.dfs import release_shared
from secfed.privacy.distributed import decode_sum, encode, rotation_seed
from secfed.privacy.ledger import PrivacyLedger
from secfed.privacy.noise import NoiseSource
from secfed.privacy.policy import PrivacyPlan
from secfed.privacy.sampling import poisson_subset


@dataclasses.dataclass
class ClientPrivacy:
    """What a client does to its contribution before anything leaves it."""

    plan: PrivacyPlan
    run_seed: int  # public: the rotation of distributed DP is derived from it
    noise: NoiseSource  # the client's own noise (its Skellam shares)

    def upload(self, contribution: Contribution, *, client_id: int, round_index: int,
               model_hash: bytes | None = None) -> Upload:
        summed = dict(contribution.summed)
        model = summed[MODEL]
        if self.plan.clip is not None:
            vector, _ = clip_l2(model.vector, self.plan.clip)
            model = Summand(vector, 1.0 if self.plan.unit_weights else model.weight, model.encoding, model.bound,
                            model.statistics)
        elif self.plan.unit_weights:
            model = dataclasses.replace(model, weight=1.0)
        if self.plan.skellam is not None:
            encoded = encode(model.vector.numpy(), self.plan.skellam, rotation_seed=rotation_seed(self.run_seed, round_index),
                             rng=self.noise.generator("dp-distributed", round_index, client_id))
            model = Summand(torch.from_numpy(encoded), 1.0, "ring")
        summed[MODEL] = model
        shared = release_shared(contribution.shared, self.plan.dfs, self.noise, round_index=round_index,
                                client_id=client_id)  # DFH: per-identity statistics in, the four DFS vectors out
        return Upload(client_id, round_index, summed, shared, model_hash)


@dataclasses.dataclass
class ServerPrivacy:
    plan: PrivacyPlan
    run_seed: int
    noise: BetaNoise | None  # the server's Gaussian noise on trainable coordinates (β or DP-FedAvg)
    ledger: PrivacyLedger | None
    source: NoiseSource  # privacy randomness: the noise above and the Poisson cohorts

    @classmethod
    def from_plan(cls, plan: PrivacyPlan, trainable_mask: torch.Tensor, run_seed: int, source: NoiseSource) -> ServerPrivacy:
        plan.check_noise_mask(trainable_mask)
        noise = None
        if plan.aggregate_noise_std > 0 or plan.beta_mode == "double":
            # std is β (β noise), or z·C/W on the mean (DP-FedAvg); "double" only ever comes with β.
            noise = BetaNoise(plan.aggregate_noise_std, plan.beta_mode, trainable_mask, source)
        return cls(plan, run_seed, noise, plan.ledger(), source)

    # -- who, and what they receive ------------------------------------------------------------

    def cohort(self, round_index: int, num_clients: int, fixed: list[int]) -> list[int]:
        """Poisson sampling when the plan accounts with it (the cohort may be empty), else ``fixed``.

        The amplification by sampling in the printed ε holds only while the cohort is secret, so it is
        drawn from the CSPRNG noise source, never from the run seed that config.json holds. It is used
        within its round only: checkpoints are written between rounds, so no drawn cohort outlives
        one, and a resumed run draws the interrupted round's cohort afresh (nothing of it was released)."""
        if self.plan.sampling != "poisson":
            return fixed
        rng = self.source.generator("select/poisson", round_index)
        return [int(k) for k in poisson_subset(num_clients, self.plan.sample_rate, rng)]

    def received(self, weights: torch.Tensor, round_index: int, client_id: int) -> torch.Tensor:
        """What a client starts from: θ, or θ + fresh β noise under Eq. 15 (``double``)."""
        if self.noise is None or self.plan.beta_mode != "double":
            return weights
        return self.noise.broadcast(weights, round_index, client_id)

    # -- after the channel -----------------------------------------------------------------------

    @property
    def denominator(self) -> float | None:
        """Fixed W the sum is divided by under DP (None: Σ weights, the method's own rule)."""
        return self.plan.denominator

    def decode(self, aggregate: Aggregate) -> Aggregate:
        """Ring-encoded sums (distributed DP) → float sums of the clipped updates plus noise."""
        ring = [name for name, total in aggregate.sums.items() if total.dtype == torch.int64]
        if not ring:
            return aggregate
        assert self.plan.skellam is not None, "a ring-encoded sum without distributed DP"
        sums = dict(aggregate.sums)
        for name in ring:
            decoded = decode_sum(sums[name].numpy().astype(np.uint64), self.plan.skellam,
                                 rotation_seed=rotation_seed(self.run_seed, aggregate.round))
            sums[name] = torch.from_numpy(decoded.astype(np.float32))
        return dataclasses.replace(aggregate, sums=sums)

    def finish(self, weights: torch.Tensor, round_index: int, contributors: Mapping[int, float]) -> torch.Tensor:
        """After the method's mean: undo the offset Eq. 15 put into the updates, then central noise.

        ``contributors`` maps client id → its aggregation weight (known to the server only when the
        method's weights are public; Eq. 15 is refused otherwise)."""
        if self.noise is None:
            return weights
        weight_sum = sum(contributors.values())
        if self.plan.beta_mode == "double" and contributors and weight_sum > 0:
            offset = torch.zeros_like(weights, dtype=torch.float64)
            for client_id, w in contributors.items():
                offset += w * self.noise.broadcast_noise(round_index, client_id).to(torch.float64)
            weights = weights + (offset / weight_sum).to(weights.dtype)
        self.noise.end_round(round_index)
        return self.noise.aggregate(weights, round_index)

    def account(self, contributors: int) -> dict[str, Any] | None:
        """Step the ledger once for the round; the metrics line's ``privacy`` entry (None: no ε claimed):
        ``epsilon`` holds against those who see only the released models, ``epsilon_server`` against the
        server (None: none holds)."""
        if self.ledger is None:
            return None
        self.ledger.record_round(contributors)
        metrics = self.ledger.metrics()
        metrics["epsilon_server"] = adversary.client_level(self.plan, metrics["epsilon"]).server
        return metrics

    def release_index(self, round_number: int) -> int:
        """The index a release note of round ``round_number`` carries: the ledger's count of accounted
        releases when the round begins (without a client-level ledger, as under DP-SGD alone, the
        round's index), so that a resume can tell which notes its restored ledger does not count."""
        return self.ledger.rounds if self.ledger is not None else round_number - 1

    def charge_lost_releases(self, notes: Sequence[Mapping[str, Any]]) -> list[int]:
        """On resume: account every release the ``notes`` (the run's release notes, not withdrawn) name that the
        restored ledger does not count — rounds begun after the checkpoint it was restored from — each
        at the worst case; returns their round numbers."""
        if self.ledger is None:
            return []
        counted = self.ledger.rounds  # a note's index is the ledger's count when its round began
        lost = [int(n["round"]) for n in notes if int(n["release"]) >= counted]
        for _ in lost:
            self.ledger.record_lost_release()
        return lost

    def state_dict(self) -> dict[str, Any] | None:
        return None if self.ledger is None else self.ledger.state_dict()

    def load_state_dict(self, state: dict[str, Any] | None) -> None:
        if (state is None) != (self.ledger is None):
            raise ValueError("the checkpoint's privacy accounting does not match this run's privacy settings")
        if self.ledger is not None:
            self.ledger.load_state_dict(state)
