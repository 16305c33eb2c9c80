"""The seed papers' claims at CPU scale, and the default run's spread over seeds.

Runs on the synthetic default (4 client domains + ``--unseen`` domains no client holds), each at the
default budget (16 rounds, E = 1, B = 32, ResNet-18 from scratch at 64×32, secure aggregation on),
for ``--seeds`` run seeds, evaluating every ``--eval-every`` rounds (default 2):

    fedpav           FedPav (MM'20 Alg. 1), with its local-only baseline (the default run)
    fedpav+kd        + knowledge distillation on the synthetic public domain (Alg. 2)
    fedpav+cdw       + cosine distance weights (Alg. 3)
    fedpav+kd+cdw    both (Alg. 5)
    fedreid          FedReID (AAAI'21): mapping network + local expert, T = 3

and reports, per domain, mean and 95 % interval (Student t over seeds) of the final rank-1 and mAP,
and against each claim whether it reproduces:

    MM'20 Table 3   CDW ≥ FedPav on every domain (rank-1)
    MM'20 Fig. 7    KD lowers round-to-round volatility: std of rank-1 changes between evaluations
    AAAI'21         FedReID's expert improves unseen-domain rank-1 over FedPav

    nice -n 19 python bench/bench_methods.py [--seeds 3] [--unseen 2] [--methods ...] [--out bench/results]

Finished runs are kept in ``methods.json`` as they end; a rerun continues where it stopped.

Writes ``methods.json`` (every run's per-round scores) and ``methods.md`` (the tables) under --out.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from scipy import stats

from secfed.config import RunConfig, RunSection
from secfed.federation.runtime import run

METHODS = {
    "fedpav": {},
    "fedpav+kd": {"kd": True},
    "fedpav+cdw": {"cdw": True},
    "fedpav+kd+cdw": {"kd": True, "cdw": True},
    "fedreid": {"algorithm": "fedreid"},
    "fedreid-no-expert": {"algorithm": "fedreid", "expert": False},  # AAAI'21 Fig. 4(d)'s ablation
}


def config(method: str, seed: int, unseen: int, eval_every: int) -> RunConfig:
    cfg = RunConfig(run=RunSection(seed=seed))
    for key, value in METHODS[method].items():
        setattr(cfg.method, key, value)
    cfg.data.synth_unseen = unseen
    cfg.run.eval_every = eval_every  # volatility needs a curve; evaluation does not touch training randomness
    cfg.run.local_baseline = method == "fedpav"
    return cfg


def interval(values: list[float], confidence: float = 0.95) -> tuple[float, float]:
    """(mean, half-width of the two-sided Student-t interval at ``confidence``) of ``values``; half-width
    NaN for a single value."""
    mean = statistics.fmean(values)
    if len(values) < 2:
        return mean, math.nan
    half = stats.t.ppf(1 - (1 - confidence) / 2, len(values) - 1) * statistics.stdev(values) / math.sqrt(len(values))
    return mean, float(half)


def volatility(rank1_by_round: list[float]) -> float:
    """Std of the changes of a domain's rank-1 between evaluations (MM'20 Fig. 7's "volatility")."""
    changes = [b - a for a, b in zip(rank1_by_round, rank1_by_round[1:])]
    return statistics.pstdev(changes) if len(changes) > 1 else math.nan


def one_run(method: str, seed: int, unseen: int, eval_every: int, tmp: Path) -> dict[str, Any]:
    start = time.perf_counter()
    result = run(config(method, seed, unseen, eval_every), tmp / f"{method}-{seed}")
    history = [json.loads(line) for line in (result.run_dir / "metrics.jsonl").read_text().splitlines()]
    evaluated = [r for r in history if "eval" in r]
    curves = {name: [r["eval"][name]["rank1"] for r in evaluated] for name in evaluated[-1]["eval"]}
    out = {"method": method, "seed": seed, "eval_every": eval_every, "seconds": time.perf_counter() - start,
           "curves": curves,
           "domains": result.summary["domains"], "unseen": result.summary["unseen"]}
    print(f"  {method:14s} seed {seed}: {out['seconds']:.0f} s, mean rank-1 "
          f"{100 * statistics.fmean(d['rank1'] for d in out['domains']):.1f} (seen) "
          f"{100 * statistics.fmean(d['rank1'] for d in out['unseen']) if out['unseen'] else math.nan:.1f} (unseen)",
          flush=True)
    return out


def fmt(values: list[float]) -> str:
    mean, half = interval(values)
    return f"{100 * mean:.1f} ± {100 * half:.1f}"


def report(runs: list[dict[str, Any]], seeds: int) -> str:
    methods = [m for m in METHODS if any(r["method"] == m for r in runs)]
    by = {m: [r for r in runs if r["method"] == m] for m in methods}
    seen = [d["name"] for d in runs[0]["domains"]]
    unseen = [d["name"] for d in runs[0]["unseen"]]
    lines = [f"Mean ± 95 % interval over {seeds} seeds (Student t); rank-1 in %.", ""]

    def table(names: list[str], part: str, key: str, title: str) -> None:
        lines.append(f"**{title}**")
        lines.append("")
        lines.append("| method | " + " | ".join(names) + " |")
        lines.append("|---|" + "---|" * len(names))
        for m in methods:
            cells = [fmt([next(d for d in r[part] if d["name"] == n)[key] for r in by[m]]) for n in names]
            lines.append(f"| {m} | " + " | ".join(cells) + " |")
        if part == "domains" and "fedpav" in by and all("local_rank1" in d for d in by["fedpav"][0]["domains"]):
            local_key = "local_rank1" if key == "rank1" else "local_mAP"
            cells = [fmt([next(d for d in r["domains"] if d["name"] == n)[local_key] for r in by["fedpav"]])
                     for n in names]
            lines.append("| local-only | " + " | ".join(cells) + " |")
        lines.append("")

    table(seen, "domains", "rank1", "Seen domains, rank-1")
    table(seen, "domains", "mAP", "Seen domains, mAP")
    if unseen:
        table(unseen, "unseen", "rank1", "Unseen domains, rank-1")
        table(unseen, "unseen", "mAP", "Unseen domains, mAP")

    lines.append("**Claims**")
    lines.append("")
    if {"fedpav", "fedpav+cdw"} <= set(by):
        verdicts = []
        for n in seen:
            pav = interval([next(d for d in r["domains"] if d["name"] == n)["rank1"] for r in by["fedpav"]])[0]
            cdw = interval([next(d for d in r["domains"] if d["name"] == n)["rank1"] for r in by["fedpav+cdw"]])[0]
            verdicts.append(f"{n} {100 * (cdw - pav):+.1f}")
        holds = all(float(v.split()[-1]) >= 0 for v in verdicts)
        lines.append(f"- MM'20 Table 3, CDW ≥ FedPav on every domain (mean rank-1 difference): {', '.join(verdicts)} — "
                     f"{'reproduces' if holds else 'does not reproduce'} in the means (see the intervals above).")
    if {"fedpav", "fedpav+kd"} <= set(by):
        vol = {m: [statistics.fmean(volatility(c) for c in r["curves"].values() if c) for r in by[m]]
               for m in ("fedpav", "fedpav+kd")}
        a, b = interval(vol["fedpav"]), interval(vol["fedpav+kd"])
        lines.append(f"- MM'20 Fig. 7, KD lowers round-to-round volatility (std of rank-1 changes, mean over domains): "
                     f"FedPav {100 * a[0]:.2f} ± {100 * a[1]:.2f}, FedPav+KD {100 * b[0]:.2f} ± {100 * b[1]:.2f} — "
                     f"{'reproduces' if b[0] < a[0] else 'does not reproduce'} in the means.")
    if unseen and {"fedpav", "fedreid"} <= set(by):
        pav = [statistics.fmean(d["rank1"] for d in r["unseen"]) for r in by["fedpav"]]
        rid = [statistics.fmean(d["rank1"] for d in r["unseen"]) for r in by["fedreid"]]
        lines.append(f"- AAAI'21, FedReID improves unseen-domain rank-1 over FedPav (mean over unseen domains): "
                     f"FedPav {fmt(pav)}, FedReID {fmt(rid)} — "
                     f"{'reproduces' if statistics.fmean(rid) > statistics.fmean(pav) else 'does not reproduce'} "
                     "in the means.")
    minutes = sum(r["seconds"] for r in runs) / 60
    lines += ["", f"{len(runs)} runs, {minutes:.0f} minutes in all."]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--first-seed", type=int, default=0, help="start at this seed (split a bench over processes)")
    parser.add_argument("--unseen", type=int, default=2)
    # Every second round: evaluating six domains (and the local baselines) every round would cost
    # more than the training itself on two cores.
    parser.add_argument("--eval-every", type=int, default=2)
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))
    # One thread: on the shared 2-core machine two torch threads per run spin against each other.
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, default=Path("bench/results"))
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    args.out.mkdir(parents=True, exist_ok=True)
    results = args.out / "methods.json"
    # An interrupted bench continues where it stopped: finished runs of the same setting are kept.
    runs = [r for r in json.loads(results.read_text())
            if len(r["unseen"]) == args.unseen and r.get("eval_every") == args.eval_every] if results.exists() else []
    done = {(r["method"], r["seed"]) for r in runs}
    with tempfile.TemporaryDirectory() as tmp:
        for seed in range(args.first_seed, args.seeds):  # seeds outermost: an interrupted bench still has every method
            for method in args.methods:
                if (method, seed) not in done:
                    runs.append(one_run(method, seed, args.unseen, args.eval_every, Path(tmp)))
                    results.write_text(json.dumps(runs, indent=1))
    runs = [r for r in runs if r["method"] in args.methods and r["seed"] < args.seeds]
    text = report(runs, len({r["seed"] for r in runs}))
    (args.out / "methods.md").write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
