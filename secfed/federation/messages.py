"""What travels between server and clients, written down once.

    Broadcast   server → every selected client: the global shared weights and the method's public
                payloads (e.g. every client's domain statistics under DFH)
    Contribution  what a method's client step produces, before the privacy step
    Upload      what leaves a client after the privacy step — exactly what the audit attacks:
                  summed  named vectors, each aggregated as Σ w_k·x_k with Σ w_k in the same
                          masked sum (backbone update, KD soft labels, …); w_k is the client's own
                  shared  named per-client payloads that are NOT summed and that the server sees
                          in the clear (DFH's domain statistics); the privacy statement names them
    Aggregate   what the server learns from a round: per summed name Σ w_k·x_k and Σ w_k over the
                clients whose input made it into the sum, plus the shared payloads

With secure aggregation on, no single Upload's summed part ever reaches the server.
:mod:`secfed.federation.codec` turns Broadcasts and Uploads into bytes and back.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Literal

import torch

from secfed.models.sharing import model_hash

MODEL = "model"  # the summed name of the shared-weight update, present in every method's upload
Encoding = Literal["float", "ring"]


@dataclass(frozen=True)
class Broadcast:
    """Server → every selected client at the start of a round. Nobody writes into its tensors."""

    round: int
    weights: torch.Tensor  # flat float32 global shared weights, in SharedLayout order
    layout_id: str  # SharedLayout.fingerprint(): a client refuses weights of another layout
    payloads: Mapping[str, torch.Tensor] = field(default_factory=dict)  # public extras of the method

    @cached_property
    def weights_hash(self) -> bytes:
        """:func:`~secfed.models.sharing.model_hash` of the weights, computed once per Broadcast: in
        one process the clients that received this very object would each compute the same digest
        of the same bytes (a client that received its own copy — decoded from the wire, or Eq. 15's
        noised weights — holds another object and hashes it itself)."""
        return model_hash(self.weights)


@dataclass(frozen=True)
class Summand:
    """One named vector a client contributes to a masked sum, and its aggregation weight.

    ``encoding="float"``: ``vector`` is float32 x_k; the channel sums w_k·x_k and w_k.
    ``encoding="ring"``: ``vector`` is already an int64 vector in the integer domain of the
    distributed-noise mechanism (noise included, weight 1); the channel sums it as it is and the
    server's privacy step decodes the sum. ``bound``: the per-coordinate range of w_k·x_k the
    channel quantises (values beyond are clipped and counted); None: the channel's default.
    ``statistics``: (start, length) runs of ``vector`` that hold BatchNorm running statistics, which
    the channel quantises in its statistics range instead (they are not bounded by a learning rate).
    """

    vector: torch.Tensor
    weight: float = 1.0
    encoding: Encoding = "float"
    bound: float | None = None
    statistics: tuple[tuple[int, int], ...] = ()


@dataclass
class TrainStats:
    """What local training reports to its own client (never uploaded)."""

    loss: float  # mean training loss over the examples seen
    accuracy: float  # training accuracy of the identity classifier
    examples: int
    steps: int


@dataclass(frozen=True)
class Contribution:
    """A method's client step output, before clipping and noise."""

    summed: Mapping[str, Summand]
    shared: Mapping[str, torch.Tensor] = field(default_factory=dict)
    stats: TrainStats | None = None


@dataclass(frozen=True)
class Upload:
    """Client → server: exactly what leaves the client (the summed part masked when secure aggregation is on)."""

    client_id: int
    round: int
    summed: Mapping[str, Summand]
    shared: Mapping[str, torch.Tensor] = field(default_factory=dict)
    model_hash: bytes | None = None  # model_hash of the weights it received (authenticated secagg compares them)


@dataclass(frozen=True)
class Aggregate:
    """Channel → server: sums over the clients whose input made it into the aggregate."""

    round: int
    sums: Mapping[str, torch.Tensor]  # name → Σ w_k·x_k (float32; int64 for ring-encoded names)
    weights: Mapping[str, float]  # name → Σ w_k
    contributors: tuple[int, ...]  # ids in the sum (the server of a secure aggregation learns this set too)
    shared: Mapping[int, Mapping[str, torch.Tensor]] = field(default_factory=dict)  # client id → its shared payloads
    bytes_up: int = 0  # every byte clients sent in this round
    bytes_down: int = 0  # every byte clients received (the broadcast included)
    # Coordinates clients clipped to the channel's range before quantisation (summed over clients),
    # in all and per summed vector ("NAME/statistics": its BatchNorm statistics) where the channel knows.
    clipped: int = 0
    clipped_by_vector: Mapping[str, int] = field(default_factory=dict)

    @property
    def empty(self) -> bool:
        return not self.contributors
