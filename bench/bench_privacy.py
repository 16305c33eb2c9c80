"""Privacy against utility on the synthetic default.

1. The shape of Wu & Gong (AAAI 2021) Fig. 3: rank-1 against β for single (Eq. 14) and double
   (Eqs. 14 + 15) white noise, next to the untrained model (their "Random-Guess"). Saves
   ``beta.png``.
2. Client-level DP-FedAvg: (ε, δ) against rank-1 for several noise multipliers, every client's
   whole shared update clipped to C, unweighted mean, BatchNorm statistics local — next to the
   same run without its DP preconditions, so the cost of each step shows.

    python bench/bench_privacy.py [--rounds 12] [--seeds 2] [--out bench/results]

Each point is the mean over ``--seeds`` run seeds of a federated run of the default setting
(4 clients, ResNet-18 from scratch at 64×32) without the local baseline; rank-1 and mAP are means
over the four domains. Single runs on these small query sets move by several points, hence seeds.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from secfed.config import RunConfig, RunSection
from secfed.federation.builder import build
from secfed.federation.evaluate import evaluate_global
from secfed.federation.runtime import run

BETAS = (0.0, 1e-4, 5e-4, 1e-3, 5e-3, 1e-2, 5e-2)
NOISE_MULTIPLIERS = (0.01, 0.1, 0.3, 1.0)


def base_config(rounds: int, seed: int) -> RunConfig:
    cfg = RunConfig(run=RunSection(seed=seed))
    cfg.schedule.rounds = rounds
    cfg.run.local_baseline = False
    cfg.run.eval_every = 0
    cfg.secagg.enabled = False  # the sums are the same (up to rounding); keep the bench about noise
    return cfg


def mean_rank1(scores: dict[str, dict[str, float]]) -> float:
    return sum(s["rank1"] for s in scores.values()) / len(scores)


def trained(configure: Callable[[RunConfig], None], rounds: int, seeds: int, tmp: Path, name: str) -> dict:
    """Mean rank-1/mAP over seeds of runs set up by ``configure``; privacy facts from the first."""
    start, rank1, mAP, privacy = time.perf_counter(), [], [], None
    for seed in range(seeds):
        cfg = base_config(rounds, seed)
        configure(cfg)
        summary = run(cfg, tmp / f"{name}-seed{seed}").summary
        rank1.append(sum(d["rank1"] for d in summary["domains"]) / len(summary["domains"]))
        mAP.append(sum(d["mAP"] for d in summary["domains"]) / len(summary["domains"]))
        privacy = privacy or summary["privacy"]
    row = {"rank1": sum(rank1) / seeds, "mAP": sum(mAP) / seeds, "rank1_runs": rank1, "privacy": privacy,
           "seconds": time.perf_counter() - start}
    spread = f"[{100 * min(rank1):.1f}–{100 * max(rank1):.1f}]" if seeds > 1 else ""
    print(f"  {name:28s} rank-1 {100 * row['rank1']:5.1f} {spread:13s} mAP {100 * row['mAP']:5.1f}  "
          f"({row['seconds']:.0f} s)", flush=True)
    return row


def plot(results: dict, untrained: float, out_png: Path) -> None:
    figure = Figure(figsize=(5.5, 3.6))
    FigureCanvasAgg(figure)
    ax = figure.add_subplot()
    for mode, marker in (("single", "o"), ("double", "s")):
        xs = [b for b in BETAS if b > 0]
        ax.plot(xs, [100 * results[mode][b]["rank1"] for b in xs], marker=marker, label=f"{mode} (β > 0)")
    ax.axhline(100 * results["single"][0.0]["rank1"], color="grey", linestyle="--", label="β = 0")
    ax.axhline(100 * untrained, color="black", linestyle=":", label="untrained (random guess)")
    ax.set_xscale("log")
    ax.set_xlabel("β")
    ax.set_ylabel(f"rank-1 (%), mean over domains and {results['seeds']} seeds")
    ax.set_title("β white noise (Wu & Gong 2021, Fig. 3 shape)")
    ax.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(out_png, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--seeds", type=int, default=2, help="run seeds averaged per point")
    parser.add_argument("--clip", type=float, default=2.0)
    parser.add_argument("--out", type=Path, default=Path("bench/results"))
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    args.out.mkdir(parents=True, exist_ok=True)

    untrained = mean_rank1(evaluate_global(build(base_config(args.rounds, 0), train_images=False)))
    print(f"untrained model: rank-1 {100 * untrained:.1f}")
    results: dict = {"untrained_rank1": untrained, "seeds": args.seeds, "rounds": args.rounds,
                     "single": {}, "double": {}, "dp": []}

    def beta_noise(beta: float, mode: str) -> Callable[[RunConfig], None]:
        def configure(cfg: RunConfig) -> None:
            cfg.privacy.dp_beta, cfg.privacy.dp_beta_mode = beta, mode
        return configure

    def dp(clip: float | None, z: float | None) -> Callable[[RunConfig], None]:
        def configure(cfg: RunConfig) -> None:
            cfg.method.aggregation, cfg.model.bn_stats = "unweighted", "local"
            cfg.privacy.clip, cfg.privacy.noise_multiplier = clip, z
        return configure

    with tempfile.TemporaryDirectory() as tmp_dir:
        tmp = Path(tmp_dir)
        print("β white noise:")
        for beta in BETAS:
            for mode in ("single", "double"):
                if beta == 0 and mode == "double":
                    results["double"][beta] = results["single"][beta]
                    continue
                results[mode][beta] = trained(beta_noise(beta, mode), args.rounds, args.seeds, tmp, f"beta-{mode}-{beta:g}")
        print(f"client-level DP-FedAvg (unweighted mean, BN statistics local, clip {args.clip}):")
        steps = [("FedPav default (weighted, BN shared)", None, None, lambda cfg: None),
                 ("unweighted, BN local, no clip", None, None, dp(None, None)),
                 (f"+ clip {args.clip:g}, no noise", args.clip, None, dp(args.clip, None))]
        steps += [(f"+ noise z = {z:g}", args.clip, z, dp(args.clip, z)) for z in NOISE_MULTIPLIERS]
        for label, clip, z, configure in steps:
            row = trained(configure, args.rounds, args.seeds, tmp, label)
            row.update(label=label, clip=clip, noise_multiplier=z)
            results["dp"].append(row)

    plot(results, untrained, args.out / "beta.png")
    (args.out / "beta.json").write_text(json.dumps(results, indent=2, default=str))
    print("\n| setting | ε (δ) | rank-1 | mAP |\n|---|---|---|---|")
    for row in results["dp"]:
        p = row["privacy"]
        eps = f"{p['epsilon']:.3g} ({p['delta']:.1g})" if "epsilon" in p else "— (no DP)"
        print(f"| {row['label']} | {eps} | {100 * row['rank1']:.1f} | {100 * row['mAP']:.1f} |")
    print(f"\nplot: {args.out / 'beta.png'}; numbers: {args.out / 'beta.json'}")


if __name__ == "__main__":
    main()
