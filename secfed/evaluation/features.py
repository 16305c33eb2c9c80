"""ReID features for retrieval: the neck output of the image plus that of its mirror image, L2-normalised.

Summing the features of an image and its horizontal flip is the usual test-time augmentation of
ReID baselines (torchreid, FedReIDBench); pedestrians look alike mirrored, so the sum is a steadier
description of the person than either view.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from secfed.data.transforms import normalize
from secfed.evaluation.metrics import Array, RetrievalScores, cmc_map
from secfed.models.reid import ReIDModel


class FeaturesNotFinite(ArithmeticError):
    """A model whose features are NaN or infinite (its weights diverged, or noise swamped them)."""


def extract_features(model: ReIDModel, images: torch.Tensor, batch_size: int = 256) -> torch.Tensor:
    """Features of ``images`` (uint8, N × 3 × H × W): (N × D) float32 on the CPU, rows of unit length.

    Runs ``model.embed`` in eval mode on the model's device, ``batch_size`` images at a time, and
    leaves every submodule in the train/eval mode it had before. :class:`FeaturesNotFinite` when a
    feature is NaN or infinite (found by review: noise of std 5 on a model's weights overflowed its
    forward pass, and the scoring stopped with a bare ValueError).
    """
    _check_images(images, "images")
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")

    parameter = next(model.parameters(), None)
    device = parameter.device if parameter is not None else torch.device("cpu")
    modes = [(module, module.training) for module in model.modules()]
    model.eval()
    try:
        with torch.inference_mode():
            chunks = []
            for start in range(0, len(images), batch_size):
                x = normalize(images[start : start + batch_size].to(device))
                feature = model.embed(x) + model.embed(x.flip(3))  # dim 3 is width: a mirror image
                if not bool(torch.isfinite(feature).all()):
                    raise FeaturesNotFinite("the model's features are not finite (NaN or an overflow)")
                chunks.append(F.normalize(feature.float(), dim=1).cpu())
            return torch.cat(chunks)
    finally:
        # Restore per module: a caller may keep parts in eval mode on purpose (e.g. frozen BatchNorm).
        for module, training in modes:
            module.training = training


def evaluate_model(
    model: ReIDModel,
    query_images: torch.Tensor,
    gallery_images: torch.Tensor,
    query_pids: Array,
    query_camids: Array,
    gallery_pids: Array,
    gallery_camids: Array,
    *,
    batch_size: int = 256,
    max_rank: int = 50,
) -> RetrievalScores:
    """Extract query and gallery features with ``model`` and score them (:func:`cmc_map`)."""
    # Bad inputs are caught before the (slow) forward passes, not after.
    _check_images(query_images, "query_images")
    _check_images(gallery_images, "gallery_images")
    for name, labels, images in (
        ("query_pids", query_pids, query_images),
        ("query_camids", query_camids, query_images),
        ("gallery_pids", gallery_pids, gallery_images),
        ("gallery_camids", gallery_camids, gallery_images),
    ):
        if len(labels) != len(images):
            raise ValueError(f"{name} has {len(labels)} entries for {len(images)} images")
    return cmc_map(
        extract_features(model, query_images, batch_size),
        extract_features(model, gallery_images, batch_size),
        query_pids=query_pids,
        gallery_pids=gallery_pids,
        query_camids=query_camids,
        gallery_camids=gallery_camids,
        max_rank=max_rank,
    )


def _check_images(images: torch.Tensor, name: str) -> None:
    if not isinstance(images, torch.Tensor) or images.dtype != torch.uint8:
        raise ValueError(f"{name} must be a uint8 torch.Tensor, got {getattr(images, 'dtype', type(images))}")
    if images.ndim != 4 or images.shape[1] != 3 or images.shape[0] == 0:
        raise ValueError(f"{name} must be a non-empty N × 3 × H × W batch, got shape {tuple(images.shape)}")
