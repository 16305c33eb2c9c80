"""Batched training augmentation on uint8 images, every random draw from an explicit generator.

FedReIDBench's train transform (``data_utils.py`` of cap-ntu/FedReID), per image::

    [ColorJitter(0.1, 0.1, 0.1)] → Resize(256×128) → Pad(10) → RandomCrop(256×128)
    → RandomHorizontalFlip → ToTensor → Normalize → [RandomErasing(p, fill 0)]

Here the resize happened once at load time (:func:`secfed.data.images.load_images`) and the rest
runs on a whole batch: random draws and normalisation vectorised, the crop a strided copy. The
pad is scaled with the image: 10 px at 256×128, 2 px at 64×32. Draws come from the
``torch.Generator`` passed in (CPU), so a client's epoch is reproducible from its seed whatever
device the images are on.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from secfed.data.transforms import normalize

REFERENCE_SIZE = (256, 128)  # the input size FedReIDBench's Pad(10) was chosen for
REFERENCE_PAD = 10


def scaled_pad(height: int, width: int) -> int:
    """Pad(10) at 256×128, scaled by the image's linear size (geometric mean of the two ratios)."""
    ratio = math.sqrt(height * width / (REFERENCE_SIZE[0] * REFERENCE_SIZE[1]))
    return round(REFERENCE_PAD * ratio)


def crop_flip(
    images: torch.Tensor, pad: int, top: torch.Tensor, left: torch.Tensor, flip: torch.Tensor
) -> torch.Tensor:
    """Zero-pad by ``pad``, crop back to (H, W) at (``top``, ``left``), mirror where ``flip``.

    The batched equivalent of torchvision's Pad → crop → hflip. ``top``/``left`` are in
    [0, 2·pad] per image, ``flip`` is bool per image.
    """
    padded = F.pad(images, (pad, pad, pad, pad))
    if images.device.type == "cpu":
        return _crop_by_slices(padded, images.shape, top, left, flip)
    return _crop_by_gather(padded, images.shape, top, left, flip)


def _crop_by_slices(
    padded: torch.Tensor, shape: torch.Size, top: torch.Tensor, left: torch.Tensor, flip: torch.Tensor
) -> torch.Tensor:
    # On CPU one strided copy per image moves a byte per pixel, where a batched gather also reads
    # an 8-byte index per pixel: 2.4 vs 11 ms CPU for 32 images at 256x128 (within 0.2 ms at 64x32).
    _, _, h, w = shape
    out = torch.empty(shape, dtype=padded.dtype)
    for i, (y, x, mirror) in enumerate(zip(top.tolist(), left.tolist(), flip.tolist())):
        crop = padded[i, :, y : y + h, x : x + w]
        out[i] = crop.flip(2) if mirror else crop
    return out


def _crop_by_gather(
    padded: torch.Tensor, shape: torch.Size, top: torch.Tensor, left: torch.Tensor, flip: torch.Tensor
) -> torch.Tensor:
    # On an accelerator one gather kernel beats a kernel launch per image.
    n, c, h, w = shape
    device = padded.device
    rows = top.to(device)[:, None] + torch.arange(h, device=device)  # (N, H) rows of the padded image
    cols = left.to(device)[:, None] + torch.arange(w, device=device)  # (N, W)
    cols = torch.where(flip.to(device)[:, None], cols.flip(1), cols)
    index = (rows[:, :, None] * padded.shape[3] + cols[:, None, :]).view(n, 1, h * w).expand(n, c, h * w)
    return padded.reshape(n, c, -1).gather(2, index).view(n, c, h, w)


def random_crop_flip(
    images: torch.Tensor, generator: torch.Generator, pad: int | None = None, flip_p: float = 0.5
) -> torch.Tensor:
    """Pad + random crop + random horizontal flip of a uint8 batch (N, 3, H, W)."""
    n, _, h, w = images.shape
    pad = scaled_pad(h, w) if pad is None else pad
    top = torch.randint(0, 2 * pad + 1, (n,), generator=generator)
    left = torch.randint(0, 2 * pad + 1, (n,), generator=generator)
    flip = torch.rand(n, generator=generator) < flip_p
    return crop_flip(images, pad, top, left, flip)


def color_jitter(images: torch.Tensor, strength: float, generator: torch.Generator) -> torch.Tensor:
    """torchvision's ColorJitter(brightness=s, contrast=s, saturation=s) on a uint8 batch.

    Each factor is drawn per image from [1 - s, 1 + s]. The three are applied in a fixed order
    (brightness, contrast, saturation), where torchvision shuffles the order per image.
    """
    n = images.shape[0]
    factors = 1 + strength * (2 * torch.rand(3, n, 1, 1, 1, generator=generator) - 1)
    brightness, contrast, saturation = (f.to(images.device) for f in factors)
    x = images.float()  # in-place from here on: a 256x128 batch is large, every temporary costs
    x.mul_(brightness).clamp_(0, 255)
    gray_mean = _grayscale(x).mean(dim=(1, 2, 3), keepdim=True)
    x.mul_(contrast).add_(gray_mean * (1 - contrast)).clamp_(0, 255)
    gray = _grayscale(x).mul_(1 - saturation)
    x.mul_(saturation).add_(gray).clamp_(0, 255)
    return x.to(torch.uint8)  # truncates, as torchvision does for uint8 images


def _grayscale(x: torch.Tensor) -> torch.Tensor:
    """ITU-R 601 luma, as torchvision's rgb_to_grayscale: (N, 1, H, W)."""
    return (x[:, 0:1] * 0.299).add_(x[:, 1:2], alpha=0.587).add_(x[:, 2:3], alpha=0.114)


def random_erasing(
    x: torch.Tensor,
    p: float,
    generator: torch.Generator,
    area: tuple[float, float] = (0.02, 0.4),
    aspect: float = 0.3,
    attempts: int = 10,
    inplace: bool = False,
) -> torch.Tensor:
    """Zhong et al.'s random erasing on a normalised float batch, filled with 0 (the mean colour).

    With probability ``p`` an image gets one rectangle of ``area`` fraction and aspect ratio in
    [``aspect``, 1/``aspect``]. The reference retries up to 100 times until the box fits; here
    ``attempts`` boxes are drawn at once per image and the first that fits is used. ``inplace``
    writes into ``x`` instead of a copy.
    """
    n, _, h, w = x.shape
    erase = torch.rand(n, generator=generator) < p
    target = h * w * (area[0] + (area[1] - area[0]) * torch.rand(n, attempts, generator=generator))
    ratio = aspect + (1 / aspect - aspect) * torch.rand(n, attempts, generator=generator)
    box_h = (target * ratio).sqrt().round().long()
    box_w = (target / ratio).sqrt().round().long()
    fits = (box_h < h) & (box_w < w)
    first = fits.float().argmax(dim=1)  # index of the first box that fits (0 if none does)
    pick = torch.arange(n)
    box_h, box_w = box_h[pick, first], box_w[pick, first]
    erase &= fits.any(dim=1)
    top = (torch.rand(n, generator=generator) * (h - box_h + 1)).long()
    left = (torch.rand(n, generator=generator) * (w - box_w + 1)).long()
    rows = torch.arange(h)[None, :]
    cols = torch.arange(w)[None, :]
    in_rows = (rows >= top[:, None]) & (rows < (top + box_h)[:, None])  # (N, H)
    in_cols = (cols >= left[:, None]) & (cols < (left + box_w)[:, None])  # (N, W)
    mask = (in_rows[:, :, None] & in_cols[:, None, :] & erase[:, None, None]).unsqueeze(1)
    mask = mask.to(x.device)
    return x.masked_fill_(mask, 0.0) if inplace else x.masked_fill(mask, 0.0)


@dataclass(frozen=True)
class TrainAugment:
    """The whole train transform: uint8 (N, 3, H, W) → normalised float32, augmented.

    ``pad`` None scales FedReIDBench's Pad(10) to the image size; ``jitter`` > 0 adds
    ColorJitter(jitter, jitter, jitter) (FedReIDBench's ``--color_jitter`` is 0.1); ``erasing_p``
    > 0 adds random erasing (its ``--erasing_p``).
    """

    pad: int | None = None
    flip_p: float = 0.5
    jitter: float = 0.0
    erasing_p: float = 0.0

    def __call__(self, images: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        if images.dtype != torch.uint8 or images.dim() != 4 or images.shape[1] != 3:
            raise ValueError(f"expected uint8 images (N, 3, H, W), got {images.dtype} {tuple(images.shape)}")
        if self.jitter > 0:
            images = color_jitter(images, self.jitter, generator)
        x = normalize(random_crop_flip(images, generator, self.pad, self.flip_p))
        if self.erasing_p > 0:
            x = random_erasing(x, self.erasing_p, generator, inplace=True)  # x is ours: normalize made it
        return x


def epoch_batches(n: int, batch_size: int, generator: torch.Generator, drop_last: bool = True) -> list[torch.Tensor]:
    """One epoch of shuffled index batches over ``n`` samples.

    ``drop_last`` drops a final partial batch: a batch of one breaks BatchNorm in training mode,
    and small tails add noisy steps. A shard smaller than one batch still yields one batch of
    all its samples (dropping it would train on nothing); a shard of fewer than 2 samples is an
    error, since BatchNorm cannot train on it.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    if n < 2:
        raise ValueError(f"cannot make training batches from {n} sample(s); BatchNorm needs at least 2")
    batches = list(torch.randperm(n, generator=generator).split(batch_size))
    if drop_last and len(batches) > 1 and len(batches[-1]) < batch_size:
        batches.pop()
    return batches
