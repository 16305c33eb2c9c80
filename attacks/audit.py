"""``secfed audit``: every attack the request names, against everything the run shares, in one budget.

    targets    update   one client's upload (what the server would see without secure aggregation)
               sum      Σ of a cohort's uploads (what a secure-aggregation server receives)
               weights  the global model (what every client receives)
               dfs      a client's domain feature statistics (DFH; shared in the clear)
               protocol what no inversion replaces (same model, cohort sizes, differencing, logs)

:func:`run_audit` opens the run, picks the round (the newest recorded one, else the re-derived
round N + 1), builds the judge's gallery, splits the wall-clock budget among the targets (each one a
class of :mod:`secfed.attacks.registry`: its share, its exposure, its attack) and returns
an :class:`AuditReport` (verdict per target, every attack's result, every setting echoed).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn


from secfed.attacks.budget import BUDGETS, REPORT_RESERVE, Budget, Stopwatch
from secfed.attacks.evidence import (AuditedRun, AuditError, RoundEvidence, client_index, gallery_for, model_with,
                                     next_cohort, open_for_audit, read_recorded, rederive_next,
                                     run_facts)
from secfed.attacks.judge import Judge
from secfed.attacks.protocol import contributor_sets, protocol_checks, protocol_verdict
from secfed.attacks.registry import TARGETS, AuditContext, TargetReport
from secfed.attacks.verdict import SEVERITY, Verdict
from secfed.federation import checkpoint as ckpt
from secfed.federation import recording
from secfed.federation.runtime import dropout_schedule
from secfed.privacy.dfs import DFS

ATTACKS = ("inversion", "membership", "protocol", "all")


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
    shares_dfs = DFS in run.fed.method.shared_in_clear
    if (request.target == "dfs" or request.attack == "membership") and not shares_dfs:  # (review: --attack
        # membership exited 0 with "n/a" alone, so a --fail-on gate passed without a test)
        raise AuditError("--target" if request.target == "dfs" else "--attack", f"this run "
                         f"({run.fed.method.describe()}) shares no DFS: domain feature statistics are shared only by "
                         "--algorithm dfh, so there is nothing to attack")
    statements = []
    if budget.lower_bound:
        why = (f"--time-limit {request.time_limit:g} s, under the {budget.name} budget's {BUDGETS[budget.name].seconds:g}"
               if not BUDGETS[budget.name].lower_bound else f"{budget.name} budget")
        statements.append(f"{why}: every verdict below is a LOWER BOUND on leakage; NO-LEAK and INCONCLUSIVE "
                          "here do not mean the run is safe")

    reports: list[TargetReport] = []
    if "protocol" in targets:
        reports.append(_protocol(run))
    attacked = [t for t in targets if t != "protocol"]
    evidence = None
    if any(TARGETS[t].needs_evidence for t in attacked):
        evidence = _evidence(run, request.round, k, say, lambda: total.expired)
    elif request.round is not None and (not attacked or request.round != run.rounds_done + 1):
        # the global model after round N is what round N + 1 starts from, so the weights target accepts that
        # round; the protocol checks read every round, so no --round means anything to them (found by review:
        # `--attack protocol --round N+1` was accepted, `--round N` refused)
        attacks = (f"the weights target is the checkpoint's global model (after round {run.rounds_done})"
                   if attacked else "the protocol checks read every round's log")  # (review: named weights)
        raise AuditError("--round", f"{attacks}; --round applies to the update, sum and dfs targets")
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

    context = AuditContext(run, evidence, k, cohort, judge, weights_judge, where, budget, request.seed, shares_dfs,
                           request.attack)
    for i, target in enumerate(attacked):
        if total.expired and (target != "dfs" or shares_dfs):  # a DFS-less run's dfs is "not applicable"
            reports.extend(TARGETS[target].out_of_time(run, budget))
            say(f"target {target}: not attacked, the time limit was reached")
            continue
        # a run sharing no DFS answers "dfs" at once: its share is the others' (found by review: every
        # FedPav audit left a third of its time unused, its weights target the weaker for it)
        later = [t for t in attacked[i:] if t != "dfs" or shares_dfs]
        weight = TARGETS[target].share / sum(TARGETS[t].share for t in later) if target in later else 0.0
        watch = total.share(weight)
        say(f"target {target}: {max(0.0, watch.remaining):.0f} s")
        reports.extend(TARGETS[target].attack(context, watch))
    site = run.fed.clients[k].site
    return AuditReport(request, budget, run_facts(run), None if evidence is None else evidence.round,
                       None if evidence is None else evidence.source,
                       {"id": site.id, "name": site.name, "images": site.num_examples,
                        "identities": int(site.labels.unique().numel()), "cohort": cohort},
                       reports, total.wall, total.cpu, statements)


# ---- evidence ------------------------------------------------------------------------------------


def _evidence(run: AuditedRun, requested: int | None, k: int, say: Callable[[str], None],
              expired: Callable[[], bool]) -> RoundEvidence | None:
    """The round's uploads; None when the time limit came first (found by review: reading 280 MB of
    recorded uploads ran 4 s past a 14-s --time-limit; re-deriving runs a local epoch per client)."""
    recorded = recording.recorded_rounds(run.run_dir)
    nxt = run.rounds_done + 1
    chosen = requested if requested is not None else (max(recorded) if recorded else nxt)
    if chosen in recorded:
        say(f"round {chosen}: recorded uploads")
        evidence = read_recorded(run, chosen, expired)
    elif chosen == nxt:
        cohort = sorted(set(next_cohort(run)) | {k})
        say(f"round {chosen}: re-deriving the uploads of {len(cohort)} client(s) from the checkpoint")
        evidence = rederive_next(run, cohort, expired)
    else:
        _no_such_round(run, chosen, recorded)
    if evidence is None:
        say(f"round {chosen}: the time limit was reached before its uploads were all in")
    return evidence


def _no_such_round(run: AuditedRun, chosen: int, recorded: list[int]) -> NoReturn:
    nxt = run.rounds_done + 1
    # (found by review: a checkpoint outside its run, or a run without its config.json, was said to be
    # a run without --record-uploads — a fact about a run directory the audit did not read)
    shown = ", ".join(map(str, recorded)) if recorded else (
        "none (the run did not use --record-uploads)" if run.run_dir is not None else
        "none readable (no run directory: the checkpoint is not in a run's checkpoints/ beside its config.json)")
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


def _protocol(run: AuditedRun) -> TargetReport:
    hashes: dict[int, dict[int, bytes | None]] = {}
    for t in recording.recorded_rounds(run.run_dir):
        try:
            recorded = recording.model_hashes(run.run_dir, t)  # the uploads' headers: their tensors are not read
        except recording.RecordingError:
            continue
        if recorded:
            hashes[t] = recorded
    findings = protocol_checks(run.config.to_dict(), run.history, hashes)
    verdict, reason = protocol_verdict(findings)
    return TargetReport("protocol", verdict, reason, True, "the run's protocol and what its server-side files keep",
                        findings=findings)
