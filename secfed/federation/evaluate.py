"""Scoring a federation on its evaluation domains: the global model, local models, baselines, raw pixels.

A seen domain is scored with the global shared weights plus what its client keeps locally (its
classifier is unused; its BatchNorm statistics under ``bn_stats="local"``). An unseen domain (no
client trained on it, AAAI'21's protocol) is scored with the global model as deployed; under local
BatchNorm statistics there is no global set, so each client's variant is scored and the mean
reported. Nothing is ever selected by its unseen-domain score.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping

import torch
from torch import nn

from secfed.evaluation.features import evaluate_model
from secfed.evaluation.metrics import RetrievalScores
from secfed.evaluation.raw_pixels import raw_pixel_scores
from secfed.federation.builder import EvalDomain, Federation
from secfed.models.sharing import load_shared

SCORE_KEYS = ("rank1", "rank5", "rank10", "mAP")


def score(model: nn.Module, domain: EvalDomain) -> dict[str, float]:
    """Rank-1/5/10 and mAP of ``model`` on the domain's query/gallery (flip-summed features)."""
    result = evaluate_model(model, domain.query, domain.gallery, domain.query_pids, domain.query_camids,
                            domain.gallery_pids, domain.gallery_camids)
    return _rates(result)


def _rates(result: RetrievalScores) -> dict[str, float]:
    return {k: float(getattr(result, k)) for k in SCORE_KEYS}


def mean_scores(scores: Iterable[Mapping[str, float]]) -> dict[str, float] | None:
    """Average of several models' scores on one domain (several clients share a domain when a single
    dataset is split by camera or identity); None when there are none."""
    scores = list(scores)
    if not scores:
        return None
    return {k: sum(s[k] for s in scores) / len(scores) for k in SCORE_KEYS}


def global_model(fed: Federation, client_id: int) -> nn.Module:
    """The deployed federated model as client ``client_id`` runs it: the global shared weights plus
    what the client keeps locally."""
    model = copy.deepcopy(fed.clients[client_id].site.model)
    load_shared(model, fed.layout, fed.server.weights)
    return model


def score_global(fed: Federation, domain: EvalDomain) -> dict[str, float]:
    if not domain.unseen:
        return score(global_model(fed, domain.client_ids[0]), domain)
    if fed.config.model.bn_stats == "shared":
        return score(global_model(fed, 0), domain)
    return mean_scores(score(global_model(fed, k), domain) for k in range(len(fed.clients)))  # type: ignore[return-value]


def evaluate_global(fed: Federation) -> dict[str, dict[str, float]]:
    return {d.name: score_global(fed, d) for d in fed.domains}


def evaluate_local_training(fed: Federation) -> dict[str, dict[str, float] | None]:
    """The local-training baseline per seen domain (mean over the domain's clients), None without one."""
    return {
        d.name: mean_scores(score(fed.baselines[k].model, d) for k in d.client_ids if k in fed.baselines)
        for d in fed.domains if not d.unseen
    }


def evaluate_final(
    fed: Federation,
    last_cohort: Iterable[int],
    federated: Mapping[str, dict[str, float]] | None = None,
    local: Mapping[str, dict[str, float] | None] | None = None,
) -> dict[str, dict[str, dict[str, float] | None]]:
    """Everything the end-of-run tables show, per domain (``federated`` and ``local``: scores the
    last round already computed, so they are not computed twice).

    ``local_model`` is the seed paper's "local model": a client's model right after its local
    training in the last round, before aggregation — measured for the clients of the last cohort.
    """
    cohort = set(last_cohort)
    federated = federated if federated is not None else evaluate_global(fed)
    local = local if local is not None else evaluate_local_training(fed)
    out: dict[str, dict[str, dict[str, float] | None]] = {}
    for d in fed.domains:
        with torch.no_grad():
            out[d.name] = {
                "federated": federated[d.name],
                "local": local.get(d.name),
                "local_model": mean_scores(score(fed.clients[k].site.model, d) for k in d.client_ids if k in cohort),
                "raw_pixels": _rates(raw_pixel_scores(
                    d.query, d.gallery, d.query_pids, d.gallery_pids, d.query_camids, d.gallery_camids
                )),
            }
    return out
