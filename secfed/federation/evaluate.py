"""Scoring a federation on its evaluation domains: the global model, local models, baselines, raw pixels."""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping

import torch

from secfed.evaluation.features import evaluate_model
from secfed.evaluation.metrics import RetrievalScores
from secfed.evaluation.raw_pixels import raw_pixel_scores
from secfed.federation.builder import EvalDomain, Federation
from secfed.models.reid import ReIDModel
from secfed.models.sharing import load_shared

SCORE_KEYS = ("rank1", "rank5", "rank10", "mAP")


def score(model: ReIDModel, domain: EvalDomain) -> dict[str, float]:
    """Rank-1/5/10 and mAP of ``model`` on the domain's query/gallery (flip-summed neck features)."""
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


def global_model_for(fed: Federation, domain: EvalDomain) -> ReIDModel:
    """The deployed federated model on a domain: global shared weights, plus what the domain's client
    keeps locally (its BatchNorm statistics under ``bn_stats="local"``)."""
    model = copy.deepcopy(fed.clients[domain.client_ids[0]].model)
    load_shared(model, fed.layout, fed.server.weights)
    return model


def evaluate_global(fed: Federation) -> dict[str, dict[str, float]]:
    return {d.name: score(global_model_for(fed, d), d) for d in fed.domains}


def evaluate_local_training(fed: Federation) -> dict[str, dict[str, float] | None]:
    """The local-training baseline per domain (mean over the domain's clients), None without one."""
    return {
        d.name: mean_scores(score(fed.baselines[k], d) for k in d.client_ids if k in fed.baselines)
        for d in fed.domains
    }


def evaluate_final(fed: Federation, last_cohort: Iterable[int]) -> dict[str, dict[str, dict[str, float] | None]]:
    """Everything the end-of-run table shows, per domain.

    ``local_model`` is the seed paper's "local model": a client's model right after its local
    training in the last round, before aggregation — measured for the clients of the last cohort.
    """
    cohort = set(last_cohort)
    local = evaluate_local_training(fed)
    out: dict[str, dict[str, dict[str, float] | None]] = {}
    for d in fed.domains:
        with torch.no_grad():
            out[d.name] = {
                "federated": score(global_model_for(fed, d), d),
                "local": local[d.name],
                "local_model": mean_scores(score(fed.clients[k].model, d) for k in d.client_ids if k in cohort),
                "raw_pixels": _rates(raw_pixel_scores(
                    d.query, d.gallery, d.query_pids, d.gallery_pids, d.query_camids, d.gallery_camids
                )),
            }
    return out
