"""What every federated ReID method is made of: a client rule and a server rule.

A method answers four questions — which tensors it shares (:mod:`secfed.models.sharing`), how a
client trains locally, what aggregation weight a client's update carries, and how the server turns
the aggregate into new global weights. FedPav and FedAvg answer them with the plain supervised rule
below; later methods (KD, CDW, FedReID, DFH) override one answer each.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from secfed.data.augment import TrainAugment, epoch_batches
from secfed.federation.messages import Aggregate
from secfed.privacy.dpsgd import ClientDpSgd, make_private, poisson_schedule
from secfed.privacy.sampling import poisson_batches


@dataclass(frozen=True)
class Schedule:
    """Learning rates of one round (already decayed for the round) and the local budget."""

    lr_backbone: float
    lr_new: float
    epochs: int
    batch_size: int
    momentum: float = 0.9
    weight_decay: float = 5e-4


def step_lr(base: float, round_index: int, step: int, gamma: float) -> float:
    """Step decay over global rounds: base · gamma^⌊round/step⌋.

    FedReIDBench's reference code rebuilds its scheduler inside every round, so its "step size 40"
    never fires; here the schedule is a function of the global round and really decays.
    """
    return base * gamma ** (round_index // step)


@dataclass
class TrainStats:
    loss: float  # mean cross-entropy over the examples seen
    accuracy: float  # training accuracy of the identity classifier
    examples: int
    steps: int


def make_optimizer(model: nn.Module, schedule: Schedule) -> torch.optim.SGD:
    """SGD with FedReIDBench's two learning rates: backbone vs. layers trained from scratch."""
    backbone = [p for n, p in model.named_parameters() if n.startswith("backbone.") and p.requires_grad]
    new = [p for n, p in model.named_parameters() if not n.startswith("backbone.") and p.requires_grad]
    return torch.optim.SGD(
        [{"params": backbone, "lr": schedule.lr_backbone}, {"params": new, "lr": schedule.lr_new}],
        momentum=schedule.momentum,
        weight_decay=schedule.weight_decay,
        nesterov=False,
    )


def train_supervised(
    model: nn.Module,
    images: torch.Tensor,
    labels: torch.Tensor,
    schedule: Schedule,
    generator: torch.Generator,
    dp: ClientDpSgd | None = None,
) -> TrainStats:
    """E local epochs of identity classification (cross-entropy) over in-memory uint8 images.

    ``generator`` drives shuffling, augmentation (and DP-SGD noise); dropout uses torch's global
    RNG, which the caller seeds per (run, round, client) before calling. With ``dp``, training is
    example-level DP-SGD (Opacus): Poisson batches, per-example clipping and noise, accounted in
    ``dp.accountant``.
    """
    model.train()
    augment = TrainAugment()  # FedReIDBench's default: pad + random crop + horizontal flip
    optimizer = make_optimizer(model, schedule)
    forward: Callable[[torch.Tensor], torch.Tensor] = model
    if dp is None:
        batches = _shuffled_batches(len(images), schedule, generator)
    else:
        rate, steps_per_epoch = poisson_schedule(len(images), schedule.batch_size)
        # DP-SGD's noise is drawn where the parameters live, from a generator seeded by ``generator``
        noise = torch.Generator(device=labels.device).manual_seed(int(torch.randint(0, 2**62, (1,), generator=generator)))
        private = make_private(
            model, optimizer, noise_multiplier=dp.noise_multiplier, max_grad_norm=dp.max_grad_norm,
            sample_rate=rate, expected_batch_size=schedule.batch_size, accountant=dp.accountant, generator=noise,
        )
        forward, optimizer = private.module, private.optimizer
        rng = np.random.default_rng(int(torch.randint(0, 2**62, (1,), generator=generator)))
        batches = _poisson_batches(len(images), rate, steps_per_epoch * schedule.epochs, rng)

    # accumulated on the device: no host synchronisation per step
    total_loss = torch.zeros((), dtype=torch.float64, device=labels.device)
    correct = torch.zeros((), dtype=torch.int64, device=labels.device)
    examples = steps = 0
    for index in batches:
        if len(index) == 0:  # an empty Poisson batch still takes its (noise-only, accounted) step
            private.empty_step()
            steps += 1
            continue
        inputs = augment(images[index], generator)
        targets = labels[index]
        optimizer.zero_grad(set_to_none=True)  # before the forward: DP-SGD's per-example grads must be clear
        logits = forward(inputs)
        loss = F.cross_entropy(logits, targets)
        loss.backward()
        optimizer.step()
        total_loss += loss.detach() * len(index)
        correct += (logits.detach().argmax(1) == targets).sum()
        examples += len(index)
        steps += 1
    optimizer.zero_grad(set_to_none=True)  # also drops DP-SGD's per-example gradients
    return TrainStats(float(total_loss) / max(examples, 1), int(correct) / max(examples, 1), examples, steps)


def _poisson_batches(n: int, rate: float, steps: int, rng: np.random.Generator) -> Iterator[torch.Tensor]:
    for batch in poisson_batches(n, rate, steps, rng):
        yield torch.from_numpy(batch)


def _shuffled_batches(n: int, schedule: Schedule, generator: torch.Generator) -> Iterator[torch.Tensor]:
    for _ in range(schedule.epochs):
        yield from epoch_batches(n, schedule.batch_size, generator)


def weighted_mean_step(global_weights: torch.Tensor, aggregate: Aggregate) -> torch.Tensor:
    """w ← w + Σ weight_k·Δ_k / Σ weight_k (FedAvg's n_k/n weighting when weight_k ∝ n_k)."""
    if aggregate.weight <= 0:
        raise ValueError(f"round {aggregate.round}: aggregate carries no weight (no client contributed)")
    return global_weights + aggregate.total / aggregate.weight
