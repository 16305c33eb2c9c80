"""The analytic probes and the adversary's model of local SGD, against the real client step."""

from __future__ import annotations

from dataclasses import replace

import torch
from torch import nn

from secfed.algorithms import base_method
from secfed.attacks.controls import client_update
from secfed.attacks.local_training import LocalSteps
from secfed.attacks.probes import (bias_ratio_probe, linear_then_batchnorm, linear_with_bias, neck_probe,
                                   revealed_batch_statistics)
from secfed.attacks.targets import PROBE_FIT
from secfed.config import RunConfig


def _model(cfg: RunConfig, seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return base_method(cfg).build_model(2)


def test_one_step_gradient_undoes_nesterov_sgd_with_weight_decay() -> None:
    """What the adversary assumes of the client's optimiser is exactly torch's SGD (first step)."""
    torch.manual_seed(1)
    layer = nn.Linear(5, 3)
    start = {k: v.detach().clone() for k, v in layer.state_dict().items()}
    optimiser = torch.optim.SGD(layer.parameters(), lr=0.03, momentum=0.9, weight_decay=5e-4, nesterov=True)
    loss = layer(torch.randn(4, 5)).square().sum()
    loss.backward()
    grads = {k: p.grad.clone() for k, p in layer.named_parameters()}
    optimiser.step()
    delta = {k: layer.state_dict()[k] - start[k] for k in start}
    steps = LocalSteps(0.03, 0.03, 0.9, 5e-4, batch_size=4, epochs=1, examples=4)
    recovered = steps.gradient_of_one_step(delta, start)
    for k in grads:
        torch.testing.assert_close(recovered[k], grads[k], rtol=1e-4, atol=1e-6)


def test_local_steps_count_what_epoch_batches_yields() -> None:
    assert LocalSteps(0.1, 0.1, 0.9, 0, batch_size=32, epochs=1, examples=2).steps == 1
    assert LocalSteps(0.1, 0.1, 0.9, 0, batch_size=32, epochs=2, examples=105).steps == 6  # 3 full batches, tail dropped
    assert LocalSteps(0.1, 0.1, 0.9, 0, batch_size=8, epochs=1, examples=24).images_seen == 24


def test_neck_probe_recovers_both_inputs_of_a_two_image_step(two_people, toy_config: RunConfig) -> None:
    """One FedPav step on two images: the neck's inputs come back exactly from ∇W and the BN statistics."""
    _, _, images = two_people
    model = _model(toy_config)
    ctl = client_update(toy_config, model, images, torch.tensor([0, 1]), seed=4)
    start, delta = ctl.layout.unflatten(ctl.start), ctl.layout.unflatten(ctl.update)
    assert linear_then_batchnorm(model, ctl.layout) == [("neck.0", "neck.1")]
    probe = neck_probe(model, ctl.layout, "neck.0", "neck.1", start, delta, ctl.steps)
    assert probe.applicable and probe.residual is not None and probe.residual < PROBE_FIT
    truth = ctl.neck_inputs
    assert truth is not None and probe.inputs is not None
    straight = (probe.inputs - truth).norm() / truth.norm()
    swapped = (probe.inputs.flip(0) - truth).norm() / truth.norm()
    assert min(straight, swapped) < 1e-3  # their order is not defined
    torch.testing.assert_close(probe.batch_mean, truth.mean(0), rtol=1e-3, atol=1e-4)


def test_neck_probe_reports_a_misfit_on_several_steps(people, toy_config: RunConfig) -> None:
    """Eight images in batches of two (four steps): the one-step model does not explain the update."""
    name, imgs = people["campus"][0]
    _, other = people["campus"][1]
    images = torch.cat([imgs[:4], other[:4]])
    ctl = client_update(toy_config, _model(toy_config), images, torch.tensor([0] * 4 + [1] * 4), seed=2, batch_size=2)
    assert ctl.steps.steps == 4
    probe = neck_probe(ctl.model, ctl.layout, "neck.0", "neck.1", ctl.layout.unflatten(ctl.start),
                       ctl.layout.unflatten(ctl.update), ctl.steps)
    assert probe.residual is not None and probe.residual > 10 * PROBE_FIT


def test_bias_probe_gives_the_input_at_batch_one_and_refuses_under_batchnorm() -> None:
    torch.manual_seed(3)
    layer = nn.Linear(6, 4)
    x = torch.rand(1, 6)
    torch.nn.functional.cross_entropy(layer(x), torch.tensor([2])).backward()
    probe = bias_ratio_probe("fc", layer.weight.grad, layer.bias.grad, space="embedding")
    assert probe.applicable and probe.inputs is not None and probe.inputs.shape[0] == 1
    torch.testing.assert_close(probe.inputs[0], x[0], rtol=1e-4, atol=1e-5)
    assert probe.residual is not None and probe.residual < 1e-5

    net = nn.Sequential(nn.Linear(6, 4), nn.BatchNorm1d(4))
    net(torch.rand(3, 6)).sin().sum().backward()
    refused = bias_ratio_probe("0", net[0].weight.grad, net[0].bias.grad, space="neck-input")
    assert not refused.applicable and "BatchNorm" in refused.reason


def test_probes_find_the_shared_layers_the_sharing_rule_names(toy_config: RunConfig) -> None:
    cfg = toy_config
    model = _model(cfg)
    layout = base_method(cfg).layout(model)
    assert linear_with_bias(model, layout) == ["neck.0"]  # FedPav: the classifier stays local
    cfg.method.algorithm = "fedavg"
    fedavg = base_method(cfg)
    torch.manual_seed(0)
    shared_head = fedavg.build_model(5)
    assert linear_with_bias(shared_head, fedavg.layout(shared_head)) == ["neck.0", "classifier"]
    cfg.model.bn_stats = "local"
    local = base_method(cfg)
    assert linear_then_batchnorm(shared_head, local.layout(shared_head)) == []  # no statistics to read


def test_revealed_batch_statistics_are_the_batch_statistics(two_people, toy_config: RunConfig) -> None:
    """The neck BatchNorm's running-statistic update gives the batch mean and variance of its input."""
    _, _, images = two_people
    ctl = client_update(toy_config, _model(toy_config), images, torch.tensor([0, 1]), seed=4)
    start = ctl.layout.unflatten(ctl.start)
    stats = revealed_batch_statistics(ctl.model, ctl.layout, start, ctl.layout.unflatten(ctl.update))
    assert "backbone.bn1" in stats and "neck.1" in stats
    assert ctl.neck_inputs is not None
    z = ctl.neck_inputs @ start["neck.0.weight"].T + start["neck.0.bias"]
    mean, var = stats["neck.1"]
    torch.testing.assert_close(mean, z.mean(0), rtol=1e-3, atol=1e-4)
    torch.testing.assert_close(var, z.var(0, unbiased=True), rtol=1e-3, atol=1e-4)


def test_a_shared_classifier_hands_over_each_label_s_feature(people, toy_config: RunConfig) -> None:
    """FedAvg shares the classifier: its label rows, background subtracted, give the batch's features."""
    toy_config.method.algorithm = "fedavg"
    method = base_method(toy_config)
    torch.manual_seed(0)
    model = method.build_model(40)
    images = torch.cat([imgs[:1] for _, imgs in people["campus"][:3]])
    seen: list[torch.Tensor] = []
    hook = model.classifier.register_forward_pre_hook(lambda m, args: seen.append(args[0].detach().clone()))
    ctl = client_update(toy_config, model, images, torch.tensor([3, 17, 30]), seed=2, batch_size=3)
    hook.remove()
    start, delta = ctl.layout.unflatten(ctl.start), ctl.layout.unflatten(ctl.update)
    grads = ctl.steps.gradient_of_one_step({k: delta[k] for k in ("classifier.weight", "classifier.bias")}, start)
    probe = bias_ratio_probe("classifier", grads["classifier.weight"], grads["classifier.bias"], space="embedding")
    assert probe.applicable and probe.inputs is not None and len(probe.inputs) == 3
    truth = seen[0]  # the deep copy the client trained carries the hook along
    for x in probe.inputs:
        assert float(((truth - x).norm(dim=1) / truth.norm(dim=1)).min()) < 1e-2


def test_neck_probe_fits_a_decayed_round_whatever_step_size_it_was_told(two_people, toy_config: RunConfig) -> None:
    """A later round's decayed learning rate (or an update shortened by a clip): weight decay and
    Nesterov's first step are removed with the step size the update itself implies, so one step on
    two images still reads as rank one — even when the adversary was told the undecayed rate."""
    _, _, images = two_people
    toy_config.schedule.rounds = 4  # one decay (×0.1) at round 3
    model = _model(toy_config)
    ctl = client_update(toy_config, model, images, torch.tensor([0, 1]), seed=4, round_index=3)
    told = replace(ctl.steps, lr_backbone=ctl.steps.lr_backbone * 10, lr_new=ctl.steps.lr_new * 10)
    start, delta = ctl.layout.unflatten(ctl.start), ctl.layout.unflatten(ctl.update)
    probe = neck_probe(model, ctl.layout, "neck.0", "neck.1", start, delta, told)
    assert probe.residual is not None and probe.residual < PROBE_FIT
    assert probe.details["weight_gradient_rank"] == 1
    assert abs(probe.details["step_size_vs_schedule"] - 0.1) < 1e-3
    truth = ctl.neck_inputs
    assert truth is not None and probe.inputs is not None
    err = min((probe.inputs - truth).norm(), (probe.inputs.flip(0) - truth).norm()) / truth.norm()
    assert err < 1e-2
