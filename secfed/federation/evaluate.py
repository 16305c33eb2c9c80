"""Scoring a federation where the data lives: the global model, local models, baselines, raw pixels.

Evaluation is a set of jobs, each run by the site that holds the domain's query/gallery; only the
scores travel back. A job is (site k, variant, domain):

    global      the deployed model as site k runs it: the global shared weights plus k's local
                tensors (its classifier is unused; its BatchNorm statistics under ``bn_stats=local``)
    baseline    site k's local-only model
    local       site k's model right after its last local training (the seed paper's "local model")
    raw_pixels  the raw-pixel floor (no model), by the site that scores the domain's global model

A seen domain is scored by its first client. An unseen domain (no client trained on it, AAAI'21's
protocol) is scored with the global model as deployed, by the site that holds it; under local
BatchNorm statistics there is no global set, so every client's variant is scored and the mean
reported. Nothing is ever selected by its unseen-domain score. :func:`plan` says which site runs
which job, :func:`run_jobs` runs a site's jobs, and the table functions assemble the scores — an
in-process run and a Flower run (each node running its sites' jobs) go through the same three.
A site that does not answer leaves its scores out: a domain's mean is then over the sites that
answered (None if none did).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping

import torch
from torch import nn

from secfed.evaluation.features import FeaturesNotFinite, evaluate_model
from secfed.evaluation.metrics import RetrievalScores
from secfed.evaluation.raw_pixels import raw_pixel_scores
from secfed.federation.builder import DomainInfo, EvalDomain, Federation
from secfed.models.copying import copy_model
from secfed.models.sharing import load_shared
from secfed.progress import tracked

SCORE_KEYS = ("rank1", "rank5", "rank10", "mAP")
Job = tuple[int, str, str]  # (site, variant, domain name)
SCORING = "extracting features and scoring"
# what a job's variant scores, in the words its progress shows
VARIANT_WORDS = {"global": "federated model", "baseline": "local-only baseline", "local": "client model before aggregation",
                 "raw_pixels": "raw pixels"}
Scores = Mapping[Job, Mapping[str, float]]


def score(model: nn.Module, domain: EvalDomain) -> dict[str, float]:
    """Rank-1/5/10 and mAP of ``model`` on the domain's query/gallery (flip-summed features)."""
    result = evaluate_model(model, domain.query, domain.gallery, domain.query_pids, domain.query_camids,
                            domain.gallery_pids, domain.gallery_camids)
    return rates(result)


def rates(result: RetrievalScores) -> dict[str, float]:
    """The scores a run directory shows, as plain floats."""
    return {k: float(getattr(result, k)) for k in SCORE_KEYS}


def raw_pixel_floor(domain: EvalDomain) -> dict[str, float]:
    """The raw-pixel floor of a domain: retrieval on the images themselves, no model."""
    return rates(raw_pixel_scores(domain.query, domain.gallery, domain.query_pids, domain.gallery_pids,
                                  domain.query_camids, domain.gallery_camids))


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
    model = copy_model(fed.clients[client_id].site.model)
    load_shared(model, fed.layout, fed.server.weights)
    return model


def global_sites(fed: Federation, domain: DomainInfo) -> list[int]:
    """The sites whose global-model variant a domain's score averages."""
    if not domain.unseen:
        return [domain.client_ids[0]]
    if fed.config.model.bn_stats == "shared":
        return [0]
    return list(range(len(fed.clients)))


def plan(fed: Federation, *, local_training: bool, final: bool, cohort: Iterable[int] = ()) -> dict[int, list[Job]]:
    """Jobs per site for a round's evaluation (+ the local-only baselines, + the final tables)."""
    jobs: dict[int, set[Job]] = defaultdict(set)
    last = set(cohort)
    for d in fed.domains:
        scorers = global_sites(fed, d)
        for k in scorers:
            jobs[k].add((k, "global", d.name))
        if final:
            jobs[scorers[0]].add((scorers[0], "raw_pixels", d.name))
        if d.unseen:
            continue
        for k in d.client_ids:
            if (local_training or final) and k in fed.baselines:
                jobs[k].add((k, "baseline", d.name))
            if final and k in last:
                jobs[k].add((k, "local", d.name))
    return {k: sorted(v) for k, v in jobs.items()}


def run_jobs(fed: Federation, jobs: Iterable[Job]) -> dict[Job, dict[str, float]]:
    """Site side: score ``jobs`` on the domains this federation holds in memory, the global shared
    weights being ``fed.server.weights`` (what the site was sent); each job is a progress step."""
    domains = {d.name: d for d in fed.domains}
    out = {}
    with torch.no_grad():
        for k, variant, name in tracked(SCORING, list(jobs), lambda job: f"{job[2]}: {VARIANT_WORDS[job[1]]}"):
            domain = domains[name]
            if not isinstance(domain, EvalDomain):
                raise ValueError(f"domain {name}: its query/gallery are not held here")
            if variant == "raw_pixels":
                out[(k, variant, name)] = raw_pixel_floor(domain)
                continue
            model = {"global": lambda: global_model(fed, k), "baseline": lambda: fed.baselines[k].model,
                     "local": lambda: fed.clients[k].site.model}[variant]()
            try:
                out[(k, variant, name)] = score(model, domain)
            except FeaturesNotFinite as exc:
                from secfed.federation.runtime import SiteDiverged

                where = fed.clients[k].site.name if k < len(fed.clients) else str(k)
                raise SiteDiverged(where, f"scoring the {VARIANT_WORDS[variant]} on {name}: {exc}") from None
    return out


def global_scores(fed: Federation, scores: Scores) -> dict[str, dict[str, float] | None]:
    """The federated model's scores per domain."""
    return {d.name: mean_scores(scores[j] for k in global_sites(fed, d) if (j := (k, "global", d.name)) in scores)
            for d in fed.domains}


def local_training_scores(fed: Federation, scores: Scores) -> dict[str, dict[str, float] | None]:
    """The local-training baseline per seen domain (mean over the domain's clients), None without one."""
    return {d.name: mean_scores(scores[j] for k in d.client_ids if (j := (k, "baseline", d.name)) in scores)
            for d in fed.domains if not d.unseen}


def final_scores(fed: Federation, scores: Scores) -> dict[str, dict[str, dict[str, float] | None]]:
    """Everything the end-of-run tables show, per domain."""
    federated, local = global_scores(fed, scores), local_training_scores(fed, scores)
    out = {}
    for d in fed.domains:
        raw = [v for (k, variant, name), v in scores.items() if variant == "raw_pixels" and name == d.name]
        out[d.name] = {
            "federated": federated[d.name],
            "local": local.get(d.name),
            "local_model": mean_scores(scores[j] for k in d.client_ids if (j := (k, "local", d.name)) in scores),
            "raw_pixels": dict(raw[0]) if raw else None,
        }
    return out


def evaluate_here(fed: Federation, *, final: bool, cohort: Iterable[int] = ()) -> dict[Job, dict[str, float]]:
    """Every site's jobs, run in this process (an in-process run; ``secfed evaluate``)."""
    jobs = plan(fed, local_training=bool(fed.baselines), final=final, cohort=cohort)
    return run_jobs(fed, [j for site_jobs in jobs.values() for j in site_jobs])


def evaluate_global(fed: Federation) -> dict[str, dict[str, float] | None]:
    return global_scores(fed, evaluate_here(fed, final=False))


def evaluate_local_training(fed: Federation) -> dict[str, dict[str, float] | None]:
    return local_training_scores(fed, evaluate_here(fed, final=False))


def evaluate_final(fed: Federation, last_cohort: Iterable[int]) -> dict[str, dict[str, dict[str, float] | None]]:
    """The end-of-run tables; ``local_model`` is measured for the clients of ``last_cohort``."""
    return final_scores(fed, evaluate_here(fed, final=True, cohort=last_cohort))
