from __future__ import annotations

import pytest
import torch
from torch import nn

from secfed.models.sharing import shared_layout
from secfed.privacy.beta import BetaNoise, add_beta_noise
from secfed.privacy.noise import NoiseSource


def torch_generator(seed: int, purpose: str, *indices: int):
    """A reproducible noise generator (the tests' stand-in for the run's secure one)."""
    return NoiseSource(seed, reproducible=True).generator(purpose, *indices)


class TinyReid(nn.Module):
    """Backbone + neck with BatchNorm, named like ReIDModel so the real sharing rule applies."""

    def __init__(self) -> None:
        super().__init__()
        self.backbone = nn.Sequential(nn.Conv2d(3, 64, 3), nn.BatchNorm2d(64))
        self.neck = nn.Sequential(nn.Linear(64, 256), nn.BatchNorm1d(256))
        self.classifier = nn.Linear(256, 5)


def _layout_and_weights():
    model = TinyReid()
    with torch.no_grad():  # non-trivial running statistics
        model.backbone[1].running_mean.uniform_(-1, 1)
        model.backbone[1].running_var.uniform_(0.5, 2)
    layout = shared_layout(model, ("backbone.", "neck."), bn_stats="shared")
    return model, layout, layout.flatten(model.state_dict())


def test_noise_std_and_only_on_trainable_entries() -> None:
    _, layout, flat = _layout_and_weights()
    mask = layout.trainable_mask()
    assert mask.any() and not mask.all()  # the layout really holds BN statistics
    noised = add_beta_noise(flat, 0.05, mask, torch_generator(0, "test"))
    diff = noised - flat
    assert torch.equal(noised[~mask], flat[~mask])  # running mean / var bit-identical
    assert float(diff[mask].std()) == pytest.approx(0.05, rel=0.02)  # ~17k draws: 2% ≫ sampling error
    assert abs(float(diff[mask].mean())) < 0.05 * 5 / mask.sum() ** 0.5


def test_dict_form_never_touches_bn_state() -> None:
    model, _, _ = _layout_and_weights()
    state = model.state_dict()
    trainable = [name for name, _ in model.named_parameters()]
    noised = add_beta_noise(state, 0.1, trainable, torch_generator(0, "test"))
    for name, tensor in state.items():
        if name in trainable:
            assert not torch.equal(noised[name], tensor)
        else:  # running_mean, running_var, num_batches_tracked
            assert torch.equal(noised[name], tensor) and noised[name].dtype == tensor.dtype
    spread = torch.cat([(noised[n] - state[n]).reshape(-1) for n in trainable])
    assert float(spread.std()) == pytest.approx(0.1, rel=0.03)


@pytest.mark.parametrize("name", ["backbone.1.running_var", "backbone.1.num_batches_tracked"])
def test_marking_bn_state_trainable_is_refused(name: str) -> None:
    model, _, _ = _layout_and_weights()
    with pytest.raises(ValueError, match="BatchNorm state"):
        add_beta_noise(model.state_dict(), 0.1, [name], torch_generator(0, "test"))


def test_same_seed_same_noise_and_zero_beta_is_identity() -> None:
    _, layout, flat = _layout_and_weights()
    mask = layout.trainable_mask()
    a = add_beta_noise(flat, 0.01, mask, torch_generator(3, "x", 1))
    b = add_beta_noise(flat, 0.01, mask, torch_generator(3, "x", 1))
    c = add_beta_noise(flat, 0.01, mask, torch_generator(3, "x", 2))
    assert torch.equal(a, b) and not torch.equal(a, c)
    assert torch.equal(add_beta_noise(flat, 0.0, mask, torch_generator(3, "x")), flat)


def test_bad_inputs_are_refused() -> None:
    flat = torch.zeros(4)
    with pytest.raises(ValueError, match="β"):
        add_beta_noise(flat, -1.0, torch.ones(4, dtype=torch.bool), torch_generator(0, "t"))
    with pytest.raises(ValueError, match="mask shape"):
        add_beta_noise(flat, 1.0, torch.ones(5, dtype=torch.bool), torch_generator(0, "t"))
    with pytest.raises(TypeError):
        add_beta_noise(flat, 1.0, ["a"], torch_generator(0, "t"))


def test_single_mode_broadcasts_theta_unchanged_and_noises_the_aggregate() -> None:
    _, layout, flat = _layout_and_weights()
    mask = layout.trainable_mask()
    beta = BetaNoise(0.02, "single", mask, NoiseSource(7))
    assert torch.equal(beta.broadcast(flat, 3, client_id=1), flat)
    noised = beta.aggregate(flat, 3)
    assert torch.equal(noised[~mask], flat[~mask])
    assert float((noised - flat)[mask].std()) == pytest.approx(0.02, rel=0.03)


def test_noise_cannot_be_regenerated_from_the_run_seed() -> None:
    """The old code drew the noise from the run seed stored in config.json: whoever read it could subtract
    the noise. Now two servers with the same run seed draw independent noise, unless the run asks for
    reproducible (and not private) noise."""
    _, layout, flat = _layout_and_weights()
    mask = layout.trainable_mask()
    a = BetaNoise(0.02, "single", mask, NoiseSource(7)).aggregate(flat, 3) - flat
    b = BetaNoise(0.02, "single", mask, NoiseSource(7)).aggregate(flat, 3) - flat
    assert abs(float(torch.corrcoef(torch.stack([a[mask], b[mask]]))[0, 1])) < 0.05
    r1 = BetaNoise(0.02, "single", mask, NoiseSource(7, reproducible=True)).aggregate(flat, 3)
    r2 = BetaNoise(0.02, "single", mask, NoiseSource(7, reproducible=True)).aggregate(flat, 3)
    assert torch.equal(r1, r2)


def test_double_mode_gives_each_client_fresh_noise_and_keeps_eq14_exact() -> None:
    _, layout, theta = _layout_and_weights()
    mask = layout.trainable_mask()
    beta = BetaNoise(0.02, "double", mask, NoiseSource(7))
    received = {i: beta.broadcast(theta, 5, i) for i in range(4)}
    n0, n1 = received[0] - theta, received[1] - theta
    assert torch.equal(n0[~mask], torch.zeros_like(n0[~mask]))
    assert float(n0[mask].std()) == pytest.approx(0.02, rel=0.03)
    correlation = torch.corrcoef(torch.stack([n0[mask], n1[mask]]))[0, 1]
    assert abs(float(correlation)) < 0.05  # independent draws per client

    # Clients train from their noised start; the server sees only updates measured from there.
    generator = torch.Generator().manual_seed(1)
    trained = {i: received[i] + 0.1 * torch.randn(theta.shape, generator=generator) for i in received}
    updates = [trained[i] - received[i] for i in received]
    # the server kept each draw's key for the round and regenerates n_i to undo the offset
    noise_mean = torch.stack([beta.broadcast_noise(5, i) for i in received]).mean(0)
    server_mean = theta + torch.stack(updates).mean(0) + noise_mean
    assert torch.allclose(server_mean, torch.stack(list(trained.values())).mean(0), atol=1e-6)


def test_private_noise_is_aes_ctr_keyed_with_128_fresh_bits_and_hardened_as_stated(monkeypatch) -> None:
    """SECURITY.md's sentences on the noise, each pinned (found by review: a 16-bit key, numpy's PCG64
    instead of AES-CTR, or one draw instead of four all passed every test, since the tests only
    checked that two runs differ and that the variance is right)."""
    import secrets

    import numpy as np
    import randomgen

    from secfed.privacy import noise

    asked: list[int] = []
    real = secrets.randbits
    monkeypatch.setattr(noise.secrets, "randbits", lambda k: asked.append(k) or real(k))
    source = noise.NoiseSource(7)
    generator = source.generator("beta", 1)
    assert asked == [128] and isinstance(generator.bit_generator, randomgen.AESCounter)
    assert isinstance(noise.NoiseSource(7, reproducible=True).generator("beta", 1).bit_generator,
                      randomgen.AESCounter)
    # the sum of four N(0, std²) draws, halved: exactly that, draw for draw
    key = source.key("check")
    drawn = noise.gaussian((1000,), 3.0, noise.NoiseSource.from_key(key)).numpy()
    again = noise.NoiseSource.from_key(key)
    four = sum(again.standard_normal(1000, dtype=np.float32) for _ in range(4))
    np.testing.assert_allclose(drawn, four * np.float32(1.5), rtol=1e-6)
