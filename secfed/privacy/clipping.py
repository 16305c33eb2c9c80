"""L2 clipping of a client's whole shared update: what bounds one client's contribution.

Every privacy figure secfed prints rests on ``‖clipped‖₂ ≤ max_norm`` holding *exactly*, not
"up to float rounding", so the scaled vector is re-measured in float64 and nudged down in the rare
case where float32 rounding left it a hair above the bound.
"""

from __future__ import annotations

import math

import torch

_MAX_NUDGES = 8


def l2_norm(vector: torch.Tensor) -> float:
    """The L2 norm of ``vector`` accumulated in float64 (a float32 sum of 10⁷ squares drifts)."""
    return float(torch.linalg.vector_norm(vector.detach(), dtype=torch.float64))


def clip_l2(update: torch.Tensor, max_norm: float) -> tuple[torch.Tensor, float]:
    """Scale ``update`` down to L2 norm ``max_norm`` if it is longer; return (clipped, norm before).

    The clipped vector keeps ``update``'s dtype and direction and is a new tensor (``update`` is
    untouched). A vector already within the bound is returned as an unchanged copy. The whole vector
    is clipped as one: with ``bn_stats="shared"`` that includes the BatchNorm running statistics.

    Raises ``ValueError`` for a non-positive bound and for an update holding NaN or ±inf (a
    non-finite update has no norm, so no bound could hold for it).
    """
    if not (math.isfinite(max_norm) and max_norm > 0):
        raise ValueError(f"clip norm must be a positive finite number, got {max_norm}")
    if not update.is_floating_point():
        raise TypeError(f"update must be a floating-point tensor, got {update.dtype}")
    norm = l2_norm(update)
    if not math.isfinite(norm):
        raise ValueError("update contains NaN or infinite values; refusing to clip it (no bound would hold)")
    if norm <= max_norm:
        return update.detach().clone(), norm
    clipped = update.detach() * (max_norm / norm)
    for _ in range(_MAX_NUDGES):
        after = l2_norm(clipped)
        if after <= max_norm:
            return clipped, norm
        # rounding of the scaled entries overshot by a few ulps: shrink by the excess.
        clipped.mul_(max_norm / after * (1.0 - 2.0**-22))
    raise ArithmeticError(f"could not bring an update of norm {norm} under {max_norm} in {update.dtype}")
