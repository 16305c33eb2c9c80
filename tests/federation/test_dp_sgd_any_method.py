"""Example-level DP-SGD is the framework's, for any method: a method that cannot run under it says
so and --dp-sgd is refused naming it before any data is read; one that trains outside train_loop is
refused before anything leaves the client, never reported at ε = 0."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from secfed.algorithms import METHODS
from secfed.algorithms.base import Method, Site, make_optimizer, train_loop
from secfed.config import ConfigError, RunConfig
from secfed.validation import check
from secfed.federation.messages import TrainStats
from secfed.federation.runtime import run
from secfed.privacy.dpsgd import DpSgdUnsupported


def _dp_sgd(cfg: RunConfig, algorithm: str) -> RunConfig:
    cfg.method.algorithm = algorithm
    cfg.schedule.rounds = 1
    cfg.run.local_baseline = False
    cfg.privacy.dp_sgd = True
    cfg.privacy.dp_sgd_noise_multiplier = 1.0
    return cfg


class OwnLoop(Method):
    """An attacker's (or a careless author's) method: plain SGD on the site's data, not through train_loop."""

    name = "ownloop"

    def local_train(self, site: Site, schedule, seed: int, model=None) -> TrainStats:
        model = site.model if model is None else model
        optimizer = make_optimizer(model, schedule)
        for start in range(0, site.num_examples, schedule.batch_size):
            optimizer.zero_grad()
            images = site.images[start:start + schedule.batch_size].float() / 255
            torch.nn.functional.cross_entropy(model(images), site.labels[start:start + schedule.batch_size]).backward()
            optimizer.step()
        return TrainStats(0.0, 0.0, 0, 0)  # and it does not even report its steps


class RawWeights(Method):
    """A loss with a term on the weights outside the model's forward pass: not per-example, not clippable."""

    name = "rawweights"

    def local_train(self, site: Site, schedule, seed: int, model=None) -> TrainStats:
        model = site.model if model is None else model
        generator = torch.Generator().manual_seed(seed)

        def loss(m, images, labels, generator):
            logits = m(images.float() / 255)
            leak = (site.model.classifier.weight * images.float().mean()).sum()  # data, outside the forward
            return torch.nn.functional.cross_entropy(logits, labels) + leak, logits

        return train_loop(model, make_optimizer(model, schedule), iter(()), site.images, site.labels, loss, generator)


@pytest.mark.parametrize("method", [OwnLoop, RawWeights])
def test_a_method_training_outside_train_loop_is_refused_not_reported_at_epsilon_0(
        method: type[Method], tiny_config: RunConfig, tmp_path: Path) -> None:
    METHODS[method.name] = method
    try:
        with pytest.raises(DpSgdUnsupported, match=f"method '{method.name}' does not support --dp-sgd"):
            run(_dp_sgd(tiny_config, method.name), tmp_path / method.name)
    finally:
        METHODS.pop(method.name)


def test_a_method_declaring_it_cannot_is_refused_by_name_before_any_data_is_read(tiny_config: RunConfig) -> None:
    class Coupled(Method):
        name = "coupled"
        dp_sgd_unsupported = "its loss couples the examples of a batch"

    METHODS["coupled"] = Coupled
    try:
        for algorithm in ("coupled", "dfh", "fedreid"):
            cfg = _dp_sgd(tiny_config, algorithm)
            cfg.data.root = "/nonexistent"  # never read: the refusal comes first
            with pytest.raises(ConfigError, match=f"method '{algorithm}' does not support") as caught:
                check(cfg)
            assert caught.value.key == "privacy.dp_sgd"
    finally:
        METHODS.pop("coupled")
