"""Analytic probes: what an update gives away in closed form, before any optimisation.

**Linear layer with bias** (Phong et al. 2017; Fowl et al. 2022, Boenisch et al. 2023): for
``z = W·x + b`` the gradients are ∇W = Σ_n δ_n x_nᵀ and ∇b = Σ_n δ_n, so a row i where one sample
dominates gives that sample's input exactly: x = ∇W[i] / ∇b[i] (every row, at batch 1). This is
how a shared classifier (FedAvg) hands the server each sample's ReID feature.

When a BatchNorm in training mode follows the layer — the neck of secfed's ReID model — the
gradient through the batch normalisation sums to zero over the batch (Σ_n δ_n = 0), so ∇b = 0 and
the ratio is undefined. The update still carries the layer's input, through two other channels:

    BatchNorm running statistics (shared with ``--bn-stats shared``): one step moves them by
        momentum·(batch mean − old) and momentum·(unbiased batch variance − old), so the batch mean
        of z, and with W (known) the batch mean of the inputs x̄, come out exactly, at any batch;
    the weight gradient: ∇W = Σ_n δ_n (x_n − x̄)ᵀ has rank B − 1. At B = 2 it is rank one, its
        right singular vector is ±(x_1 − x_2)/‖x_1 − x_2‖, and the batch variance of z fixes the
        length — so both inputs are recovered exactly (their order is not defined).

:func:`neck_probe` does this; its residual says how well "one step on a batch of two" explains the
layer's update (the part of ∇W outside rank one, and the misfit of the variance), so on an update of
many steps or a larger batch it reports that it did not fit, with the batch mean it still recovered.
Weight decay and Nesterov's first step are removed with the step size the update itself implies
(:func:`one_step_weight_gradient`), not only the one the schedule names: a decayed learning rate or a
clipped update otherwise leaves a full-rank wd·θ remainder that hides the rank-one gradient.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from secfed.attacks.local_training import LocalSteps
from secfed.models.sharing import SharedLayout

RANK_TOLERANCE = 1e-3  # singular values below this fraction of the largest count as zero
BIAS_VANISHES = 1e-3  # ‖∇b‖ below this fraction of ‖∇W‖: no bias gradient to divide by


@dataclass
class ProbeOutput:
    probe: str
    layer: str
    applicable: bool
    reason: str
    residual: float | None = None
    inputs: torch.Tensor | None = None  # recovered inputs of the layer, one row each
    batch_mean: torch.Tensor | None = None
    batch_estimate: int | None = None  # B suggested by the rank of the weight gradient
    space: str = ""  # what the inputs are: "neck-input" (pooled backbone features) or "embedding"
    details: dict[str, Any] = field(default_factory=dict)


def linear_with_bias(model: nn.Module, layout: SharedLayout) -> list[str]:
    """Shared Linear layers with a bias (their weight and bias travel in the update)."""
    shared = set(layout.names)
    return [name for name, m in model.named_modules()
            if isinstance(m, nn.Linear) and m.bias is not None and f"{name}.weight" in shared and f"{name}.bias" in shared]


def linear_then_batchnorm(model: nn.Module, layout: SharedLayout) -> list[tuple[str, str]]:
    """(Linear, BatchNorm1d) pairs, consecutive in a Sequential, both shared with their statistics."""
    shared = set(layout.names)
    pairs = []
    for name, m in model.named_modules():
        if not isinstance(m, nn.Sequential):
            continue
        children = list(m.named_children())
        for (a, first), (b, second) in zip(children, children[1:]):
            lin, bn = f"{name}.{a}" if name else a, f"{name}.{b}" if name else b
            if (isinstance(first, nn.Linear) and isinstance(second, nn.BatchNorm1d) and f"{lin}.weight" in shared
                    and f"{bn}.running_mean" in shared):
                pairs.append((lin, bn))
    return pairs


def bias_ratio_probe(name: str, grad_w: torch.Tensor, grad_b: torch.Tensor, *, space: str,
                     max_inputs: int = 64) -> ProbeOutput:
    """x = ∇W[i] / ∇b[i] on the rows where the bias gradient is not negligible."""
    gw, gb = grad_w.double(), grad_b.double()
    # A real bias gradient is ∇W's rows divided by inputs of moderate norm; one a thousand times
    # smaller than ∇W is rounding noise around zero (Σ_n δ_n = 0 under BatchNorm).
    if gb.norm() <= BIAS_VANISHES * gw.norm():
        return ProbeOutput("linear-bias", name, False,
                           "the bias gradient vanishes (a BatchNorm in training mode follows the layer: Σ_n δ_n = 0)",
                           space=space)
    present = gb < 0
    if present.any() and int((~present).sum()) >= 2:
        # A softmax cross-entropy head (Zhao et al.'s iDLG; Fowl et al.): a label in the batch makes
        # its row's bias gradient negative (Σ_n p_nc − count_c). The other rows are Σ_n p_nc·x_n, a
        # background that is subtracted before dividing — one input (the label's mean) per label.
        background_w, background_b = gw[~present].mean(0), gb[~present].mean()
        distinct = list((background_w - gw[present]) / (background_b - gb[present])[:, None])[:max_inputs]
        reason = f"{len(distinct)} label row(s) of a cross-entropy head, background rows subtracted"
    else:
        rows = (gb.abs() > 1e-3 * gb.abs().max()).nonzero().squeeze(1)
        candidates = gw[rows] / gb[rows, None]
        # Rows dominated by the same sample give the same input: keep one of each (cosine > 0.999).
        order = gb[rows].abs().argsort(descending=True)
        distinct = []
        for i in order.tolist():
            c = candidates[i]
            if all(torch.nn.functional.cosine_similarity(c, d, dim=0) < 0.999 for d in distinct):
                distinct.append(c)
            if len(distinct) >= max_inputs:
                break
        reason = f"{len(distinct)} distinct input(s) from {len(rows)} rows"
    x = torch.stack(distinct)
    # How much of ∇W the recovered inputs explain: ∇W ≈ Δ·X with Δ by least squares.
    coef = torch.linalg.lstsq(x.T, gw.T).solution  # (k, rows)
    residual = float((gw - (x.T @ coef).T).norm() / gw.norm())
    return ProbeOutput("linear-bias", name, True, reason, residual, x.float(), space=space,
                       batch_estimate=len(distinct))


def neck_probe(model: nn.Module, layout: SharedLayout, linear: str, batchnorm: str, start: dict[str, torch.Tensor],
               delta: dict[str, torch.Tensor], steps: LocalSteps, scale: float = 1.0) -> ProbeOutput:
    """Inputs of a shared Linear followed by a shared BatchNorm1d, from one step's update (see module doc)."""
    bn = model.get_submodule(batchnorm)
    momentum = bn.momentum if bn.momentum is not None else 0.1
    w0, b0 = start[f"{linear}.weight"].double(), start[f"{linear}.bias"].double()
    gw, step_ratio = one_step_weight_gradient(delta[f"{linear}.weight"], start[f"{linear}.weight"], steps,
                                              steps.lr(f"{linear}.weight") * steps.first_step_factor * scale)
    z_mean = start[f"{batchnorm}.running_mean"].double() + delta[f"{batchnorm}.running_mean"].double() / (momentum * scale)
    z_var = start[f"{batchnorm}.running_var"].double() + delta[f"{batchnorm}.running_var"].double() / (momentum * scale)
    x_mean = torch.linalg.lstsq(w0, (z_mean - b0).unsqueeze(1)).solution.squeeze(1)
    _, sv, vh = torch.linalg.svd(gw, full_matrices=False)
    if sv[0] <= 0:
        return ProbeOutput("neck-bn", linear, False, "the layer's weight gradient is zero", space="neck-input")
    rank = int((sv > RANK_TOLERANCE * sv[0]).sum())
    off_rank_one = float(sv[1:].square().sum().sqrt() / sv.square().sum().sqrt())
    # B = 2: x_1 − x_2 = s·v, and |z_1 − z_2| = |s|·|W v| = sqrt(2·var) coordinate-wise.
    v = vh[0]
    wv = (w0 @ v).abs()
    spread = (2 * z_var.clamp_min(0)).sqrt()
    s = float((wv * spread).sum() / wv.square().sum())
    variance_misfit = float((s * wv - spread).norm() / spread.norm().clamp_min(1e-12))
    negative = float(x_mean.clamp_max(0).norm() / x_mean.norm().clamp_min(1e-12))
    residual = max(off_rank_one, variance_misfit)
    inputs = torch.stack([x_mean + s * v / 2, x_mean - s * v / 2]).float()
    details = {"weight_gradient_rank": rank, "off_rank_one": off_rank_one, "variance_misfit": variance_misfit,
               "negative_mean_fraction": negative, "bn_momentum": momentum,
               "step_size_vs_schedule": step_ratio}
    if steps.steps != 1:
        details["note"] = f"the client took {steps.steps} local steps; the probe models one"
    return ProbeOutput("neck-bn", linear, True, f"batch mean exact for one step; weight-gradient rank {rank} → "
                       f"batch of ~{rank + 1}", residual, inputs, x_mean.float(), rank + 1, "neck-input", details)


SKETCH = 16  # columns of the random sketch the step-size search ranks on (rank is preserved for rank ≤ 15)


def _off_rank_one(gram: torch.Tensor) -> float:
    """Share of a matrix's energy outside its leading singular direction, from its Gram matrix."""
    eig = torch.linalg.eigvalsh(gram)
    return float((eig.sum() - eig[-1]).clamp_min(0) / eig.sum().clamp_min(1e-300))


def one_step_weight_gradient(delta: torch.Tensor, theta: torch.Tensor, steps: LocalSteps, nominal: float,
                             search: float = 100.0) -> tuple[torch.Tensor, float]:
    """∇W of one SGD step ``delta`` from ``theta``: Δ = −c·(∇W + wd·θ), c = lr·(1 + m)·scale.

    The weight-decay term wd·θ is full rank, so a step size c even slightly off (a decayed learning
    rate read from the wrong round, an update shortened by clipping) leaves a full-rank remainder
    that hides the rank-one gradient of two images. c is therefore taken from the update itself:
    the value within ``search``× of ``nominal`` (the schedule's) that makes ∇W closest to rank one —
    for one step on two images that is the round's real step size. The search ranks a random
    sketch ∇W·Ω (Ω: d × :data:`SKETCH`, fixed seed; not a privacy draw), which has the rank of ∇W
    when that is small, at the cost of a 16 × 16 eigenproblem per try. Returns ∇W (float64) and
    c / ``nominal``."""
    d, w = delta.double(), theta.double()
    if steps.weight_decay == 0:
        return -d / nominal, 1.0
    wd = steps.weight_decay
    omega = torch.randn(d.shape[1], SKETCH, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    sd, sw = d @ omega, w @ omega
    a, cross, c = sd.T @ sd, sd.T @ sw + sw.T @ sd, wd * wd * (sw.T @ sw)

    def misfit(log_u: float) -> float:
        u = math.exp(log_u)
        return _off_rank_one(u * u * a + u * wd * cross + c)

    centre, span = -math.log(nominal), math.log(search)
    grid = [centre - span + 2 * span * i / 40 for i in range(41)]
    best = min(grid, key=misfit)
    lo, hi = best - 2 * span / 40, best + 2 * span / 40
    golden = (math.sqrt(5) - 1) / 2
    for _ in range(40):  # golden-section refinement on log u
        x1, x2 = hi - golden * (hi - lo), lo + golden * (hi - lo)
        if misfit(x1) < misfit(x2):
            hi = x2
        else:
            lo = x1
    log_u = (lo + hi) / 2
    if misfit(centre) <= misfit(log_u):
        log_u = centre
    u = math.exp(log_u)
    return -u * d - wd * w, 1.0 / (u * nominal)


def revealed_batch_statistics(model: nn.Module, layout: SharedLayout, start: dict[str, torch.Tensor],
                              delta: dict[str, torch.Tensor], scale: float = 1.0) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """Per shared BatchNorm layer, the batch mean and unbiased batch variance of its input that one
    training step's running-statistic update reveals: mean = old + Δ/momentum (likewise the variance)."""
    out = {}
    for name, m in model.named_modules():
        if isinstance(m, nn.modules.batchnorm._BatchNorm) and f"{name}.running_mean" in delta:
            momentum = m.momentum if m.momentum is not None else 0.1
            mean = start[f"{name}.running_mean"] + delta[f"{name}.running_mean"] / (momentum * scale)
            var = start[f"{name}.running_var"] + delta[f"{name}.running_var"] / (momentum * scale)
            out[name] = (mean.float(), var.float().clamp_min(0))
    return out
