"""The secure channel: the summed part of a round's uploads aggregated with :mod:`secfed.protocols`.

Each client's summed vectors become one ring vector before masking, one segment per name in name
order (so every client lays them out alike):

* float summand ``x`` with weight ``w``: ``[w·x, w]`` clipped per coordinate to its bound (the
  summand's own, else `secagg.clip` — ≥ 1, so a weight in (0, 1] is never clipped), scaled and
  stochastically rounded into Z_{2^32} with that segment's quantiser — the weight travels inside the
  masked vector, so the server learns Σ w·x and Σ w and nothing per client;
* ring summand (distributed DP): the client's integer encoding with its noise share, as it is.

The protocol runs in memory through :func:`secfed.protocols.simulate`: real keys, real masks, every
message encoded to bytes and decoded by its receiver, so byte counts are the wire's. Masks cancel
exactly, so the result depends only on the seeded rounding: runs stay reproducible. What clients
share unsummed (DFH's statistics) travels beside the sum in the clear, through the codec.

A round the protocol aborts (too few clients left for some threshold) is run again, as a new
session with fresh keys, among the clients still online; a round left with fewer than two clients
releases nothing, since the "sum" of one client would be its update. The privacy plan analyses
exactly this rule (:mod:`secfed.privacy.policy`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from secfed import protocols
from secfed.config import ConfigError, RunConfig
from secfed.federation import codec
from secfed.federation.channel import check_uploads, only_shared, zero_sums
from secfed.federation.messages import Aggregate, Broadcast, Summand, Upload
from secfed.privacy.distributed import to_ring
from secfed.seeding import derive_seed, numpy_rng

RING_BITS = 32
STATISTICS = "statistics"  # clipped counts of a summand's BatchNorm statistics: "NAME/statistics"
MIN_DESIGN_DROPOUT = 0.1  # SecAgg+ parameters are chosen for at least this dropout rate
MIN_COHORT = 2
# A client's aggregation weight travels in the ring too: at least this many units, so no cohort's weights
# ever sum to zero and stochastic rounding (unbiased) moves each by less than a quarter (16 refused an
# MSMT17-sized by-identity split of 1,041 clients at the default clip: found by review)
MIN_WEIGHT_UNITS = 4
# The coarsest ring unit BatchNorm statistics may get: a round's change of a running mean or variance
# below it is rounded away (unbiased, but noise). 4096 — the default — gives 0.019 at 10,000 clients.
MAX_STATS_UNIT = 0.1


@dataclass(frozen=True)
class _Piece:
    start: int  # within the summand's vector (and its segment)
    length: int
    quantizer: protocols.Quantizer


@dataclass(frozen=True)
class _Segment:
    name: str
    start: int
    length: int  # ring words: numel + 1 (the weight) for float summands
    quantizer: protocols.Quantizer | None  # None: ring-encoded summand; else the values' and the weight's
    pieces: tuple[_Piece, ...] = ()  # float summands: the values, cut by range (statistics apart)


@dataclass
class SecureChannel:
    run_seed: int
    num_clients: int  # the largest possible cohort: quantisers are sized for it, once per run
    clip: float  # default per-coordinate bound of float summands
    authenticated: bool
    graph: str  # "auto" (SecAgg+ where a sparse graph meets the targets) or "complete" (SecAgg)
    design_dropout: float
    stats_clip: float = 4096.0  # bound of BatchNorm running statistics inside a float summand
    name: str = "secagg"
    summed_round: int | None = None  # the newest round whose sum was unmasked (runtime.drive_round reads it)

    @classmethod
    def for_run(cls, cfg: RunConfig, num_clients: int) -> SecureChannel:
        s = cfg.secagg
        return cls(
            run_seed=cfg.seed, num_clients=num_clients, clip=s.clip, authenticated=s.authenticated, graph=s.graph,
            design_dropout=max(MIN_DESIGN_DROPOUT, s.dropout_rate), stats_clip=s.stats_clip,
        )

    def quantizer(self, bound: float | None = None) -> protocols.Quantizer:
        """The quantiser of a float segment: one scale per bound for the whole run (accounting needs it)."""
        return protocols.Quantizer.for_cohort(self.num_clients, bound or self.clip, bits=RING_BITS)

    @property
    def scale(self) -> float:
        """Ring units per 1.0 of the model update's segment."""
        return self.quantizer().scale

    def check_weights_resolved(self, smallest: float) -> None:
        """Refuse a ``secagg.clip`` so coarse that the ``smallest`` aggregation weight a client carries is
        fewer than MIN_WEIGHT_UNITS ring units (found by review: `--secagg-clip 1e308` rounded every
        weight to zero, and round 1 stopped with a traceback)."""
        units = smallest * self.scale
        if units < MIN_WEIGHT_UNITS:
            raise ConfigError("secagg.clip", f"{self.clip:g} leaves the smallest client's aggregation weight "
                              f"({smallest:.3g}) {units:.3g} ring units at {self.num_clients} clients (at least "
                              f"{MIN_WEIGHT_UNITS} needed): give at most {_round_down(self.clip * units / MIN_WEIGHT_UNITS)}")

    def check_statistics_resolved(self) -> None:
        """Refuse a ``secagg.stats_clip`` whose ring unit is coarser than MAX_STATS_UNIT at this cohort
        (found by review: `--secagg-stats-clip 1e308` rounded every BatchNorm statistic to zero, silently)."""
        unit = 1.0 / self.quantizer(self.stats_clip).scale
        if unit > MAX_STATS_UNIT:
            raise ConfigError("secagg.stats_clip", f"{self.stats_clip:g} leaves BatchNorm statistics a ring unit of "
                              f"{unit:.3g} at {self.num_clients} clients (at most {MAX_STATS_UNIT:g}): give at most "
                              f"{_round_down(self.stats_clip * MAX_STATS_UNIT / unit)}")

    @property
    def needs_model_hash(self) -> bool:
        return self.authenticated

    @property
    def phases(self) -> tuple[str, ...]:
        return tuple(p.name.lower() for p in protocols.Phase
                     if self.authenticated or p is not protocols.Phase.CONSISTENCY_CHECK)

    def session_id(self, round_index: int, attempt: int = 0) -> bytes:
        """Public and unique per (run, round, attempt), derived from the run seed; the keys stay fresh OS
        randomness every session, and the neighbour graph's seed hashes nonces the clients reveal, so
        neither repeats in a rerun."""
        return derive_seed(self.run_seed, "secagg/session", round_index, attempt).to_bytes(8, "little") + \
            derive_seed(self.run_seed, "secagg/session-2", round_index, attempt).to_bytes(8, "little")

    def params(self, n: int) -> protocols.GraphParams:
        return protocols.choose_params(
            n, dropout_rate=self.design_dropout, authenticated=self.authenticated, complete=self.graph == "complete"
        )

    # ---- one round -----------------------------------------------------------------------------

    def aggregate(self, broadcast: Broadcast, uploads: Sequence[Upload], dropouts: Mapping[int, str],
                  *, broadcast_bytes: int) -> Aggregate:
        uploads = sorted(uploads, key=lambda u: u.client_id)
        check_uploads(uploads)
        t = broadcast.round
        down = broadcast_bytes * len(uploads)
        # unsummed payloads travel in the clear, through the codec, from clients that did not vanish first
        shared_bytes, shared = 0, {}
        for u in uploads:
            if dropouts.get(u.client_id) == "advertise_keys" or not u.shared:
                continue
            data = codec.encode_upload(only_shared(u))
            shared_bytes += len(data)
            shared[u.client_id] = dict(codec.decode_upload(data).shared)
        layout = self.layout(ring_shape(uploads[0]) if uploads else [])
        inputs = {u.client_id: layout.ring_vector_by_name(u, self.rounding(t, u.client_id)) for u in uploads}
        up = received = 0
        online = [u.client_id for u in uploads]
        pending = dict(dropouts)
        for attempt in range(len(uploads)):
            if len(online) < MIN_COHORT:  # the "sum" of one client would be its update: nothing is aggregated
                break
            try:
                result = protocols.simulate(
                    [inputs[k][0] for k in online],
                    dropouts={online.index(k): phase for k, phase in pending.items() if k in online},
                    params=self.params(len(online)),
                    authenticated=self.authenticated,
                    model_hashes=[_hash(uploads, k) for k in online] if self.authenticated else None,
                    session_id=self.session_id(t, attempt),
                    round=t,
                    ring_bits=RING_BITS,
                )
            except protocols.BelowThreshold:
                # Nobody's input is released by an aborted session; retry with the clients still online.
                # (The aborted session's bytes are not counted: simulate() does not return them.)
                online = [k for k in online if k not in pending]
                pending = {}
                continue
            self.summed_round = t  # the sum is unmasked: an interrupt from here may follow its release
            up += sum(result.bytes_sent)
            received += sum(result.bytes_received)
            contributors = tuple(online[i] for i in result.survivors)
            sums, weights = layout.decode(result.ring_total, len(contributors))
            clipped = _clipped(inputs, contributors)
            return Aggregate(t, sums, weights, contributors, {k: v for k, v in shared.items() if k in contributors},
                             up + shared_bytes, down + received, sum(clipped.values()), clipped)
        sums, weights = zero_sums(uploads)
        return Aggregate(t, sums, weights, (), {}, up + shared_bytes, down + received, 0, {})

    def rounding(self, round_index: int, client_id: int, secret: int | None = None) -> np.random.Generator:
        """The stochastic rounding draws of one client's ring vector, from the run seed: every
        process that quantises a client's upload (in-process, or its Flower node) rounds it alike,
        so the ring sums — and the new global model — are the same bit for bit; from a Flower node's
        ``secret`` randomness where the node keeps its vector from being recomputed elsewhere."""
        return numpy_rng(self.run_seed if secret is None else secret, "secagg/rounding", round_index, client_id)

    # ---- ring layout ---------------------------------------------------------------------------

    def layout(self, shape: Sequence[Sequence]) -> RingLayout:
        """The ring layout of uploads of this ``shape`` (see :func:`ring_shape`), with this run's quantisers."""
        segments, start = [], 0
        for name, numel, encoding, bound, *rest in sorted(shape, key=lambda entry: entry[0]):
            if encoding == "ring":
                segments.append(_Segment(name, start, numel, None))
                start += numel
                continue
            statistics = [tuple(run) for run in (rest[0] if rest else ())]
            quantizer = self.quantizer(bound)
            segments.append(_Segment(name, start, numel + 1, quantizer,
                                     self._pieces(numel, quantizer, statistics)))
            start += numel + 1
        return RingLayout(tuple(segments))

    def _pieces(self, numel: int, values: protocols.Quantizer, statistics: Sequence[tuple[int, int]]) -> tuple[_Piece, ...]:
        """The summand's values cut into runs, each with its range: statistics in ``stats_clip``."""
        stats = self.quantizer(self.stats_clip)
        pieces, at = [], 0
        for begin, length in statistics:
            if begin > at:
                pieces.append(_Piece(at, begin - at, values))
            pieces.append(_Piece(begin, length, stats))
            at = begin + length
        if at < numel or not pieces:
            pieces.append(_Piece(at, numel - at, values))
        return tuple(pieces)


def _clipped(inputs: Mapping[int, tuple[Any, Mapping[str, int]]], contributors: Sequence[int]) -> dict[str, int]:
    """Per summand, the coordinates the ring's range clipped in the released sum: the contributors'
    only (found by review: a client that dropped before masking was counted, its count un-noised)."""
    out: dict[str, int] = {}
    for k in contributors:
        for key, count in inputs[k][1].items():
            out[key] = out.get(key, 0) + count
    return out


def ring_shape(upload: Upload) -> list[tuple[str, int, str, float | None, list[list[int]]]]:
    """What a ring layout depends on, and no value: (name, size, encoding, bound, statistics runs) per
    summed vector. A Flower node announces this; the server rebuilds the layout from it."""
    return [(name, s.vector.numel(), s.encoding, s.bound, [list(run) for run in s.statistics])
            for name, s in sorted(upload.summed.items())]


@dataclass(frozen=True)
class RingLayout:
    """Where each summed vector lies in a client's ring vector: an upload → its ring vector, a summed
    ring vector → the decoded sums. The secure channel and the Flower transport both use it."""

    segments: tuple[_Segment, ...]

    @property
    def length(self) -> int:
        return sum(s.length for s in self.segments)

    def ring_vector(self, upload: Upload, rng: np.random.Generator) -> tuple[np.ndarray, int]:
        """One client's ring vector and how many of its values were clipped to the segments' bounds."""
        vector, clipped = self.ring_vector_by_name(upload, rng)
        return vector, sum(clipped.values())

    def ring_vector_by_name(self, upload: Upload, rng: np.random.Generator) -> tuple[np.ndarray, dict[str, int]]:
        """One client's ring vector and, per summed vector, how many of its values were clipped (a
        vector's BatchNorm statistics counted apart, under ``NAME/statistics``)."""
        out = protocols.parallel.zeros(self.length)
        clipped: dict[str, int] = {}
        for seg in self.segments:
            s: Summand = upload.summed[seg.name]
            part = out[seg.start : seg.start + seg.length]
            if seg.quantizer is None:
                part[:] = to_ring(s.vector.numpy(), RING_BITS)
                continue
            # [w·x, w], each run of x in its own range, then the weight (the draws from rng in order)
            values = s.vector.numpy()
            for piece in seg.pieces:
                window = slice(piece.start, piece.start + piece.length)
                key = seg.name if piece.quantizer is seg.quantizer else f"{seg.name}/{STATISTICS}"
                count = piece.quantizer.quantize_into(part[window], values[window], rng, weight=s.weight)
                clipped[key] = clipped.get(key, 0) + count
            clipped[seg.name] = clipped.get(seg.name, 0) + \
                seg.quantizer.quantize_into(part[-1:], np.array([s.weight]), rng)
        return out, clipped

    def decode(self, total: np.ndarray, contributors: int) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
        """The sums Σ w·x and Σ w per name from a summed ring vector of ``contributors`` clients."""
        sums: dict[str, torch.Tensor] = {}
        weights: dict[str, float] = {}
        for seg in self.segments:
            part = total[seg.start : seg.start + seg.length]
            if seg.quantizer is None:
                sums[seg.name] = torch.from_numpy(part.astype(np.int64))
                weights[seg.name] = float(contributors)
            else:
                values = np.empty(seg.length - 1, dtype=np.float32)
                for piece in seg.pieces:
                    window = slice(piece.start, piece.start + piece.length)
                    values[window] = piece.quantizer.from_ring(part[window], dtype=np.float32)
                sums[seg.name] = torch.from_numpy(values)
                weights[seg.name] = float(seg.quantizer.from_ring(part[-1:])[0])
        return sums, weights


def _hash(uploads: Sequence[Upload], client_id: int) -> bytes:
    upload = next(u for u in uploads if u.client_id == client_id)
    assert upload.model_hash is not None, "authenticated secure aggregation needs every upload's model hash"
    return upload.model_hash


def _round_down(value: float) -> str:
    """``value`` to three significant digits, never above it (a suggested bound that still passes)."""
    digits = 2 - math.floor(math.log10(value)) if value > 0 else 0
    return f"{math.floor(value * 10**digits) / 10**digits:.3g}"
