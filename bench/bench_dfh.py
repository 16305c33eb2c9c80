"""DFH's claim at CPU scale: leave-one-domain-out on the synthetic default (the FedDG protocol of
Yang et al.'s Table 1), FedPav against DFH and the Table 2 ablations.

    python bench/bench_dfh.py [--seeds 0 1 2] [--targets campus plaza corridor gate]
                              [--methods fedpav dfh dfh-no-dh dfh-no-fh] [--rounds 16]
                              [--results bench/results/dfh_runs.jsonl] [--report]

For every (seed, held-out target, method): the default setting (the four synthetic domains of
`secfed train`, written once to the cache and read as `--data-root`; ResNet-18 from scratch at
64×32, B = 32, E = 1, all clients every round) trained on the other three domains with
``--leave-out TARGET``, no local baseline, plain channel (secure aggregation gives the same sums up
to its rounding and is not what is measured), scored on the held-out target only. DFH runs with the
paper's λ = 5 and margin m = 0.5 (§4.1), P = 8 identities × K = 4 images, α = 1; nothing was tuned.

    fedpav      FedPav (cross-entropy, shuffled batches)
    dfh         DFH: Eq. 3.6 (FH onto every other client + DH's novel domain)
    dfh-no-dh   DFH without domain hallucinating (Table 2 row 2: FH only)
    dfh-no-fh   DFH without feature hallucinating onto the other clients (the DH term alone)
    dfh-l0      DFH with λ = 0: L_ori alone (CE + triplet on real pool-5 features, P×K batches), the
                control that separates hallucinating from DFH's triplet, sampler and retrieval feature

Each run's unseen-domain scores go to ``--results`` (JSON lines) as it finishes, so an interrupted
bench continues where it stopped. Scores are given for each method's own retrieval feature (FedPav:
the neck, DFH: pool-5 as the paper) and, for every method, for both features, so the choice of
feature is not mistaken for the method's effect. The report: per target, mean and 95 % t-interval
over seeds; overall, each DFH variant − FedPav and − the λ = 0 control, paired by (target, seed),
with the 95 % t-interval of the paired differences.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch
from bench_methods import interval
from torch import nn

from secfed.config import RunConfig, RunSection
from secfed.data.synth import cached
from secfed.evaluation.features import evaluate_model
from secfed.federation.builder import SYNTH_IMAGE_SIZE, cache_dir
from secfed.federation.evaluate import global_model
from secfed.federation.runtime import run

TARGETS = ("campus", "plaza", "corridor", "gate")
METHODS = {
    "fedpav": {"algorithm": "fedpav"},
    "dfh": {"algorithm": "dfh", "dfh_hallucinate": "both"},
    "dfh-no-dh": {"algorithm": "dfh", "dfh_hallucinate": "features"},
    "dfh-no-fh": {"algorithm": "dfh", "dfh_hallucinate": "domains"},
    "dfh-l0": {"algorithm": "dfh", "dfh_lambda": 0.0},
}
PAPER = {"dfh_lambda": 5.0, "triplet_margin": 0.5}  # §4.1
DEFAULT_RESULTS = Path(__file__).resolve().parent / "results" / "dfh_runs.jsonl"


def synthetic_default() -> Path:
    """The four synthetic domains of the default, on disk (read as `data.root`, so any of them can be
    left out by name)."""
    root, _ = cached(cache_dir(), domains=4, seed=0, scale=1.0, height=SYNTH_IMAGE_SIZE[0], width=SYNTH_IMAGE_SIZE[1])
    return root


def config(method: str, target: str, seed: int, rounds: int) -> RunConfig:
    cfg = RunConfig(run=RunSection(seed=seed))
    cfg.data.root = str(synthetic_default())
    cfg.schedule.rounds = rounds
    cfg.data.leave_out = [target]
    cfg.run.local_baseline = False
    cfg.run.eval_every = 0
    cfg.secagg.enabled = False
    settings = {**PAPER, **METHODS[method]} if METHODS[method]["algorithm"] == "dfh" else METHODS[method]
    for key, value in settings.items():
        setattr(cfg.method, key, value)
    return cfg


class Retrieval(nn.Module):
    """A trained ReID model scored on its pool-5 feature or on its neck's output."""

    def __init__(self, model: nn.Module, feature: str) -> None:
        super().__init__()
        self.model, self.feature = model, feature

    def embed(self, images: torch.Tensor) -> torch.Tensor:
        pool5 = self.model.backbone(images)
        return pool5 if self.feature == "pool5" else self.model.neck(pool5)


def one_run(method: str, target: str, seed: int, rounds: int, tmp: Path, cfg: RunConfig | None = None) -> dict:
    """One leave-one-domain-out run and its scores; ``cfg``: this run's configuration when the caller
    adjusted :func:`config`'s (claims.py: device, learning rates)."""
    cpu, wall = time.process_time(), time.perf_counter()
    result = run(cfg or config(method, target, seed, rounds), tmp / f"{method}-{target}-{seed}")
    fed, summary = result.federation, result.summary
    [unseen] = [d for d in fed.domains if d.unseen]
    [own] = summary["unseen"]
    by_feature = {}
    with torch.no_grad():
        model = global_model(fed, 0)
        for feature in ("pool5", "neck"):
            scores = evaluate_model(Retrieval(model, feature), unseen.query, unseen.gallery, unseen.query_pids,
                                    unseen.query_camids, unseen.gallery_pids, unseen.gallery_camids)
            by_feature[feature] = {"mAP": float(scores.mAP), "rank1": float(scores.rank1)}
    losses = [json.loads(line).get("loss") for line in (result.run_dir / "metrics.jsonl").read_text().splitlines()]
    return {"method": method, "target": target, "seed": seed, "rounds": rounds,
            "unseen": {"mAP": own["mAP"], "rank1": own["rank1"]}, **by_feature,
            "seen_mAP": statistics.mean(d["mAP"] for d in summary["domains"]), "inputs": run_inputs(fed.data_info),
            "loss_per_round": losses,
            "cpu_seconds": time.process_time() - cpu, "wall_seconds": time.perf_counter() - wall}


def run_inputs(data_info: dict) -> dict:
    """What a run started from (its data.json, which the caller's temporary run folder discards): the
    data's content fingerprint and the initial backbone's SHA-256 (None from scratch), so that two
    machines' runs can be told to have read the same bytes."""
    return {"data_fingerprint": data_info["fingerprint"],
            "backbone_sha256": data_info["pretrained"].get("backbone_sha256")}


def cell(values: list[float]) -> str:
    mean, half = interval([100 * v for v in values])
    return f"{mean:5.1f} ± {half:4.1f}" if half == half else f"{mean:5.1f}"


def report(rows: list[dict], methods: list[str], targets: list[str]) -> str:
    lines = []
    for score_key, title in (("unseen", "each method's own retrieval feature (FedPav: neck, DFH: pool-5)"),
                             ("pool5", "pool-5 feature for every method"), ("neck", "neck feature for every method")):
        lines += [f"### Unseen-target mAP / rank-1 (%), {title}", "",
                  "| target | " + " | ".join(f"{m} mAP | {m} R-1" for m in methods) + " |",
                  "|---|" + "---|" * (2 * len(methods))]
        for target in [*targets, "mean"]:
            cells = []
            for m in methods:
                picked = [r for r in rows if r["method"] == m and (target == "mean" or r["target"] == target)]
                if target == "mean":  # mean over targets per seed, then the interval over seeds
                    seeds = sorted({r["seed"] for r in picked})
                    per_seed = [[r for r in picked if r["seed"] == s] for s in seeds]
                    full = [p for p in per_seed if len(p) == len(targets)]
                    picked = [{score_key: {k: statistics.mean(r[score_key][k] for r in p) for k in ("mAP", "rank1")}}
                              for p in full]
                cells += [cell([r[score_key]["mAP"] for r in picked]) if picked else "–",
                          cell([r[score_key]["rank1"] for r in picked]) if picked else "–"]
            lines.append(f"| {target} | " + " | ".join(cells) + " |")
        lines.append("")
    key = {(r["method"], r["target"], r["seed"]): r for r in rows}
    for base in ("fedpav", "dfh-l0"):
        for m in methods:
            if m == base or m == "fedpav" or (base == "dfh-l0" and m == "dfh-l0"):
                continue
            pairs = [(key[(m, t, s)]["unseen"]["mAP"], key[(base, t, s)]["unseen"]["mAP"])
                     for (mm, t, s) in key if mm == m and (base, t, s) in key]
            if not pairs:
                continue
            diffs = [100 * (a - b) for a, b in pairs]
            mean, half = interval(diffs)
            lines.append(f"{m} − {base}, unseen mAP: {mean:+.1f} ± {half:.1f} points (95 % t-interval over "
                         f"{len(diffs)} (target, seed) pairs; {m} higher in {sum(d > 0 for d in diffs)})")
    cpu = sum(r["cpu_seconds"] for r in rows)
    lines.append(f"\n{len(rows)} runs, {cpu / 60:.1f} CPU-minutes in all")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--targets", nargs="+", default=list(TARGETS), choices=TARGETS)
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))
    parser.add_argument("--rounds", type=int, default=16)
    parser.add_argument("--results", type=Path, default=DEFAULT_RESULTS)
    # One thread: on a shared 2-core machine two torch threads per run spin against each other and the
    # neighbours' load (measured: 16 rounds of FedPav took 489 CPU-s with 2 threads, ≈ 95 with 1).
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--report", action="store_true", help="only print the report of the results file")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    rows = [json.loads(line) for line in args.results.read_text().splitlines()] if args.results.exists() else []
    rows = [r for r in rows if r["rounds"] == args.rounds]
    if not args.report:
        done = {(r["method"], r["target"], r["seed"]) for r in rows}
        args.results.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory() as tmp:
            for seed in args.seeds:
                for target in args.targets:
                    for method in args.methods:
                        if (method, target, seed) in done:
                            continue
                        row = one_run(method, target, seed, args.rounds, Path(tmp))
                        rows.append(row)
                        with open(args.results, "a") as fh:
                            fh.write(json.dumps(row) + "\n")
                        print(f"seed {seed} {target:9s} {method:10s} unseen mAP {100 * row['unseen']['mAP']:5.1f} "
                              f"R-1 {100 * row['unseen']['rank1']:5.1f} (pool-5 {100 * row['pool5']['mAP']:5.1f}, "
                              f"neck {100 * row['neck']['mAP']:5.1f}) max loss {max(row['loss_per_round']):.3g}  "
                              f"{row['cpu_seconds']:.0f} CPU-s", flush=True)
    wanted = [r for r in rows if r["method"] in args.methods and r["target"] in args.targets and r["seed"] in args.seeds]
    print(report(wanted, args.methods, args.targets))


if __name__ == "__main__":
    main()
