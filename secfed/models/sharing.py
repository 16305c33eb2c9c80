"""The one place that says which tensors leave a client and which stay.

A method names the prefixes of its shared tensors (``Method.shared_prefixes``); this module applies
the rule:

    shared (travels to the server, is aggregated, is what the audit attacks):
        tensors under the method's prefixes — backbone.* and neck.* (FedPav, DFH), plus
        classifier.* (FedAvg: one classifier over the union of identities), backbone.* alone
        (FedReID: the mapping network stays local)
        BatchNorm running_mean / running_var under those prefixes — only with ``bn_stats="shared"``
    local (never leaves the client):
        everything else (the classifier under FedPav, FedReID's mapping network); BatchNorm running
        statistics with ``bn_stats="local"``; every ``num_batches_tracked`` counter (a counter, not a
        statistic: averaging it is meaningless)

A :class:`SharedLayout` fixes the order and shapes, so the shared state can travel as one flat
float32 vector (what secure aggregation masks) and come back as tensors.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Literal

import torch
from torch import nn

from secfed.protocols.crypto import vector_digest

BN_STAT_SUFFIXES = (".running_mean", ".running_var")


@dataclass(frozen=True)
class Segment:
    """One shared tensor inside the flat vector."""

    name: str
    shape: tuple[int, ...]
    offset: int
    trainable: bool  # a Parameter (True) or a BatchNorm running statistic (False)

    @property
    def numel(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n


@dataclass(frozen=True)
class SharedLayout:
    """Order, shapes and kinds of the shared tensors of a model under a sharing rule."""

    segments: tuple[Segment, ...]

    @property
    def size(self) -> int:
        last = self.segments[-1]
        return last.offset + last.numel

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(s.name for s in self.segments)

    @property
    def nbytes(self) -> int:
        """Bytes of the shared model as float32 (MM'20 §3.5 counts the model size this way)."""
        return 4 * self.size

    def trainable_mask(self) -> torch.Tensor:
        """Bool vector: True where the flat vector holds a trainable weight (β noise goes only there)."""
        mask = torch.zeros(self.size, dtype=torch.bool)
        for seg in self.segments:
            if seg.trainable:
                mask[seg.offset : seg.offset + seg.numel] = True
        return mask

    def statistics_runs(self) -> tuple[tuple[int, int], ...]:
        """(start, length) of each contiguous run of BatchNorm running statistics in the flat vector.
        Not trained by SGD, their change in a round is not bounded by the learning rate: secure
        aggregation quantises them in a range of their own (``secagg.stats_clip``)."""
        runs: list[list[int]] = []
        for seg in self.segments:
            if seg.trainable:
                continue
            if runs and runs[-1][0] + runs[-1][1] == seg.offset:
                runs[-1][1] += seg.numel
            else:
                runs.append([seg.offset, seg.numel])
        return tuple((start, length) for start, length in runs)

    def flatten(self, state: dict[str, torch.Tensor]) -> torch.Tensor:
        """Shared tensors of ``state`` (a state_dict) → one float32 vector, in layout order."""
        return torch.cat([state[s.name].detach().reshape(-1).to(torch.float32) for s in self.segments])

    def unflatten(self, vector: torch.Tensor) -> dict[str, torch.Tensor]:
        """Inverse of :meth:`flatten` (views into ``vector``)."""
        if vector.numel() != self.size:
            raise ValueError(f"vector has {vector.numel()} values, the shared layout has {self.size}")
        return {s.name: vector[s.offset : s.offset + s.numel].view(s.shape) for s in self.segments}

    def fingerprint(self) -> str:
        """Identifies the layout (names and shapes); checkpoints and messages carry it."""
        text = ";".join(f"{s.name}:{'x'.join(map(str, s.shape))}:{int(s.trainable)}" for s in self.segments)
        return hashlib.sha256(text.encode()).hexdigest()[:16]


def is_shared(name: str, prefixes: tuple[str, ...], bn_stats: Literal["shared", "local"]) -> bool:
    """The rule itself, for one state_dict key."""
    if not name.startswith(prefixes):
        return False
    if name.endswith(".num_batches_tracked"):
        return False
    if name.endswith(BN_STAT_SUFFIXES):
        return bn_stats == "shared"
    return True


def shared_layout(
    model: nn.Module, prefixes: tuple[str, ...], bn_stats: Literal["shared", "local"]
) -> SharedLayout:
    params = {name for name, _ in model.named_parameters()}
    segments: list[Segment] = []
    offset = 0
    for name, tensor in model.state_dict().items():
        if not is_shared(name, prefixes, bn_stats):
            continue
        if not tensor.is_floating_point():
            raise TypeError(f"shared tensor {name} is {tensor.dtype}; only float tensors can be aggregated")
        seg = Segment(name, tuple(tensor.shape), offset, name in params)
        segments.append(seg)
        offset += seg.numel
    if not segments:
        raise ValueError("the model has no tensor under the shared prefixes " + ", ".join(prefixes))
    return SharedLayout(tuple(segments))


def local_state(model: nn.Module, layout: SharedLayout) -> dict[str, torch.Tensor]:
    """Everything in the model's state that is not shared: it stays on the client (cloned)."""
    shared = set(layout.names)
    return {k: v.detach().clone() for k, v in model.state_dict().items() if k not in shared}


def load_shared(model: nn.Module, layout: SharedLayout, vector: torch.Tensor) -> None:
    """Overwrite the model's shared tensors with ``vector`` (in place; local tensors untouched)."""
    state = model.state_dict()
    with torch.no_grad():
        for name, value in layout.unflatten(vector).items():
            state[name].copy_(value)


def model_hash(vector: torch.Tensor) -> bytes:
    """The digest of the shared weights' float32 bytes (BLAKE3, two-level, on every core:
    :func:`secfed.protocols.crypto.vector_digest`): every client checks it trained on the same
    global model."""
    data = vector.detach().cpu().contiguous().to(torch.float32).reshape(-1).numpy()
    return vector_digest(data.view("<u4"))
