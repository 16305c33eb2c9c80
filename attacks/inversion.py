"""Gradient inversion of an update or of a sum of updates (Geiping et al. 2020, "Inverting Gradients").

Dummy images are optimised until the update the adversary's model of local training predicts for
them matches the observed one in cosine distance, with a total-variation prior, restarts and early
stopping. What is matched is exactly what is shared:

* **head-agnostic** — FedPav keeps the classifier local, so the server cannot compute the loss. The
  gradient that reaches the shared trunk's output (the neck feature; the logits when the classifier
  is shared) is a free variable per image and step: any head and any loss, dropout masks included,
  produce some such vector, so the relaxation assumes nothing about them;
* **unrolled local steps** — a client that took T steps (Nesterov momentum, weight decay, from a
  fresh optimiser) is simulated step by step, differentiably (``torch.func.functional_call``); when
  T·B dummies exceed the budget, the update is treated as one large step on fewer dummies — an
  approximation the result names, whose residual shows how far it is off;
* **BN-statistics prior** — with ``--bn-stats shared`` the running statistics in the update are a
  function of every batch's mean and variance at every BatchNorm layer; the simulated ones are
  matched too (for one step they are the batch statistics themselves: GradInversion's prior, exact);
* **probe seeding** — when :func:`secfed.attacks.probes.neck_probe` recovered the neck inputs, a
  cheap first phase inverts those features (no second-order gradients) before the full objective.

The residual is 1 − cos(predicted, observed) over the shared trainable weights: the attack's own
measure of whether it fitted.

Written here rather than taken from ``breaching``: that package targets its own model zoo and
user/server objects, pins old torch versions, and has no notion of secfed's head-agnostic FedPav
upload, its Nesterov schedule or its shared BN statistics; the loop below is ~200 lines.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call

from secfed.attacks.budget import Stopwatch
from secfed.attacks.local_training import LocalSteps
from secfed.data.transforms import IMAGENET_MEAN, IMAGENET_STD
from secfed.models.sharing import SharedLayout

TV_WEIGHT = 0.05
BN_WEIGHT = 0.5
FEATURE_WEIGHT = 1.0


@dataclass(frozen=True)
class SimulatedClient:
    """One client as the adversary simulates it: its local steps and its aggregation weight."""

    steps: LocalSteps
    weight: float = 1.0


@dataclass
class InversionProblem:
    model: nn.Module  # a private copy holding the start weights (and any local tensors the adversary assumes)
    layout: SharedLayout
    start: dict[str, torch.Tensor]  # shared tensors at the start of the round (the broadcast)
    observed: dict[str, torch.Tensor]  # the shared update (mean over clients for a sum)
    clients: list[SimulatedClient]
    scale: float = 1.0  # known factor the observed update was multiplied by (clipping)
    neck_features: torch.Tensor | None = None  # probe-recovered neck inputs of a one-step, one-client update
    neck_linear: str | None = None  # the Linear whose input those are


@dataclass
class InversionOutput:
    images: torch.Tensor  # uint8 (N, 3, H, W): the best restart's dummies
    residual: float
    bn_residual: float | None
    iterations: int
    restarts: int
    dummies: int
    exact_model: bool
    residual_per_restart: list[float] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


class _Trunk(nn.Module):
    """The shared part of the model as a function of images: its output is where the free gradient lives —
    the logits when the classifier is shared, else the input of the first module a client keeps: the
    neck's output where the neck is shared (FedPav; DFH, whose retrieval feature is the pool-5 output
    before it — found by review: every DFH audit stopped with the neck's parameters unused), the
    backbone's where it is not (FedReID's mapping network)."""

    def __init__(self, model: nn.Module, logits: bool, neck_shared: bool) -> None:
        super().__init__()
        self.model = model
        self.logits = logits
        self.neck_shared = neck_shared

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.logits:
            return self.model(x)
        features = self.model.backbone(x)
        return self.model.neck(features) if self.neck_shared else features


def image_box(device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    mean = torch.tensor(IMAGENET_MEAN, device=device).view(1, 3, 1, 1)
    std = torch.tensor(IMAGENET_STD, device=device).view(1, 3, 1, 1)
    return (0 - mean) / std, (1 - mean) / std


def image_step(loss: torch.Tensor, optimizer: torch.optim.Optimizer, schedule: torch.optim.lr_scheduler.LRScheduler,
               images: list[torch.Tensor], lo: torch.Tensor, hi: torch.Tensor) -> None:
    """One optimiser step on dummy images, kept inside the valid (normalised) pixel box."""
    loss.backward()
    optimizer.step()
    schedule.step()
    with torch.no_grad():
        for x in images:
            x.copy_(torch.maximum(torch.minimum(x, hi), lo))


def to_uint8(x: torch.Tensor) -> torch.Tensor:
    mean = torch.tensor(IMAGENET_MEAN, device=x.device).view(1, 3, 1, 1)
    std = torch.tensor(IMAGENET_STD, device=x.device).view(1, 3, 1, 1)
    return (x.detach() * std + mean).mul(255).round().clamp(0, 255).to(torch.uint8).cpu()


def total_variation(x: torch.Tensor) -> torch.Tensor:
    return (x[:, :, 1:, :] - x[:, :, :-1, :]).abs().mean() + (x[:, :, :, 1:] - x[:, :, :, :-1]).abs().mean()


def _batch_stats(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    dims = [0] if x.dim() == 2 else [0, 2, 3]
    return x.mean(dims), x.var(dims, unbiased=True)


class _Simulator:
    """Differentiable local training of dummy images from the start weights (see the module doc)."""

    def __init__(self, problem: InversionProblem, image_shape: tuple[int, int, int]) -> None:
        self.p = problem
        self.image_shape = image_shape
        model = problem.model
        model.train()
        for m in model.modules():
            if isinstance(m, nn.Dropout):
                m.eval()  # the free trunk gradient absorbs dropout masks
        names = set(problem.layout.names)
        self.logits = any(n.startswith("classifier.") for n in names)
        self.trunk = _Trunk(model, self.logits, any(n.startswith("neck.") for n in names))
        self.trainable = [s.name for s in problem.layout.segments if s.trainable]
        self.const = {f"model.{k}": v.detach() for k, v in model.state_dict().items() if k not in self.trainable}
        self.bns = [(n, m) for n, m in model.named_modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)
                    and f"{n}.running_mean" in names]
        self.captured: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.features: list[torch.Tensor] = []
        self.hooks = [m.register_forward_hook(self._capture_bn) for _, m in self.bns]
        if problem.neck_linear is not None:
            self.hooks.append(model.get_submodule(problem.neck_linear).register_forward_hook(
                lambda m, i, o: self.features.append(i[0])))
        device = next(model.parameters()).device
        self.device = device
        self.observed_w = torch.cat([problem.observed[n].reshape(-1) for n in self.trainable]).to(device)
        self.start_w = {n: problem.start[n].to(device) for n in self.trainable}
        self.out_dim = self._out_dim()

    def close(self) -> None:
        for h in self.hooks:
            h.remove()

    def _capture_bn(self, module: nn.Module, inputs: tuple[torch.Tensor, ...], output: torch.Tensor) -> None:
        self.captured.append(_batch_stats(inputs[0]))

    def _out_dim(self) -> int:
        with torch.no_grad():
            c, h, w = self.image_shape
            out = self.trunk(torch.zeros(2, c, h, w, device=self.device))
        self.captured.clear()
        self.features.clear()
        return out.shape[1]

    def forward(self, theta: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
        params = {**self.const, **{f"model.{k}": v for k, v in theta.items()}}
        # Buffers are passed as fresh copies: BatchNorm's in-place running-stat update must not touch ours.
        params.update({k: v.clone() for k, v in self.const.items() if "running_" in k})
        return functional_call(self.trunk, params, (x,))

    def run(self, dummies: list[list[torch.Tensor]], grads: list[list[torch.Tensor]], lr_scale: float = 1.0,
            create_graph: bool = True) -> tuple[torch.Tensor, list[list[tuple[torch.Tensor, torch.Tensor]]]]:
        """Predicted (mean over clients) trainable update or gradient, and the per-client BN stats of every step."""
        total_w = sum(c.weight for c in self.p.clients)
        predicted = torch.zeros_like(self.observed_w)
        stats_per_client = []
        for client, xs, gs in zip(self.p.clients, dummies, grads):
            s = client.steps
            theta = {n: self.start_w[n].detach().clone().requires_grad_(True) for n in self.trainable}
            start = dict(theta)
            buf: dict[str, torch.Tensor] = {}
            client_stats = []
            one_step = len(xs) == 1
            for t, (x, g) in enumerate(zip(xs, gs)):
                self.captured.clear()
                out = self.forward(theta, x)
                client_stats.append(list(self.captured))
                loss = (g * out).sum() / len(x)
                step_grads = torch.autograd.grad(loss, [theta[n] for n in self.trainable], create_graph=create_graph)
                if one_step:  # compare gradients: free of the (known) weight-decay term and of G's scale
                    flat = torch.cat([gr.reshape(-1) for gr in step_grads])
                    predicted = predicted + client.weight * flat
                    break
                for n, gr in zip(self.trainable, step_grads):
                    d = gr + s.weight_decay * theta[n]
                    buf[n] = d if t == 0 else s.momentum * buf[n] + d
                    move = d + s.momentum * buf[n] if s.nesterov else buf[n]
                    theta[n] = theta[n] - lr_scale * s.lr(n) * move
            else:
                predicted = predicted + client.weight * torch.cat([(theta[n] - start[n]).reshape(-1) for n in self.trainable])
            stats_per_client.append(client_stats)
        return predicted / total_w, stats_per_client


def _observed_gradient(problem: InversionProblem, sim: _Simulator, steps: LocalSteps) -> torch.Tensor:
    grad = steps.gradient_of_one_step({n: problem.observed[n] for n in sim.trainable}, problem.start, problem.scale)
    return torch.cat([grad[n].reshape(-1) for n in sim.trainable]).to(sim.device)


def _observed(problem: InversionProblem, sim: _Simulator, one_step: bool) -> torch.Tensor:
    """What the simulation is matched with: the gradient of one step (weight decay and scale removed),
    or the update itself when several steps are unrolled."""
    if not one_step:
        return sim.observed_w / problem.scale
    total_w = sum(c.weight for c in problem.clients)
    observed = torch.zeros_like(sim.observed_w)
    for c in problem.clients:
        observed = observed + c.weight * _observed_gradient(problem, sim, c.steps)
    return observed / total_w


def fit_residual(problem: InversionProblem, image_shape: tuple[int, int, int], images: list[list[torch.Tensor]],
                 trunk_gradients: list[list[torch.Tensor]]) -> tuple[float, float | None]:
    """The attack's two fit measures — 1 − cos(simulated, observed) and the BatchNorm-statistics
    residual — at given normalised images and trunk gradients (per client, per step). At the truth
    both are ~0: the check that the adversary's simulation is the client's real step."""
    sim = _Simulator(problem, image_shape)
    try:
        one_step = all(len(steps) == 1 for steps in images)
        predicted, stats = sim.run(images, trunk_gradients)
        residual = float(1 - F.cosine_similarity(predicted.detach(), _observed(problem, sim, one_step), dim=0))
        bn = _bn_residual(problem, sim, stats)
        return residual, None if bn is None else float(bn.detach())
    finally:
        sim.close()


def _bn_residual(problem: InversionProblem, sim: _Simulator,
                 stats: list[list[list[tuple[torch.Tensor, torch.Tensor]]]]) -> torch.Tensor | None:
    """Relative error of the simulated running-statistic changes against the observed ones (mean over layers)."""
    if not sim.bns:
        return None
    total_w = sum(c.weight for c in problem.clients)
    errors = []
    for j, (name, module) in enumerate(sim.bns):
        momentum = module.momentum if module.momentum is not None else 0.1
        rm0 = problem.start[f"{name}.running_mean"].to(sim.device)
        rv0 = problem.start[f"{name}.running_var"].to(sim.device)
        d_mean = torch.zeros_like(rm0)
        d_var = torch.zeros_like(rv0)
        for client, per_step in zip(problem.clients, stats):
            rm, rv = rm0, rv0
            for step_stats in per_step:
                mu, var = step_stats[j]
                rm = (1 - momentum) * rm + momentum * mu
                rv = (1 - momentum) * rv + momentum * var
            d_mean = d_mean + client.weight * (rm - rm0)
            d_var = d_var + client.weight * (rv - rv0)
        obs_mean = problem.observed[f"{name}.running_mean"].to(sim.device) / problem.scale
        obs_var = problem.observed[f"{name}.running_var"].to(sim.device) / problem.scale
        errors.append((d_mean / total_w - obs_mean).norm() / obs_mean.norm().clamp_min(1e-8)
                      + (d_var / total_w - obs_var).norm() / obs_var.norm().clamp_min(1e-8))
    return torch.stack(errors).mean() / 2


def gradient_inversion(problem: InversionProblem, *, image_shape: tuple[int, int, int], iterations: int,
                       restarts: int, max_dummies: int, stopwatch: Stopwatch, seed: int = 0,
                       fit_threshold: float = 0.05, feature_iterations: int = 0,
                       progress: Callable[[int, float], None] | None = None) -> InversionOutput:
    """Reconstruct the images behind ``problem.observed``; stops at ``stopwatch``'s deadline."""
    sim = _Simulator(problem, image_shape)
    try:
        return _invert(problem, sim, image_shape, iterations, restarts, max_dummies, stopwatch, seed,
                       fit_threshold, feature_iterations, progress)
    finally:
        sim.close()


def _invert(problem: InversionProblem, sim: _Simulator, image_shape: tuple[int, int, int], iterations: int,
            restarts: int, max_dummies: int, stopwatch: Stopwatch, seed: int, fit_threshold: float,
            feature_iterations: int, progress: Callable[[int, float], None] | None) -> InversionOutput:
    notes: list[str] = []
    needed = sum(c.steps.images_seen for c in problem.clients)
    exact = needed <= max_dummies
    if exact:
        layout = [[c.steps.batch] * c.steps.steps for c in problem.clients]
        lr_scale = 1.0
    else:
        # One large step on as many dummies as the budget allows, shared out by client size.
        total = sum(c.steps.images_seen for c in problem.clients)
        per = [max(2, round(max_dummies * c.steps.images_seen / total)) for c in problem.clients]
        layout = [[n] for n in per]
        lr_scale = 1.0
        notes.append(f"the update needs {needed} dummy images ({', '.join(f'{c.steps.steps}×{c.steps.batch}' for c in problem.clients)} "
                     f"steps×images); the budget allows {max_dummies}: modelled as one step on {sum(per)} dummies "
                     "(an approximation)")
    one_step = all(len(steps) == 1 for steps in layout)
    observed = _observed(problem, sim, one_step)
    lo, hi = image_box(sim.device)
    use_features = problem.neck_features is not None and one_step and len(problem.clients) == 1 \
        and problem.neck_features.shape[0] == layout[0][0]
    best: tuple[float, torch.Tensor, float | None] | None = None
    per_restart: list[float] = []
    total_iterations = 0
    restarts_done = 0
    for r in range(max(1, restarts)):
        if stopwatch.expired and best is not None:
            break
        watch = stopwatch.share(1.0 / (max(1, restarts) - r))
        gen = torch.Generator().manual_seed(seed * 1000 + r)
        xs = [[(torch.randn((n, *image_shape), generator=gen) * 0.5).to(sim.device).requires_grad_(True) for n in steps]
              for steps in layout]
        gs = [[torch.randn((n, sim.out_dim), generator=gen).to(sim.device).requires_grad_(True) for n in steps]
              for steps in layout]
        params = [x for row in xs for x in row] + [g for row in gs for g in row]
        restarts_done += 1
        if use_features:
            total_iterations += _feature_phase(problem, sim, xs[0][0], feature_iterations, watch.share(0.4), lo, hi)
        if not one_step:
            _scale_free_gradients(sim, xs, gs, observed, lr_scale)
        optimizer = torch.optim.Adam(params, lr=0.1)
        schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, max(1, iterations), eta_min=0.005)
        for _ in range(iterations):
            if watch.expired:
                break
            optimizer.zero_grad(set_to_none=True)
            predicted, stats = sim.run(xs, gs, lr_scale)
            cos = F.cosine_similarity(predicted, observed, dim=0)
            loss = 1 - cos
            bn = _bn_residual(problem, sim, stats)
            if bn is not None:
                loss = loss + BN_WEIGHT * bn
            dummies = torch.cat([x for row in xs for x in row])
            loss = loss + TV_WEIGHT * total_variation(dummies)
            if use_features and sim.features:
                loss = loss + FEATURE_WEIGHT * (1 - F.cosine_similarity(
                    sim.features[0], problem.neck_features.to(sim.device), dim=1)).mean()
            sim.features.clear()
            image_step(loss, optimizer, schedule, [x for row in xs for x in row], lo, hi)
            residual = float(1 - cos.detach())
            total_iterations += 1
            if progress is not None:
                progress(total_iterations, residual)
            if residual < fit_threshold / 4:
                break
        # the residual of the final dummies (the loop's value is one step behind)
        final, stats = sim.run(xs, gs, lr_scale)
        residual = float(1 - F.cosine_similarity(final.detach(), observed, dim=0))
        bn_final = _bn_residual(problem, sim, stats)
        bn_res = None if bn_final is None else float(bn_final.detach())
        sim.features.clear()
        per_restart.append(residual)
        if best is None or residual < best[0]:
            best = (residual, torch.cat([x.detach() for row in xs for x in row]), bn_res)
    assert best is not None
    return InversionOutput(to_uint8(best[1]), best[0], best[2], total_iterations, restarts_done,
                           best[1].shape[0], exact, per_restart, notes)


def _scale_free_gradients(sim: _Simulator, xs: list[list[torch.Tensor]], gs: list[list[torch.Tensor]],
                          observed: torch.Tensor, lr_scale: float) -> None:
    """Scale the free trunk gradients so the first simulated update is as long as the observed one
    (several steps: weight decay makes the update depend on the gradients' scale)."""
    predicted, _ = sim.run(xs, gs, lr_scale, create_graph=False)
    ratio = float(observed.norm() / predicted.norm().clamp_min(1e-12))
    with torch.no_grad():
        for row in gs:
            for g in row:
                g.mul_(ratio)
    sim.features.clear()


def _feature_phase(problem: InversionProblem, sim: _Simulator, x: torch.Tensor, iterations: int, watch: Stopwatch,
                   lo: torch.Tensor, hi: torch.Tensor) -> int:
    """Invert the probe's neck inputs under the one-step batch statistics (first-order only, cheap)."""
    target = problem.neck_features.to(sim.device)  # type: ignore[union-attr]
    theta = {n: sim.start_w[n] for n in sim.trainable}
    optimizer = torch.optim.Adam([x], lr=0.1)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, max(1, iterations), eta_min=0.005)
    done = 0
    for _ in range(iterations):
        if watch.expired:
            break
        optimizer.zero_grad(set_to_none=True)
        sim.captured.clear()
        sim.features.clear()
        sim.forward(theta, x)
        loss = (1 - F.cosine_similarity(sim.features[0], target, dim=1)).mean() * FEATURE_WEIGHT
        bn = _bn_residual(problem, sim, [[list(sim.captured)]])
        if bn is not None:
            loss = loss + BN_WEIGHT * bn
        image_step(loss + TV_WEIGHT * total_variation(x), optimizer, schedule, [x], lo, hi)
        done += 1
    sim.captured.clear()
    sim.features.clear()
    return done
