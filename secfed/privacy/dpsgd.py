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

Only Opacus' public API is used (``GradSampleModuleExpandedWeights``, ``DPOptimizer``,
``ModuleValidator``, the RDP accountant). Its front door ``PrivacyEngine.make_private`` is not: it
builds its own data loader whose Poisson batches and noise come from torch's generator (secure only
with the unmaintained torchcsprng), while secfed draws the noise from its NoiseSource and trains on
index batches of tensors already on the device. :func:`make_private` composes the same parts.

The framework, not a method, applies DP-SGD: a client's step runs inside
:func:`private_local_training`, and :func:`secfed.algorithms.base.train_loop` privatises itself
there (:meth:`LocalDpSgd.privatise`), for any method.

The wrapped module prefixes parameter names with ``_module.``; it shares its parameters with the
plain model, so keep using the plain model's ``state_dict()`` for the shared weights, or map names with
:func:`plain_name`.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import nn

from secfed.privacy.accountant import SampledGaussianAccountant
from secfed.privacy.noise import NoiseSource
from secfed.privacy.sampling import poisson_batches

if TYPE_CHECKING:
    from opacus.optimizers import DPOptimizer

    from secfed.algorithms.base import Schedule

# Opacus is imported where its parts are used (and the DPOptimizer subclass lives in
# secure_optimizer.py): ``import opacus`` costs about a second, which runs without DP-SGD skip.

_WRAPPER_PREFIX = "_module."


def dp_compatible(model: nn.Module) -> nn.Module:
    """A copy of ``model`` with every BatchNorm replaced as described in the module docstring."""
    from opacus.validators import ModuleValidator

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
    from opacus.validators import ModuleValidator

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
        _empty_grad_samples(self.optimizer)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)

    def epsilon(self, delta: float) -> float:
        return self.accountant.epsilon(delta)


def _empty_grad_samples(optimizer: DPOptimizer) -> None:
    """Per-example gradients of an empty batch, so that the next step adds noise only."""
    for p in optimizer.params:
        p.grad_sample = torch.zeros((0, *p.shape), dtype=p.dtype, device=p.device)


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
    from opacus.grad_sample import GradSampleModuleExpandedWeights

    from secfed.privacy.secure_optimizer import SecureNoiseDPOptimizer

    module = GradSampleModuleExpandedWeights(model, batch_first=True, loss_reduction="mean")
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
    """One client's example-level DP-SGD settings, its accountant (kept across rounds), where its
    noise comes from, and the example count n_k its noise and δ were set for."""

    noise_multiplier: float
    max_grad_norm: float
    delta: float
    accountant: SampledGaussianAccountant
    noise: NoiseSource
    num_examples: int

    def epsilon(self) -> float:
        return self.accountant.epsilon(self.delta)

    def epsilon_every_round(self, batch_size: int, local_epochs: int, rounds: int) -> float:
        """ε of a client that trained in every one of ``rounds`` rounds (one loop of ``local_epochs``
        Poisson epochs each): what a run with secret client cohorts publishes, since the ε a client's
        own accountant holds counts the rounds it was selected for and so gives the cohorts away."""
        rate, steps_per_epoch = poisson_schedule(self.num_examples, batch_size)
        every = SampledGaussianAccountant()
        if rounds > 0:
            every.load_state_dict({**every.state_dict(), "history": [
                [self.noise_multiplier, rate, steps_per_epoch * local_epochs * rounds]]})
        return every.epsilon(self.delta)


class DpSgdUnsupported(ValueError):
    """A method's local training cannot run under example-level DP-SGD as written (names the method)."""

    def __init__(self, method: str, why: str) -> None:
        self.method = method
        super().__init__(f"method {method!r} does not support --dp-sgd: {why}")


@dataclass
class PrivateLoop:
    """The parts of a local training loop that DP-SGD replaces: module, optimiser, batches."""

    module: nn.Module
    optimizer: DPOptimizer
    batches: Iterator[torch.Tensor]
    method: str

    def empty_batch(self) -> None:
        """An empty Poisson batch: no per-example gradient; its step adds noise only and is accounted."""
        _empty_grad_samples(self.optimizer)

    def check_per_example(self) -> None:
        """After the loss's backward: Opacus' ExpandedWeights leave ``p.grad`` unset and put the gradient
        in ``p.grad_sample``, so a ``p.grad`` means a loss term reached the weights outside the model's
        forward pass — a gradient that is neither per-example nor clipped. Refused, never dropped."""
        if any(p.grad is not None for p in self.optimizer.params):
            raise DpSgdUnsupported(self.method, "its loss reaches the weights outside the model's forward pass, so "
                                   "that part of its gradient is not per-example and cannot be clipped (give a "
                                   "data-independent term to train_loop as `penalty`)")


@dataclass
class LocalDpSgd:
    """One client's local training under DP-SGD, as the framework runs it around *any* method's
    ``local_train``: :func:`secfed.algorithms.base.train_loop` finds it (:func:`active`) and privatises
    its loop; afterwards the caller's :meth:`check` refuses a model that moved by steps the accountant
    did not count."""

    dp: ClientDpSgd
    num_examples: int
    schedule: Schedule
    method: str
    loops: int = 0
    steps_before: int = field(init=False)

    def __post_init__(self) -> None:
        self.steps_before = self.dp.accountant.steps

    @property
    def accounted_steps(self) -> int:
        return self.dp.accountant.steps - self.steps_before

    def check(self, steps: int, trained: bool) -> None:
        """After the local training: ``steps`` optimiser steps the method reports, ``trained`` whether
        its model changed. Every step must have been a private, accounted one — a method that trains
        some other way is refused before anything is uploaded, so no ε of 0 is ever reported for a
        client whose model trained."""
        if steps > self.accounted_steps or (trained and self.accounted_steps == 0):
            raise DpSgdUnsupported(self.method, f"its local training trained outside secfed's train_loop ({steps} "
                                   f"steps reported, {self.accounted_steps} clipped, noised and accounted); train "
                                   "through train_loop, or declare `dp_sgd_unsupported`")

    def privatise(self, model: nn.Module, optimizer: torch.optim.Optimizer, generator: torch.Generator) -> PrivateLoop:
        """DP-SGD for the loop: Poisson batches of expected size B (rate q = B/n, round(1/q) steps per
        epoch), per-example clipping, secure Gaussian noise, every step accounted in ``dp.accountant``.
        The noise multiplier was calibrated for one such loop per round, so a second one is refused."""
        if self.loops:
            raise DpSgdUnsupported(self.method, "its local training runs more than one training loop per round, "
                                   "beyond the steps the noise multiplier was calibrated for")
        self.loops += 1
        dp, schedule = self.dp, self.schedule
        rate, steps_per_epoch = poisson_schedule(self.num_examples, schedule.batch_size)
        # ``generator`` (training randomness) only tells a reproducible NoiseSource this loop from others;
        # the noise and the batches themselves come from the CSPRNG (amplification needs them secret)
        local_round = int(torch.randint(0, 2**62, (1,), generator=generator))
        private = make_private(
            model, optimizer, noise_multiplier=dp.noise_multiplier, max_grad_norm=dp.max_grad_norm,
            sample_rate=rate, expected_batch_size=schedule.batch_size, accountant=dp.accountant,
            noise_generator=dp.noise.generator("dp-sgd", local_round),
        )
        batches = private_batches(self.num_examples, rate, steps_per_epoch * schedule.epochs,
                                  dp.noise.generator("dp-sgd/batches", local_round))
        return PrivateLoop(private.module, private.optimizer, batches, self.method)


def private_batches(num_examples: int, rate: float, steps: int, rng: np.random.Generator) -> Iterator[torch.Tensor]:
    """The Poisson batches (index tensors) of one private loop, drawn from ``rng`` — the client's
    CSPRNG noise source, so nothing in the run directory recomputes them."""
    return (torch.from_numpy(b) for b in poisson_batches(num_examples, rate, steps, rng))


_ACTIVE: ContextVar[LocalDpSgd | None] = ContextVar("secfed_local_dp_sgd", default=None)


def active() -> LocalDpSgd | None:
    """The DP-SGD of the local training running in this thread, if any."""
    return _ACTIVE.get()


@contextmanager
def private_local_training(dp: ClientDpSgd | None, num_examples: int, schedule: Schedule,
                           method: str) -> Iterator[LocalDpSgd | None]:
    """Run a method's local training (the block) under example-level DP-SGD when ``dp`` is given:
    every :func:`~secfed.algorithms.base.train_loop` inside it trains privately, whatever the method.
    Call :meth:`LocalDpSgd.check` with what the block did before anything leaves the client."""
    if dp is None:
        yield None
        return
    token = _ACTIVE.set(LocalDpSgd(dp, num_examples, schedule, method))
    try:
        yield _ACTIVE.get()
    finally:
        _ACTIVE.reset(token)
