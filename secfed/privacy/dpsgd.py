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
  independently with rate q; use :func:`poisson_schedule` and
  :func:`secfed.privacy.sampling.poisson_batches`. An empty batch still takes a (noise-only) step:
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
from dataclasses import dataclass

import torch
from opacus.grad_sample.utils import prepare_module
from opacus.optimizers import DPOptimizer
from opacus.validators import ModuleValidator
from torch import nn

from secfed.privacy.accountant import SampledGaussianAccountant

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


def make_private(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    *,
    noise_multiplier: float,
    max_grad_norm: float,
    sample_rate: float,
    expected_batch_size: int,
    accountant: SampledGaussianAccountant | None = None,
    generator: torch.Generator | None = None,
) -> PrivateTraining:
    """Wrap ``model`` and ``optimizer`` for DP-SGD (per-example clipping to ``max_grad_norm``, Gaussian
    noise of std ``noise_multiplier · max_grad_norm`` on the sum, averaged over ``expected_batch_size``).

    ``optimizer`` must be built over ``model.parameters()``. Pass the client's persistent
    ``accountant`` so ε accumulates across rounds; ``generator`` seeds the noise (training-side
    randomness: whoever knows its seed can regenerate the noise).
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
    dp_optimizer = DPOptimizer(
        optimizer,
        noise_multiplier=noise_multiplier,
        max_grad_norm=max_grad_norm,
        expected_batch_size=expected_batch_size,
        loss_reduction="mean",
        generator=generator,
    )
    accountant = accountant if accountant is not None else SampledGaussianAccountant()
    dp_optimizer.attach_step_hook(accountant.opacus.get_optimizer_hook_fn(sample_rate=sample_rate))
    return PrivateTraining(module=module, optimizer=dp_optimizer, accountant=accountant, sample_rate=sample_rate)


@dataclass
class ClientDpSgd:
    """One client's example-level DP-SGD settings and its accountant, kept across rounds."""

    noise_multiplier: float
    max_grad_norm: float
    delta: float
    accountant: SampledGaussianAccountant

    def epsilon(self) -> float:
        return self.accountant.epsilon(self.delta)
