"""DP-SGD on the real ReID model: torchvision ResNet-18 backbone + neck + classifier at 32×16."""

from __future__ import annotations

import copy

import pytest
import torch
from opacus.accountants import RDPAccountant
from opacus.grad_sample.utils import prepare_module
from torch import nn

from secfed.models.reid import ReIDModel
from secfed.privacy.accountant import SampledGaussianAccountant
from secfed.privacy.dpsgd import dp_compatible, make_private, plain_name
from secfed.privacy.noise import NoiseSource


def _noise(index: int = 0):
    return NoiseSource(0, reproducible=True).generator("dp-sgd", index)

CLASSES, BATCH = 5, 2


@pytest.fixture(scope="module")
def private_model() -> nn.Module:
    torch.manual_seed(0)
    return dp_compatible(ReIDModel("resnet18", num_classes=CLASSES, neck_dim=64))


@pytest.fixture(scope="module")
def batch() -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    return torch.randn(BATCH, 3, 32, 16, generator=generator), torch.randint(0, CLASSES, (BATCH,), generator=generator)


def _sgd(model: nn.Module) -> torch.optim.SGD:
    return torch.optim.SGD(model.parameters(), lr=0.1)


def test_dp_compatible_replaces_every_batchnorm_and_keeps_names(private_model: nn.Module) -> None:
    plain = ReIDModel("resnet18", num_classes=CLASSES, neck_dim=64)
    assert not any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in private_model.modules())
    assert isinstance(private_model.neck[1], nn.GroupNorm) and private_model.neck[1].num_groups == 1
    assert isinstance(private_model.backbone.bn1, nn.GroupNorm) and private_model.backbone.bn1.num_groups == 32
    stats = (".running_mean", ".running_var", ".num_batches_tracked")
    kept = {k for k in plain.state_dict() if not k.endswith(stats)}
    assert set(private_model.state_dict()) == kept
    assert any(isinstance(m, nn.BatchNorm2d) for m in plain.modules())  # the input model is untouched


def test_hooks_mode_breaks_on_torchvision_resnet(private_model: nn.Module, batch) -> None:
    """Why secfed uses the "ew" mode: Opacus' hooks trip over the ResNet's in-place ops."""
    module = prepare_module(copy.deepcopy(private_model), "hooks", batch_first=True, loss_reduction="mean")
    images, labels = batch
    with pytest.raises(RuntimeError, match="modified inplace"):
        nn.functional.cross_entropy(module(images), labels).backward()


def test_per_sample_gradients_match_one_example_at_a_time(private_model: nn.Module, batch) -> None:
    model = copy.deepcopy(private_model).eval()  # dropout off, so both sides see the same function
    images, labels = batch
    reference = []
    for i in range(BATCH):
        model.zero_grad()
        nn.functional.cross_entropy(model(images[i : i + 1]), labels[i : i + 1]).backward()
        reference.append({name: p.grad.clone() for name, p in model.named_parameters()})
    model.zero_grad(set_to_none=True)
    private = make_private(model, _sgd(model), noise_multiplier=0.0, max_grad_norm=1.0, sample_rate=0.1, expected_batch_size=BATCH, noise_generator=_noise())
    nn.functional.cross_entropy(private.module(images), labels).backward()
    for name, p in private.module.named_parameters():
        expected = torch.stack([r[plain_name(name)] for r in reference])
        assert p.grad_sample.shape == (BATCH, *p.shape)
        error = float((p.grad_sample - expected).abs().max())
        assert error <= 1e-5 * float(expected.abs().max()) + 1e-8, name


def test_one_private_step_is_clipped_and_bounded(private_model: nn.Module, batch) -> None:
    model = copy.deepcopy(private_model)
    before = [p.detach().clone() for p in model.parameters()]
    clip = 1e-3
    private = make_private(model, _sgd(model), noise_multiplier=0.0, max_grad_norm=clip, sample_rate=0.1, expected_batch_size=BATCH, noise_generator=_noise())
    images, labels = batch
    private.optimizer.zero_grad(set_to_none=True)
    nn.functional.cross_entropy(private.module(images), labels).backward()
    per_example = torch.cat([p.grad_sample.reshape(BATCH, -1) for p in model.parameters()], dim=1).norm(dim=1)
    assert (per_example > clip).all()  # so clipping really acts
    private.optimizer.step()
    step = torch.cat([(p.detach() - b).reshape(-1) for p, b in zip(model.parameters(), before)]).norm()
    assert 0 < float(step) <= 0.1 * clip * (1 + 1e-5)  # lr · (Σ clipped)/B ≤ lr · C
    assert private.accountant.steps == 1 and private.epsilon(1e-5) == float("inf")  # no noise, no privacy


def test_noise_is_added_and_accounted_across_rounds(private_model: nn.Module) -> None:
    accountant = SampledGaussianAccountant()  # one per client, kept across rounds
    model = copy.deepcopy(private_model)
    noise_std = 0.1 * 1.0 * 1e-3 / BATCH  # lr · z · C / B per coordinate
    for round_index in range(2):  # a fresh optimiser per round over the same accountant
        private = make_private(
            model, _sgd(model), noise_multiplier=1.0, max_grad_norm=1e-3, sample_rate=0.2, expected_batch_size=BATCH,
            accountant=accountant, noise_generator=_noise(round_index),
        )
        before = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
        private.empty_step()  # an empty Poisson batch: no gradient, noise only, and still a step
        update = torch.cat([p.detach().reshape(-1) for p in model.parameters()]) - before
        assert float(update.std()) == pytest.approx(noise_std, rel=0.01)
        assert abs(float(update.mean())) < 5 * noise_std / update.numel() ** 0.5
    opacus = RDPAccountant()
    opacus.history = [(1.0, 0.2, 2)]
    assert accountant.steps == 2 and accountant.epsilon(1e-5) == opacus.get_epsilon(1e-5)


def test_wrapped_names_map_back_to_the_plain_model(private_model: nn.Module) -> None:
    model = copy.deepcopy(private_model)
    private = make_private(model, _sgd(model), noise_multiplier=1.0, max_grad_norm=1.0, sample_rate=0.1, expected_batch_size=4, noise_generator=_noise())
    wrapped = dict(private.module.named_parameters())
    plain = dict(model.named_parameters())
    assert all(name.startswith("_module.") for name in wrapped)
    assert {plain_name(n): p for n, p in wrapped.items()}.keys() == plain.keys()
    assert all(plain[plain_name(n)] is p for n, p in wrapped.items())  # the very same tensors


def test_refusals() -> None:
    plain = ReIDModel("resnet18", num_classes=CLASSES, neck_dim=64)
    with pytest.raises(ValueError, match="dp_compatible"):
        make_private(plain, _sgd(plain), noise_multiplier=1.0, max_grad_norm=1.0, sample_rate=0.1, expected_batch_size=4, noise_generator=_noise())
    fixed = dp_compatible(plain)
    partial = torch.optim.SGD(fixed.backbone.parameters(), lr=0.1)
    with pytest.raises(ValueError, match="exactly the model's trainable parameters"):
        make_private(fixed, partial, noise_multiplier=1.0, max_grad_norm=1.0, sample_rate=0.1, expected_batch_size=4, noise_generator=_noise())


def test_a_data_free_penalty_joins_the_clipped_noised_gradient_unclipped() -> None:
    """train_loop's ``penalty`` (FedProx's proximal term) leaves its gradient in ``p.grad`` before the step;
    Opacus' DPOptimizer overwrote it, SecureNoiseDPOptimizer adds it to the private mean gradient."""
    torch.manual_seed(0)
    plain = nn.Linear(3, 2)
    twin = copy.deepcopy(plain)
    images, labels = torch.randn(4, 3), torch.tensor([0, 1, 1, 0])
    private = make_private(twin, torch.optim.SGD(twin.parameters(), lr=1.0), noise_multiplier=0.0, max_grad_norm=1e6,
                           sample_rate=0.5, expected_batch_size=4, noise_generator=_noise())
    private.optimizer.zero_grad(set_to_none=True)
    nn.functional.cross_entropy(private.module(images), labels).backward()
    (0.5 * twin.weight.pow(2).sum()).backward()  # the penalty: gradient = w
    private.optimizer.step()
    loss = nn.functional.cross_entropy(plain(images), labels) + 0.5 * plain.weight.pow(2).sum()
    torch.optim.SGD(plain.parameters(), lr=1.0).zero_grad()
    loss.backward()
    with torch.no_grad():
        for p in plain.parameters():
            p -= p.grad
    for mine, reference in zip(twin.parameters(), plain.parameters()):
        torch.testing.assert_close(mine, reference)
