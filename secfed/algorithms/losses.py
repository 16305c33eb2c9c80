"""The batch-hard triplet loss (Hermans, Beyer & Leibe 2017; Yang et al.'s Eq. 3.4).

    L = mean over anchors a of [ max_{p: y_p = y_a} ‖f_a − f_p‖ − min_{n: y_n ≠ y_a} ‖f_a − f_n‖ + m ]₊

Euclidean distances on the features as they are (no normalisation), as the reference codes of
both papers. An anchor with no negative in the batch (a batch of one identity) contributes nothing;
a batch where no anchor has one gives 0. Written here rather than taken from a library because it
is a dozen lines and torchreid / pytorch-metric-learning would pull in much more than they give.
"""

from __future__ import annotations

import torch


def pairwise_distances(features: torch.Tensor) -> torch.Tensor:
    """(B, B) Euclidean distances; the square root is taken of a floor of 1e-12 so that the
    gradient stays finite where two features coincide (an image and its duplicate)."""
    squared = features.pow(2).sum(1)
    d2 = squared[:, None] + squared[None, :] - 2 * features @ features.t()
    return d2.clamp_min(1e-12).sqrt()


def batch_hard_triplet(features: torch.Tensor, labels: torch.Tensor, margin: float) -> torch.Tensor:
    """Eq. 3.4 over the batch ``features`` (B, d) with identity ``labels`` (B,)."""
    if features.dim() != 2 or labels.shape != (features.shape[0],):
        raise ValueError(f"features (B, d) and labels (B,) expected, got {tuple(features.shape)} and "
                         f"{tuple(labels.shape)}")
    dist = pairwise_distances(features)
    same = labels[:, None] == labels[None, :]
    hardest_positive = dist.masked_fill(~same, float("-inf")).amax(1)  # the anchor itself is a positive (0)
    hardest_negative = dist.masked_fill(same, float("inf")).amin(1)
    valid = torch.isfinite(hardest_negative)
    if not bool(valid.any()):
        return features.sum() * 0.0  # keeps the graph (and the loop's backward) alive
    losses = torch.relu(hardest_positive[valid] - hardest_negative[valid] + margin)
    return losses.mean()
