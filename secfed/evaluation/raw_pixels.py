"""The raw-pixel nearest-neighbour baseline: what retrieval scores without learning anything.

An image's feature is its own pixels at the model's input size, standardised per image (so a global
brightness or contrast change does not move it) and L2-normalised (so the cosine distance that
:func:`~secfed.evaluation.metrics.cmc_map` ranks by is one minus the pixels' correlation). Trained
models are reported next to this floor: if a model barely beats it, it has not learned ReID, and if
the floor is high, the data makes ReID trivial.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from secfed.evaluation.metrics import Array, RetrievalScores, cmc_map


def raw_pixel_features(images: torch.Tensor) -> torch.Tensor:
    """uint8 (N, 3, H, W) images at the model's input size → float32 (N, 3·H·W) unit-norm features.

    Each image is flattened, its mean subtracted and divided by its standard deviation, then
    L2-normalised. A flat image (zero variance) maps to the zero vector, as close to everything as
    to nothing.
    """
    if not isinstance(images, torch.Tensor) or images.dtype != torch.uint8:
        raise ValueError(f"images must be a uint8 tensor, got {getattr(images, 'dtype', type(images))}")
    if images.ndim != 4 or images.shape[1] != 3 or images.shape[0] == 0:
        raise ValueError(f"images must be (N, 3, H, W) with N ≥ 1, got shape {tuple(images.shape)}")
    x = images.flatten(1).float()
    x = x - x.mean(dim=1, keepdim=True)
    x = x / x.std(dim=1, keepdim=True).clamp_min(1e-6)
    return F.normalize(x, dim=1)


def raw_pixel_scores(
    query_images: torch.Tensor,
    gallery_images: torch.Tensor,
    query_pids: Array,
    gallery_pids: Array,
    query_camids: Array,
    gallery_camids: Array,
) -> RetrievalScores:
    """Rank-1/5/10 and mAP of raw-pixel nearest neighbours under the Market-1501 protocol."""
    return cmc_map(
        raw_pixel_features(query_images), raw_pixel_features(gallery_images),
        query_pids, gallery_pids, query_camids, gallery_camids,
    )
