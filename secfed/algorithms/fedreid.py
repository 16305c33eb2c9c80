"""FedReID (Wu & Gong, AAAI 2021): a shared feature embedding, a local mapping network, a local expert.

    model   feature embedding network φ (the backbone; its pool-5 output is the ReID feature) +
            mapping network δ (FC → BN → ReLU → Dropout → FC over the client's identities)
    shared  φ only (Eq. 7–8): the mapping network and the expert never leave the client; only φ's
            update goes through the secure sum, weighted n_k/n as FedPav (Eq. 8 is the plain mean
            of the S-fraction; `method.aggregation` unweighted gives it)
    client  Eq. 10: the expert starts each round from the client's latest local model (what it
            trained last round, before aggregation); the client model from the global φ beside its
            own δ (Eq. 7). Both train on the same batches under separate augmentations with
                L = CE(client) + CE(expert) + T²·KL(Q ‖ P)       (Eqs. 3, 9, 11–13), T = 3
            where P, Q are the softened outputs of client and expert; the expert is the teacher of
            the KL term (its Q is not differentiated there), and it learns from its own CE.
            ``--no-expert`` (the paper's ablation, Fig. 4(d)) trains the client model on CE alone.
    lrs     0.01 for the embedding, 0.1 for the mapping network (the paper's); SGD, Nesterov 0.9,
            weight decay 5e-4. β noise (Eqs. 14–15) is the privacy layer's and composes with it.
            Their schedule is secfed's (one ×0.1 step at 3/4 of the rounds, `--lr-step` moves it), not
            the paper's ×0.1 every 40 of 100 epochs.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from secfed.algorithms.base import AUGMENT, Method, Schedule, Site, make_optimizer, shuffled_batches, train_loop
from secfed.errors import ConfigIssue
from secfed.federation.messages import Broadcast, TrainStats
from secfed.models.reid import MappedReIDModel
from secfed.models.sharing import SharedLayout, load_shared

if TYPE_CHECKING:
    from secfed.config import RunConfig

EXPERT = "expert"


class _WithExpert(nn.Module):
    """The client model and its expert as one module, so one optimiser and one loop train both."""

    def __init__(self, model: nn.Module, expert: nn.Module) -> None:
        super().__init__()
        self.model, self.expert = model, expert


class FedReID(Method):
    name = "fedreid"
    shared_prefixes = ("backbone.",)
    learning_rates = (0.1, 0.01)  # the paper's: mapping network, embedding
    own_settings = ("expert_temperature", "expert")
    dp_sgd_unsupported = ("its expert distillation trains two models jointly and calls them outside the model's "
                          "forward pass, so Opacus gets no per-example gradients of it")

    @classmethod
    def config_issues(cls, cfg: RunConfig) -> list[ConfigIssue]:
        """A temperature for an expert --no-expert turns off would be silently unused (found by review)."""
        default = type(cfg.method).model_fields["expert_temperature"].default
        if not cfg.method.expert and cfg.method.expert_temperature != default:
            return [ConfigIssue("method.expert_temperature", "applies to the local expert, which --no-expert "
                                "(`method.expert` = false) turns off", unused=True)]
        return []

    def build_model(self, num_classes: int) -> nn.Module:
        m = self.cfg.model
        return MappedReIDModel(m.backbone, num_classes, pretrained=self.pretrained_weights(), neck_dim=m.neck_dim,
                               dropout=m.neck_dropout)

    def receive(self, site: Site, broadcast: Broadcast, layout: SharedLayout) -> None:
        if self.cfg.method.expert:
            site.extra[EXPERT] = copy.deepcopy(site.model)  # Eq. 10, before Eq. 7 overwrites the embedding
        load_shared(site.model, layout, broadcast.weights)

    def local_train(self, site: Site, schedule: Schedule, seed: int, model: nn.Module | None = None) -> TrainStats:
        model = site.model if model is None else model
        if not self.cfg.method.expert:
            return super().local_train(site, schedule, seed, model)  # CE alone, as FedPav's client
        # The local-only baseline (and a first round without a previous local model) starts its
        # expert from the model itself.
        expert = site.extra.pop(EXPERT, None) if model is site.model else None
        pair = _WithExpert(model, expert if expert is not None else copy.deepcopy(model))
        torch.manual_seed(seed)
        generator = torch.Generator().manual_seed(seed)
        temperature = self.cfg.method.expert_temperature

        def loss(pair: nn.Module, images: torch.Tensor, targets: torch.Tensor,
                 generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
            d = pair.model(AUGMENT(images, generator))  # separately augmented views of the same batch
            d_expert = pair.expert(AUGMENT(images, generator))
            kl = F.kl_div(F.log_softmax(d / temperature, dim=1), F.softmax(d_expert.detach() / temperature, dim=1),
                          reduction="batchmean")
            return F.cross_entropy(d, targets) + F.cross_entropy(d_expert, targets) + temperature**2 * kl, d

        return train_loop(pair, make_optimizer(pair, schedule), shuffled_batches(site.num_examples, schedule, generator),
                          site.images, site.labels, loss, generator)

    # The latest local embedding is the next round's expert: a resume must keep it.
    def site_state(self, site: Site) -> dict[str, torch.Tensor]:
        return {f"local_model.{k}": v.detach().clone() for k, v in site.model.state_dict().items()}

    def load_site_state(self, site: Site, state: Mapping[str, torch.Tensor]) -> None:
        prefix = "local_model."
        site.model.load_state_dict({k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)})
