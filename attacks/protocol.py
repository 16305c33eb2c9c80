"""Protocol checks: what no inversion replaces, read from the run directory.

    secure-aggregation      was the summed part masked, or did the server receive every update?
    same-model              did every client of a round train from the same model (the SHA-256 each
                            recorded upload carries; in authenticated mode a completed round proves it)
    min-cohort              every released aggregate summed at least 3 clients: with 2, each of them
                            learns the other's update exactly (its own is known; the global change
                            gives the sum) unless noise was added to the aggregate
    dropout-differencing    two aggregates whose contributors differ by one client: their difference
                            approximates that client's update (the models differ by one round)
    participation-metadata  what the server-side logs keep per client (cohort, loss, accuracy)

Each finding is pass, fail, risk (an exposure to weigh, not an identification), not-checked (the
check applies but the run kept too little to do it) or not-applicable (the question does not arise in
this run: e.g. dropout-differencing under client-level DP, whose ε covers each client's whole
participation and whose log keeps no cohorts to difference). The protocol verdict is LEAK when a
check fails, INCONCLUSIVE when one could not be checked, and NO-LEAK-AT-THIS-STRENGTH otherwise
(risks are listed with it; not-applicable checks are listed and weigh nothing, so turning DP on
never makes the verdict worse).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from secfed.attacks.verdict import Verdict

MIN_SAFE_COHORT = 3
# Phases after which a vanished client's masked input is already in the sum.
CONTRIBUTING_PHASES = {"consistency_check", "unmask"}


@dataclass(frozen=True)
class Finding:
    check: str
    status: str  # pass | fail | risk | not-checked | not-applicable
    detail: str

    def to_dict(self) -> dict[str, str]:
        return asdict(self)


def contributor_sets(history: Sequence[Mapping[str, Any]], secagg: bool) -> dict[int, frozenset[str]] | None:
    """Round → names of the clients in its aggregate, from metrics.jsonl (None when the log omits cohorts)."""
    sets = {}
    for record in history:
        if "cohort" not in record:
            return None
        dropped = record.get("dropped", {})
        if secagg:
            members = {c for c in record["cohort"] if c not in dropped or dropped[c] in CONTRIBUTING_PHASES}
        else:
            members = {c for c in record["cohort"] if c not in dropped}
        if record.get("contributors", len(members)) == 0:
            members = set()  # an aborted round releases nothing
        sets[int(record["round"])] = frozenset(members)
    return sets


def protocol_checks(config: Mapping[str, Any], history: Sequence[Mapping[str, Any]],
                    model_hashes: Mapping[int, Mapping[int, bytes | None]]) -> list[Finding]:
    """``config``: the run's configuration as a dict; ``history``: metrics.jsonl records;
    ``model_hashes``: round → client id → the hash its recorded upload carries (empty if none recorded)."""
    secagg = bool(config["secagg"]["enabled"])
    authenticated = secagg and bool(config["secagg"]["authenticated"])
    privacy = config["privacy"]
    client_level = privacy.get("noise_multiplier") is not None or privacy.get("target_epsilon") is not None
    # Noise covers a small cohort only where the run claims a client-level ε for it (its rounds'
    # privacy entries hold one): β without a clip bounds nothing, and clipped β outside an ε is any
    # size — 1e-9 against a clip of 1 hides nothing of a 2-client sum.
    claimed = bool(history) and all(isinstance((r.get("privacy") or {}).get("epsilon"), (int, float))
                                    for r in history if int(r.get("contributors", 0)) > 0)
    return [_secure_aggregation(secagg, authenticated), _same_model(model_hashes, authenticated),
            _min_cohort(history, claimed), _dropout_differencing(history, secagg, client_level),
            _participation_metadata(history)]


def _secure_aggregation(secagg: bool, authenticated: bool) -> Finding:
    if secagg:
        return Finding("secure-aggregation", "pass", "the summed part of every upload was masked; the server "
                       "received only sums" + (" (authenticated mode)" if authenticated else ""))
    return Finding("secure-aggregation", "risk", "secure aggregation was off: the server received every "
                   "client's update in the clear (the `update` target is what it saw)")


def _same_model(model_hashes: Mapping[int, Mapping[int, bytes | None]], authenticated: bool) -> Finding:
    """Did every client of a round train from the same model (recorded hashes, or the protocol's check)?"""
    if model_hashes:
        split = {t: sorted({h.hex() for h in hashes.values() if h is not None}) for t, hashes in model_hashes.items()}
        unhashed = [t for t, hashes in model_hashes.items() if any(h is None for h in hashes.values())]
        differing = [t for t, found in split.items() if len(found) > 1]
        if differing:
            return Finding("same-model", "fail", f"clients trained from different models in round(s) "
                           f"{', '.join(map(str, sorted(differing)))} (recorded model hashes differ)")
        if unhashed and not any(split.values()):
            return Finding("same-model", "pass" if authenticated else "not-checked",
                           "the recorded uploads carry no model hash" + (
                               "; authenticated secure aggregation compared them in-protocol and every "
                               "round completed" if authenticated else "; no authenticated secure aggregation compared them"))
        return Finding("same-model", "pass", f"every recorded round ({len(split)}) has one model hash across its clients")
    if authenticated:
        return Finding("same-model", "pass", "no recorded uploads read; authenticated secure aggregation "
                       "compares the clients' own model hashes in every round and aborts on a mismatch, "
                       "and every round completed")
    return Finding("same-model", "not-checked", "no recorded uploads read (--record-uploads keeps them in the run "
                   "directory) and no "
                   "authenticated secure aggregation: nothing shows every client got the same model")


def _min_cohort(history: Sequence[Mapping[str, Any]], noised: bool) -> Finding:
    counts = {int(r["round"]): int(r.get("contributors", 0)) for r in history}
    released = {t: c for t, c in counts.items() if c > 0}
    small = sorted(t for t, c in released.items() if c < MIN_SAFE_COHORT)
    if not released:
        return Finding("min-cohort", "not-checked", "no round of the log released an aggregate")
    if small:
        what = ", ".join(f"round {t}: {released[t]}" for t in small[:8])
        return Finding("min-cohort", "risk" if noised else "fail",
                       f"aggregates of fewer than {MIN_SAFE_COHORT} clients ({what}): a client of a 2-client sum "
                       "learns the other's update from the global model's change"
                       + (" up to the aggregate's noise, which the run's ε bounds" if noised else
                          " exactly (no client-level ε is claimed: whatever noise there is, nothing bounds it)"))
    return Finding("min-cohort", "pass", f"every released aggregate summed ≥ {min(released.values())} "
                   f"clients (≥ {MIN_SAFE_COHORT} needed)")


def _dropout_differencing(history: Sequence[Mapping[str, Any]], secagg: bool, client_level: bool) -> Finding:
    """Two aggregates whose cohorts differ by one client give away that client's update."""
    sets = contributor_sets(history, secagg)
    if sets is None and client_level:
        return Finding("dropout-differencing", "not-applicable", "client-level DP: its ε bounds what any "
                       "two aggregates reveal about one client's participation, and the log keeps no "
                       "cohorts to difference")
    if sets is None:
        return Finding("dropout-differencing", "not-checked", "the log keeps no cohorts (a run that claims "
                       "an ε logs only what its accountant covers) and no client-level DP covers participation")
    rounds = sorted(sets)
    pairs = [(t, u, next(iter(sets[t] ^ sets[u]))) for i, t in enumerate(rounds) for u in rounds[i + 1:]
             if sets[t] and sets[u] and len(sets[t] ^ sets[u]) == 1]
    if not pairs:
        return Finding("dropout-differencing", "pass", "no two aggregates differ by exactly one client")
    shown = ", ".join(f"rounds {t}/{u} ({k})" for t, u, k in pairs[:6])
    more = f" and {len(pairs) - 6} more" if len(pairs) > 6 else ""
    return Finding("dropout-differencing", "risk", f"{len(pairs)} pair(s) of aggregates differ by one "
                   f"client: {shown}{more}; their difference approximates that client's update")


def _participation_metadata(history: Sequence[Mapping[str, Any]]) -> Finding:
    if any("clients" in r or "cohort" in r for r in history):
        return Finding("participation-metadata", "risk", "metrics.jsonl records every round's cohort and each "
                       "client's training loss and accuracy; no ε covers them — keep the run directory "
                       "server-private or run with client-level DP (which logs only what it covers)")
    return Finding("participation-metadata", "pass", "the log keeps only what the accounted mechanism "
                   "releases (and labels what no ε covers)")


def protocol_verdict(findings: Sequence[Finding]) -> tuple[Verdict, str]:
    failed = [f for f in findings if f.status == "fail"]
    if failed:
        return Verdict.LEAK, "; ".join(f"{f.check}: {f.detail}" for f in failed)
    unchecked = [f for f in findings if f.status == "not-checked"]
    if unchecked:
        return Verdict.INCONCLUSIVE, "; ".join(f"{f.check}: {f.detail}" for f in unchecked)
    risks = [f.check for f in findings if f.status == "risk"]
    idle = [f.check for f in findings if f.status == "not-applicable"]
    return Verdict.NO_LEAK, "every check that applies passed" + (f" (risks to weigh: {', '.join(risks)})" if risks else "") \
        + (f" (not applicable: {', '.join(idle)})" if idle else "")
