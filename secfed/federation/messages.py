"""What travels between server and clients, written down once.

Everything a client sends is one :class:`Upload`; everything it receives is one :class:`Broadcast`.
The channel turns a cohort's uploads into one :class:`Aggregate` — the only thing the server rule
sees. With secure aggregation on, no single Upload ever reaches the server in the clear.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Broadcast:
    """Server → every selected client at the start of a round."""

    round: int
    weights: torch.Tensor  # flat float32 shared weights, in SharedLayout order
    layout_id: str  # SharedLayout.fingerprint(): a client refuses weights of another layout
    weight_scale: float  # public normaliser: a client's aggregation weight is n_k · weight_scale


@dataclass(frozen=True)
class Upload:
    """Client → server (through the channel): the change of the shared weights and its weight."""

    client_id: int
    round: int
    update: torch.Tensor  # flat float32 Δ = w_k − w_global, after the client's privacy step
    weight: float  # aggregation weight; the channel sends weight·update and weight, masked together
    model_hash: bytes | None  # SHA-256 of the weights it received (authenticated secagg compares them), else None


@dataclass(frozen=True)
class Aggregate:
    """Channel → server: sums over the clients whose input made it into the aggregate."""

    round: int
    total: torch.Tensor  # Σ weight_k · update_k (float32)
    weight: float  # Σ weight_k
    contributors: tuple[int, ...]  # ids in the sum (the server of a secure aggregation learns this set too)
    bytes_up: int  # every byte clients sent in this round's aggregation
    bytes_down: int  # every byte clients received (the broadcast included)
    # Coordinates clients clipped to the channel's range before quantisation (summed over clients).
    # Each client knows its own count; the simulation logs the sum so a bad --secagg-clip shows.
    clipped: int = 0
