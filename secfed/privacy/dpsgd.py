"""Example-level DP-SGD inside one client, with Opacus' parts.

What Opacus needs, and how secfed meets it:

* **No BatchNorm.** A BatchNorm output depends on the other examples of the batch, so per-example
  gradients would not be per-example. :func:`dp_compatible` applies Opacus' rule (``ModuleValidator.fix``:
  BatchNorm2d → GroupNorm(gcd(32, C), C)) to the backbone, and turns the neck's BatchNorm1d into
  GroupNorm(1, C) — on a (batch, C) feature a group of one channel would normalise every value to 0.
  This changes the architecture, so the server and *every* client must build their models through
  it (and the evaluation model too); DP-trained models have no running statistics to share.
* **Per-example gradients on torchvision ResNets.** Opacus' ``hooks`` mode (and ``functorch``, which
  still hooks each module) fails on them: the in-place ``ReLU(inplace=True)`` and ``out += identity``
  modify a hooked module's output ("Output 0 of BackwardHookFunction is a view and is being modified
  inplace"). The ``ew`` mode (PyTorch's ExpandedWeights) computes them without module hooks and works
  on the unmodified model; its per-example gradients match a vmap reference (see the tests).
* **Poisson batches.** The accountant's amplification assumes each example joins each batch
  independently with rate q, and that nobody knows which: use :func:`poisson_schedule` and
  :func:`secfed.privacy.sampling.poisson_batches` over a NoiseSource generator (batches recomputed from
  the run seed would void the amplification). An empty batch still takes a (noise-only) step:
  :meth:`PrivateTraining.empty_step`.
* **Per-example losses only.** The loss must be a mean of per-example terms (cross-entropy is);
  batch-level terms such as batch-hard triplet mining couple examples and void the guarantee.
* **Every trained parameter goes through the private optimiser,** the local classifier included: a
  non-private head would feed data into later private backbone steps.

The wrapped module prefixes parameter names with ``_module.``; it shares its parameters with the
plain model, so keep using the plain model's ``state_dict()`` for the shared weights, or map names with
:func:`plain_name`.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from opacus.grad_sample.utils import prepare_module
from opacus.optimizers import DPOptimizer
from opacus.optimizers.optimizer import _check_processed_flag, _mark_as_processed
from opacus.validators import ModuleValidator
from torch import nn

from secfed.privacy.accountant import SampledGaussianAccountant
from secfed.privacy.noise import NoiseSource, gaussian
from secfed.privacy.sampling import poisson_batches

GRAD_SAMPLE_MODE = "ew"
_WRAPPER_PREFIX = "_module."


def dp_compatible(model: nn.Module) -> nn.Module:
    """A copy of ``model`` with every BatchNorm replaced as described in the module docstring."""
    fixed = copy.deepcopy(model)
    for parent in list(fixed.modules()):
        for child_name, child in list(parent.named_children()):
            if isinstance(child, nn.BatchNorm1d):
                setattr(parent, child_name, nn.GroupNorm(1, child.num_features, affine=child.affine))
    fixed = ModuleValidator.fix(fixed)
    errors = _layer_errors(fixed)
    if errors:
        raise ValueError("model still has layers Opacus cannot train privately: " + "; ".join(map(str, errors)))
    return fixed


def _layer_errors(model: nn.Module) -> list[Exception]:
    """Opacus' validation of the layers alone: it also insists on training mode, which is the caller's
    business (an evaluation-mode model has the same layers), so validate in training mode and restore."""
    modes = {module: module.training for module in model.modules()}
    try:
        model.train()
        return ModuleValidator.validate(model, strict=False)
    finally:
        for module, training in modes.items():
            module.training = training


def plain_name(name: str) -> str:
    """A wrapped module's parameter/state name → the plain model's (``_module.backbone.x`` → ``backbone.x``)."""
    while name.startswith(_WRAPPER_PREFIX):
        name = name[len(_WRAPPER_PREFIX) :]
    return name


def poisson_schedule(num_examples: int, batch_size: int) -> tuple[float, int]:
    """(sample rate q, steps per epoch) for Poisson batches of expected size ``batch_size``.

    q = B/n and round(n/B) steps per epoch, as Opacus' ``DPDataLoader`` does.
    """
    if num_examples < 1 or batch_size < 1:
        raise ValueError(f"need ≥ 1 example and batch size ≥ 1, got {num_examples} and {batch_size}")
    rate = min(1.0, batch_size / num_examples)
    return rate, max(1, round(1 / rate))


@dataclass
class PrivateTraining:
    """What :func:`make_private` returns: call ``module`` for the forward pass, step ``optimizer``.

    ``accountant`` advances by one step (noise multiplier, sample rate) per optimiser step.
    """

    module: nn.Module
    optimizer: DPOptimizer
    accountant: SampledGaussianAccountant
    sample_rate: float

    def empty_step(self) -> None:
        """The step of an empty Poisson batch: no gradient, noise only, and it is accounted."""
        self.optimizer.zero_grad(set_to_none=True)
        for p in self.optimizer.params:
            p.grad_sample = torch.zeros((0, *p.shape), dtype=p.dtype, device=p.device)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)

    def epsilon(self, delta: float) -> float:
        return self.accountant.epsilon(delta)


class SecureNoiseDPOptimizer(DPOptimizer):
    """Opacus' DPOptimizer whose Gaussian noise comes from a :class:`~secfed.privacy.noise.NoiseSource`
    generator (AES-CTR keyed by OS entropy, floating-point hardened) instead of torch's generator —
    Opacus' own ``secure_mode`` needs torchcsprng, which is no longer maintained."""

    def __init__(self, *args, noise_generator: np.random.Generator, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.noise_generator = noise_generator

    def add_noise(self) -> None:
        std = self.noise_multiplier * self.max_grad_norm
        for p in self.params:
            _check_processed_flag(p.summed_grad)
            noise = gaussian(tuple(p.summed_grad.shape), std, self.noise_generator, device=p.summed_grad.device)
            p.grad = (p.summed_grad + noise.to(p.summed_grad.dtype)).view_as(p)
            _mark_as_processed(p.summed_grad)


def make_private(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    *,
    noise_multiplier: float,
    max_grad_norm: float,
    sample_rate: float,
    expected_batch_size: int,
    noise_generator: np.random.Generator,
    accountant: SampledGaussianAccountant | None = None,
) -> PrivateTraining:
    """Wrap ``model`` and ``optimizer`` for DP-SGD (per-example clipping to ``max_grad_norm``, Gaussian
    noise of std ``noise_multiplier · max_grad_norm`` on the sum, averaged over ``expected_batch_size``).

    ``optimizer`` must be built over ``model.parameters()``. Pass the client's persistent
    ``accountant`` so ε accumulates across rounds; ``noise_generator`` (from a NoiseSource) draws the noise.
    """
    errors = _layer_errors(model)
    if errors:
        raise ValueError(
            "the model is not DP-SGD compatible (build it with secfed.privacy.dp_compatible): "
            + "; ".join(map(str, errors))
        )
    if not (math.isfinite(noise_multiplier) and noise_multiplier >= 0):
        raise ValueError(f"noise multiplier must be a finite number ≥ 0, got {noise_multiplier}")
    if not (math.isfinite(max_grad_norm) and max_grad_norm > 0):
        raise ValueError(f"max grad norm must be a positive finite number, got {max_grad_norm}")
    if not 0 < sample_rate <= 1:
        raise ValueError(f"sample rate must lie in (0, 1], got {sample_rate}")
    if expected_batch_size < 1:
        raise ValueError(f"expected batch size must be ≥ 1, got {expected_batch_size}")
    model_params = {id(p) for p in model.parameters() if p.requires_grad}
    optimised = {id(p) for group in optimizer.param_groups for p in group["params"]}
    if model_params != optimised:
        raise ValueError("the optimiser must hold exactly the model's trainable parameters (a private model trains all of them privately)")
    module = prepare_module(model, GRAD_SAMPLE_MODE, batch_first=True, loss_reduction="mean")
    dp_optimizer = SecureNoiseDPOptimizer(
        optimizer,
        noise_multiplier=noise_multiplier,
        max_grad_norm=max_grad_norm,
        expected_batch_size=expected_batch_size,
        loss_reduction="mean",
        noise_generator=noise_generator,
    )
    accountant = accountant if accountant is not None else SampledGaussianAccountant()
    dp_optimizer.attach_step_hook(accountant.opacus.get_optimizer_hook_fn(sample_rate=sample_rate))
    return PrivateTraining(module=module, optimizer=dp_optimizer, accountant=accountant, sample_rate=sample_rate)


@dataclass
class ClientDpSgd:
    """One client's example-level DP-SGD settings, its accountant (kept across rounds) and where its
    noise comes from."""

    noise_multiplier: float
    max_grad_norm: float
    delta: float
    accountant: SampledGaussianAccountant
    noise: NoiseSource

    def epsilon(self) -> float:
        return self.accountant.epsilon(self.delta)


@dataclass
class PrivateLoop:
    """The three parts of a local training loop that DP-SGD replaces: module, optimiser, batches."""

    module: nn.Module
    optimizer: DPOptimizer
    batches: Iterator[torch.Tensor]
    empty_step: Callable[[], None]


def privatise(model: nn.Module, optimizer: torch.optim.Optimizer, dp: ClientDpSgd, num_examples: int,
              schedule: Any, generator: torch.Generator) -> PrivateLoop:
    """DP-SGD for a local loop: Poisson batches of expected size B (rate q = B/n, round(1/q) steps per
    epoch), per-example clipping, secure Gaussian noise, every step accounted in ``dp.accountant``.
    The noise and the batches (amplification holds only while they are secret) come from ``dp.noise``;
    ``generator`` (training randomness) only tells a reproducible NoiseSource this round from others."""
    rate, steps_per_epoch = poisson_schedule(num_examples, schedule.batch_size)
    local_round = int(torch.randint(0, 2**62, (1,), generator=generator))
    private = make_private(
        model, optimizer, noise_multiplier=dp.noise_multiplier, max_grad_norm=dp.max_grad_norm,
        sample_rate=rate, expected_batch_size=schedule.batch_size, accountant=dp.accountant,
        noise_generator=dp.noise.generator("dp-sgd", local_round),
    )
    rng = dp.noise.generator("dp-sgd/batches", local_round)
    batches = (torch.from_numpy(b) for b in poisson_batches(num_examples, rate, steps_per_epoch * schedule.epochs, rng))
    return PrivateLoop(private.module, private.optimizer, batches, private.empty_step)
