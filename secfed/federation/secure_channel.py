"""The secure channel: a round's uploads aggregated with :mod:`secfed.protocols` (SecAgg / SecAgg+).

Each client's upload becomes one ring vector before masking:

* float path (no distributed noise): ``[weight·update, weight]`` clipped per coordinate to
  ``--secagg-clip`` (≥ 1, so a weight in (0, 1] is never clipped), scaled and stochastically rounded
  into Z_{2^32} — the weight travels inside the masked vector, so the server learns Σ weight·update
  and Σ weight and nothing per client;
* distributed DP (``--dp-distributed``): the client's clipped update, encoded with its share of
  Skellam noise (:mod:`secfed.privacy.distributed`); every weight is 1 and the server divides by the
  plan's fixed denominator.

The whole protocol runs in memory through :func:`secfed.protocols.simulate`: real keys, real masks,
every message encoded to bytes and decoded by its receiver, so byte counts are the wire's. Masks
cancel exactly, so the result depends only on the seeded rounding and noise: runs stay reproducible.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from secfed import protocols
from secfed.config import RunConfig
from secfed.federation.channel import broadcast_bytes
from secfed.federation.messages import Aggregate, Broadcast, Upload
from secfed.privacy.distributed import SkellamParams, decode_sum, encode, rotation_seed, to_ring
from secfed.seeding import derive_seed, numpy_rng

RING_BITS = 32
MIN_DESIGN_DROPOUT = 0.1  # SecAgg+ parameters are chosen for at least this dropout rate


@dataclass
class SecureChannel:
    run_seed: int
    quantizer: protocols.Quantizer  # float path; its scale is fixed for the run (accounting needs it)
    skellam: SkellamParams | None
    authenticated: bool
    graph: str  # "auto" (SecAgg+ where a sparse graph meets the targets) or "complete" (SecAgg)
    design_dropout: float
    name: str = "secagg"

    @classmethod
    def for_run(cls, cfg: RunConfig, dim: int, num_clients: int, skellam: SkellamParams | None) -> SecureChannel:
        s = cfg.secagg
        return cls(
            run_seed=cfg.seed,
            # sized for the largest possible cohort (every client, + the weight coordinate) so the
            # scale is one number for the whole run
            quantizer=protocols.Quantizer.for_cohort(num_clients, s.clip, bits=RING_BITS),
            skellam=skellam,
            authenticated=s.authenticated,
            graph=s.graph,
            design_dropout=max(MIN_DESIGN_DROPOUT, s.dropout_rate),
        )

    @property
    def needs_model_hash(self) -> bool:
        return self.authenticated

    @property
    def scale(self) -> float:
        return self.quantizer.scale

    @property
    def phases(self) -> tuple[str, ...]:
        return tuple(p.name.lower() for p in protocols.Phase
                     if self.authenticated or p is not protocols.Phase.CONSISTENCY_CHECK)

    def session_id(self, round_index: int) -> bytes:
        """Public and unique per (run, round), derived from the run seed so a rerun draws the same
        neighbour graph; the keys stay fresh OS randomness every round."""
        return derive_seed(self.run_seed, "secagg/session", round_index).to_bytes(8, "little") + \
            derive_seed(self.run_seed, "secagg/session-2", round_index).to_bytes(8, "little")

    def params(self, n: int) -> protocols.GraphParams:
        return protocols.choose_params(
            n, dropout_rate=self.design_dropout, authenticated=self.authenticated, complete=self.graph == "complete"
        )

    def aggregate(self, broadcast: Broadcast, uploads: Sequence[Upload], dropouts: Mapping[int, str]) -> Aggregate:
        uploads = sorted(uploads, key=lambda u: u.client_id)
        ids = [u.client_id for u in uploads]
        down = broadcast_bytes(broadcast) * len(uploads)
        if len(uploads) < 2:  # the "sum" of one client would be its update: nothing is aggregated
            return _empty(broadcast, bytes_down=down)
        t = broadcast.round
        clipped = 0
        if self.skellam is None:
            inputs = [_with_weight(u) for u in uploads]
            clipped = sum(int(np.count_nonzero(np.abs(x) > self.quantizer.clip)) for x in inputs)
            run = dict(quantizer=self.quantizer, rng=numpy_rng(self.run_seed, "secagg/rounding", t))
        else:
            noise_rng = numpy_rng(self.run_seed, "dp-distributed/noise", t)
            seed = rotation_seed(self.run_seed, t)
            inputs = [to_ring(encode(u.update.numpy(), self.skellam, rotation_seed=seed, rng=noise_rng), RING_BITS)
                      for u in uploads]
            run = dict(ring_bits=RING_BITS)
        try:
            result = protocols.simulate(
                inputs,
                dropouts={ids.index(k): phase for k, phase in dropouts.items() if k in ids},
                params=self.params(len(uploads)),
                authenticated=self.authenticated,
                model_hashes=[u.model_hash for u in uploads] if self.authenticated else None,
                session_id=self.session_id(t),
                round=t,
                **run,
            )
        except protocols.BelowThreshold:
            # Too few survivors to unmask: the protocol aborts and this round aggregates nothing.
            return _empty(broadcast, bytes_down=down)
        survivors = tuple(ids[i] for i in result.survivors)
        if self.skellam is None:
            total = torch.from_numpy(result.total[:-1].astype(np.float32))
            weight = float(result.total[-1])
        else:
            total = torch.from_numpy(
                decode_sum(result.ring_total, self.skellam, rotation_seed=rotation_seed(self.run_seed, t)).astype(np.float32)
            )
            weight = float(len(survivors))
        return Aggregate(t, total, weight, survivors, sum(result.bytes_sent), down + sum(result.bytes_received), clipped)


def _with_weight(upload: Upload) -> np.ndarray:
    vector = np.empty(upload.update.numel() + 1, dtype=np.float64)
    vector[:-1] = upload.update.numpy()
    vector[:-1] *= upload.weight
    vector[-1] = upload.weight
    return vector


def _empty(broadcast: Broadcast, bytes_down: int) -> Aggregate:
    return Aggregate(broadcast.round, torch.zeros_like(broadcast.weights), 0.0, (), 0, bytes_down)
