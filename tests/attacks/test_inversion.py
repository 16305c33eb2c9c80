"""Gradient inversion: at the true images the adversary's simulation is the client's real step."""

from __future__ import annotations

import copy

import pytest
import torch

from secfed.algorithms import base, base_method
from secfed.algorithms.base import Site
from secfed.attacks.budget import Budget, Stopwatch
from secfed.attacks.inversion import InversionProblem, SimulatedClient, fit_residual, gradient_inversion
from secfed.attacks.local_training import LocalSteps
from secfed.config import RunConfig
from secfed.data.transforms import normalize
from secfed.federation.messages import MODEL, Broadcast
from secfed.federation.runtime import schedule_for


def _real_step(cfg: RunConfig, images: torch.Tensor, labels: torch.Tensor, batch_size: int):
    """The method's client step with every per-step input and trunk-output gradient captured."""
    method = base_method(cfg)
    torch.manual_seed(0)
    model = method.build_model(int(labels.max()) + 1)
    layout = method.layout(model)
    site_model = copy.deepcopy(model)
    inputs, grads = [], []
    site_model.backbone.register_forward_pre_hook(lambda m, args: inputs.append(args[0].detach().clone()))

    def keep_gradient(module: torch.nn.Module, args: tuple, output: torch.Tensor) -> None:
        output.register_hook(lambda g: grads.append(g.clone()))

    site_model.neck[1].register_forward_hook(keep_gradient)
    schedule = schedule_for(cfg, 0)
    schedule = type(schedule)(**{**schedule.__dict__, "batch_size": batch_size})
    start = layout.flatten(model.state_dict())
    site = Site(0, "c", images, labels, site_model, 1.0)
    update = method.client_step(site, Broadcast(0, start.clone(), layout.fingerprint()), layout, schedule, 7).summed[MODEL]
    steps = LocalSteps.from_schedule(schedule, len(images))
    problem = InversionProblem(copy.deepcopy(model), layout, layout.unflatten(start),
                               {k: v.clone() for k, v in layout.unflatten(update.vector).items()}, [SimulatedClient(steps)])
    # the simulation's loss is Σ<G, out>/B: G is B × the captured gradient of the mean loss
    return problem, [inputs], [[g * len(g) for g in grads]], steps


@pytest.fixture
def no_augmentation(monkeypatch: pytest.MonkeyPatch) -> None:
    """The true training views are then the images themselves (the attack reconstructs augmented views)."""
    monkeypatch.setattr(base, "AUGMENT", lambda images, generator: normalize(images))


@pytest.mark.parametrize("count,batch", [(2, 2), (8, 4)])
def test_at_the_truth_the_simulation_is_the_real_step(two_people, toy_config: RunConfig, no_augmentation,
                                                      count: int, batch: int) -> None:
    """One step (gradient matched) and two unrolled Nesterov steps (update matched), BN statistics too.
    (Two steps of two images at 32×16 are chaotic — layer4's BatchNorm normalises two numbers — so the
    unrolled case uses batches of four.)"""
    _, _, victims = two_people
    images = torch.cat([victims, victims.flip(3), victims.flip(2), victims.roll(3, dims=3)])[:count]
    problem, xs, gs, steps = _real_step(toy_config, images, torch.arange(count) % 2, batch)
    assert steps.steps == count // batch and len(xs[0]) == steps.steps
    residual, bn = fit_residual(problem, (3, 32, 16), xs, gs)
    assert residual < 1e-4
    assert bn is not None and bn < 1e-3
    wrong = [[torch.randn_like(x) for x in xs[0]]]
    assert fit_residual(problem, (3, 32, 16), wrong, gs)[0] > 0.05


def test_inversion_reports_its_effort_and_stops_at_the_deadline(two_people, toy_config: RunConfig) -> None:
    _, _, victims = two_people
    problem, _, _, _ = _real_step(toy_config, victims, torch.tensor([0, 1]), 2)
    watch = Stopwatch(3.0)
    out = gradient_inversion(problem, image_shape=(3, 32, 16), iterations=10_000, restarts=2, max_dummies=8,
                             stopwatch=watch, feature_iterations=0)
    assert watch.wall < 8.0  # the deadline holds (plus the final residual of each restart)
    assert out.images.shape == (2, 3, 32, 16) and out.images.dtype == torch.uint8
    assert 0 < out.iterations < 10_000 and out.restarts >= 1 and out.exact_model
    assert 0.0 <= out.residual <= 2.0


def test_too_many_images_for_the_budget_is_modelled_as_one_step_and_said(two_people, toy_config: RunConfig) -> None:
    _, _, victims = two_people
    problem, _, _, steps = _real_step(toy_config, victims.repeat(4, 1, 1, 1), torch.arange(8) % 2, 2)
    tiny = Budget("t", 5, 1, 1, max_dummies=4, feature_iterations=0, model_inversion_iterations=1,
                  model_inversion_images=1, lower_bound=True)
    out = gradient_inversion(problem, image_shape=(3, 32, 16), iterations=tiny.inversion_iterations, restarts=1,
                             max_dummies=tiny.max_dummies, stopwatch=Stopwatch(5.0))
    assert not out.exact_model and out.dummies == 4
    assert any("approximation" in note for note in out.notes)


@pytest.mark.parametrize("algorithm", ["dfh", "fedreid"])
def test_every_method_s_model_can_be_attacked(toy_config: RunConfig, algorithm: str) -> None:
    """(found by review: every DFH audit stopped with "a differentiated tensor appears not to have been
    used" — the free gradient sat at the pool-5 feature, before DFH's shared neck; every FedReID audit of
    the weights stopped with "backward through the graph a second time" — its head's BatchNorm term was
    left to the next step) Gradient inversion's simulation runs on DFH's model, deep inversion with
    FedReID's mapping network as the head."""
    from secfed.attacks.model_inversion import deep_inversion

    toy_config.method.algorithm = algorithm
    method = base_method(toy_config)
    torch.manual_seed(0)
    model = method.build_model(2)
    if algorithm == "dfh":
        layout = method.layout(model)
        start = layout.flatten(model.state_dict())
        problem = InversionProblem(model, layout, layout.unflatten(start), layout.unflatten(torch.zeros_like(start)),
                                   [SimulatedClient(LocalSteps(0.01, 0.01, 0.9, 5e-4, 2, 1, 2))])
        neck_out = model.neck(model.backbone(torch.zeros(2, 3, 32, 16))).shape[1]
        residual, _ = fit_residual(problem, (3, 32, 16), [[torch.randn(2, 3, 32, 16)]], [[torch.randn(2, neck_out)]])
        assert residual == residual  # a number: the simulation ran through the shared neck
    else:
        head = torch.nn.Sequential(model.neck, model.classifier)
        out = deep_inversion(model, images=2, image_shape=(3, 32, 16), iterations=3, restarts=1,
                             stopwatch=Stopwatch(30), head=head, targets=torch.tensor([0, 1]))
        assert out.iterations == 3 and out.images.shape == (2, 3, 32, 16)


def test_the_identity_head_follows_the_embedding_through_the_neck_where_the_embedding_stops_before_it(
        toy_config: RunConfig) -> None:
    """(found by review: DFH's classifier was applied to its pool-5 feature, the shared neck skipped —
    the sizes agree, so nothing said so) FedPav's embedding includes its neck; FedReID's and DFH's do not."""
    from secfed.attacks.registry import identity_head

    for algorithm, through_neck in (("fedpav", False), ("fedreid", True), ("dfh", True)):
        toy_config.method.algorithm = algorithm
        model = base_method(toy_config).build_model(3).eval()
        x = torch.randn(2, 3, 32, 16)
        with torch.no_grad():
            assert torch.equal(identity_head(model)(model.embed(x)), model(x)), algorithm
        assert isinstance(identity_head(model), torch.nn.Sequential) == through_neck
