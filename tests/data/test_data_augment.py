"""Batched augmentation: same result as torchvision's per-image ops, reproducible from a generator."""

from __future__ import annotations

import pytest
import torch
from torchvision.transforms.v2 import functional as TF

import torch.nn.functional as F

from secfed.data import augment
from secfed.data.augment import (
    TrainAugment,
    color_jitter,
    crop_flip,
    epoch_batches,
    random_crop_flip,
    random_erasing,
    scaled_pad,
)
from secfed.data.transforms import normalize


def _images(n=6, h=16, w=8, seed=0):
    return torch.randint(0, 256, (n, 3, h, w), dtype=torch.uint8, generator=torch.Generator().manual_seed(seed))


def _gen(seed):
    return torch.Generator().manual_seed(seed)


def test_scaled_pad():
    assert scaled_pad(256, 128) == 10
    assert scaled_pad(128, 64) == 5
    assert scaled_pad(64, 32) == 2  # 2.5 rounds to even
    assert scaled_pad(384, 192) == 15


@pytest.mark.parametrize("kernel", ["public", "gather"])  # CPU path, and the accelerator path run on CPU
def test_crop_flip_equals_torchvision_pad_crop_hflip_per_image(kernel):
    images = _images(n=5)
    pad = 3
    top = torch.tensor([0, 6, 3, 1, 5])
    left = torch.tensor([6, 0, 3, 2, 4])
    flip = torch.tensor([False, True, True, False, True])
    if kernel == "public":
        out = crop_flip(images, pad, top, left, flip)
    else:
        out = augment._crop_by_gather(F.pad(images, (pad,) * 4), images.shape, top, left, flip)
    for i in range(5):
        ref = TF.crop(TF.pad(images[i], [pad]), int(top[i]), int(left[i]), 16, 8)
        if flip[i]:
            ref = TF.horizontal_flip(ref)
        assert torch.equal(out[i], ref), i


def test_crop_at_centre_without_flip_is_identity():
    images = _images()
    n = images.shape[0]
    out = crop_flip(images, 2, torch.full((n,), 2), torch.full((n,), 2), torch.zeros(n, dtype=torch.bool))
    assert torch.equal(out, images)


def test_random_crop_flip_is_reproducible_and_seed_dependent():
    images = _images(n=32)
    a = random_crop_flip(images, _gen(1))
    assert torch.equal(a, random_crop_flip(images, _gen(1)))
    assert not torch.equal(a, random_crop_flip(images, _gen(2)))
    assert a.dtype == torch.uint8 and a.shape == images.shape


def test_train_augment_output_and_determinism():
    images = _images(n=8, h=32, w=16)
    augment = TrainAugment(jitter=0.1, erasing_p=0.5)
    x = augment(images, _gen(7))
    assert x.dtype == torch.float32 and x.shape == (8, 3, 32, 16)
    assert torch.equal(x, augment(images, _gen(7)))
    assert not torch.equal(x, augment(images, _gen(8)))
    with pytest.raises(ValueError, match="uint8"):
        augment(images.float(), _gen(0))


def test_train_augment_without_randomness_is_normalize():
    images = _images()
    plain = TrainAugment(pad=0, flip_p=0.0)
    assert torch.equal(plain(images, _gen(0)), normalize(images))


def test_flip_probability_one_mirrors_every_image():
    images = _images()
    out = TrainAugment(pad=0, flip_p=1.0)(images, _gen(0))
    assert torch.equal(out, normalize(images.flip(3)))


def test_color_jitter_matches_torchvision_factors():
    images = _images(n=4, h=8, w=4)
    strength = 0.4
    out = color_jitter(images, strength, _gen(5))
    factors = 1 + strength * (2 * torch.rand(3, 4, 1, 1, 1, generator=_gen(5)) - 1)
    for i in range(4):
        ref = images[i].float() / 255
        ref = TF.adjust_brightness(ref, float(factors[0, i]))
        ref = TF.adjust_contrast(ref, float(factors[1, i]))
        ref = TF.adjust_saturation(ref, float(factors[2, i]))
        assert (out[i].float() - ref * 255).abs().max() < 1.01, i  # float reference vs uint8 truncation
    assert torch.equal(color_jitter(images, 0.0, _gen(5)), images)


def test_random_erasing_boxes_are_zero_filled_and_sized():
    x = torch.ones(200, 3, 32, 16)
    out = random_erasing(x, 0.5, _gen(3))
    erased = (out == 0).all(dim=1)  # (N, H, W), all channels erased together
    counts = erased.flatten(1).sum(dim=1)
    hit = counts > 0
    assert 60 < int(hit.sum()) < 140  # about half the images
    area = counts[hit].float() / (32 * 16)
    assert area.min() >= 0.01 and area.max() <= 0.45  # area drawn in [0.02, 0.4], boxes rounded
    rows, cols = erased.any(dim=2), erased.any(dim=1)
    assert torch.equal(counts, rows.sum(1) * cols.sum(1))  # each erased region is one rectangle
    assert torch.equal(out[~hit], x[~hit])
    assert torch.equal(random_erasing(x, 0.0, _gen(3)), x)


def test_epoch_batches_cover_a_permutation():
    batches = epoch_batches(10, 4, _gen(0), drop_last=False)
    assert [len(b) for b in batches] == [4, 4, 2]
    assert sorted(torch.cat(batches).tolist()) == list(range(10))
    dropped = epoch_batches(10, 4, _gen(0))
    assert [len(b) for b in dropped] == [4, 4]
    assert all(torch.equal(a, b) for a, b in zip(dropped, batches))
    assert not torch.equal(torch.cat(epoch_batches(10, 4, _gen(1))), torch.cat(dropped))


def test_epoch_batches_small_shards():
    assert [len(b) for b in epoch_batches(3, 32, _gen(0))] == [3]  # one short batch rather than none
    assert [len(b) for b in epoch_batches(64, 32, _gen(0))] == [32, 32]
    with pytest.raises(ValueError, match="BatchNorm"):
        epoch_batches(1, 32, _gen(0))
    with pytest.raises(ValueError, match="batch_size"):
        epoch_batches(10, 0, _gen(0))
