"""Federated ReID methods: one module each, and options (KD, CDW) that wrap any of them.

    make_method(cfg, ...)  the configured method: FedPav | FedAvg | FedReID | DFH, wrapped by
                           CosineDistanceWeight and KnowledgeDistillation when asked for
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from secfed.algorithms.base import Method, MethodWrapper, Schedule, Site, step_lr
from secfed.algorithms.cdw import CosineDistanceWeight
from secfed.algorithms.dfh import DFH
from secfed.algorithms.fedavg import FedAvg
from secfed.algorithms.fedpav import FedPav
from secfed.algorithms.fedreid import FedReID
from secfed.algorithms.kd import KnowledgeDistillation
from secfed.models.sharing import SharedLayout

if TYPE_CHECKING:
    from secfed.config import RunConfig

METHODS: dict[str, type[Method]] = {cls.name: cls for cls in (FedPav, FedAvg, FedReID, DFH)}


def base_method(cfg: RunConfig) -> Method:
    try:
        return METHODS[cfg.method.algorithm](cfg)
    except KeyError:
        raise ValueError(f"unknown algorithm {cfg.method.algorithm!r}; choose one of {', '.join(METHODS)}") from None


def with_options(method: Method, cfg: RunConfig, *, public_images: torch.Tensor | None = None,
                 server_model: nn.Module | None = None, layout: SharedLayout | None = None) -> Method:
    """``method`` wrapped by the options the configuration asks for (CDW inside, KD outside)."""
    if cfg.method.cdw:
        method = CosineDistanceWeight(method)
    if cfg.method.kd:
        if public_images is None or server_model is None or layout is None:
            raise ValueError("knowledge distillation needs the public images, the server's model and the layout")
        lr = cfg.method.kd_lr
        method = KnowledgeDistillation(method, public_images, server_model, layout, epochs=cfg.method.kd_epochs,
                                       lr=lr, seed=cfg.seed)
    return method


__all__ = ["METHODS", "Method", "MethodWrapper", "Schedule", "Site", "base_method", "step_lr", "with_options"]
