"""Leave-one-domain-out: the FedDG protocol (Yang et al., Table 1) as one command.

Every training domain in turn is held out (`data.leave_out = [NAME]`), the others train, and the
held-out one is scored as an unseen target. Each of those trainings is an ordinary run directory
(``RUN/leave-out-NAME``: checkpoints, metrics, summary, resumable on its own); ``RUN/sweep.json``
names the sweep and its configuration so ``--resume RUN`` continues it, and
``RUN/leave-one-out.json`` holds the per-target scores and their mean.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from secfed.config import ConfigError, RunConfig
from secfed.federation import checkpoint as ckpt
from secfed.federation.builder import check_overlaps, make_shards, resolve_data
from secfed.federation.runtime import RATES, Reporter, claimed_run_dir, run
from secfed.privacy import adversary
from secfed.validation import check

SWEEP_FILE = "sweep.json"
RESULT_FILE = "leave-one-out.json"


@dataclass
class SweepResult:
    run_dir: Path
    targets: list[dict[str, Any]]  # per held-out domain: name, rank1, mAP, run (its run directory)
    mean: dict[str, float]
    privacy: dict[str, Any] | None = None  # the runs' client-level ε composed per client (None: none claimed)

    def to_dict(self) -> dict[str, Any]:
        out = {"protocol": "leave-one-domain-out", "targets": self.targets, "mean": self.mean}
        return out | ({"privacy": self.privacy} if self.privacy else {})


def composed_privacy(targets: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Each run states its own ε, but a client's data trains every run except the one holding its
    domain out: its ε over the sweep adds up (basic composition: ε and δ sum over the runs it trained
    in) — the client-level ε, and DFH's identity-level DFS ε beside it (found by review: the sweep
    composed only the first, and a DFS-only sweep stated none) — and each client's example-level DP-SGD ε
    over every model its examples trained (found by review: a DP-SGD sweep stated none). None when no run
    claims any."""
    client = {t["name"]: (p["epsilon"], p["delta"]) for t in targets
              if (p := t.get("privacy") or {}).get("epsilon") is not None}
    dfs = {t["name"]: (g["released_models"], g["delta"]) for t in targets
           for g in (t.get("privacy") or {}).get("epsilon_against", []) if g.get("guarantee") == adversary.DFS_GUARANTEE}
    dp_sgd = adversary.dp_sgd_per_client(
        (who, dp) for t in targets for who, dp in ((t.get("privacy") or {}).get("dp_sgd") or {}).items())
    if not client and not dfs and not dp_sgd:
        return None
    out: dict[str, Any] = {"composition": "basic: a client's ε and δ add over the runs its data trained in (every "
                                          "run but the one holding its domain out)"}
    for key, claimed in (("client_level", client), ("dfs", dfs)):
        if not claimed:
            continue
        per_domain = {}
        for name in (t["name"] for t in targets):
            runs = [p for held_out, p in claimed.items() if held_out != name]
            per_domain[name] = {"runs": len(runs), "epsilon": sum(e for e, _ in runs), "delta": sum(d for _, d in runs)}
        worst = {"epsilon": max(d["epsilon"] for d in per_domain.values()),
                 "delta": max(d["delta"] for d in per_domain.values()), "per_domain": per_domain}
        out[key] = worst
    if dp_sgd:  # per client, over every model its examples trained: each run's federated and local-only models
        out["dp_sgd"] = {"epsilon": max(c["epsilon"] for c in dp_sgd.values()),
                         "delta": max(c["delta"] for c in dp_sgd.values()), "per_client": dp_sgd}
    if "client_level" in out:  # the figures earlier sweeps recorded at the top
        out.update(epsilon=out["client_level"]["epsilon"], delta=out["client_level"]["delta"],
                   per_domain=out["client_level"]["per_domain"])
    return out


def training_domains(cfg: RunConfig) -> list[str]:
    """The domains a run of ``cfg`` would train on, were none left out."""
    whole = cfg.model_copy(deep=True)
    whole.data.leave_out = []
    trained = resolve_data(whole).trained
    shards, _ = make_shards(whole, trained)  # every domain a site that can train: refused before any target starts
    # so are pictures shared under an ε, and a domain tested on what another trains on (review)
    check_overlaps(whole, shards, trained, trained, saved=False, unseen_key="data.datasets")
    return [d.name for d in trained]


def is_sweep(run_dir: Path) -> bool:
    return (Path(run_dir) / SWEEP_FILE).is_file()


def leave_one_out(cfg: RunConfig, run_dir: Path, *, resume: bool = False, reporter: Reporter | None = None,
                  data_root: Path | None = None, rates_given: Collection[str] = ()) -> SweepResult:
    """Train once per held-out training domain and score each on its held-out domain.

    ``cfg.data.leave_out`` must be empty (the sweep sets it); at least three training domains are
    needed, so that every training keeps two clients for the secure sum.
    """
    if cfg.data.leave_out:
        raise ConfigError("data.leave_out", "cannot be combined with a leave-one-out sweep, which holds out each "
                          "training domain in turn")
    if cfg.data.validation:  # (found by review: validation mode scores no unseen domain — the sweep
        # trained its first target whole and stopped with a traceback, looking for the held-out score)
        raise ConfigError("data.validation", "cannot be combined with a leave-one-out sweep: validation mode scores "
                          "the training domains' held-out images, never the held-out domain a sweep scores")
    check(cfg, saved=resume)
    names = training_domains(cfg)
    if len(names) < 3:
        raise ConfigError("data.datasets", f"leave-one-out needs at least three training domains (got "
                          f"{', '.join(names)}): two keep training while one is held out")
    run_dir = Path(run_dir)
    # a refusal before any target started leaves nothing behind; one process at a time
    with claimed_run_dir(run_dir, fresh=not resume, marker=SWEEP_FILE):
        # a rate given to a sweep's resume is the sweep's from then on: targets not begun yet build from this
        # file (found by review: they went back to the rate given first); begun ones take their checkpoint's
        if not resume or not is_sweep(run_dir) or set(rates_given) & set(RATES):
            ckpt.write_run_file(run_dir / SWEEP_FILE, json.dumps(
                {"protocol": "leave-one-domain-out", "targets": names, "config": json.loads(cfg.to_json())}, indent=2))
        targets = _targets(cfg, run_dir, names, resume=resume, reporter=reporter, data_root=data_root,
                           rates_given=rates_given)
        mean = {key: statistics.fmean(t[key] for t in targets) for key in ("rank1", "mAP")}
        result = SweepResult(run_dir, [{k: v for k, v in t.items() if k != "privacy"} for t in targets], mean,
                             composed_privacy(targets))
        ckpt.write_run_file(run_dir / RESULT_FILE, json.dumps(result.to_dict(), indent=2))
    return result


def _targets(cfg: RunConfig, run_dir: Path, names: list[str], *, resume: bool, reporter: Reporter | None,
             data_root: Path | None, rates_given: Collection[str]) -> list[dict[str, Any]]:
    """Each held-out domain's run (resumed or read back when it already finished) and its scores."""
    targets = []
    for name in names:
        sub_dir = run_dir / f"leave-out-{name}"
        summary_file = sub_dir / "summary.json"
        if resume and (summary_file.exists() or summary_file.is_symlink()):
            summary = _finished(summary_file, name)
        else:
            sub = cfg.model_copy(deep=True)
            sub.data.leave_out = [name]
            # resumed, a target without a checkpoint starts afresh in its folder (run's resume does that)
            summary = run(sub, sub_dir, resume=resume, reporter=reporter, data_root=data_root,
                          rates_given=rates_given).summary
        scores = next(d for d in summary["unseen"] if d.get("name") == name)
        targets.append({"name": name, "rank1": scores["rank1"], "mAP": scores["mAP"], "run": sub_dir.name,
                        "privacy": summary.get("privacy")})
    return targets


def _finished(summary_file: Path, name: str) -> dict[str, Any]:
    """A finished target's summary.json, read as `secfed compare` reads one (typed), scoring ``name`` as
    its held-out domain (found by review: a damaged file raised, one without the domain raised too)."""
    from secfed.evaluation.compare import RunUnreadable, load_run

    try:
        load_run(summary_file.parent)
    except RunUnreadable as exc:
        raise ckpt.CheckpointError(f"{exc}; delete {summary_file.parent} and resume to train that target again") from None
    summary = json.loads(summary_file.read_text())
    held_out = [d for d in summary.get("unseen", []) if d.get("name") == name]
    if not held_out or not all(isinstance(held_out[0].get(k), (int, float)) for k in ("rank1", "mAP")):
        raise ckpt.CheckpointError(f"{summary_file}: scores no held-out domain {name!r}: not this sweep's target; "
                                   f"delete {summary_file.parent} and resume to train it again")
    return summary
