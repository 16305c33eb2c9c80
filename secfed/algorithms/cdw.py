"""Cosine distance weights (Zhuang et al., MM 2020, Alg. 3), around any method.

    m_k = mean over one batch of the client's images of 1 − cos(f, f^t)

where f are the logits of the model the client started the round with (global shared weights +
its own classifier) and f^t those of the model after local training. m_k replaces n_k/n as the
client's aggregation weight, inside the masked sum: the server learns Σ m_k·Δ_k and Σ m_k, never
an m_k. (Alg. 3's line 8 prints m ← Σ 1/m_k; the weighted mean it feeds needs m = Σ m_k.)

Fixed against the reference code: both logit passes run in evaluation mode under no_grad on frozen
copies, so computing the weight never moves the BatchNorm running statistics (the reference's
passes in training mode do) and dropout does not randomise it. The batch is drawn from the round's
seed without augmentation.
"""

from __future__ import annotations

from dataclasses import replace

import torch
import torch.nn.functional as F
from torch import nn

from secfed.algorithms.base import Method, MethodWrapper, Schedule, Site, eval_copy
from secfed.data.transforms import normalize
from secfed.federation.messages import MODEL, Broadcast, Contribution
from secfed.models.sharing import SharedLayout, load_shared


def logits(model: nn.Module, images: torch.Tensor) -> torch.Tensor:
    frozen = eval_copy(model)
    with torch.inference_mode():
        return frozen(normalize(images)).float()


def cosine_distance_weight(before: torch.Tensor, after: torch.Tensor) -> float:
    """mean(1 − cos(f_i, f^t_i)) over the rows of two logit matrices (in [0, 2])."""
    return float((1 - F.cosine_similarity(before, after, dim=1)).mean())


class CosineDistanceWeight(MethodWrapper):
    def __init__(self, inner: Method) -> None:
        super().__init__(inner)
        self.public_weights = False  # m_k is computed from private images and stays inside the sum

    def client_step(self, site: Site, broadcast: Broadcast, layout: SharedLayout, schedule: Schedule,
                    seed: int) -> Contribution:
        generator = torch.Generator().manual_seed(seed ^ 0x5EED_CD)
        batch = site.images[torch.randperm(site.num_examples, generator=generator)[: schedule.batch_size]]
        start = eval_copy(site.model)  # (w, v): the global weights beside the site's own head
        load_shared(start, layout, broadcast.weights)
        before = logits(start, batch)
        contribution = self.inner.client_step(site, broadcast, layout, schedule, seed)
        m = cosine_distance_weight(before, logits(site.model, batch))
        return replace(contribution, summed={**contribution.summed, MODEL: replace(contribution.summed[MODEL], weight=m)})

    def describe(self) -> str:
        return f"{self.inner.describe()}+cdw"
