"""DFH (Yang et al., "Federated and Generalized Person Re-identification through Domain and Feature
Hallucinating"): share domain-level feature statistics, hallucinate features of other and of novel
domains, train them with a batch-hard triplet loss.

    model   FedPav's (backbone → neck → local classifier); backbone + neck shared, FedAvg of the
            shared weights through the secure sum with weights n_k/n (Eq. 3.7). Retrieval uses the
            pool-5 feature (the backbone's output), as the paper does (§4.1), not the neck's.
    client  1. receive the global weights; extract the pool-5 features of all local images with
               them (evaluation mode) and form the IFS — per identity the mean and variance
               (Alg. 2 l. 3). The IFS go to the privacy step, which turns them into the four DFS
               vectors of Eq. 3.1 (clipped and noised under `method.dfs_noise`, :mod:`secfed.privacy.dfs`);
               only the DFS leave.
            2. from the broadcast's DFS table, once per round (Alg. 1 l. 9–12): for every client k
               sample μ_Dk ~ N(μ̂_k, σ̂²_k), σ²_Dk ~ N(μ̃_k, σ̃²_k) (negative draws set to 0), and a
               novel domain μ_N = Σ w_k μ_Dk, σ²_N = Σ w_k σ²_Dk with w ~ Dir(α·1) over every client
               in the table, this one included (Eq. 3.3).
            3. E epochs over P×K batches (`method.ids_per_batch` P, K = B / P) of
                   L = CE(FC(F)) + T(F) + λ·[T(F_N) + mean_{k≠i} T(F_k)]      (Eqs. 3.4–3.6)
               F the batch's pool-5 features, FC the neck + classifier, T the batch-hard triplet loss
               (`method.triplet_margin`), F_k = μ_Dk + σ_Dk·BN(F) with BN the standardisation by the
               batch's own mean and variance (Eq. 3.2; gradients flow through it, μ and σ are
               constants). `method.dfh_hallucinate` features keeps only the F_k terms (no DH),
               domains only the F_N term (no FH onto the other clients' own statistics).
    server  keeps the latest DFS of every client that reached an aggregate (ServerSide.state,
            ``dfs/<client id>``) and broadcasts the whole table with the weights (Alg. 2 l. 13, 17).

The first round. Alg. 2 shares DFS computed with the initial models before any training. Here they
travel with the first round's upload (computed, as in every round, with the model the client
received — in round 1 the initial one), so the first round's local training has no DFS and trains
L = CE + T(F) alone; every later round hallucinates with the table the server broadcasts. A client
without any other client's DFS in the table (the first round; a cohort that has not met yet) trains
the same way, and so does the local-only baseline, which never sees another client.

Sampling once per round follows Alg. 1, where lines 9–12 stand before the iteration loop.

Departures from the paper, on purpose. §3.1 uploads DFS computed "with corresponding local models"
after local training; here they are computed with the model the client received, before it trains:
the feature extractor is then the public broadcast, which the DFS privacy analysis assumes
(:mod:`secfed.privacy.dfs`), not a model that holds the client's own update. Eq. 3.5 applies FC to the
pool-5 feature; here FC is FedPav's neck and classifier. The defaults λ = 1 and margin 0.3 are not
§4.1's 5 and 0.5; ``bench/bench_dfh.py`` runs the paper's. The rest of §4.1's training is not the
paper's either, here or in the bench: a round is E epochs of ⌊n/(P·K)⌋ P×K batches (3–14 iterations
on the synthetic domains, not 200 iterations of batch 64), at secfed's learning rates and schedule
(0.02 from scratch, one ×0.1 step at 3/4 of the rounds; the paper's 1e-3, ×0.5 at epochs 20 and 30 of
40), with pad, crop and flip and no random erasing. Eq. 3.2's BN ("the pooling-5 batch-norm function")
is a parameter-free standardisation over the batch: the backbone has no BatchNorm at pool-5, and the
paper's intent is the map of fᵢ to the standard Gaussian.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from secfed.algorithms.base import AUGMENT, Method, Schedule, Site, eval_copy, make_optimizer, train_loop
from secfed.algorithms.losses import batch_hard_triplet
from secfed.data.samplers import identity_batches
from secfed.errors import ConfigIssue
from secfed.data.transforms import normalize
from secfed.federation.messages import Aggregate, Broadcast, Contribution, TrainStats
from secfed.models.reid import ReIDModel
from secfed.models.sharing import SharedLayout
from secfed.privacy.dfs import DFS, IFS, ROWS

if TYPE_CHECKING:
    from secfed.config import RunConfig

PREFIX = "dfs/"  # server state and broadcast payloads: dfs/<client id> → (4, d)
TABLE = "dfh/table"  # site.extra: this round's DFS table, from the broadcast
BN_EPS = 1e-5  # BatchNorm's own ε in the standardisation of Eq. 3.2


class MalformedDfs(ValueError):
    """DFS that are not a (4, d) float32 table entry (a broadcast payload or a client's upload)."""


class PoolFiveReIDModel(ReIDModel):
    """FedPav's model whose retrieval feature is the pool-5 output (DFH's §4.1), not the neck's."""

    def embed(self, images: torch.Tensor) -> torch.Tensor:
        return self.backbone(images)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        # the logits DFH trains (backbone → neck → classifier); the inherited forward, classifier(embed),
        # skipped the neck, the sizes agreeing (found by review)
        return self.classifier(self.neck(self.backbone(images)))


# ---- client: statistics, hallucination, the loss ----------------------------------------------------


def identity_statistics(model: nn.Module, images: torch.Tensor, labels: torch.Tensor,
                        batch_size: int = 256) -> torch.Tensor:
    """IFS: (2, C, d) float32 on the CPU — per identity (sorted labels) the mean and the (biased)
    variance of its pool-5 features, extracted in evaluation mode from a frozen copy of ``model``."""
    frozen = eval_copy(model)
    device = next(frozen.parameters()).device
    with torch.inference_mode():
        features = torch.cat([frozen.backbone(normalize(images[i : i + batch_size].to(device))).double().cpu()
                              for i in range(0, len(images), batch_size)])
    _, inverse = torch.unique(labels.cpu(), return_inverse=True)
    count = torch.bincount(inverse).double()[:, None]
    mean = torch.zeros(len(count), features.shape[1], dtype=torch.float64).index_add_(0, inverse, features) / count
    centred = (features - mean[inverse]).pow(2)
    variance = torch.zeros_like(mean).index_add_(0, inverse, centred) / count
    return torch.stack([mean, variance]).float()


def check_dfs(dfs: torch.Tensor, what: str, dim: int | None = None) -> torch.Tensor:
    """``dfs`` if it is a float32 (4, d) table entry whose rows 1–3 (variances and the mean of
    variances) are non-negative, else MalformedDfs."""
    shaped = dfs.dim() == 2 and dfs.shape[0] == len(ROWS) and (dim is None or dfs.shape[1] == dim)
    if dfs.dtype != torch.float32 or not shaped:
        want = f"(4, {dim})" if dim is not None else "(4, d)"
        raise MalformedDfs(f"{what}: DFS must be float32 {want}, got {dfs.dtype} {tuple(dfs.shape)}")
    if not torch.isfinite(dfs).all() or bool((dfs[1:] < 0).any()):
        raise MalformedDfs(f"{what}: DFS hold non-finite values or negative variances")
    return dfs


def received_table(payloads: Mapping[str, torch.Tensor], dim: int) -> dict[int, torch.Tensor]:
    """Client id → DFS from a broadcast's payloads; anything else in them is refused, naming it."""
    table = {}
    for name, dfs in payloads.items():
        ident = name[len(PREFIX):]
        if not name.startswith(PREFIX) or not ident.isdigit():
            raise MalformedDfs(f"broadcast payload {name!r}: DFH expects only dfs/<client id>")
        table[int(ident)] = check_dfs(dfs, f"broadcast payload {name!r}", dim)
    return table


@dataclass(frozen=True)
class Targets:
    """The statistics one round hallucinates with: (μ, σ) per other client, and the novel domain's."""

    others: tuple[tuple[torch.Tensor, torch.Tensor], ...]
    novel: tuple[torch.Tensor, torch.Tensor]


def sample_domain(dfs: torch.Tensor, rng: np.random.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """(μ_D, σ²_D) drawn from a client's DFS: N(μ̂, σ̂²) and N(μ̃, σ̃²), variances floored at 0."""
    mu_hat, sigma_hat_sq, mu_tilde, sigma_tilde_sq = dfs.double()
    normal = torch.from_numpy(rng.standard_normal((2, dfs.shape[1])))
    mu = mu_hat + sigma_hat_sq.sqrt() * normal[0]
    variance = (mu_tilde + sigma_tilde_sq.sqrt() * normal[1]).clamp_min(0)
    return mu, variance


def draw_targets(table: Mapping[int, torch.Tensor], own_id: int, alpha: float,
                 rng: np.random.Generator) -> Targets | None:
    """Alg. 1 l. 9–12: a sample per client in the table, the Dirichlet mix of all of them (Eq. 3.3);
    None when the table holds no other client's DFS."""
    others = sorted(k for k in table if k != own_id)
    if not others:
        return None
    domains = sorted(table)
    drawn = {k: sample_domain(table[k], rng) for k in domains}
    w = torch.from_numpy(rng.dirichlet([alpha] * len(domains)))
    mu_novel = sum(w[n] * drawn[k][0] for n, k in enumerate(domains))
    var_novel = sum(w[n] * drawn[k][1] for n, k in enumerate(domains))
    as_pair = lambda mu, var: (mu.float(), var.sqrt().float())  # noqa: E731 - Eq. 3.2 scales by σ, not σ²
    return Targets(tuple(as_pair(*drawn[k]) for k in others), as_pair(mu_novel, var_novel))


def hallucinate(features: torch.Tensor, mu: torch.Tensor, sigma: torch.Tensor) -> torch.Tensor:
    """Eq. 3.2: the batch standardised by its own mean and variance, scaled by σ, shifted by μ."""
    standard = F.batch_norm(features, None, None, training=True, eps=BN_EPS)
    return mu.to(features.device) + sigma.to(features.device) * standard


def hallucinated_loss(features: torch.Tensor, labels: torch.Tensor, targets: Targets, mode: str,
                      margin: float) -> torch.Tensor:
    """The bracket of Eq. 3.6 (``both``), or its FH part (``features``) or DH part (``domains``)."""
    loss = features.new_zeros(())
    if mode in ("both", "domains"):
        loss = loss + batch_hard_triplet(hallucinate(features, *targets.novel), labels, margin)
    if mode in ("both", "features"):
        terms = [batch_hard_triplet(hallucinate(features, mu, sigma), labels, margin) for mu, sigma in targets.others]
        loss = loss + torch.stack(terms).mean()
    return loss


# ---- the method ------------------------------------------------------------------------------------


MAX_DFS_NOISE_LOG10 = 30  # the DFS are float32 (≤ 3.4e38): noise beyond 1e30 leaves them nothing but noise


class DFH(Method):
    name = "dfh"
    dp_sgd_unsupported = "its batch-hard triplet losses couple the examples of a batch, so they are not per-example"
    own_settings = ("dfs_noise", "dfs_clip", "dfh_alpha", "dfh_lambda", "dfh_hallucinate", "triplet_margin",
                    "ids_per_batch")
    shared_in_clear = (DFS,)

    @classmethod
    def config_issues(cls, cfg: RunConfig) -> list[ConfigIssue]:
        """P×K batches: P identities of at least two images each must fit one batch. The DFS mechanism's
        ε treats the feature extractor as public, which local BatchNorm statistics are not."""
        p, batch = cfg.method.ids_per_batch, cfg.schedule.batch_size
        issues = []
        if p * 2 > batch:
            issues.append(ConfigIssue("method.ids_per_batch", f"P = {p} identities × K ≥ 2 images need "
                                      f"`schedule.batch_size` ≥ {2 * p}, got {batch}"))
        if cfg.method.dfs_noise > 0 and cfg.model.bn_stats == "local":
            issues.append(ConfigIssue("method.dfs_noise", "the DFS mechanism treats the feature extractor as public, "
                                      "but local BatchNorm statistics come from the client's own images; use "
                                      "`model.bn_stats` shared"))
        z, clip = cfg.method.dfs_noise, cfg.method.dfs_clip
        if z > 0 and math.log10(2 * math.sqrt(2) * z) + 2 * math.log10(clip) > MAX_DFS_NOISE_LOG10:
            # (found by review: C² overflowed mid-round, after local training and a printed ε)
            key = "method.dfs_noise" if math.log10(z) > 2 * math.log10(clip) else "method.dfs_clip"
            issues.append(ConfigIssue(key, f"noise z = {z:g} at clip C = {clip:g} has a standard deviation "
                                      f"2z·√2·C² beyond 1e{MAX_DFS_NOISE_LOG10} on the float32 statistics"))
        return issues

    def build_model(self, num_classes: int) -> nn.Module:
        m = self.cfg.model
        return PoolFiveReIDModel(m.backbone, num_classes, pretrained=self.pretrained_weights(), neck_dim=m.neck_dim,
                                 dropout=m.neck_dropout)

    def receive(self, site: Site, broadcast: Broadcast, layout: SharedLayout) -> None:
        super().receive(site, broadcast, layout)
        ifs = identity_statistics(site.model, site.images, site.labels)  # with the model just received
        site.extra[IFS] = ifs
        site.extra[TABLE] = received_table(broadcast.payloads, ifs.shape[-1])

    def client_step(self, site: Site, broadcast: Broadcast, layout: SharedLayout, schedule: Schedule,
                    seed: int) -> Contribution:
        contribution = super().client_step(site, broadcast, layout, schedule, seed)
        # The IFS go to the privacy step, which releases the DFS formed from them (and nothing else).
        return replace(contribution, shared={**contribution.shared, IFS: site.extra.pop(IFS)})

    def local_train(self, site: Site, schedule: Schedule, seed: int, model: nn.Module | None = None) -> TrainStats:
        model = site.model if model is None else model
        table = site.extra.pop(TABLE, {}) if model is site.model else {}
        m = self.cfg.method
        targets = draw_targets(table, site.id, m.dfh_alpha, np.random.default_rng([seed, 0xDF5]))
        torch.manual_seed(seed)  # the neck's dropout draws from torch's global generator
        generator = torch.Generator().manual_seed(seed)
        batches = identity_batches(site.labels, m.ids_per_batch, schedule.batch_size // m.ids_per_batch, generator,
                                   epochs=schedule.epochs)

        def loss(model: nn.Module, images: torch.Tensor, labels: torch.Tensor,
                 generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
            features = model.backbone(AUGMENT(images, generator))
            logits = model.classifier(model.neck(features))
            total = F.cross_entropy(logits, labels) + batch_hard_triplet(features, labels, m.triplet_margin)
            if targets is not None and m.dfh_lambda > 0:
                total = total + m.dfh_lambda * hallucinated_loss(features, labels, targets, m.dfh_hallucinate,
                                                                 m.triplet_margin)
            return total, logits

        return train_loop(model, make_optimizer(model, schedule), batches, site.images, site.labels, loss, generator)

    # ---- server: the DFS table --------------------------------------------------------------------

    def payloads(self, server_state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return {name: dfs for name, dfs in sorted(server_state.items()) if name.startswith(PREFIX)}

    def absorb(self, server_state: dict[str, torch.Tensor], aggregate: Aggregate) -> None:
        dims = {dfs.shape[1] for name, dfs in server_state.items() if name.startswith(PREFIX)}
        for client_id, shared in sorted(aggregate.shared.items()):
            if DFS in shared:
                dfs = check_dfs(shared[DFS], f"client {client_id}'s upload", next(iter(dims), None))
                server_state[f"{PREFIX}{client_id}"] = dfs.clone()
                dims.add(dfs.shape[1])
