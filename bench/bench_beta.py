"""Privacy against utility on the synthetic default.

1. The shape of Wu & Gong (AAAI 2021) Fig. 3: rank-1 against β for single (Eq. 14) and double
   (Eqs. 14 + 15) white noise, next to the untrained model (their "Random-Guess"). Saves
   ``beta.png``.
2. Client-level DP-FedAvg: (ε, δ) against rank-1 for several noise multipliers, every client's
   whole shared update clipped to C, unweighted mean, BatchNorm statistics local.

    python bench/bench_beta.py [--rounds 12] [--out bench/out]

Each point is one federated run of the default setting (4 clients, ResNet-18 from scratch at
64×32) without the local baseline; rank-1 is the mean over the four domains.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from secfed.config import RunConfig
from secfed.federation.builder import build
from secfed.federation.evaluate import evaluate_global
from secfed.federation.runtime import run

BETAS = (0.0, 1e-4, 5e-4, 1e-3, 5e-3, 1e-2)
NOISE_MULTIPLIERS = (None, 0.01, 0.1, 0.3, 1.0)  # None: clipped, no noise


def base_config(rounds: int) -> RunConfig:
    cfg = RunConfig(seed=0)
    cfg.train.rounds = rounds
    cfg.train.local_baseline = False
    cfg.train.eval_every = 0
    cfg.secagg.enabled = False  # the sums are the same (up to rounding); keep the bench about noise
    return cfg


def mean_rank1(scores: dict[str, dict[str, float]]) -> float:
    return sum(s["rank1"] for s in scores.values()) / len(scores)


def trained(cfg: RunConfig, tmp: Path, name: str) -> dict:
    start = time.perf_counter()
    result = run(cfg, tmp / name)
    final = result.summary
    row = {"rank1": sum(d["rank1"] for d in final["domains"]) / len(final["domains"]),
           "mAP": sum(d["mAP"] for d in final["domains"]) / len(final["domains"]),
           "privacy": final["privacy"], "seconds": time.perf_counter() - start}
    print(f"  {name:28s} rank-1 {100 * row['rank1']:5.1f}  mAP {100 * row['mAP']:5.1f}  ({row['seconds']:.0f} s)", flush=True)
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
    ax.set_ylabel("rank-1 (%), mean over domains")
    ax.set_title("β white noise (Wu & Gong 2021, Fig. 3 shape)")
    ax.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(out_png, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--clip", type=float, default=2.0)
    parser.add_argument("--out", type=Path, default=Path("bench/out"))
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    args.out.mkdir(parents=True, exist_ok=True)

    cfg = base_config(args.rounds)
    untrained = mean_rank1(evaluate_global(build(cfg, train_images=False)))
    print(f"untrained model: rank-1 {100 * untrained:.1f}")
    results: dict = {"untrained_rank1": untrained, "single": {}, "double": {}, "dp": []}
    with tempfile.TemporaryDirectory() as tmp_dir:
        tmp = Path(tmp_dir)
        print("β white noise:")
        for beta in BETAS:
            for mode in ("single", "double"):
                if beta == 0 and mode == "double":
                    results["double"][beta] = results["single"][beta]
                    continue
                cfg = base_config(args.rounds)
                cfg.privacy.dp_beta, cfg.privacy.dp_beta_mode = beta, mode
                results[mode][beta] = trained(cfg, tmp, f"beta-{mode}-{beta:g}")
        print(f"client-level DP-FedAvg (clip {args.clip}, unweighted, BN local):")
        for z in NOISE_MULTIPLIERS:
            cfg = base_config(args.rounds)
            cfg.train.aggregation, cfg.model.bn_stats = "unweighted", "local"
            cfg.privacy.clip, cfg.privacy.noise_multiplier = args.clip, z
            row = trained(cfg, tmp, f"dp-z{z}")
            row["noise_multiplier"] = z
            results["dp"].append(row)

    plot(results, untrained, args.out / "beta.png")
    (args.out / "beta.json").write_text(json.dumps(results, indent=2, default=str))
    print("\n| z | ε (δ) | rank-1 | mAP |\n|---|---|---|---|")
    for row in results["dp"]:
        p = row["privacy"]
        eps = f"{p['epsilon']:.3g} ({p['delta']:.1g})" if "epsilon" in p else "— (no noise: no DP)"
        z = "—" if row["noise_multiplier"] is None else f"{row['noise_multiplier']:g}"
        print(f"| {z} | {eps} | {100 * row['rank1']:.1f} | {100 * row['mAP']:.1f} |")
    print(f"\nplot: {args.out / 'beta.png'}; numbers: {args.out / 'beta.json'}")


if __name__ == "__main__":
    main()
