"""The seed papers' claims, decided from paired seeds — one resumable command (`make claims`).

    python bench/claims.py [--seeds 10] [--workers N] [--device cpu|cuda] [--threads T]
                           [--only CLAIM ...] [--out bench/results/claims] [--publish] [--max-minutes M]
                           [--lr-grid 0.5 1 2] [--grid-seeds 1] [--spread ARM@START ... [--tune]]

Each claim compares two arms trained with the SAME seed (same data order, same initial weights): the
per-seed difference d (in rank-1/mAP points, signed so that positive is what the paper claims) is a
paired sample, and its mean and 95 % Student-t interval [lo, hi] decide:

    reproduced       lo > threshold                      (the claimed effect is there)
    not reproduced   hi < threshold + margin             (any effect in the claimed direction is
                                                          smaller than the margin, 1 point)
    undecided        otherwise — more seeds would be needed; the interval is printed

Raising the seeds after an undecided look and deciding again is a second look at the same claim, and
a rule applied at 95 % on every look would find an effect that is not there more often than 5 % of the
time. So each report records, per claim, the number of paired seeds it decided from (OUT/looks.json;
the same number again is the same look), and a claim looked at k times is decided from the 1 − 0.05/k
interval (Bonferroni: the intervals of all k looks cover the true mean together with probability
≥ 95 %; the table names k and the level). It is conservative for nested seeds, whose looks are
correlated. Strictly it holds for k looks planned in advance: here each look was added after an
undecided one, the earlier ones at a less strict level (the first at 95 %), so a claim decided at an
early look would have stopped there at that level; the correction makes today's decision as strict as
a plan of k looks would have, and cannot undo a look already taken.

Arms (bench_methods.py's and bench_dfh.py's settings; each run ≤ 5 CPU-minutes):

    fedpav, fedpav+kd, fedpav+cdw, fedpav+kd+cdw, fedreid   the default (4 client domains, 2 unseen,
                                                             16 rounds, evaluation every 2 rounds)
    fedreid+beta                                            FedReID with β = 0.0005 (AAAI'21 Fig. 3)
    fedreid-no-expert                                       FedReID on CE alone (AAAI'21 Fig. 4(d))
    lodo:fedpav, lodo:dfh, lodo:dfh-no-dh, lodo:dfh-l0      leave-one-domain-out (campus held out), DFH's
                                                             Tables 1–2 at the paper's λ and margin; λ = 0
                                                             is DFH's recipe (triplet, P×K batches, pool-5
                                                             retrieval) without hallucinating
    ARM@synthetic                                           ARM from the synthetic pretrained backbone
                                                             (`secfed pretrain`, built first if missing)

``--spread ARM@START ...`` runs only those arms, ``--seeds`` seeds each at their defaults, for the
seed-to-seed spread table (issue 24 item 2: does a pretrained start steady the setting?); every report
shows the spread of every arm in OUT/runs.jsonl, and decides each claim all of whose arms ran from one
start. With ``--tune`` the arms first get the same grid as the claims' arms (below), then their seeds
at the chosen factor where it is not 1 (before the factor-1 seeds); the report decides those claims
from each arm's tuned runs once all its seeds are in (else from factor 1) and says which under the table.

Each arm gets the same tuning budget first: its learning rates (new layers and backbone together)
are scaled by each factor of ``--lr-grid``, trained on seeds of their own (10,000 and up, never a
claim seed) and scored on the VALIDATION split of the training domains (``data.validation``:
held-out training identities; no test set and no unseen domain is scored); the factor with the best
validation mAP is the arm's for every claim run (``fedreid+beta`` takes FedReID's). ``--lr-grid 1``
skips tuning. The choice is printed and written to OUT/grid.json. The report decides each claim from
each arm's runs at its chosen factor once all ``--seeds`` of them are in, else from its factor-1 runs
(an interrupted command publishes what it has, the same rule as the pretrained starts' table), and
says under the table which arms are at which; ``--at-defaults`` decides from the factor-1 runs of
every arm, printing the grid's choice beside them.

Every finished run is appended to OUT/runs.jsonl at once; a rerun skips what is there (kill it at
any time). Runs go out seed by seed, so an interrupted bench leaves whole pairs. ``--workers`` runs
that many processes, each on ``--threads`` torch threads. The table goes to OUT/claims.md and the
forest plot of the intervals (the pretrained starts' claims below the main ones) to OUT/claims.png;
``--publish`` also writes the table into README.md and bench/RESULTS.md between their
``<!-- claims:begin -->`` / ``<!-- claims:end -->`` markers, with the environment and the command beside it.
"""

from __future__ import annotations

import argparse
import collections
import io
import json
import math
import multiprocessing
import os
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from scipy import stats

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_dfh  # noqa: E402
import bench_methods  # noqa: E402

from secfed import atomic_file  # noqa: E402
from secfed.environment import describe, environment  # noqa: E402
from secfed.evaluation.report import is_finite_number  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
BEGIN, END = "<!-- claims:begin -->", "<!-- claims:end -->"
LODO_TARGET = "campus"
BETA = 0.0005
VALIDATION_FRACTION = 0.25  # of each training domain's multi-camera identities, held out for tuning
GRID_SEED = 10_000  # tuning seeds start here: never a claim seed
LR_GRID = (0.5, 1.0, 2.0)  # the learning-rate factors each arm is tuned over (`--lr-grid`)
# A run of a method that has changed since is neither reused nor decided from: it is redone. KD's
# soft labels became feature directions in 655c22e (secfed/algorithms/kd.py), so a KD arm's row
# counts only if it records that revision; the older rows stay in runs.jsonl as history.
KD_REVISION = "directions"


# ---- arms -------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Job:
    """One run: ``arm`` at ``seed`` with its learning rates × ``lr_scale``; ``validation``: a tuning
    run, scored on held-out training identities only."""

    arm: str
    seed: int
    lr_scale: float = 1.0
    validation: bool = False


def job_of(row: dict[str, Any]) -> Job:
    """The job a finished row ran (rows from before the grid ran at factor 1, on the test sets)."""
    return Job(row["arm"], row["seed"], float(row.get("lr_scale", 1.0)), bool(row.get("validation", False)))


def split_arm(arm: str) -> tuple[str, str]:
    """``METHOD@START`` → (method arm, initial weights: "" for the arm's own, e.g. "synthetic")."""
    method, _, start = arm.partition("@")
    return method, start


def tuned_as(arm: str) -> str:
    """The arm whose learning-rate factor ``arm`` uses (β changes the noise, not the optimiser)."""
    method, start = split_arm(arm)
    return method.removesuffix("+beta") + (f"@{start}" if start else "")


def arm_config(arm: str, seed: int, device: str, rounds: int) -> Any:
    """The RunConfig of ``arm`` (built by the bench that owns it) on ``device``."""
    method, start = split_arm(arm)
    cfg = _method_config(method, seed, rounds)
    if start:
        cfg.model.pretrained = start  # the learning rates then resolve to the pretrained defaults
    cfg.run.device = device
    return cfg


def _method_config(arm: str, seed: int, rounds: int) -> Any:
    if arm.startswith("lodo:"):
        cfg = bench_dfh.config(arm.removeprefix("lodo:"), LODO_TARGET, seed, rounds)
    else:
        cfg = bench_methods.config(tuned_as(arm), seed, unseen=2, eval_every=2)
        cfg.schedule.rounds = rounds
        if arm.endswith("+beta"):
            cfg.privacy.dp_beta = BETA
    return cfg


@cache
def uses_kd(arm: str) -> bool:
    """Whether ``arm``'s configuration distils on the server — the one test both the row a run writes
    (:func:`run_arm`) and the rows a report reads (:func:`current`) apply."""
    return bool(arm_config(arm, 0, "cpu", 1).method.kd)


def scale_learning_rates(cfg: Any, scale: float) -> None:
    """Both learning rates (new layers, backbone) of ``cfg`` × ``scale``, from the method's defaults."""
    from secfed.algorithms import method_class

    pretrained = cfg.model.pretrained != "none"
    new, backbone = method_class(cfg).learning_rates or (None, None)  # a method's paper may fix its own
    cfg.schedule.lr = scale * cfg.schedule.resolved_lr(pretrained, new)
    cfg.schedule.lr_backbone = scale * cfg.schedule.resolved_backbone_lr(pretrained, backbone)


def run_arm(job: Job, device: str, threads: int, rounds: int = 16) -> dict[str, Any]:
    """Train one job (in a worker process) and return what the claims and the grid read."""
    import torch

    from secfed.federation.runtime import run

    from secfed.federation.builder import resolve_device

    torch.set_num_threads(threads)
    cfg = arm_config(job.arm, job.seed, device, rounds)
    scale_learning_rates(cfg, job.lr_scale)
    head = {"arm": job.arm, "seed": job.seed, "rounds": rounds, "lr_scale": job.lr_scale,
            "device": resolve_device(device).type,
            "validation": job.validation, "lr": cfg.schedule.lr, "lr_backbone": cfg.schedule.lr_backbone,
            **({"kd": KD_REVISION} if uses_kd(job.arm) else {})}
    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        if job.validation:
            cfg.data.validation = VALIDATION_FRACTION
            cfg.data.synth_unseen = 0
            cfg.run.local_baseline = False
            result = run(cfg, Path(tmp) / "run")
            return {**head, "seconds": time.perf_counter() - start, "domains": result.summary["domains"],
                    "unseen": [], "inputs": bench_dfh.run_inputs(result.federation.data_info),
                    "environment": environment()}
        if job.arm.startswith("lodo:"):
            row = bench_dfh.one_run(job.arm.removeprefix("lodo:"), LODO_TARGET, job.seed, rounds, Path(tmp), cfg=cfg)
            return {**head, "seconds": row["wall_seconds"], "unseen": [{"name": LODO_TARGET, **row["unseen"]}],
                    "inputs": row["inputs"], "environment": environment()}
        result = run(cfg, Path(tmp) / "run")
        history = [json.loads(line) for line in (result.run_dir / "metrics.jsonl").read_text().splitlines()]
        evaluated = [r for r in history if "eval" in r]
        curves = {name: [r["eval"][name]["rank1"] for r in evaluated] for name in evaluated[-1]["eval"]}
        return {**head, "seconds": time.perf_counter() - start, "curves": curves,
                "domains": result.summary["domains"], "unseen": result.summary["unseen"],
                "inputs": bench_dfh.run_inputs(result.federation.data_info), "environment": environment()}


def choose(rows: Iterable[dict[str, Any]], arms: Iterable[str], scales: list[float]) -> dict[str, dict[str, Any]]:
    """Per tuned arm: validation mAP (%, mean over grid seeds and training domains) per factor, the
    factor chosen (the best; 1 when nothing was run) and the fewest tuning seeds behind a factor."""
    tuning = [(job_of(r), r) for r in rows if r.get("validation")]  # the grid's runs
    out = {}
    for arm in dict.fromkeys(tuned_as(a) for a in arms):
        score, seeds = {}, []
        for scale in scales:
            got = [r for job, r in tuning if job.arm == arm and job.lr_scale == scale]
            if got:
                score[scale] = 100 * statistics.fmean(d["mAP"] for r in got for d in r["domains"])
                seeds.append(len({r["seed"] for r in got}))
        out[arm] = {"validation_mAP": {f"{k:g}": v for k, v in score.items()},
                    "chosen": max(score, key=score.__getitem__) if score else 1.0,
                    "complete": len(score) == len(scales), "seeds": min(seeds, default=0)}
    return out


def chosen_factor(grid: dict[str, dict[str, Any]], arm: str) -> float:
    """The factor ``arm``'s grid (:func:`choose`'s, looked up by the arm it is tuned as) chose once every
    factor is scored; 1 without a complete grid."""
    g = grid.get(tuned_as(arm))
    return g["chosen"] if g and g["complete"] else 1.0


# ---- claims -----------------------------------------------------------------------------------------

def seen_rank1(run: dict[str, Any]) -> float:
    return 100 * statistics.fmean(d["rank1"] for d in run["domains"])


def unseen_rank1(run: dict[str, Any]) -> float:
    return 100 * statistics.fmean(d["rank1"] for d in run["unseen"])


def unseen_map(run: dict[str, Any]) -> float:
    return 100 * statistics.fmean(d["mAP"] for d in run["unseen"])


FIG7_MIN_ROUNDS = 6  # three evaluations at bench_methods' one every 2 rounds: two changes to take a std of


def volatility(run: dict[str, Any]) -> float:
    return 100 * statistics.fmean(bench_methods.volatility(c) for c in run["curves"].values() if len(c) > 2)


def smallest_gain(run: dict[str, Any]) -> float:
    """Federated − local-only rank-1 on the domain with the fewest training images (MM'20 Fig. 6)."""
    small = min(run["domains"], key=lambda d: d.get("train_images", math.inf))
    return 100 * (small["rank1"] - small["local_rank1"])


@dataclass(frozen=True)
class Claim:
    key: str
    source: str
    statement: str
    arms: tuple[str, ...]
    measure: Callable[[dict[str, dict[str, Any]]], float]  # {arm: run} of one seed → d (points)
    unit: str
    threshold: float = 0.0
    margin: float = 1.0


CLAIMS = [
    Claim("mm20-fig6", "MM'20 Fig. 6", "federation helps the smallest domain (federated − local-only rank-1)",
          ("fedpav",), lambda r: smallest_gain(r["fedpav"]), "rank-1 points"),
    Claim("mm20-table3", "MM'20 Table 3", "CDW improves FedPav (mean seen rank-1)",
          ("fedpav", "fedpav+cdw"), lambda r: seen_rank1(r["fedpav+cdw"]) - seen_rank1(r["fedpav"]), "rank-1 points"),
    Claim("mm20-fig7", "MM'20 Fig. 7", "KD lowers round-to-round volatility (FedPav − FedPav+KD, std of changes)",
          ("fedpav", "fedpav+kd"), lambda r: volatility(r["fedpav"]) - volatility(r["fedpav+kd"]), "rank-1 points",
          margin=0.25),
    Claim("mm20-alg5", "MM'20 Alg. 5", "KD + CDW improve FedPav (mean seen rank-1)",
          ("fedpav", "fedpav+kd+cdw"), lambda r: seen_rank1(r["fedpav+kd+cdw"]) - seen_rank1(r["fedpav"]),
          "rank-1 points"),
    # (found by review: "AAAI'21 Fig. 4" compared FedReID with FedPav — another head, other shared layers,
    # learning rates and retrieval feature — while Fig. 4(d) is FedReID with against without its expert)
    Claim("aaai21-fig4", "AAAI'21 vs FedPav", "FedReID's recipe (mapping network, expert, its learning rates) "
          "improves unseen-domain rank-1 over FedPav",
          ("fedpav", "fedreid"), lambda r: unseen_rank1(r["fedreid"]) - unseen_rank1(r["fedpav"]), "rank-1 points"),
    Claim("aaai21-fig4d", "AAAI'21 Fig. 4(d)", "the local expert improves FedReID's unseen-domain rank-1 "
          "(FedReID − FedReID on CE alone)",
          ("fedreid-no-expert", "fedreid"),
          lambda r: unseen_rank1(r["fedreid"]) - unseen_rank1(r["fedreid-no-expert"]), "rank-1 points"),
    Claim("aaai21-fig3", "AAAI'21 Fig. 3", f"β = {BETA} costs FedReID less than 2 seen rank-1 points (the paper "
          "plots unseen VIPeR; the 2-point bar is secfed's)",
          ("fedreid", "fedreid+beta"), lambda r: seen_rank1(r["fedreid+beta"]) - seen_rank1(r["fedreid"]),
          "rank-1 points", threshold=-2.0, margin=0.0),
    # (found by review: the paper's FedPav row is its Table 2's "no FH, no DH" — one recipe — while lodo:fedpav
    # lacks DFH's triplet loss, P×K batches and pool-5 retrieval; λ = 0 keeps them and drops hallucinating)
    Claim("dfh-table1", "DFH Table 1", f"DFH's recipe beats FedPav on the held-out domain ({LODO_TARGET}, mAP)",
          ("lodo:fedpav", "lodo:dfh"), lambda r: unseen_map(r["lodo:dfh"]) - unseen_map(r["lodo:fedpav"]),
          "mAP points"),
    Claim("dfh-table1-l0", "DFH Table 1 (λ = 0)", "hallucinating beats DFH's recipe without it (λ = 0; held-out "
          "mAP)", ("lodo:dfh-l0", "lodo:dfh"),
          lambda r: unseen_map(r["lodo:dfh"]) - unseen_map(r["lodo:dfh-l0"]), "mAP points"),
    Claim("dfh-table2", "DFH Table 2", "domain hallucination adds to feature hallucination (held-out mAP)",
          ("lodo:dfh-no-dh", "lodo:dfh"), lambda r: unseen_map(r["lodo:dfh"]) - unseen_map(r["lodo:dfh-no-dh"]),
          "mAP points"),
]


ALPHA = 0.05  # the error rate a claim's decision is held to over all its looks


def confidence(looks: int) -> float:
    """The per-look confidence of a claim looked at ``looks`` times: its 95 % split over the looks
    (Bonferroni), so the intervals of every look cover the true mean together with probability ≥ 95 %."""
    return 1 - ALPHA / max(1, looks)


def interval(values: list[float], looks: int = 1) -> tuple[float, float, float]:
    """(mean, lo, hi) of the Student-t interval of ``values`` at :func:`confidence` (95 % for one look;
    bench_methods' interval; NaN bounds for one value, which decides nothing)."""
    mean, half = bench_methods.interval(values, confidence(looks))
    return mean, mean - half, mean + half


def decide(differences: list[float], threshold: float, margin: float, looks: int = 1) -> str:
    """reproduced / not reproduced / undecided from the paired differences (module docstring), with
    the interval of a claim looked at ``looks`` times."""
    if len(differences) < 2:
        return "undecided"
    _, lo, hi = interval(differences, looks)
    if lo > threshold:
        return "reproduced"
    if hi < threshold + margin:
        return "not reproduced"
    return "undecided"


def record_looks(path: Path, seeds: dict[str, int], *, fewer: bool = False) -> dict[str, int]:
    """Add today's look at each claim to ``path`` (OUT/looks.json: per claim label, the numbers of
    paired seeds at which a report has decided it) and return each claim's number of looks.

    ``seeds``: the paired seeds of every claim a report decides now (label → n; a claim with too few
    seeds to be decided is not looked at). A report at a number of seeds already recorded is the same
    look again; any other number is a new look — raising the seeds after an undecided look and
    deciding again is a second look, and the interval of each is widened to keep the 95 % over all
    (:func:`confidence`). A look at fewer seeds than an earlier one is refused unless ``fewer``
    (``--new-look``): it is a look too, and widens every later interval (found by review: a report at
    --seeds 5 after 10 turned a reproduced claim undecided for good, without a word)."""
    recorded: dict[str, list[int]] = {}
    if path.exists():
        try:
            recorded = json.loads(path.read_text())
        except ValueError as error:
            raise SystemExit(f"{path}: not a looks file ({{claim: [seeds, ...]}}): {error}") from None
        if not isinstance(recorded, dict) or not all(
                isinstance(ns, list) and all(type(n) is int and n > 0 for n in ns) for ns in recorded.values()):
            raise SystemExit(f"{path}: not a looks file: each claim must map to a list of seed counts ≥ 1")
    shrunk = {label: n for label, n in seeds.items() if recorded.get(label) and n not in recorded[label]
              and n < max(recorded[label])}
    if shrunk and not fewer:
        raise SystemExit(f"{path}: " + "; ".join(f"{label} was decided at {max(recorded[label])} seeds" for label in shrunk)
                         + f" — a report at fewer ({', '.join(map(str, sorted(set(shrunk.values()))))}) is another look, "
                         "which widens every later interval of the claim: pass --new-look to take it, or give --seeds "
                         "as before")
    for label, n in seeds.items():
        recorded[label] = sorted({*recorded.get(label, []), n})
    atomic_file.write_text(path, json.dumps(recorded, indent=1, sort_keys=True) + "\n")
    return {label: len(ns) for label, ns in recorded.items()}


def machine_of(run: dict[str, Any]) -> str:
    """The machine a run ran on (:func:`environment_line` without the commit; "" for a run made before
    environments were recorded), and its CPU where a run on a GPU machine trained there (found by
    review: a CPU run and a CUDA run on one GPU machine paired as one machine's)."""
    if "environment" not in run:
        return ""
    env = run["environment"]
    gpu_machine = bool(env.get("gpu") or env.get("cuda"))
    # recorded since 2026-11-29; every earlier run on a GPU machine trained on its GPU
    device = run.get("device") or ("cuda" if gpu_machine else "cpu")
    return environment_line(env, commit=False) + (", trained on its CPU" if gpu_machine and device == "cpu" else "")


def this_machine(device: str, threads: int) -> str:
    """:func:`machine_of` a run this process would make now on ``device`` with ``threads`` threads."""
    from secfed.federation.builder import resolve_device

    env = environment()
    env["torch_threads"] = threads  # what run_arm sets in its worker
    return machine_of({"environment": env, "device": resolve_device(device).type})


def paired(claim: Claim, runs: Iterable[dict[str, Any]]) -> list[float]:
    """One difference per seed and machine that has every arm of the claim: the arms of a pair ran on
    one machine, so a folder that holds two machines' runs never pairs a seed across them (the same
    seed is another run on another CPU: README, "What makes a run repeatable on another machine")."""
    by_seed: dict[tuple[int, str], dict[str, dict[str, Any]]] = {}
    for r in runs:
        by_seed.setdefault((r["seed"], machine_of(r)), {})[r["arm"]] = r
    return [claim.measure(arms) for _, arms in sorted(by_seed.items()) if all(a in arms for a in claim.arms)]


def claim_label(claim: Claim, start: str = "") -> str:
    """A claim's name in OUT/looks.json: its key, with ``@START`` when decided from a pretrained start."""
    return f"{claim.key}@{start}" if start else claim.key


def table(runs: list[dict[str, Any]], claims: list[Claim], min_seeds: int = 1,
          looks: dict[str, int] | None = None, start: str = "") -> str:
    """The claims decided from ``runs``; one with fewer than ``min_seeds`` paired seeds is undecided
    (and one seed decides nothing anyway: :func:`decide`). ``looks``: how many times each claim
    (:func:`claim_label`, with ``start``) has been decided, from :func:`record_looks` (1 when absent); a
    claim looked at more than once is decided from its wider interval, and says so."""
    looks = looks or {}
    lines = ["| claim | statement | seeds | mean d [95 % interval] | decision |", "|---|---|---|---|---|"]
    for claim in claims:
        d = paired(claim, runs)
        if not d:
            lines.append(f"| {claim.source} | {claim.statement} | 0 | — | not run |")
            continue
        k = looks.get(claim_label(claim, start), 1)
        mean, lo, hi = interval(d, k)
        shown = f"{mean:+.2f} [{lo:+.2f}, {hi:+.2f}] {claim.unit}" if len(d) > 1 else f"{mean:+.2f} {claim.unit}"
        if k > 1 and len(d) > 1:
            shown += f" ({k} looks: a {100 * confidence(k):.1f} % interval each)"
        verdict = decide(d, claim.threshold, claim.margin, k) if len(d) >= min_seeds else \
            f"undecided ({len(d)} of the {min_seeds} seeds a decision needs)"
        lines.append(f"| {claim.source} | {claim.statement} | {len(d)} | {shown} | **{verdict}** |")
    return "\n".join(lines)


def look_seeds(runs: list[dict[str, Any]], claims: list[Claim], started: dict[str, list[dict[str, Any]]]
               ) -> dict[str, int]:
    """The paired seeds of every claim a report decides now (:func:`record_looks`' ``seeds``): the main
    table's with ≥ 2 pairs, each start's (:func:`started_by_start`) with ≥ ``STARTED_MIN_SEEDS``."""
    seeds = {claim_label(c): n for c in claims if (n := len(paired(c, runs))) >= 2}
    for start, mine in started.items():
        seeds |= {claim_label(c, start): n for c in claims if (n := len(paired(c, mine))) >= STARTED_MIN_SEEDS}
    return seeds


def labelled(run: dict[str, Any]) -> str:
    """A run's arm, with its learning-rate factor when that is not 1 ("fedreid@synthetic ×0.5")."""
    scale = job_of(run).lr_scale
    return run["arm"] if scale == 1.0 else f"{run['arm']} ×{scale:g}"


def spread(runs: list[dict[str, Any]]) -> str:
    """Per arm (and factor, when not 1): seeds, mean and seed-to-seed standard deviation of the mean
    seen rank-1 and the mean unseen mAP (issue 24's goal for a setting stable enough to decide: both
    std ≤ 3 points)."""
    lines = ["| arm | seeds | seen rank-1, mean (std) | unseen mAP, mean (std) |", "|---|---|---|---|"]
    for arm in dict.fromkeys(map(labelled, runs)):
        mine = [r for r in runs if labelled(r) == arm]
        cells = []
        for values in ([seen_rank1(r) for r in mine if r.get("domains")], [unseen_map(r) for r in mine if r["unseen"]]):
            sd = statistics.stdev(values) if len(values) > 1 else math.nan
            cells.append(f"{statistics.fmean(values):.1f} ({sd:.1f})" if values else "—")
        lines.append(f"| {arm} | {len(mine)} | {cells[0]} | {cells[1]} |")
    return "\n".join(lines)


DECISION_COLOURS = {"reproduced": "tab:green", "not reproduced": "tab:red", "undecided": "tab:grey"}


def figure(runs: list[dict[str, Any]], claims: list[Claim], out_png: Path,
           started: dict[str, list[dict[str, Any]]] | None = None, looks: dict[str, int] | None = None) -> None:
    """The claims as a forest plot: each claim's mean paired difference and interval (95 %, split over
    its ``looks`` as in :func:`table`) against its threshold (dashed), coloured by the decision; then
    the same claims from each pretrained start (``started``: :func:`started_by_start`'s runs, decided
    on ≥ ``STARTED_MIN_SEEDS`` seeds as in its table, grey below that); a claim with fewer than two
    paired seeds is left out."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    looks = looks or {}
    shown = [(c.source, c, paired(c, runs), 2, looks.get(claim_label(c), 1)) for c in claims]
    shown += [(f"{c.source} @{start}", c, paired(c, mine), STARTED_MIN_SEEDS, looks.get(claim_label(c, start), 1))
              for start, mine in (started or {}).items() for c in claims]
    shown = [row for row in shown if len(row[2]) > 1]
    fig = Figure(figsize=(7.5, 0.55 * len(shown) + 1.4))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    for y, (_, claim, d, needed, k) in enumerate(reversed(shown)):
        mean, lo, hi = interval(d, k)
        colour = DECISION_COLOURS[decide(d, claim.threshold, claim.margin, k) if len(d) >= needed else "undecided"]
        ax.errorbar(mean, y, xerr=[[mean - lo], [hi - mean]], fmt="o", color=colour, capsize=3)
        ax.vlines(claim.threshold, y - 0.4, y + 0.4, colors="black", linestyles="--", linewidth=0.8)
    ax.set_yticks(range(len(shown)), [f"{name} (n={len(d)}{f', {k} looks' if k > 1 else ''})"
                                      for name, _, d, _, k in reversed(shown)], fontsize=8)
    ax.set_xlabel("paired difference d, points (> threshold: what the paper claims)")
    ax.set_title("claims: mean d and 95 % interval, split over looks (green reproduced, red not, grey undecided)",
                 fontsize=9)
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=110)
    atomic_file.write_bytes(out_png, buffer.getvalue())


def grid_summary(chosen: dict[str, dict[str, Any]]) -> str:
    """``arm ×factor (×0.5: mAP, ×1: mAP, …)`` per tuned arm, ";"-joined; ``(N tuning seeds; …)`` where
    the means are over more than one."""
    def scores(g: dict[str, Any]) -> str:
        seeds = f"{g['seeds']} tuning seeds; " if g.get("seeds", 1) > 1 else ""
        return seeds + ", ".join(f"×{k}: {v:.1f}" for k, v in g["validation_mAP"].items())

    return "; ".join(f"{a} ×{g['chosen']:g} ({scores(g)})" for a, g in chosen.items())


def publication(runs: list[dict[str, Any]], claims: list[Claim], command: str,
                grid: dict[str, dict[str, Any]], factors: dict[str, float] | None = None,
                spread_only: list[dict[str, Any]] = (), started_grid: dict[str, dict[str, Any]] | None = None,
                other_factors: list[dict[str, Any]] = (), looks: dict[str, int] | None = None) -> str:
    """The claims table (``runs``: :func:`claim_runs`'s, at ``factors``, the factor per arm; ``grid``:
    :func:`choose`'s for the claims' arms), the spread of every arm (``other_factors``: the claims'
    arms' test runs at the factor the table does not use; ``spread_only``: the ``--spread`` arms' runs,
    e.g. from the synthetic pretrained backbone; ``started_grid``: what ``--spread --tune``'s grid
    chose for them), the tuning line and the footer; ``looks``: :func:`record_looks`' count per claim."""
    wall = sum(r["seconds"] for r in runs) / 60
    return "\n".join([
        table(runs, claims, looks=looks), "",
        spread([*runs, *other_factors, *spread_only]), "",
        *([spread_only_line(spread_only), ""] if spread_only else []),
        *([started, ""] if (started := started_claims(spread_only, claims, started_grid or {}, looks)) else []),
        tuning_line(arms_of(claims), grid, factors), "",
        f"d > 0 is what the paper claims; reproduced: the interval's low end is above the threshold (0 unless "
        f"the statement names one); not reproduced: its high end is below threshold + 1 point (0.25 for "
        f"volatility); otherwise undecided. A claim decided k > 1 times — its seeds raised after an undecided "
        f"look — is decided from a 1 − 0.05/k interval at each look (Bonferroni: 95 % over all its looks; "
        f"OUT/looks.json records the seeds of each). {len(runs)} runs, {wall:.0f} run-minutes, on "
        f"{machines_line(runs)}; {inputs_line(runs)}; generated by `{command}`.",
    ])


STARTED_MIN_SEEDS = 10  # issue 24: a claim is decided on ≥ 10 paired seeds (an interrupted --spread has fewer)


def started_claims(spread_only: Iterable[dict[str, Any]], claims: list[Claim],
                   grid: dict[str, dict[str, Any]] | None = None, looks: dict[str, int] | None = None) -> str:
    """The claims every arm of which has ``--spread`` runs from one start (ARM@START, paired by seed),
    decided as the main table decides from each arm's runs at the factor the ``--tune`` grid
    (``grid``, :func:`choose`'s for the ARM@START arms) chose once they are all in, else at factor 1:
    one table per start, nothing when none; under each, which factor each arm's runs are at. ``looks``:
    :func:`record_looks`' count per claim (``KEY@START``)."""
    by_start, factors = started_by_start(spread_only, grid)
    blocks = []
    for start, mine in by_start.items():
        decidable = [c for c in claims if paired(c, mine)]
        if decidable:
            blocks.append(f"The same claims from the {start} pretrained backbone, where `--spread` ran every arm "
                          f"(ARM@{start}, paired by seed; each arm's learning-rate factor is named below the table):"
                          f"\n\n{table(mine, decidable, STARTED_MIN_SEEDS, looks, start)}\n\n"
                          f"{tuning_line(arms_of(decidable), grid or {}, factors, start)}")
    return "\n\n".join(blocks)


def started_by_start(spread_only: Iterable[dict[str, Any]], grid: dict[str, dict[str, Any]] | None = None
                     ) -> tuple[dict[str, list[dict[str, Any]]], dict[str, float]]:
    """Per start, the runs its claims are decided from (:func:`decided_runs`), named by method;
    and the factor used per ARM@START arm."""
    runs, factors = decided_runs(list(spread_only), grid or {}, STARTED_MIN_SEEDS)
    by_start: dict[str, list[dict[str, Any]]] = {}
    for r in runs:
        method, start = split_arm(r["arm"])
        by_start.setdefault(start, []).append({**r, "arm": method})
    return by_start, factors


def decided_runs(rows: list[dict[str, Any]], grid: dict[str, dict[str, Any]], min_seeds: int
                 ) -> tuple[list[dict[str, Any]], dict[str, float]]:
    """Each arm's test runs at the factor its complete grid chose once that factor has ``min_seeds``
    seeds (a half-made set would turn a decided claim undecided), else its factor-1 runs; and the
    factor used per arm. One rule for both tables: from scratch and from each pretrained start."""
    out: list[dict[str, Any]] = []
    factors: dict[str, float] = {}
    tests = [r for r in rows if not job_of(r).validation]
    for arm in dict.fromkeys(r["arm"] for r in tests):
        chosen = chosen_factor(grid, arm)
        at = {scale: [r for r in tests if r["arm"] == arm and job_of(r).lr_scale == scale] for scale in (chosen, 1.0)}
        factors[arm] = chosen if len(at[chosen]) >= min_seeds else 1.0
        out += at[factors[arm]]
    return out, factors


def tuning_line(arms: list[str], grid: dict[str, dict[str, Any]], factors: dict[str, float] | None = None,
                start: str = "") -> str:
    """What the learning-rate grid chose per arm (from scratch, or from ``start``: `--spread ARM@START
    --tune`), which arms' runs in the table are at the tuned factor (``factors``: the factor used per
    arm, 1 when absent), which are at factor 1 though it chose another, and which it has not scored."""
    factors = factors or {}
    name = {a: f"{a}@{start}" if start else a for a in arms}
    where, how = ((f"from the {start} start", f"`--spread ARM@{start} --tune`") if start
                  else ("from scratch", "`python bench/claims.py`"))
    tuned = list(dict.fromkeys(tuned_as(name[a]) for a in arms))
    scored = {a: g for a in tuned if (g := grid.get(a)) and g["complete"]}  # every factor scored
    if not scored:
        return f"Learning rates {where}: the defaults, untuned (no complete grid: {how}). Not tuned yet: {', '.join(tuned)}."
    used = {name[a]: factors.get(name[a], 1.0) for a in arms}
    at_tuned = [a for a, f in used.items() if tuned_as(a) in scored and f == scored[tuned_as(a)]["chosen"]]
    off = [a for a, f in used.items() if tuned_as(a) in scored and a not in at_tuned]
    missing = [a for a in tuned if a not in scored]
    return (f"Learning rates {where} — the grid on the validation split of the training domains "
            f"(validation mAP % per factor) chose: {grid_summary(scored)}. "
            + (f"The runs above are at the tuned factor for {', '.join(f'{a} (×{used[a]:g})' for a in at_tuned)}. "
               if at_tuned else "")
            + (f"For {', '.join(off)} they are at factor 1, NOT the tuned ones. " if off else "")
            + (f"Not tuned yet: {', '.join(missing)}." if missing else "")).strip()


def spread_only_line(runs: list[dict[str, Any]]) -> str:
    """Where the ``--spread`` arms' runs come from: outside the main table, and maybe another machine's."""
    arms = ", ".join(dict.fromkeys(r["arm"] for r in runs))
    return (f"{arms}: measured with `--spread` (ARM@synthetic starts from the synthetic pretrained backbone, "
            f"`python bench/claims.py --spread ARM@synthetic`; the main table uses none of them, the table "
            f"below only the claims all of whose arms ran from that start), {len(runs)} runs, "
            f"{sum(r['seconds'] for r in runs) / 60:.0f} run-minutes, on {machines_line(runs)}; {inputs_line(runs)}.")


DEFAULT_BEGIN, DEFAULT_END = "<!-- default-results:start -->", "<!-- default-results:end -->"


def default_results(runs: list[dict[str, Any]], command: str) -> str:
    """README's default-run block: the FedPav arm (the default setting) per domain over its seeds,
    federated against local-only, mean ± 95 % interval, and the paired rank-1 gain."""
    mine = [r for r in runs if r["arm"] == "fedpav" and job_of(r).lr_scale == 1.0]  # the default: factor 1
    if not mine:
        return ""

    def cell(values: list[float]) -> str:
        mean, lo, hi = interval([100 * v for v in values])
        return f"{mean:.1f}" if len(values) < 2 else f"{mean:.1f} ± {(hi - lo) / 2:.1f}"

    lines = [f"What it gives over {len(mine)} seeds (the FedPav arm of `make claims`, mean ± 95 % interval,"
             " in %; two unseen domains evaluated beside it):", "",
             "| domain (train images) | federated R-1 | local-only R-1 | federated mAP | local-only mAP | "
             "R-1 gain, paired |", "|---|---|---|---|---|---|"]
    for d in mine[0]["domains"]:
        rows = [next(x for x in r["domains"] if x["name"] == d["name"]) for r in mine]
        lines.append(f"| {d['name']} ({d.get('train_images', '?')}) | {cell([x['rank1'] for x in rows])} | "
                     f"{cell([x['local_rank1'] for x in rows])} | {cell([x['mAP'] for x in rows])} | "
                     f"{cell([x['local_mAP'] for x in rows])} | "
                     f"{cell([x['rank1'] - x['local_rank1'] for x in rows]).replace('-', '−')} |")
    lines += ["", f"Generated from `bench/results/claims/runs.jsonl` ({machines_line(mine)}; runs made by "
              f"`{command}`)."]
    return "\n".join(lines)


def environment_line(env: dict[str, Any], *, commit: bool = True) -> str:
    """One run's machine in a few words: CPU, cores, torch and its kernels, threads, CUDA and the GPU
    (and commit)."""
    cpu = env.get("cpu") or {}
    cuda = f", CUDA {env['cuda']}" if env.get("cuda") else ""
    cuda += f" on {env['gpu']}" if env.get("gpu") else ""
    return (f"{cpu.get('model', '?')} ({cpu.get('logical_cores', '?')} cores, {env.get('torch_cpu_capability')}), "
            f"torch {env.get('torch')} on {env.get('torch_threads')} threads{cuda}"
            + (f", commit {short_commit(env['commit'])}" if commit and env.get("commit") else ""))


def short_commit(commit: Any) -> str:
    """A recorded commit in 7 digits, "-dirty" kept: a run of uncommitted code is not that commit's (found
    by review: the footers cut the suffix off)."""
    text = str(commit or "")
    return text[:7] + ("-dirty" if text.endswith("-dirty") else "")


def machines_line(runs: list[dict[str, Any]]) -> str:
    """The machines ``runs`` ran on, each once with the commits it ran ("n/a" without records)."""
    commits: dict[str, list[str]] = {}
    for r in runs:
        if "environment" in r:
            found = commits.setdefault(machine_of(r), [])
            commit = short_commit(r["environment"].get("commit"))
            if commit and commit not in found:
                found.append(commit)
    return "; ".join(f"{machine}" + (f", commit{'s' if len(c) > 1 else ''} {', '.join(c)}" if c else "")
                     for machine, c in sorted(commits.items())) or "n/a"


def inputs_line(runs: list[dict[str, Any]]) -> str:
    """What ``runs`` started from: each data fingerprint and initial backbone SHA-256 (first 12 hex
    digits) with how many runs read it; runs made before these were recorded (2026-11-28) counted apart."""
    recorded = [r["inputs"] for r in runs if "inputs" in r]
    unrecorded = len(runs) - len(recorded)

    def counted(values: Iterable[str]) -> str:
        return ", ".join(f"{v} ({n} run{'s' if n > 1 else ''})" for v, n in collections.Counter(values).most_common())

    parts = []
    if recorded:
        parts += [f"data {counted(i['data_fingerprint'][:12] for i in recorded)}",
                  "initial backbone " + counted((i["backbone_sha256"] or "")[:12] or "from scratch" for i in recorded)]
    if unrecorded:
        parts.append(f"{unrecorded} run{'s' if unrecorded > 1 else ''} made before data fingerprints and initial "
                     "backbones were recorded")
    return "; ".join(parts) or "no runs"


def rewrite_between_markers(text: str, block: str, begin: str = BEGIN, end_marker: str = END) -> str:
    """``text`` with what lies between the markers replaced by ``block`` (markers kept)."""
    start, end = text.find(begin), text.find(end_marker)
    if start < 0 or end < start:
        raise ValueError(f"no {begin} … {end_marker} block")
    return text[:start + len(begin)] + "\n" + block.strip() + "\n" + text[end:]


# ---- the command ------------------------------------------------------------------------------------

def current(row: dict[str, Any]) -> bool:
    """Whether ``row`` ran today's method (see :data:`KD_REVISION`)."""
    return not uses_kd(row["arm"]) or row.get("kd") == KD_REVISION


def known_arm(arm: Any) -> bool:
    """Whether ``arm`` names an arm this bench runs (a claim's arm, from its own start or ``@synthetic``)."""
    if not isinstance(arm, str):
        return False
    method, start = split_arm(arm)
    return method in arms_of(CLAIMS) and start in ("", "synthetic")


def load(path: Path) -> list[dict[str, Any]]:
    """The finished runs in ``path`` that ran today's methods (:func:`current`), in order; rows of an
    arm this bench does not know, damaged rows and a second row of one run are set aside with a line on
    stderr naming them (found by review: a line cut by a kill was skipped without a word; a missing seed,
    an empty domain list or a NaN score were tracebacks; a duplicated row counted twice in the spread)."""
    if not path.exists():
        return []
    rows, seen, unknown = [], set(), set()
    for number, line in enumerate(path.read_text().splitlines(), 1):
        try:
            row = json.loads(line)
        except json.JSONDecodeError:  # a line cut short by a kill: that run is redone
            print(f"{path}:{number}: not a whole run (cut short by a kill?): set aside, the run is redone",
                  file=sys.stderr)
            continue
        if not isinstance(row, dict):
            continue
        if not known_arm(row.get("arm")):
            unknown.add(str(row.get("arm")))
            continue
        damage = row_damage(row)
        key = (job_of(row), machine_of(row)) if damage is None else None
        if damage is None and key in seen:
            damage = "a second row of a run already read (the first is kept)"
        if damage is not None:
            print(f"{path}:{number}: set aside: {damage}", file=sys.stderr)
            continue
        seen.add(key)
        rows.append(row)
    if unknown:
        print(f"{path}: set aside the runs of arms this bench does not know: {', '.join(sorted(unknown))}",
              file=sys.stderr)
    return [r for r in rows if current(r)]


def row_damage(row: dict[str, Any]) -> str | None:
    """What is wrong with a run's row, in words (None: nothing) — what the tables read of it."""
    seed = row.get("seed")
    if type(seed) is not int or seed < 0:
        return f"seed {seed!r} is not a whole number ≥ 0"
    scale = row.get("lr_scale", 1.0)
    if not is_finite_number(scale) or scale <= 0:
        return f"lr_scale {scale!r} is not a number > 0"
    for field in ("domains", "unseen"):
        entries = row.get(field, [])
        if not isinstance(entries, list) or not all(isinstance(e, dict) and isinstance(e.get("name"), str)
                                                    for e in entries):
            return f"{field} is not a list of named domains"
        for e in entries:
            bad = [k for k, v in e.items() if k != "name" and not is_finite_number(v)]
            if bad:
                return f"{field} {e['name']!r}: {', '.join(bad)} not a finite number"
    validation = row.get("validation", False)
    if not isinstance(validation, bool):
        return f"validation {validation!r} is not true or false"
    if row["arm"].startswith("lodo:") and not validation:
        return None if row.get("unseen") else "no held-out domain score"
    return None if row.get("domains") else "no domain scores"


def recorded_command(folder: Path) -> str:
    """The command(s) that made ``folder``'s runs, from its command.txt: written by the command itself,
    or by hand where runs were copied in or several commands ran — ``#`` lines there explain and are
    left out of what a report quotes; several commands are joined with "then"."""
    path = folder / "command.txt"
    if not path.exists():
        return "?"
    lines = [line.strip() for line in path.read_text().splitlines()]
    return " then ".join(line for line in lines if line and not line.startswith("#")) or "?"


def note_command(folder: Path, command: str) -> None:
    """Add ``command`` to ``folder``'s command.txt, which names every command that made its runs (found
    by review: a rerun that made nothing overwrote it, naming itself as the maker of runs it never made)."""
    path = folder / "command.txt"
    lines = path.read_text().splitlines() if path.exists() else []
    if not lines or lines[-1].strip() != command:
        atomic_file.write_text(path, "".join(line + "\n" for line in [*lines, command]))


def append(path: Path, row: dict[str, Any]) -> None:
    """Add one run to ``path``, on a line of its own even after a line a kill cut short (found by review:
    the redone run was glued onto the fragment, and lost too)."""
    cut = path.exists() and path.stat().st_size > 0 and not path.read_bytes().endswith(b"\n")
    with path.open("a") as f:
        if cut:
            f.write("\n")
        f.write(json.dumps(row) + "\n")
        f.flush()
        os.fsync(f.fileno())


def arms_of(claims: list[Claim]) -> list[str]:
    """Every arm the claims compare, once, in claim order."""
    return list(dict.fromkeys(a for c in claims for a in c.arms))


def grid_jobs(arms: Iterable[str], scales: list[float], grid_seeds: int) -> list[Job]:
    """The tuning runs: each tuned arm of ``arms`` at each factor on each grid seed (none for a
    one-factor grid)."""
    if len(scales) < 2:
        return []
    tuned = dict.fromkeys(tuned_as(a) for a in arms)
    return [Job(a, GRID_SEED + s, scale, True) for s in range(grid_seeds) for a in tuned for scale in scales]


def claim_jobs(claims: list[Claim], seeds: int, chosen: dict[str, dict[str, Any]]) -> list[Job]:
    """The claim runs, seed by seed, each arm once however many claims share it, at its chosen factor."""
    return [Job(a, s, chosen[tuned_as(a)]["chosen"]) for s in range(seeds) for a in arms_of(claims)]


def claim_tests(rows: list[dict[str, Any]], claims: list[Claim], seeds: int) -> list[dict[str, Any]]:
    """The claims' arms' finished test runs (not the grid's) of seeds 0 … ``seeds`` − 1, at any factor."""
    return [r for r in started_runs(rows, arms_of(claims)) if r["seed"] < seeds]


def claim_runs(rows: list[dict[str, Any]], claims: list[Claim], seeds: int, grid: dict[str, dict[str, Any]]
               ) -> tuple[list[dict[str, Any]], dict[str, float]]:
    """The finished test rows (:func:`claim_tests`) the claims are decided from, and the factor per
    arm: each arm's runs at the factor its complete ``grid`` chose once all ``seeds`` are in there,
    else at factor 1 (:func:`decided_runs`; ``grid`` {}: factor 1 for all)."""
    return decided_runs(claim_tests(rows, claims, seeds), grid, seeds)


def prepare_data(arms: Iterable[str]) -> None:
    """Generate the synthetic data (and the pretrained backbones) every selected arm reads (cached on
    disk; workers then only read)."""
    from secfed.federation.builder import build
    from secfed.models import pretrain

    arms = set(arms)
    for arm in sorted(arms):
        cfg = arm_config(arm, 0, "cpu", 1)
        if cfg.model.pretrained != "synthetic":
            continue
        built = pretrain.build(pretrain.default_recipe(cfg.model.backbone, cfg.data.height, cfg.data.width))
        print(f"{arm}: pretrained backbone {built.path} ({'trained' if built.trained else 'cached'}, "
              f"{built.seconds:.0f} s)", flush=True)
    if any(a.startswith("lodo:") for a in arms):
        bench_dfh.synthetic_default()
    if any(not a.startswith("lodo:") for a in arms):
        build(bench_methods.config("fedpav+kd", 0, unseen=2, eval_every=2))  # the default's domains, unseen, public


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--only", nargs="+", choices=[c.key for c in CLAIMS], help="these claims (default: all)")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "claims")
    # Claims are decided at the default 16 rounds; fewer only to check the command end to end
    parser.add_argument("--rounds", type=int, default=16, help="rounds per run (16: the published setting)")
    parser.add_argument("--lr-grid", type=float, nargs="+", default=list(LR_GRID),
                        help="learning-rate factors each arm is tuned over (1 alone: no tuning)")
    parser.add_argument("--grid-seeds", type=int, default=1, help="tuning seeds per factor")
    parser.add_argument("--max-minutes", type=float, help="stop handing out runs after this long")
    parser.add_argument("--publish", action="store_true", help="rewrite README.md's and RESULTS.md's claims blocks")
    parser.add_argument("--report", action="store_true", help="run nothing: decide from the runs already in --out")
    parser.add_argument("--new-look", action="store_true",
                        help="decide a claim at fewer seeds than an earlier report did (another look: it widens "
                             "every later interval of that claim)")
    parser.add_argument("--at-defaults", action="store_true",
                        help="with --report: decide from the runs at factor 1, printing the grid's choice beside them")
    parser.add_argument("--spread", nargs="+", metavar="ARM@START",
                        help="run only these arms (e.g. fedpav@synthetic), --seeds seeds each at their defaults, "
                             "and print their seed-to-seed spread")
    parser.add_argument("--tune", action="store_true",
                        help="with --spread: first the --lr-grid for those arms, on their validation split and "
                             "--grid-seeds tuning seeds (the report then says whether factor 1 is each arm's choice)")
    args = parser.parse_args()
    if args.seeds < 2 or args.grid_seeds < 1 or any(x <= 0 for x in args.lr_grid):
        parser.error("--seeds ≥ 2, --grid-seeds ≥ 1, --lr-grid factors > 0")
    if args.at_defaults and not args.report:
        parser.error("--at-defaults decides from runs already made: use it with --report")
    if args.tune and not args.spread:
        parser.error("--tune tunes the --spread arms (the claims' own arms are always tuned over --lr-grid)")
    claims = [c for c in CLAIMS if not args.only or c.key in args.only]
    if args.rounds < FIG7_MIN_ROUNDS and any(c.key == "mm20-fig7" for c in claims) and not args.spread:
        parser.error(f"--rounds {args.rounds}: MM'20 Fig. 7 measures the changes between ≥ 3 evaluations "
                     f"(one every 2 rounds): give --rounds ≥ {FIG7_MIN_ROUNDS} or leave mm20-fig7 out (--only)")
    known = arms_of(CLAIMS)
    for arm in args.spread or ():
        method, start = split_arm(arm)
        if method not in known or start != "synthetic":
            parser.error(f"--spread {arm}: give ARM@synthetic with ARM one of {', '.join(known)}")
    args.out.mkdir(parents=True, exist_ok=True)
    results = args.out / "runs.jsonl"
    rows = [r for r in load(results) if r.get("rounds", 16) == args.rounds]
    if args.spread:
        measure_spread(args, rows, results)
        return
    command = "python bench/claims.py " + " ".join(sys.argv[1:])
    if args.report:
        command = recorded_command(args.out)
    else:
        print(describe(), flush=True)
        prepare_data(arms_of(claims))  # once, before the workers race for it
        started = time.monotonic()
        tuned = execute(grid_jobs(arms_of(claims), args.lr_grid, args.grid_seeds), rows, results, args, started)
        rows += tuned
    starts = [a for a in dict.fromkeys(r["arm"] for r in rows) if split_arm(a)[1]]  # --spread's arms, if any ran
    chosen = choose(rows, arms_of(claims), args.lr_grid)
    (args.out / "grid.json").write_text(json.dumps(chosen, indent=1) + "\n")
    print("learning-rate factors: " + "; ".join(f"{a} ×{g['chosen']:g}" for a, g in chosen.items()), flush=True)
    if not args.report:
        made = execute(claim_jobs(claims, args.seeds, chosen), rows, results, args, started)
        rows += made
        if tuned or made:
            note_command(args.out, command)
        print(f"the command's runs took {(time.monotonic() - started) / 60:.1f} minutes (wall)", flush=True)
    runs, factors = claim_runs(rows, claims, args.seeds, {} if args.at_defaults else chosen)
    others = [r for r in claim_tests(rows, claims, args.seeds) if job_of(r).lr_scale != factors[r["arm"]]]
    publish(runs, claims, command, args, chosen, factors, others, started_runs(rows, starts),
            choose(rows, starts, args.lr_grid))


def measure_spread(args: argparse.Namespace, rows: list[dict[str, Any]], results: Path) -> None:
    """``--spread``: (with ``--tune``, first the grid, then) the named arms' seeds as :func:`spread_jobs`
    orders them (resumable like the claims); the spread table of those arms and what the grid chose."""
    if not args.report:
        print(describe(), flush=True)
        prepare_data(args.spread)
        started = time.monotonic()
        chosen: dict[str, dict[str, Any]] = {}
        made: list[dict[str, Any]] = []
        if args.tune:
            made += execute(grid_jobs(args.spread, args.lr_grid, args.grid_seeds), rows, results, args, started)
            chosen = choose(rows + made, args.spread, args.lr_grid)
        made += execute(spread_jobs(args.spread, args.seeds, chosen), rows + made, results, args, started)
        rows = rows + made
        if made:
            note_command(args.out, "python bench/claims.py " + " ".join(sys.argv[1:]))
    print(spread(started_runs(rows, args.spread)))
    chosen = {a: g for a, g in choose(rows, args.spread, args.lr_grid).items() if g["validation_mAP"]}
    if chosen:
        print(f"learning-rate grid (validation mAP % per factor): {grid_summary(chosen)}")


def spread_jobs(arms: list[str], seeds: int, chosen: dict[str, dict[str, Any]]) -> list[Job]:
    """The ``--spread`` arms' test seeds: first, seed by seed, every arm at the factor its complete grid
    chose (1 without one) — the runs the pretrained-start claims are decided from, so a run stopped by
    ``--max-minutes`` has spent its time on them — then the factor-1 seeds of the arms whose grid chose
    another factor (the spread at the defaults)."""
    factor = {a: chosen_factor(chosen, a) for a in arms}
    jobs = [Job(a, s, factor[a]) for s in range(seeds) for a in arms]
    jobs += [Job(a, s) for s in range(seeds) for a in arms if factor[a] != 1.0]
    return jobs


def started_runs(rows: list[dict[str, Any]], arms: Iterable[str]) -> list[dict[str, Any]]:
    """The finished test runs (not the grid's) of ``arms``, at any factor."""
    wanted = set(arms)
    return [r for r in rows if r["arm"] in wanted and not job_of(r).validation]


def spread_runs(rows: list[dict[str, Any]], arms: Iterable[str]) -> list[dict[str, Any]]:
    """The finished runs of ``arms`` at their defaults (factor 1, test sets)."""
    return [r for r in started_runs(rows, arms) if job_of(r).lr_scale == 1.0]


def exit_on_sigterm() -> None:
    """SIGTERM ends this process as Ctrl-C does, through the pool's ``with`` (which terminates the
    workers): found by review, a SIGTERMed command left its workers training, reparented to init."""
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))


def to_run(jobs: list[Job], rows: list[dict[str, Any]], here: str) -> tuple[list[Job], int]:
    """The jobs ``rows`` hold no run of made on the machine ``here`` (:func:`machine_of`), and how many
    of them another machine's rows hold. Found by review: a folder holding another machine's runs
    "resumed" with nothing to do, and a second-machine check passed on the first machine's runs. A
    tuning run counts wherever it ran: the grid is chosen once, and folders that copied another
    machine's grid (their command.txt says so) keep its choice (review of the fix)."""
    done = {job_of(r) for r in rows if machine_of(r) == here or job_of(r).validation}
    elsewhere = {job_of(r) for r in rows} - done
    todo = [j for j in jobs if j not in done]
    return todo, sum(j in elsewhere for j in todo)


def execute(jobs: list[Job], rows: list[dict[str, Any]], results: Path, args: argparse.Namespace,
            started: float) -> list[dict[str, Any]]:
    """Run the jobs not yet in ``rows`` on the worker pool, appending each to ``results`` as it ends
    (until ``--max-minutes`` from ``started``); the new rows."""
    todo, elsewhere = to_run(jobs, rows, this_machine(args.device, args.threads))
    print(f"{len(jobs) - len(todo)} of {len(jobs)} runs done, {len(todo)} to go on {args.workers} worker(s) × "
          f"{args.threads} thread(s), device {args.device}"
          + (f" ({elsewhere} of them made on another machine: not reused)" if elsewhere else ""), flush=True)
    new: list[dict[str, Any]] = []
    if not todo:
        return new
    exit_on_sigterm()
    context = multiprocessing.get_context("spawn")
    with context.Pool(args.workers, maxtasksperchild=1) as pool:
        pending_runs = [pool.apply_async(run_arm, (job, args.device, args.threads, args.rounds)) for job in todo]
        for i, pending_run in enumerate(pending_runs, 1):
            remaining = None
            if args.max_minutes is not None:
                remaining = max(0.0, args.max_minutes * 60 - (time.monotonic() - started))
            try:
                row = pending_run.get(timeout=remaining)
            except multiprocessing.TimeoutError:
                print(f"stopped after {args.max_minutes} minutes; rerun to continue", flush=True)
                pool.terminate()
                break
            append(results, row)
            new.append(row)
            elapsed = time.monotonic() - started
            what = f"{row['arm']} ×{row['lr_scale']:g}{' (validation)' if row['validation'] else ''}"
            print(f"[{i}/{len(todo)}] {what} seed {row['seed']}: {row['seconds']:.0f} s "
                  f"(elapsed {elapsed / 60:.1f} min, ETA {elapsed / i * (len(todo) - i) / 60:.1f} min)", flush=True)
    return new


def publish(runs: list[dict[str, Any]], claims: list[Claim], command: str, args: argparse.Namespace,
            grid: dict[str, dict[str, Any]], factors: dict[str, float], other_factors: list[dict[str, Any]],
            spread_only: list[dict[str, Any]], started_grid: dict[str, dict[str, Any]]) -> None:
    started = started_by_start(spread_only, started_grid)[0]
    looks = record_looks(args.out / "looks.json", look_seeds(runs, claims, started), fewer=args.new_look)
    text = publication(runs, claims, command, grid, factors, spread_only, started_grid, other_factors, looks)
    (args.out / "claims.md").write_text(text + "\n")
    figure(runs, claims, args.out / "claims.png", started, looks)
    print(text)
    if args.publish:
        for path in (REPO / "README.md", REPO / "bench" / "RESULTS.md"):
            path.write_text(rewrite_between_markers(path.read_text(), text))
        block = default_results([*runs, *other_factors], command)
        if block:
            readme = REPO / "README.md"
            readme.write_text(rewrite_between_markers(readme.read_text(), block, DEFAULT_BEGIN, DEFAULT_END))


if __name__ == "__main__":
    main()
