"""The audit's targets as a registry: one class per thing a run shares, each with its name, its share of
the time budget, how exposed a run leaves it, and its attack (a run's evidence in, reports out).

    update   one client's upload (what the server would see without secure aggregation)
    sum      Σ of a cohort's uploads (what a secure-aggregation server receives)
    weights  the global model (what every client receives), and with a local classifier weights+head
    dfs      a client's domain feature statistics (DFH; shared in the clear)

Adding a target is one class here and one line in :data:`TARGETS`; :func:`secfed.attacks.audit.run_audit`
plans, budgets and runs whatever the registry holds.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch

from secfed.attacks.budget import Budget, Stopwatch
from secfed.attacks.dfs import DFS_KEY
from secfed.attacks.evidence import AuditedRun, RoundEvidence, float_update, model_with
from secfed.attacks.inversion import SimulatedClient
from secfed.attacks.judge import Judge
from secfed.attacks.local_training import LocalSteps
from secfed.attacks.protocol import Finding
from secfed.attacks.targets import attack_dfs, attack_update, attack_weights
from secfed.attacks.verdict import AttackResult, Verdict, target_verdict
from secfed.federation import recording
from secfed.federation.messages import MODEL
from secfed.models.reid import ReIDModel


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


@dataclass(frozen=True)
class AuditContext:
    """What every target's attack reads: the run, the round's evidence, the audited client ``k`` and its
    cohort, the judges (``weights_judge`` holds the checkpoint's global model) and the gallery's layout."""

    run: AuditedRun
    evidence: RoundEvidence | None
    k: int
    cohort: list[int]
    judge: Judge
    weights_judge: Judge
    where: dict[int, list[int]]
    budget: Budget
    seed: int
    shares_dfs: bool
    attack: str = "all"  # --attack: which attacks a target runs (inversion, membership, all)


def identity_head(model: torch.nn.Module) -> torch.nn.Module:
    """What maps the model's embedding to identities: the classifier, after the neck where the embedding
    stops before it — FedReID's mapping network, and DFH's neck (its retrieval feature is pool-5; found by
    review: DFH's classifier was applied to the pool-5 feature, the neck skipped, the sizes agreeing)."""
    return torch.nn.Sequential(model.neck, model.classifier) if type(model).embed is not ReIDModel.embed \
        else model.classifier


class Target:
    """One thing a run shares, attacked by the audit."""

    name: ClassVar[str]
    share: ClassVar[float]  # its weight in the split of the wall-clock budget
    needs_evidence: ClassVar[bool] = True  # reads a round's uploads (recorded or re-derived)

    def exposed(self, run: AuditedRun) -> bool:
        """Whether this run really hands the target to an adversary."""
        return True

    def out_of_time(self, run: AuditedRun, budget: Budget) -> list[TargetReport]:
        """The target when the time limit left it none: INCONCLUSIVE (not attacked is not safe)."""
        reason = (f"not attacked: the {budget.seconds:g} s limit, counted from the command's start, ran out before "
                  "this target")
        return [TargetReport(self.name, Verdict.INCONCLUSIVE, reason, self.exposed(run), "not measured")]

    def attack(self, ctx: AuditContext, watch: Stopwatch) -> list[TargetReport]:
        """Every attack on this target within ``watch``, judged."""
        raise NotImplementedError


def _steps(run: AuditedRun, evidence: RoundEvidence, client_id: int) -> LocalSteps:
    return LocalSteps.from_schedule(evidence.schedule, run.fed.clients[client_id].site.num_examples)


def _clip_note(run: AuditedRun) -> list[str]:
    if run.fed.plan.clip is None:
        return []
    return [f"updates are clipped to L2 ≤ {run.fed.plan.clip}: the attacks' cosine objectives do not depend on the "
            "scale; the probes assume the update was not shortened"]


class UpdateTarget(Target):
    """One client's upload: probes, then gradient inversion."""

    name, share = "update", 0.4

    def exposed(self, run: AuditedRun) -> bool:
        return not run.config.secagg.enabled  # masked: the server never sees it

    def attack(self, ctx: AuditContext, watch: Stopwatch) -> list[TargetReport]:
        run, evidence, k = ctx.run, ctx.evidence, ctx.k
        assert evidence is not None
        secagg = run.config.secagg.enabled
        exposure = ("masked by secure aggregation: the server never sees it; shown for what the masking protects"
                    if secagg else "received in the clear by the server (secure aggregation is off)")
        if k not in evidence.uploads:
            return [TargetReport("update", Verdict.INCONCLUSIVE, f"client {k} did not upload in round {evidence.round}",
                                 not secagg, exposure)]
        site = run.fed.clients[k].site
        results, notes = attack_update(
            model=ctx.judge.model, layout=run.fed.layout, start=evidence.start(k),
            observed=float_update(run, evidence.uploads[k]), clients=[SimulatedClient(_steps(run, evidence, k))],
            judge=ctx.judge, victims=ctx.where[k], budget=ctx.budget, watch=watch, target="update", seed=ctx.seed)
        verdict, reason = target_verdict(results)
        notes = [f"{evidence.source} upload of client {site.name} in round {evidence.round}"] + _clip_note(run) + notes
        return [TargetReport("update", verdict, reason, not secagg, exposure, results, notes=notes)]


class SumTarget(Target):
    """The weighted mean of a cohort's uploads: the same attacks, on what secure aggregation releases."""

    name, share = "sum", 0.3

    def attack(self, ctx: AuditContext, watch: Stopwatch) -> list[TargetReport]:
        run, evidence, cohort = ctx.run, ctx.evidence, ctx.cohort
        assert evidence is not None
        exposure = "what the server receives (secure aggregation reveals the sum)" if run.config.secagg.enabled \
            else "what every client can compute from two successive global models"
        if not cohort:
            return [TargetReport("sum", Verdict.INCONCLUSIVE, f"no aggregate was released in round {evidence.round}",
                                 True, exposure)]
        weights = {i: evidence.uploads[i].summed[MODEL].weight for i in cohort}
        mean = sum(weights[i] * float_update(run, evidence.uploads[i]) for i in cohort) / sum(weights.values())
        starts = {i: evidence.start(i) for i in cohort}
        start = starts[cohort[0]]
        clients = [SimulatedClient(_steps(run, evidence, i), weights[i]) for i in cohort]
        victims = [v for i in cohort for v in ctx.where[i]]
        results, notes = attack_update(model=ctx.judge.model, layout=run.fed.layout, start=start, observed=mean,
                                       clients=clients, judge=ctx.judge, victims=victims, budget=ctx.budget,
                                       watch=watch, target="sum", seed=ctx.seed)
        verdict, reason = target_verdict(results)
        names = [run.fed.clients[i].site.name for i in cohort]
        notes = [f"weighted mean of the {evidence.source} uploads of {len(cohort)} client(s) ({', '.join(names)}) in "
                 f"round {evidence.round}, {sum(c.steps.images_seen for c in clients)} images in all"] + notes
        if any(not torch.equal(s, start) for s in starts.values()):
            notes.append("clients received different (Eq. 15-noised) weights; the attack starts them all from the first")
        return [TargetReport("sum", verdict, reason, True, exposure, results, notes=notes)]


def _head_shared(run: AuditedRun) -> bool:
    return any(n.startswith("classifier.") for n in run.fed.layout.names)


class WeightsTarget(Target):
    """The global model as everyone holds it; and, when the classifier stays local, what it gives away
    together with the audited client's classifier (reported apart as weights+head: that classifier is not shared)."""

    name, share, needs_evidence = "weights", 0.2, False

    def out_of_time(self, run: AuditedRun, budget: Budget) -> list[TargetReport]:
        reports = super().out_of_time(run, budget)
        if not _head_shared(run):
            reports.append(TargetReport("weights+head", Verdict.INCONCLUSIVE, reports[0].reason, False, "not measured"))
        return reports

    def attack(self, ctx: AuditContext, watch: Stopwatch) -> list[TargetReport]:
        run, k, model = ctx.run, ctx.k, ctx.weights_judge.model
        bn_shared = any(n.endswith(".running_mean") for n in run.fed.layout.names)
        head_shared = _head_shared(run)
        site = run.fed.clients[k].site
        head = identity_head(model)
        facts = [f"global model after round {run.rounds_done}"]
        common = dict(model=model, judge=ctx.weights_judge, client_images=ctx.where[k], bn_shared=bn_shared,
                      head_labels=site.labels, budget=ctx.budget, seed=ctx.seed)
        results, notes = attack_weights(head=head if head_shared else None, head_source="the shared classifier",
                                        watch=watch.share(1.0 if head_shared else 0.6), **common)
        verdict, reason = target_verdict(results)
        reports = [TargetReport("weights", verdict, reason, True, "every client receives the global model each round",
                                results, notes=facts + notes)]
        if not head_shared:
            results, notes = attack_weights(head=head, head_source=f"client {site.name}'s own classifier",
                                            watch=Stopwatch(watch.remaining), unconditional=False, **common)
            verdict, reason = target_verdict(results)
            reports.append(TargetReport(
                "weights+head", verdict, reason, False, f"client {site.name}'s classifier never leaves the client; "
                "shown for what the global model and that classifier give away together (a stolen or published "
                "client model)", results, notes=facts + notes))
        return reports


class DfsTarget(Target):
    """DFH's domain feature statistics: membership/linkage of identities and inversion of μ̂."""

    name, share = "dfs", 0.15

    def attack(self, ctx: AuditContext, watch: Stopwatch) -> list[TargetReport]:
        run, evidence, k = ctx.run, ctx.evidence, ctx.k
        if not ctx.shares_dfs:  # (before reading the evidence: a time limit may have come before the uploads)
            return [TargetReport("dfs", None, "this run shares no DFS (only --algorithm dfh does)", False, "not shared")]
        assert evidence is not None
        dfs, source, weights = _latest_dfs(run, evidence, k)
        exposure = "shared in the clear with the server, which keeps every client's latest and redistributes them"
        if dfs is None:  # the server holds it all the same: never "not shared"
            return [TargetReport("dfs", Verdict.INCONCLUSIVE, f"client {k}'s DFS is with the server, but no recorded "
                                 f"round up to {evidence.round} holds it; audit --round of a round it took part in",
                                 True, exposure)]
        # the DFS were computed with the model of the round that sent them: an earlier round's are read with
        # that round's broadcast, not the audited round's (found by review: the features did not match)
        judge = ctx.judge if weights is None else Judge(model_with(run, k, weights), ctx.judge.gallery)
        results, notes = attack_dfs(model=judge.model, dfs=dfs, judge=judge, client_images=ctx.where[k],
                                    budget=ctx.budget, watch=watch, seed=ctx.seed,
                                    membership=ctx.attack in ("all", "membership"),
                                    inversion=ctx.attack in ("all", "inversion"))
        verdict, reason = target_verdict(results)
        return [TargetReport("dfs", verdict, reason, True, exposure, results,
                             notes=[f"{source} DFS of client {run.fed.clients[k].site.name}"] + notes)]


def _latest_dfs(run: AuditedRun, evidence: RoundEvidence,
                k: int) -> tuple[torch.Tensor | None, str, torch.Tensor | None]:
    """Client ``k``'s DFS as the server holds it at the audited round: from that round's upload, else
    from the last recorded round (before it) the client took part in — a client outside the audited
    round's cohort still has its statistics with the server (found by review: reported "not shared") —
    with the weights of the broadcast they were computed with (None: the audited round's)."""
    upload = evidence.uploads.get(k)
    if upload is not None and DFS_KEY in upload.shared:
        return upload.shared[DFS_KEY], evidence.source, None
    for t in sorted((r for r in recording.recorded_rounds(run.run_dir) if r < evidence.round), reverse=True):
        try:
            recorded = recording.read_round(run.run_dir, t, max_bytes=run.max_message_bytes)
        except recording.RecordingError:
            continue
        earlier = recorded.uploads.get(k)
        if earlier is not None and DFS_KEY in earlier.shared:
            return (earlier.shared[DFS_KEY], f"recorded (round {t}, its last before round {evidence.round}), read "
                    f"with round {t}'s model", recorded.broadcast.weights)
    return None, "", None


# the registry, in the order the audit attacks them
TARGETS: dict[str, Target] = {t.name: t for t in (UpdateTarget(), SumTarget(), WeightsTarget(), DfsTarget())}

__all__ = ["TARGETS", "AuditContext", "Target", "TargetReport"]
