"""The seed paper's β white noise (Wu & Gong, AAAI 2021, Eqs. 14–15), exactly.

    Eq. 14 (``single``, the default):  θ_{k+1} = mean of the cohort's shared weights + β·N(0, 1)
    Eq. 15 (``double``, in addition):  client i starts round k+1 from θ_{k+1} + β·N(0, 1),
                                       fresh noise for every client

Noise goes on trainable weights only: BatchNorm running statistics and counters are never
perturbed (a noised running variance can go negative, and a counter is not a weight).

β alone is not differential privacy — nothing bounds a client's contribution. With ``--clip C``
the same noise is a Gaussian mechanism with noise multiplier z = W·β/C; :mod:`secfed.privacy.policy`
decides whether an ε may be printed. The generic "add N(0, std²) to the trainable coordinates"
below is therefore also what the server uses for DP-FedAvg's central noise.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Literal, TypeVar

import numpy as np
import torch

from secfed.privacy.noise import NoiseSource, gaussian

BetaMode = Literal["single", "double"]
_BN_STATE_SUFFIXES = (".running_mean", ".running_var", ".num_batches_tracked")

Weights = TypeVar("Weights", torch.Tensor, Mapping[str, torch.Tensor])


def add_beta_noise(weights: Weights, beta: float, trainable_mask: torch.Tensor | Iterable[str],
                   generator: np.random.Generator) -> Weights:
    """Return ``weights`` + β·N(0, 1) on the trainable entries only (a new tensor or dict).

    ``weights`` is either a flat float vector with ``trainable_mask`` a bool tensor of the same
    shape (``SharedLayout.trainable_mask()``), or a state-dict-like mapping with ``trainable_mask``
    the names of its trainable tensors. Non-trainable entries come back bit-identical. Noise is drawn
    from ``generator`` (a :class:`~secfed.privacy.noise.NoiseSource` generator) in a fixed order
    (flat: one draw per entry, used on the mask only; dict: the mapping's order).

    Raises ``ValueError`` when β is negative or not finite, when the mask does not fit the vector,
    or when a BatchNorm running statistic or counter is marked trainable.
    """
    if not (math.isfinite(beta) and beta >= 0):
        raise ValueError(f"β must be a finite number ≥ 0, got {beta}")
    if isinstance(weights, torch.Tensor):
        return _noise_flat(weights, beta, trainable_mask, generator)
    return _noise_dict(weights, beta, trainable_mask, generator)


def _noise_flat(vector: torch.Tensor, beta: float, mask: object, generator: np.random.Generator) -> torch.Tensor:
    if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool:
        raise TypeError("a flat weight vector needs a bool tensor mask (SharedLayout.trainable_mask())")
    if mask.shape != vector.shape:
        raise ValueError(f"mask shape {tuple(mask.shape)} does not match weights shape {tuple(vector.shape)}")
    if not vector.is_floating_point():
        raise TypeError(f"weights must be floating point, got {vector.dtype}")
    if beta == 0:
        return vector.detach().clone()
    # One draw per entry, used only on the mask: a fixed order, and no slow boolean gather/scatter;
    # torch.where keeps the other entries bit-identical (even a -0.0 running mean).
    noise = gaussian(tuple(vector.shape), beta, generator, device=vector.device)
    return torch.where(mask, vector.detach() + noise.to(vector.dtype), vector.detach())


def _noise_dict(
    state: Mapping[str, torch.Tensor], beta: float, names: object, generator: np.random.Generator
) -> dict[str, torch.Tensor]:
    if isinstance(names, torch.Tensor):
        raise TypeError("a dict of weights needs the names of its trainable tensors as the mask")
    trainable = set(names)  # type: ignore[arg-type]
    unknown = trainable - set(state)
    if unknown:
        raise ValueError(f"trainable names not in the weights: {', '.join(sorted(unknown))}")
    for name in trainable:
        if name.endswith(_BN_STATE_SUFFIXES):
            raise ValueError(f"{name} is BatchNorm state, not a trainable weight: β noise never goes there")
        if not state[name].is_floating_point():
            raise ValueError(f"{name} is {state[name].dtype}; β noise goes only on floating-point weights")
    out: dict[str, torch.Tensor] = {}
    for name, tensor in state.items():
        value = tensor.detach().clone()
        if name in trainable and beta > 0:
            value += gaussian(tuple(value.shape), beta, generator, device=value.device).to(value.dtype)
        out[name] = value
    return out


class BetaNoise:
    """Eqs. 14–15 for the server, every draw from a :class:`~secfed.privacy.noise.NoiseSource`.

    ``aggregate`` is Eq. 14 (always on when β > 0). ``broadcast`` is Eq. 15: in ``double`` mode each
    selected client gets θ + its own fresh noise; in ``single`` mode it gets θ unchanged.

    In ``double`` mode a client's update Δ_i = ω_i − (θ + n_i) is measured from its noised start,
    while Eq. 14 averages the client weights ω_i themselves. The server drew n_i, keeps the key of
    each draw in memory until :meth:`end_round`, regenerates n_i and adds back their weighted mean
    over the contributors, so that θ + mean(Δ_i) + mean(n_i) = mean(ω_i) exactly as in the paper.
    This needs per-client weights the server knows (public enrolment sizes, or 1 under DP).
    """

    def __init__(self, beta: float, mode: BetaMode, trainable_mask: torch.Tensor, source: NoiseSource) -> None:
        if mode not in ("single", "double"):
            raise ValueError(f"β mode must be 'single' or 'double', got {mode!r}")
        if not (math.isfinite(beta) and beta >= 0):
            raise ValueError(f"β must be a finite number ≥ 0, got {beta}")
        self.beta = beta
        self.mode: BetaMode = mode
        self.trainable_mask = trainable_mask
        self.source = source
        self._keys: dict[tuple[int, int], int] = {}  # (round, client) → key of its broadcast noise

    def aggregate(self, new_global: torch.Tensor, round_index: int) -> torch.Tensor:
        """Eq. 14: the freshly averaged shared weights + β·N(0, 1) on trainable entries."""
        return add_beta_noise(new_global, self.beta, self.trainable_mask, self.source.generator("beta/aggregate", round_index))

    def broadcast_noise(self, round_index: int, client_id: int) -> torch.Tensor:
        """n_i of Eq. 15 for one client (zeros in ``single`` mode); the same draw every call this round."""
        zeros = torch.zeros(self.trainable_mask.shape, dtype=torch.float32)
        if self.mode == "single":
            return zeros
        key = self._keys.setdefault((round_index, client_id), self.source.key("beta/broadcast", round_index, client_id))
        return add_beta_noise(zeros, self.beta, self.trainable_mask, NoiseSource.from_key(key))

    def broadcast(self, weights: torch.Tensor, round_index: int, client_id: int) -> torch.Tensor:
        """Eq. 15: what client ``client_id`` receives at the start of round ``round_index``."""
        if self.mode == "single":
            return weights.detach().clone()
        return weights.detach() + self.broadcast_noise(round_index, client_id).to(weights.dtype)

    def end_round(self, round_index: int) -> None:
        """Forget the round's broadcast-noise keys (they never leave memory)."""
        self._keys = {k: v for k, v in self._keys.items() if k[0] != round_index}
