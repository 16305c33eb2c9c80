"""``secfed audit``: every attack the request names, against everything the run shares, in one budget.

    targets    update   one client's upload (what the server would see without secure aggregation)
               sum      Σ of a cohort's uploads (what a secure-aggregation server receives)
               weights  the global model (what every client receives)
               dfs      a client's domain feature statistics (DFH; shared in the clear)
               protocol what no inversion replaces (same model, cohort sizes, differencing, logs)

:func:`run_audit` opens the run, picks the round (the newest recorded one, else the re-derived
round N + 1), builds the judge's gallery, splits the wall-clock budget among the targets and returns
an :class:`AuditReport` (verdict per target, every attack's result, every setting echoed).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from secfed.attacks.budget import BUDGETS, REPORT_RESERVE, Budget, Stopwatch
from secfed.attacks.dfs import DFS_KEY
from secfed.attacks.evidence import (AuditedRun, AuditError, RoundEvidence, client_index, float_update, gallery_for,
                                     model_with, next_cohort, open_for_audit, read_recorded, recorded_rounds,
                                     rederive_next, run_facts)
from secfed.attacks.inversion import SimulatedClient
from secfed.attacks.judge import Judge
from secfed.attacks.local_training import LocalSteps
from secfed.attacks.protocol import Finding, contributor_sets, protocol_checks, protocol_verdict
from secfed.attacks.targets import attack_dfs, attack_update, attack_weights
from secfed.attacks.verdict import SEVERITY, AttackResult, Verdict, target_verdict
from secfed.federation import checkpoint as ckpt
from secfed.federation.runtime import dropout_schedule
from secfed.models.reid import MappedReIDModel

ATTACKS = ("inversion", "membership", "protocol", "all")
TARGETS = ("update", "sum", "weights", "dfs")
SHARE = {"update": 0.4, "sum": 0.3, "weights": 0.2, "dfs": 0.15}


@dataclass(frozen=True)
class AuditRequest:
    run: Path
    attack: str = "all"
    target: str | None = None  # None: every target the attack applies to
    round: int | None = None
    client: str | None = None
    budget: str = "standard"
    time_limit: float | None = None
    device: str | None = None
    data_root: Path | None = None
    seed: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {"run": str(self.run), "attack": self.attack, "target": self.target, "round": self.round,
                "client": self.client, "budget": self.budget, "time_limit": self.time_limit, "device": self.device,
                "data_root": None if self.data_root is None else str(self.data_root), "seed": self.seed}


@dataclass
class TargetReport:
    target: str
    verdict: Verdict | None  # None: not applicable to this run
    reason: str
    exposed: bool  # whether this run really hands the target to an adversary (--fail-on looks only at these)
    exposure: str
    results: list[AttackResult] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"target": self.target, "verdict": None if self.verdict is None else str(self.verdict),
                "reason": self.reason, "exposed": self.exposed, "exposure": self.exposure,
                "results": [r.to_dict() for r in self.results], "findings": [f.to_dict() for f in self.findings],
                "notes": self.notes}


@dataclass
class AuditReport:
    request: AuditRequest
    budget: Budget
    run: dict[str, Any]
    round: int | None
    source: str | None
    client: dict[str, Any]
    targets: list[TargetReport]
    wall_seconds: float = 0.0
    cpu_seconds: float = 0.0
    statements: list[str] = field(default_factory=list)

    def worst(self, exposed_only: bool = True) -> Verdict | None:
        found = [t.verdict for t in self.targets if t.verdict is not None and (t.exposed or not exposed_only)]
        return max(found, key=lambda v: SEVERITY[v]) if found else None

    def to_dict(self) -> dict[str, Any]:
        return {"secfed_audit": 1, "request": self.request.to_dict(), "budget": self.budget.to_dict(),
                "lower_bound": self.budget.lower_bound, "statements": self.statements, "run": self.run,
                "round": self.round, "source": self.source, "client": self.client,
                "verdicts": {t.target: None if t.verdict is None else str(t.verdict) for t in self.targets},
                "targets": [t.to_dict() for t in self.targets],
                "seconds": {"wall": round(self.wall_seconds, 2), "cpu": round(self.cpu_seconds, 2)}}


def plan_targets(attack: str, target: str | None) -> list[str]:
    """Which targets an --attack/--target pair asks for (protocol first); refuses pairs that mean nothing."""
    if attack not in ATTACKS:
        raise AuditError("--attack", f"{attack!r} is not one of {', '.join(ATTACKS)}")
    if target is not None and target not in TARGETS:
        raise AuditError("--target", f"{target!r} is not one of {', '.join(TARGETS)}")
    if attack == "protocol":
        if target is not None:
            raise AuditError("--target", "protocol checks concern the whole run; leave --target out")
        return ["protocol"]
    if attack == "membership":
        if target not in (None, "dfs"):
            raise AuditError("--target", "membership attacks shared statistics: use --target dfs")
        return ["dfs"]
    chosen = [target] if target is not None else list(TARGETS)
    return (["protocol"] if attack == "all" else []) + chosen


def run_audit(request: AuditRequest, progress: Callable[[str], None] | None = None,
              started: float | None = None) -> AuditReport:
    """The audit ``request`` asks for; ``started`` (``time.monotonic()``) is when the budget began
    (the command's start: loading torch counts too)."""
    say = progress or (lambda message: None)
    if request.budget not in BUDGETS:
        raise AuditError("--budget", f"{request.budget!r} is not one of {', '.join(BUDGETS)}")
    budget = BUDGETS[request.budget]
    if request.time_limit is not None:
        budget = budget.with_seconds(request.time_limit)
    total = Stopwatch(budget.seconds * (1 - REPORT_RESERVE), since=started)
    targets = plan_targets(request.attack, request.target)
    try:
        run = open_for_audit(request.run, data_root=request.data_root, device=request.device)
    except ckpt.CheckpointError as exc:
        raise AuditError("RUN", str(exc)) from None
    say(f"opened {run.checkpoint} (after round {run.rounds_done})")
    k = client_index(run, request.client)
    shares_dfs = run.config.method.algorithm == "dfh"
    if request.target == "dfs" and not shares_dfs:
        raise AuditError("--target", f"this run ({run.fed.method.describe()}) shares no DFS: domain feature "
                         "statistics are shared only by --algorithm dfh, so there is nothing to attack")
    statements = []
    if budget.lower_bound:
        statements.append("quick budget: every verdict below is a LOWER BOUND on leakage; NO-LEAK and INCONCLUSIVE "
                          "here do not mean the run is safe")

    reports: list[TargetReport] = []
    if "protocol" in targets:
        reports.append(_protocol(run))
    attacked = [t for t in targets if t != "protocol"]
    evidence = None
    if any(t in ("update", "sum", "dfs") for t in attacked):
        evidence = _evidence(run, request.round, k, say)
    elif request.round is not None and request.round != run.rounds_done + 1:
        raise AuditError("--round", "the weights target is the checkpoint's global model (after round "
                         f"{run.rounds_done}); --round applies to update, sum and dfs")
    cohort = _contributors(run, evidence) if evidence is not None else []
    gallery_clients = sorted(set(cohort) | {k})
    gallery, where = gallery_for(run, gallery_clients, seed=request.seed)
    start = evidence.start(k) if evidence is not None else run.fed.server.weights
    judge = Judge(model_with(run, k, start), gallery)
    weights_judge = judge if evidence is None or evidence.source == "re-derived" else \
        Judge(model_with(run, k, run.fed.server.weights), gallery)
    say(f"gallery: {len(gallery.identities)} images ({int(gallery.from_client.sum())} of the clients, "
        f"{int((~gallery.from_client).sum())} distractors)")
    if attacked and not total.expired:
        judge.embedding  # embed the gallery now: no attack then starts a step it cannot finish in time

    for i, target in enumerate(attacked):
        if total.expired and (target != "dfs" or shares_dfs):  # a DFS-less run's dfs is "not applicable"
            reports.extend(_out_of_time(run, target, budget))
            say(f"target {target}: not attacked, the time limit was reached")
            continue
        weight = SHARE[target] / sum(SHARE[t] for t in attacked[i:])
        watch = total.share(weight)
        say(f"target {target}: {watch.remaining:.0f} s")
        if target == "update":
            reports.append(_update(run, evidence, k, judge, where, budget, watch, request.seed))
        elif target == "sum":
            reports.append(_sum(run, evidence, cohort, judge, where, budget, watch, request.seed))
        elif target == "weights":
            reports.extend(_weights(run, k, weights_judge, where, budget, watch, request.seed))
        elif target == "dfs":
            reports.append(_dfs(run, evidence, k, judge, where, budget, watch, request.seed, shares_dfs))
    site = run.fed.clients[k].site
    return AuditReport(request, budget, run_facts(run), None if evidence is None else evidence.round,
                       None if evidence is None else evidence.source,
                       {"id": site.id, "name": site.name, "images": site.num_examples,
                        "identities": int(site.labels.unique().numel()), "cohort": cohort},
                       reports, total.wall, total.cpu, statements)


def _out_of_time(run: AuditedRun, target: str, budget: Budget) -> list[TargetReport]:
    """A target the time limit left no time for: INCONCLUSIVE (not attacked is not safe)."""
    reason = f"not attacked: the {budget.seconds:g} s limit, counted from the command's start, ran out before this target"
    reports = [TargetReport(target, Verdict.INCONCLUSIVE, reason, not (target == "update" and run.config.secagg.enabled),
                            "not measured")]
    if target == "weights" and not any(n.startswith("classifier.") for n in run.fed.layout.names):
        reports.append(TargetReport("weights+head", Verdict.INCONCLUSIVE, reason, False, "not measured"))
    return reports


# ---- evidence ------------------------------------------------------------------------------------


def _evidence(run: AuditedRun, requested: int | None, k: int, say: Callable[[str], None]) -> RoundEvidence:
    recorded = recorded_rounds(run.run_dir)
    nxt = run.rounds_done + 1
    chosen = requested if requested is not None else (max(recorded) if recorded else nxt)
    if chosen in recorded:
        say(f"round {chosen}: recorded uploads")
        return read_recorded(run, chosen)
    if chosen == nxt:
        cohort = sorted(set(next_cohort(run)) | {k})
        say(f"round {chosen}: re-deriving the uploads of {len(cohort)} client(s) from the checkpoint")
        return rederive_next(run, cohort)
    shown = ", ".join(map(str, recorded)) if recorded else "none (the run did not use --record-uploads)"
    raise AuditError("--round", f"round {chosen} cannot be audited: recorded rounds: {shown}; the checkpoint keeps "
                     f"the state after round {run.rounds_done}, so round {nxt} can be re-derived")


def _contributors(run: AuditedRun, evidence: RoundEvidence) -> list[int]:
    """The clients whose uploads made it into the round's sum (dropouts per the run's own schedule)."""
    ids = sorted(evidence.uploads)
    if evidence.source == "recorded":
        sets = contributor_sets(run.history, run.config.secagg.enabled)
        if sets is not None and evidence.round in sets:
            names = sets[evidence.round]
            return [i for i in ids if run.fed.clients[i].site.name in names]
        return ids
    cohort = sorted(set(next_cohort(run)) & set(ids))
    dropped = dropout_schedule(run.config, run.rounds_done, cohort, run.fed.channel.phases)
    return [i for i in cohort if i not in dropped or dropped[i] in ("consistency_check", "unmask")]


def _steps(run: AuditedRun, evidence: RoundEvidence, client_id: int) -> LocalSteps:
    return LocalSteps.from_schedule(evidence.schedule, run.fed.clients[client_id].site.num_examples)


def _clip_note(run: AuditedRun) -> list[str]:
    if run.fed.plan.clip is None:
        return []
    return [f"updates are clipped to L2 ≤ {run.fed.plan.clip}: the attacks' cosine objectives do not depend on the "
            "scale; the probes assume the update was not shortened"]


# ---- targets -------------------------------------------------------------------------------------


def _update(run: AuditedRun, evidence: RoundEvidence, k: int, judge: Judge, where: dict[int, list[int]],
            budget: Budget, watch: Stopwatch, seed: int) -> TargetReport:
    secagg = run.config.secagg.enabled
    exposure = ("masked by secure aggregation: the server never sees it; shown for what the masking protects"
                if secagg else "received in the clear by the server (secure aggregation is off)")
    if k not in evidence.uploads:
        return TargetReport("update", Verdict.INCONCLUSIVE, f"client {k} did not upload in round {evidence.round}",
                            not secagg, exposure)
    upload = evidence.uploads[k]
    site = run.fed.clients[k].site
    results, notes = attack_update(
        model=judge.model, layout=run.fed.layout, start=evidence.start(k), observed=float_update(run, upload),
        clients=[SimulatedClient(_steps(run, evidence, k))], judge=judge, victims=where[k], budget=budget,
        watch=watch, target="update", seed=seed)
    verdict, reason = target_verdict(results)
    notes = [f"{evidence.source} upload of client {site.name} in round {evidence.round}"] + _clip_note(run) + notes
    return TargetReport("update", verdict, reason, not secagg, exposure, results, notes=notes)


def _sum(run: AuditedRun, evidence: RoundEvidence, cohort: list[int], judge: Judge, where: dict[int, list[int]],
         budget: Budget, watch: Stopwatch, seed: int) -> TargetReport:
    exposure = "what the server receives (secure aggregation reveals the sum)" if run.config.secagg.enabled \
        else "what every client can compute from two successive global models"
    if not cohort:
        return TargetReport("sum", Verdict.INCONCLUSIVE, f"no aggregate was released in round {evidence.round}",
                            True, exposure)
    weights = {i: evidence.uploads[i].summed["model"].weight for i in cohort}
    total = sum(weights.values())
    mean = sum(weights[i] * float_update(run, evidence.uploads[i]) for i in cohort) / total
    starts = {i: evidence.start(i) for i in cohort}
    start = starts[cohort[0]]
    clients = [SimulatedClient(_steps(run, evidence, i), weights[i]) for i in cohort]
    victims = [v for i in cohort for v in where[i]]
    results, notes = attack_update(model=judge.model, layout=run.fed.layout, start=start, observed=mean,
                                   clients=clients, judge=judge, victims=victims, budget=budget, watch=watch,
                                   target="sum", seed=seed)
    verdict, reason = target_verdict(results)
    names = [run.fed.clients[i].site.name for i in cohort]
    notes = [f"weighted mean of the {evidence.source} uploads of {len(cohort)} client(s) ({', '.join(names)}) in "
             f"round {evidence.round}, {sum(c.steps.images_seen for c in clients)} images in all"] + notes
    if any(not torch.equal(s, start) for s in starts.values()):
        notes.append("clients received different (Eq. 15-noised) weights; the attack starts them all from the first")
    return TargetReport("sum", verdict, reason, True, exposure, results, notes=notes)


def _weights(run: AuditedRun, k: int, judge: Judge, where: dict[int, list[int]], budget: Budget, watch: Stopwatch,
             seed: int) -> list[TargetReport]:
    """The global model as everyone holds it; and, when the classifier stays local, what it gives away
    together with the audited client's classifier (reported apart: that classifier is not shared)."""
    model = judge.model
    layout_names = set(run.fed.layout.names)
    bn_shared = any(n.endswith(".running_mean") for n in layout_names)
    head_shared = any(n.startswith("classifier.") for n in layout_names)
    site = run.fed.clients[k].site
    # what maps the model's embedding to identities (FedReID's embedding skips its local mapping network)
    head = torch.nn.Sequential(model.neck, model.classifier) if isinstance(model, MappedReIDModel) else model.classifier
    facts = [f"global model after round {run.rounds_done}"]
    results, notes = attack_weights(model=model, judge=judge, client_images=where[k], bn_shared=bn_shared,
                                    head=head if head_shared else None, head_labels=site.labels,
                                    head_source="the shared classifier", budget=budget,
                                    watch=watch.share(1.0 if head_shared else 0.6), seed=seed)
    verdict, reason = target_verdict(results)
    reports = [TargetReport("weights", verdict, reason, True, "every client receives the global model each round",
                            results, notes=facts + notes)]
    if not head_shared:
        results, notes = attack_weights(model=model, judge=judge, client_images=where[k], bn_shared=bn_shared,
                                        head=head, head_labels=site.labels,
                                        head_source=f"client {site.name}'s own classifier", budget=budget,
                                        watch=Stopwatch(watch.remaining), seed=seed, unconditional=False)
        verdict, reason = target_verdict(results)
        reports.append(TargetReport(
            "weights+head", verdict, reason, False, f"client {site.name}'s classifier never leaves the client; shown "
            "for what the global model and that classifier give away together (a stolen or published client model)",
            results, notes=facts + notes))
    return reports


def _dfs(run: AuditedRun, evidence: RoundEvidence, k: int, judge: Judge, where: dict[int, list[int]], budget: Budget,
         watch: Stopwatch, seed: int, shares_dfs: bool) -> TargetReport:
    upload = evidence.uploads.get(k)
    dfs = None if upload is None else upload.shared.get(DFS_KEY)
    if dfs is None:
        reason = "this run shares no DFS (only --algorithm dfh does)" if not shares_dfs else \
            f"client {k}'s upload of round {evidence.round} carries no shared['{DFS_KEY}']"
        return TargetReport("dfs", None, reason, False, "not shared")
    results, notes = attack_dfs(model=judge.model, dfs=dfs, judge=judge, client_images=where[k], budget=budget,
                                watch=watch, seed=seed)
    verdict, reason = target_verdict(results)
    return TargetReport("dfs", verdict, reason, True, "shared in the clear with the server, which redistributes "
                        "them to every client", results, notes=[f"{evidence.source} DFS of client "
                                                                f"{run.fed.clients[k].site.name}"] + notes)


def _protocol(run: AuditedRun) -> TargetReport:
    hashes: dict[int, dict[int, bytes | None]] = {}
    for t in recorded_rounds(run.run_dir):
        try:
            evidence = read_recorded(run, t)
        except AuditError:
            continue
        hashes[t] = {i: u.model_hash for i, u in evidence.uploads.items()}
    findings = protocol_checks(run.config.to_dict(), run.history, hashes)
    verdict, reason = protocol_verdict(findings)
    return TargetReport("protocol", verdict, reason, True, "the run's protocol and what its server-side files keep",
                        findings=findings)
