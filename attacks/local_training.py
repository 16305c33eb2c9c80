"""The adversary's model of a client's local training: what turns a batch of images into an update.

A server knows a run's configuration (learning rates, momentum, weight decay, batch size, local
epochs) and each client's number of examples n_k (the public aggregation weights are made of it),
so it knows how many local steps of which batch size a client took — the assumptions every attack
result lists. secfed's clients run SGD with Nesterov momentum and weight decay, from a fresh
optimiser every round (:func:`secfed.algorithms.base.make_optimizer`); one step therefore moves a
parameter by ``-lr·(1+m)·(g + wd·θ)``, which :meth:`LocalSteps.gradient_of_one_step` inverts exactly.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

import torch

from secfed.algorithms.base import Schedule


def in_backbone(name: str) -> bool:
    """The optimiser's rule for which learning rate a parameter gets (make_optimizer)."""
    return name.startswith("backbone.") or ".backbone." in name


@dataclass(frozen=True)
class LocalSteps:
    lr_backbone: float
    lr_new: float
    momentum: float
    weight_decay: float
    batch_size: int
    epochs: int
    examples: int  # n_k

    @classmethod
    def from_schedule(cls, schedule: Schedule, examples: int) -> LocalSteps:
        return cls(schedule.lr_backbone, schedule.lr_new, schedule.momentum, schedule.weight_decay,
                   schedule.batch_size, schedule.epochs, examples)

    @property
    def nesterov(self) -> bool:
        return self.momentum > 0

    @property
    def batch(self) -> int:
        """Images per local step (a shard smaller than one batch trains on all of it)."""
        return min(self.examples, self.batch_size)

    @property
    def batches_per_epoch(self) -> int:
        # epoch_batches: split into batches of B, drop a partial last batch unless it is the only one
        if self.examples <= self.batch_size:
            return 1
        return self.examples // self.batch_size

    @property
    def steps(self) -> int:
        return self.epochs * self.batches_per_epoch

    @property
    def images_seen(self) -> int:
        return self.steps * self.batch

    def lr(self, name: str) -> float:
        return self.lr_backbone if in_backbone(name) else self.lr_new

    @property
    def first_step_factor(self) -> float:
        """Nesterov's first step from an empty momentum buffer moves by (1 + m)·d."""
        return 1.0 + self.momentum if self.nesterov else 1.0

    def gradient_of_one_step(self, delta: Mapping[str, torch.Tensor], start: Mapping[str, torch.Tensor],
                             scale: float = 1.0) -> dict[str, torch.Tensor]:
        """The loss gradient of a one-step update (exact for one step; for several, the gradient of the
        one step that would have moved the weights as far). ``scale``: a known factor the update was
        multiplied by (clipping)."""
        return {name: -d / (scale * self.lr(name) * self.first_step_factor) - self.weight_decay * start[name]
                for name, d in delta.items()}

    def describe(self) -> dict[str, Any]:
        return {**asdict(self), "steps": self.steps, "images_per_step": self.batch}
