"""Evaluation when the sites live on SuperNodes: every score that needs a site's private parts is
computed by the node that hosts the site, and the server assembles the same tables as
:mod:`secfed.federation.evaluate` (which an in-process run calls directly).

A job is (site k, variant, domain): ``global`` — the deployed model as site k runs it (the global
shared weights plus k's local tensors: its BN statistics under ``bn_stats=local``); ``baseline``
— site k's local-only model; ``local`` — site k's model right after its last local training.
Which jobs a table needs follows evaluate.py's rules exactly (a test compares the two on one
federation); raw-pixel scores need no model and stay on the server. A node that does not answer
leaves its scores out: a domain's mean is then over the sites that answered (None if none did).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping

import torch

from secfed.federation.builder import EvalDomain, Federation
from secfed.federation.evaluate import _rates, global_model, mean_scores, score
from secfed.evaluation.raw_pixels import raw_pixel_scores

Job = tuple[int, str, str]  # (site, variant, domain name)
Scores = Mapping[Job, Mapping[str, float]]


def _global_sites(fed: Federation, domain: EvalDomain) -> list[int]:
    if not domain.unseen:
        return [domain.client_ids[0]]
    if fed.config.model.bn_stats == "shared":
        return [0]
    return list(range(len(fed.clients)))


def plan(fed: Federation, *, local_training: bool, final: bool, cohort: Iterable[int] = ()) -> dict[int, list[Job]]:
    """Jobs per site for evaluate_global (+ evaluate_local_training, + the final tables)."""
    jobs: dict[int, set[Job]] = defaultdict(set)
    last = set(cohort)
    for d in fed.domains:
        for k in _global_sites(fed, d):
            jobs[k].add((k, "global", d.name))
        if d.unseen:
            continue
        if local_training or final:
            for k in d.client_ids:
                if k in fed.baselines:
                    jobs[k].add((k, "baseline", d.name))
        if final:
            for k in d.client_ids:
                if k in last:
                    jobs[k].add((k, "local", d.name))
    return {k: sorted(v) for k, v in jobs.items()}


def run_jobs(fed: Federation, jobs: Iterable[Job], weights: torch.Tensor) -> dict[Job, dict[str, float]]:
    """Node side: score the jobs of this node's sites, the global shared weights being ``weights``."""
    fed.server.weights = weights
    domains = {d.name: d for d in fed.domains}
    out = {}
    with torch.no_grad():
        for k, variant, name in jobs:
            model = {"global": lambda: global_model(fed, k), "baseline": lambda: fed.baselines[k].model,
                     "local": lambda: fed.clients[k].site.model}[variant]()
            out[(k, variant, name)] = score(model, domains[name])
    return out


def global_scores(fed: Federation, scores: Scores) -> dict[str, dict[str, float] | None]:
    """What evaluate_global returns."""
    return {d.name: mean_scores(scores[j] for k in _global_sites(fed, d) if (j := (k, "global", d.name)) in scores)
            for d in fed.domains}


def local_training_scores(fed: Federation, scores: Scores) -> dict[str, dict[str, float] | None]:
    """What evaluate_local_training returns."""
    return {d.name: mean_scores(scores[j] for k in d.client_ids if (j := (k, "baseline", d.name)) in scores)
            for d in fed.domains if not d.unseen}


def final_scores(fed: Federation, scores: Scores) -> dict[str, dict[str, dict[str, float] | None]]:
    """What evaluate_final returns (raw-pixel scores computed here, on the server)."""
    federated, local = global_scores(fed, scores), local_training_scores(fed, scores)
    out = {}
    for d in fed.domains:
        out[d.name] = {
            "federated": federated[d.name],
            "local": local.get(d.name),
            "local_model": mean_scores(scores[j] for k in d.client_ids if (j := (k, "local", d.name)) in scores),
            "raw_pixels": _rates(raw_pixel_scores(d.query, d.gallery, d.query_pids, d.gallery_pids, d.query_camids,
                                                  d.gallery_camids)),
        }
    return out
