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
from secfed.errors import ConfigError, ConfigIssue
from secfed.models.sharing import SharedLayout

if TYPE_CHECKING:
    from secfed.config import RunConfig

METHODS: dict[str, type[Method]] = {cls.name: cls for cls in (FedPav, FedAvg, FedReID, DFH)}


def method_issues(cfg: RunConfig) -> list[ConfigIssue]:
    """What the chosen method refuses: an unknown name, or a privacy option it declares it cannot support."""
    name = cfg.method.algorithm
    if name not in METHODS:
        return [ConfigIssue("method.algorithm", f"unknown method {name!r}; known: {', '.join(METHODS)}")]
    method = METHODS[name]
    issues = []
    if cfg.privacy.dp_sgd and method.dp_sgd_unsupported:
        issues.append(ConfigIssue("privacy.dp_sgd", f"method {name!r} does not support `privacy.dp_sgd`: "
                                  f"{method.dp_sgd_unsupported}"))
    defaults = type(cfg.method).model_fields
    for other in METHODS.values():  # given a value of its own (not its default) for another method: said
        issues += [ConfigIssue(f"method.{key}", f"applies to `method.algorithm` {other.name}", unused=True)
                   for key in other.own_settings
                   if other is not method and getattr(cfg.method, key) != defaults[key].default]
    return issues + method.config_issues(cfg)


def method_class(cfg: RunConfig) -> type[Method]:
    """The registered class of the configured method, whose declarations say its rules (refuses an
    unknown name as :func:`method_issues` does)."""
    if cfg.method.algorithm not in METHODS:
        raise ConfigError(method_issues(cfg))
    return METHODS[cfg.method.algorithm]


def base_method(cfg: RunConfig) -> Method:
    """The configured method, unwrapped."""
    return method_class(cfg)(cfg)


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


__all__ = ["METHODS", "Method", "MethodWrapper", "Schedule", "Site", "base_method", "method_class", "method_issues",
           "step_lr", "with_options"]
