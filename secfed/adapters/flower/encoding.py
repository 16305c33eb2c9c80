"""What a client's reply becomes in the ring, and what the ring sum becomes on the server.

The session's control record names one of two encodings:

* ``weighted-mean`` (:class:`~secfed.adapters.flower.strategy.SecAggStrategy`): the reply's
  ArrayRecord x (the keys and shapes of the model it was sent, in that order), the weight w of its
  MetricRecord (the strategy's ``weighted_by_key``) and the listed metrics m become
  [w'·x, w', w'·m] with w' = w / max_weight ∈ (0, 1], every coordinate clipped to [−clip, clip]
  and stochastically rounded by ``Quantizer.for_cohort(n, clip)``. The server learns Σw'x, Σw' and
  Σw'm — the weighted means Σwx/Σw, Σwm/Σw and the total weight — and nothing per client. Flower's
  SecAgg+ encodes the same way (its ``max_weight`` and ``clipping_range``).
* ``ring`` (``secfed train --flower``): the app quantizes itself and replies with the ring vector
  (ArrayRecord ``secfed.ring``, key ``vector``, uint32); its other records travel in the clear.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, MetricRecord, RecordDict

from secfed.protocols import MalformedMessage, Quantizer

from .wire import typed

WEIGHTED_MEAN, RING = "weighted-mean", "ring"
RING_RECORD = "secfed.ring"


class ReplyRefused(ValueError):
    """A client's own reply cannot be encoded as the session asks (wrong arrays, weight beyond the
    maximum, missing metric): the client sends nothing of it and drops out of the round."""


@dataclass(frozen=True)
class Encoding:
    """How replies become ring vectors in one session (sent to the clients with the session).

    ``layout``: the arrays' keys, shapes and dtypes (weighted-mean); ``length``: the ring vector's
    length (ring). ``clip``/``max_weight``/``weight_key``/``metrics``: as in the module docstring.
    """

    kind: str
    clip: float = 8.0
    max_weight: float = 1000.0
    weight_key: str = "num-examples"
    metrics: tuple[str, ...] = ()
    layout: tuple[tuple[str, tuple[int, ...], str], ...] = ()
    length: int = 0

    def __post_init__(self) -> None:
        if self.kind not in (WEIGHTED_MEAN, RING):
            raise ValueError(f"encoding must be {WEIGHTED_MEAN!r} or {RING!r}, got {self.kind!r}")
        if not (math.isfinite(self.clip) and self.clip >= 1):
            raise ValueError(f"clip must be a finite number ≥ 1 (a weight of 1 must fit), got {self.clip}")
        if not (math.isfinite(self.max_weight) and self.max_weight > 0):
            raise ValueError(f"max_weight must be a positive finite number, got {self.max_weight}")

    @classmethod
    def weighted_mean(cls, arrays: ArrayRecord, *, clip: float = 8.0, max_weight: float = 1000.0,
                      weight_key: str = "num-examples", metrics: tuple[str, ...] = ()) -> Encoding:
        layout = tuple((key, tuple(a.shape), a.dtype) for key, a in arrays.items())
        return cls(WEIGHTED_MEAN, clip, max_weight, weight_key, tuple(metrics), layout)

    @property
    def dimension(self) -> int:
        if self.kind == RING:
            return self.length
        return sum(math.prod(shape) for _, shape, _ in self.layout) + 1 + len(self.metrics)

    def quantizer(self, n_clients: int) -> Quantizer | None:
        return Quantizer.for_cohort(n_clients, self.clip) if self.kind == WEIGHTED_MEAN else None

    # ---- on the wire (inside the control record) ------------------------------------------------

    def write(self, record: ConfigRecord) -> None:
        record["encoding"] = self.kind
        if self.kind == RING:
            record["length"] = self.length
            return
        record["clip"], record["max-weight"], record["weight-key"] = self.clip, self.max_weight, self.weight_key
        record["metrics"] = list(self.metrics)
        record["array-keys"] = [key for key, _, _ in self.layout]
        record["array-dtypes"] = [dtype for _, _, dtype in self.layout]
        record["array-shapes"] = [",".join(map(str, shape)) for _, shape, _ in self.layout]

    @classmethod
    def read(cls, record: ConfigRecord) -> Encoding:
        kind = typed(record, "encoding", str)
        if kind == RING:
            length = int(typed(record, "length", int))
            if length < 1:
                raise MalformedMessage(f"encoding: ring length {length} must be positive")
            return cls(RING, length=length)
        keys, dtypes, shapes = (typed(record, k, list) for k in ("array-keys", "array-dtypes", "array-shapes"))
        if not len(keys) == len(dtypes) == len(shapes) or not all(isinstance(v, str) for v in [*keys, *dtypes, *shapes]):
            raise MalformedMessage("encoding: array keys, dtypes and shapes must be lists of text of one length")
        try:
            layout = tuple((k, tuple(int(n) for n in s.split(",") if n), d) for k, s, d in zip(keys, shapes, dtypes))
        except ValueError:
            raise MalformedMessage(f"encoding: array shapes {shapes!r} are not comma-separated integers") from None
        metrics = typed(record, "metrics", list)
        if kind != WEIGHTED_MEAN or not all(isinstance(m, str) for m in metrics):
            raise MalformedMessage(f"encoding {kind!r} with metrics {metrics!r}: unknown kind or metric names not text")
        try:
            return cls(kind, float(typed(record, "clip", (float, int))), float(typed(record, "max-weight", (float, int))),
                       str(typed(record, "weight-key", str)), tuple(metrics), layout)
        except ValueError as exc:
            raise MalformedMessage(f"encoding: {exc}") from None

    # ---- client: reply → ring vector ------------------------------------------------------------

    def encode(self, reply: RecordDict, n_clients: int, rng: np.random.Generator) -> tuple[np.ndarray, RecordDict]:
        """The ring vector of ``reply`` and what of it travels in the clear (ring encoding only)."""
        if self.kind == RING:
            return self._ring(reply)
        arrays = list(reply.array_records.values())
        metrics = list(reply.metric_records.values())
        if len(arrays) != 1 or len(metrics) != 1:
            raise ReplyRefused(f"a weighted-mean reply needs one ArrayRecord and one MetricRecord; got "
                               f"{len(arrays)} and {len(metrics)}")
        got = tuple((key, tuple(a.shape)) for key, a in arrays[0].items())
        if got != tuple((key, shape) for key, shape, _ in self.layout):
            raise ReplyRefused(f"reply arrays {got} differ from the model's {[(k, s) for k, s, _ in self.layout]}")
        weight = _number(metrics[0], self.weight_key)
        if not 0 < weight <= self.max_weight:
            raise ReplyRefused(f"weight {self.weight_key} = {weight} must lie in (0, max_weight = {self.max_weight}]")
        scale = weight / self.max_weight
        values = np.empty(self.dimension, dtype=np.float64)
        at = 0
        for a in arrays[0].values():
            flat = np.asarray(a.numpy(), dtype=np.float64).reshape(-1)
            values[at : at + flat.size] = flat
            at += flat.size
        values[at] = 1.0
        values[at + 1 :] = [_number(metrics[0], m) for m in self.metrics]
        values *= scale
        return self.quantizer(n_clients).to_ring(values, rng), RecordDict()

    def _ring(self, reply: RecordDict) -> tuple[np.ndarray, RecordDict]:
        record = reply.array_records.get(RING_RECORD) if RING_RECORD in reply else None
        if record is None or "vector" not in record:
            raise ReplyRefused(f"a ring reply needs an ArrayRecord {RING_RECORD!r} with key 'vector'")
        vector = record["vector"].numpy()
        if vector.dtype != np.uint32 or vector.shape != (self.length,):
            raise ReplyRefused(f"ring vector must be uint32 of length {self.length}, got {vector.dtype} {vector.shape}")
        clear = RecordDict({name: r for name, r in reply.items() if name != RING_RECORD})
        return vector, clear

    # ---- server: ring sum → means ---------------------------------------------------------------

    def decode(self, total: np.ndarray, n_clients: int) -> tuple[ArrayRecord, MetricRecord] | None:
        """Weighted means of the arrays and metrics, and the total weight; None if nobody weighed in."""
        values = self.quantizer(n_clients).from_ring(total)
        d = self.dimension - 1 - len(self.metrics)
        weight = values[d]
        if weight <= 0:
            return None
        arrays, at = ArrayRecord(), 0
        for key, shape, dtype in self.layout:
            size = math.prod(shape)
            arrays[key] = Array((values[at : at + size] / weight).reshape(shape).astype(dtype))
            at += size
        metrics = MetricRecord({self.weight_key: float(weight * self.max_weight)})
        for name, total_m in zip(self.metrics, values[d + 1 :]):
            metrics[name] = float(total_m / weight)
        return arrays, metrics


def _number(record: MetricRecord, key: str) -> float:
    value = record.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ReplyRefused(f"metric {key!r} must be a finite number, got {value!r}")
    return float(value)
