"""The one rule of what is shared: layouts, flattening, and what stays on the client."""

from __future__ import annotations

import pytest
import torch

from secfed.models.reid import ReIDModel
from secfed.models.sharing import is_shared, load_shared, local_state, model_hash, shared_layout

PAV = ("backbone.", "neck.")  # FedPav's shared prefixes
AVG = (*PAV, "classifier.")  # FedAvg shares the classifier too


@pytest.fixture(scope="module")
def model() -> ReIDModel:
    torch.manual_seed(0)
    return ReIDModel("resnet18", num_classes=7)


def test_fedpav_shares_backbone_and_neck_not_classifier(model: ReIDModel) -> None:
    layout = shared_layout(model, PAV, bn_stats="shared")
    names = set(layout.names)
    assert not any(n.startswith("classifier.") for n in names)
    assert "neck.0.weight" in names and "neck.1.running_var" in names
    assert "backbone.conv1.weight" in names and "backbone.bn1.running_mean" in names
    assert not any(n.endswith("num_batches_tracked") for n in names)
    params = {n for n, _ in model.named_parameters() if not n.startswith("classifier.")}
    assert {s.name for s in layout.segments if s.trainable} == params


def test_fedavg_shares_the_classifier(model: ReIDModel) -> None:
    layout = shared_layout(model, AVG, bn_stats="shared")
    assert {"classifier.weight", "classifier.bias"} <= set(layout.names)


def test_local_bn_stats_stay_local(model: ReIDModel) -> None:
    layout = shared_layout(model, PAV, bn_stats="local")
    assert not any(n.endswith(("running_mean", "running_var")) for n in layout.names)
    kept = local_state(model, layout)
    assert "backbone.bn1.running_mean" in kept and "neck.1.running_var" in kept
    assert "classifier.weight" in kept and "backbone.bn1.num_batches_tracked" in kept
    # every state key is exactly one of shared / local
    assert set(kept) | set(layout.names) == set(model.state_dict())
    assert not set(kept) & set(layout.names)


@pytest.mark.parametrize("name, classifier, bn, expected", [
    ("backbone.layer1.0.conv1.weight", False, "local", True),
    ("backbone.layer1.0.bn1.running_mean", False, "local", False),
    ("backbone.layer1.0.bn1.running_mean", False, "shared", True),
    ("backbone.layer1.0.bn1.num_batches_tracked", True, "shared", False),
    ("classifier.weight", False, "shared", False),
    ("classifier.weight", True, "shared", True),
])
def test_rule_per_key(name: str, classifier: bool, bn: str, expected: bool) -> None:
    assert is_shared(name, AVG if classifier else PAV, bn) is expected


def test_flatten_roundtrip_and_load_shared_touches_only_shared(model: ReIDModel) -> None:
    layout = shared_layout(model, PAV, bn_stats="shared")
    vector = layout.flatten(model.state_dict())
    assert vector.dtype == torch.float32 and vector.numel() == layout.size == layout.nbytes // 4
    for name, value in layout.unflatten(vector).items():
        assert torch.equal(value, model.state_dict()[name].float())

    other = ReIDModel("resnet18", num_classes=7)
    classifier_before = other.classifier.weight.detach().clone()
    load_shared(other, layout, vector)
    assert torch.equal(layout.flatten(other.state_dict()), vector)
    assert torch.equal(other.classifier.weight, classifier_before)
    assert model_hash(vector) == model_hash(layout.flatten(other.state_dict()))
    with pytest.raises(ValueError, match="shared layout"):
        layout.unflatten(vector[:-1])


def test_trainable_mask_covers_parameters_only(model: ReIDModel) -> None:
    layout = shared_layout(model, PAV, bn_stats="shared")
    mask = layout.trainable_mask()
    n_params = sum(p.numel() for n, p in model.named_parameters() if not n.startswith("classifier."))
    assert int(mask.sum()) == n_params
    stats = sum(s.numel for s in layout.segments if not s.trainable)
    assert layout.size - n_params == stats > 0


def test_layout_fingerprint_differs_by_rule(model: ReIDModel) -> None:
    a = shared_layout(model, PAV, "shared").fingerprint()
    b = shared_layout(model, PAV, "local").fingerprint()
    c = shared_layout(model, AVG, "shared").fingerprint()
    assert len({a, b, c}) == 3
