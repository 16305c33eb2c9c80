"""Calibration of `secfed audit` at the default model and size (ResNet-18, 64×32, the synthetic default).

    python bench/bench_audit.py --data-root DIR [--run RUN] [--sections ...] [--seconds S] [--out bench/results]

Sections (each prints its table; everything lands in OUT/audit.json, the figure in OUT/audit_leakage.png):

    positive    (a) one local step on two images of two people, no secure aggregation: the neck probe's
                exactness, and what every attack of `--target update` says, for several pairs of people,
                from the untrained model and (with --run) from a trained run's global model; gradient
                inversion at 64×32 and 32×16 for two iteration budgets (the smallest settings that leak)
    probes      the Linear-with-bias probe: FedPav's neck (BatchNorm after it: the bias gradient
                vanishes, the BN-aware probe is exact at B = 2) and FedAvg's shared classifier
    dfs         (b) DFS of a client with 1, 2, 5, 20 identities: membership AUC, TPR at 1 % FPR, linkage
    negative    steps whose victims are not in the batch: noise images (untrained model) and, with --run,
                photographs (trained model) — never LEAK; and a step on noise images judged against them
                (the feature-level criterion on an exact recovery of no one's picture); the secure sum of the
                default run is `secfed audit RUN --target sum` (bench/RESULTS.md quotes it)
    leakage     leakage against batch size, cohort size, β and client-level DP z, plotted

``--data-root``: the synthetic default on disk (``secfed data synth DIR``; the run directory's
config.json names the data of a run). ``--run``: a run of the default setting, whose global model
is the trained start point (the "late round" an audit of a finished run re-derives).
"""

from __future__ import annotations

import argparse
import json
import math
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import torch
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from secfed.algorithms import base_method
from secfed.attacks.budget import BUDGETS, Budget, Stopwatch
from secfed.attacks.controls import client_update, gallery_of, noise_images
from secfed.attacks.dfs import DomainStatistics, identity_statistics, pool5_features
from secfed.attacks.inversion import SimulatedClient
from secfed.attacks.judge import Judge
from secfed.attacks.probes import bias_ratio_probe, neck_probe
from secfed.attacks.targets import attack_dfs, attack_update
from secfed.attacks.verdict import Verdict, target_verdict
from secfed.config import RunConfig
from secfed.data.images import load_images
from secfed.data.registry import load_dataset
from secfed.federation import checkpoint as ckpt
from secfed.models.sharing import load_shared
from secfed.privacy.clipping import clip_l2

DOMAINS = ("campus", "plaza", "corridor", "gate")


# ---- data and models ---------------------------------------------------------------------------------


class People:
    """Every training person of the default domains (≥ 3 images) and the distractors (test people)."""

    def __init__(self, root: Path, height: int, width: int) -> None:
        self.by_domain: dict[str, list[tuple[str, torch.Tensor]]] = {}
        self.tests: dict[str, list[tuple[str, torch.Tensor]]] = {}
        for name in DOMAINS:
            ds = load_dataset(root / name, "market1501", name=name)
            train: dict[int, list] = defaultdict(list)
            for s in ds.train:
                train[s.pid].append(s)
            self.by_domain[name] = [(f"{name}/{pid}", load_images(ss, height, width))
                                    for pid, ss in sorted(train.items())]
            test: dict[int, list] = defaultdict(list)
            for s in ds.query + ds.gallery:
                if s.pid > 0:
                    test[s.pid].append(s)
            self.tests[name] = [(f"{name}:test/{pid}", load_images(ss, height, width)) for pid, ss in sorted(test.items())]

    def scene(self, picks: dict[str, list[int]]) -> tuple[Any, list[int], torch.Tensor, list[int]]:
        """Victims: the first image of each picked person (per domain); gallery: those, the rest of
        their domains' training images, and those domains' test people as distractors (same cameras).
        Returns (gallery, victim indices, victim images, victims per domain)."""
        groups, own, victims_at = [], [], []
        for domain, people in picks.items():
            persons = self.by_domain[domain]
            for p in people:
                groups.append((persons[p][0], persons[p][1][:1]))
                own.append(True)
                victims_at.append(len(groups) - 1)
            for p, (name, imgs) in enumerate(persons):
                rest = imgs[1:] if p in people else imgs
                if len(rest):
                    groups.append((name, rest))
                    own.append(True)
        distractors = [g for d in picks for g in self.tests[d]]
        groups += distractors
        own += [False] * len(distractors)
        gallery, where = gallery_of(groups, own=own)
        victims = [where[g][0] for g in victims_at]
        return gallery, victims, gallery.images[victims], [len(p) for p in picks.values()]

    def people_with(self, domain: str, images: int) -> list[int]:
        return [i for i, (_, imgs) in enumerate(self.by_domain[domain]) if len(imgs) >= images]


def model_for(cfg: RunConfig, run: Path | None) -> torch.nn.Module:
    method = base_method(cfg)
    torch.manual_seed(0)
    model = method.build_model(2)
    if run is not None:
        state = ckpt.load_checkpoint(ckpt.latest_checkpoint(run))
        load_shared(model, method.layout(model), state["global"])
    return model.eval()


def config(height: int = 64, width: int = 32, algorithm: str = "fedpav", round_index: int = 0) -> RunConfig:
    cfg = RunConfig()
    cfg.data.height, cfg.data.width = height, width
    cfg.method.algorithm = algorithm
    return cfg


def summarise(results: list) -> dict[str, Any]:
    """The target verdict, and per attack: verdict, residual, iterations, best p-value, PSNR/SSIM."""
    verdict, reason = target_verdict(results)
    out: dict[str, Any] = {"verdict": str(verdict), "reason": reason, "attacks": {}}
    for r in results:
        p = min((t.p_value for t in r.tests.values() if t.measurable and not t.threshold), default=1.0)
        out["attacks"][r.attack] = {"verdict": str(r.verdict), "residual": r.residual, "iterations": r.iterations,
                                    "restarts": r.restarts, "cpu_seconds": round(r.cpu_seconds, 1), "p": p,
                                    "psnr": r.metrics.get("psnr_mean"), "ssim": r.metrics.get("ssim_mean")}
    out["p"] = min([a["p"] for a in out["attacks"].values()] + [1.0])
    return out


def audit_update(model: torch.nn.Module, cfg: RunConfig, gallery: Any, victims: list[int], images: torch.Tensor,
                 labels: torch.Tensor, budget: Budget, seconds: float, *, batch: int | None = None,
                 observed_transform=None) -> tuple[dict[str, Any], Any]:
    ctl = client_update(cfg, model, images, labels, seed=1, batch_size=batch)
    observed = ctl.update if observed_transform is None else observed_transform(ctl.update)
    results, _ = attack_update(model=ctl.model, layout=ctl.layout, start=ctl.start, observed=observed,
                               clients=[SimulatedClient(ctl.steps)], judge=Judge(ctl.model, gallery), victims=victims,
                               budget=budget, watch=Stopwatch(seconds))
    return summarise(results), ctl


# ---- sections ----------------------------------------------------------------------------------------


def section_positive(people: People, run: Path | None, pairs: int, seconds: float) -> dict[str, Any]:
    out: dict[str, Any] = {}
    starts = [("untrained", None)] + ([("trained", run)] if run is not None else [])
    candidates = people.people_with("campus", 4)
    for name, source in starts:
        cfg = config()
        model = model_for(cfg, source)
        rows = []
        for pair in range(pairs):
            picks = {"campus": candidates[2 * pair: 2 * pair + 2]}
            gallery, victims, images, _ = people.scene(picks)
            summary, ctl = audit_update(model, cfg, gallery, victims, images, torch.tensor([0, 1]), BUDGETS["standard"],
                                        seconds)
            start, delta = ctl.layout.unflatten(ctl.start), ctl.layout.unflatten(ctl.update)
            probe = neck_probe(ctl.model, ctl.layout, "neck.0", "neck.1", start, delta, ctl.steps)
            truth = ctl.neck_inputs
            error = min((probe.inputs - truth).norm(), (probe.inputs.flip(0) - truth).norm()) / truth.norm()
            summary["probe_relative_error"] = float(error)
            rows.append(summary)
            print(f"positive {name} pair {pair}: {summary['verdict']:<25} probe error {float(error):.1e} "
                  + " ".join(f"{a}={v['verdict']}(res {v['residual']:.3g}, p {v['p']:.2g})"
                             for a, v in summary["attacks"].items()), flush=True)
        leaks = sum(r["verdict"] == "LEAK" for r in rows)
        print(f"positive {name}: LEAK in {leaks}/{len(rows)} pairs; NO-LEAK in "
              f"{sum(r['verdict'] == str(Verdict.NO_LEAK) for r in rows)}", flush=True)
        out[name] = rows
    # the smallest settings where gradient inversion itself re-identifies: resolution × iterations
    sweep = []
    for (h, w) in ((32, 16), (64, 32)):
        small = People.__new__(People)
        small.by_domain = {d: [(n, torch.nn.functional.interpolate(i.float(), size=(h, w), mode="area").round().to(
            torch.uint8)) for n, i in v] for d, v in people.by_domain.items()}
        small.tests = {d: [(n, torch.nn.functional.interpolate(i.float(), size=(h, w), mode="area").round().to(
            torch.uint8)) for n, i in v] for d, v in people.tests.items()}
        cfg = config(h, w)
        model = model_for(cfg, run)
        gallery, victims, images, _ = small.scene({"campus": candidates[:2]})
        for iterations in (100, 400):
            budget = Budget("sweep", seconds, inversion_iterations=iterations, restarts=1, max_dummies=8,
                            feature_iterations=iterations, model_inversion_iterations=1, model_inversion_images=1,
                            lower_bound=False)
            summary, _ = audit_update(model, cfg, gallery, victims, images, torch.tensor([0, 1]), budget, 10 * seconds)
            gi = summary["attacks"]["inversion:gradient"]
            # the budget's iterations apart from the attack's own count (review: `**gi` overwrote them)
            sweep.append({"resolution": f"{h}x{w}", **gi, "budget_iterations": iterations})
            print(f"inversion {h}x{w} {iterations} it: {gi['verdict']} residual {gi['residual']:.3g} p {gi['p']:.2g} "
                  f"PSNR {gi['psnr']:.1f} SSIM {gi['ssim']:.3f} ({gi['cpu_seconds']} s CPU)", flush=True)
    out["inversion_sweep"] = sweep
    return out


def section_probes(people: People, run: Path | None) -> dict[str, Any]:
    out: dict[str, Any] = {}
    candidates = people.people_with("campus", 4)
    for batch in (2, 4, 8, 32):
        cfg = config()
        model = model_for(cfg, run)
        picks = candidates[:batch] if batch <= len(candidates) else candidates
        images = torch.cat([people.by_domain["campus"][p][1][:1] for p in picks])
        labels = torch.arange(len(picks))
        ctl = client_update(cfg, model, images, labels, seed=1, batch_size=batch)
        start, delta = ctl.layout.unflatten(ctl.start), ctl.layout.unflatten(ctl.update)
        probe = neck_probe(ctl.model, ctl.layout, "neck.0", "neck.1", start, delta, ctl.steps)
        grads = ctl.steps.gradient_of_one_step({k: delta[k] for k in ("neck.0.weight", "neck.0.bias")}, start)
        bias_ratio = float(grads["neck.0.bias"].norm() / grads["neck.0.weight"].norm())
        mean_error = float((probe.batch_mean - ctl.neck_inputs.mean(0)).norm() / ctl.neck_inputs.mean(0).norm())
        row = {"batch": batch, "bias_over_weight_gradient": bias_ratio, "probe_residual": probe.residual,
               "rank_estimate": probe.batch_estimate, "batch_mean_relative_error": mean_error}
        if batch == 2:
            row["inputs_relative_error"] = float(min((probe.inputs - ctl.neck_inputs).norm(),
                                                     (probe.inputs.flip(0) - ctl.neck_inputs).norm())
                                                 / ctl.neck_inputs.norm())
        out[f"fedpav_B{batch}"] = row
        print(f"probe fedpav B={batch}: ‖∇b‖/‖∇W‖ {bias_ratio:.1e}, residual {probe.residual:.3g}, "
              f"batch mean error {mean_error:.1e}, inputs error {row.get('inputs_relative_error', float('nan')):.1e}",
              flush=True)
    # FedAvg: the classifier is shared, over every identity of the federation
    cfg = config(algorithm="fedavg")
    method = base_method(cfg)
    torch.manual_seed(0)
    classes = sum(len(v) for v in people.by_domain.values())
    model = method.build_model(classes)
    for batch in (2, 8):
        images = torch.cat([people.by_domain["campus"][p][1][:1] for p in candidates[:batch]])
        labels = torch.tensor(candidates[:batch])
        seen: list[torch.Tensor] = []
        hook = model.classifier.register_forward_pre_hook(lambda m, a: seen.append(a[0].detach().clone()))
        ctl = client_update(cfg, model, images, labels, seed=1, batch_size=batch)
        hook.remove()
        start, delta = ctl.layout.unflatten(ctl.start), ctl.layout.unflatten(ctl.update)
        grads = ctl.steps.gradient_of_one_step({k: delta[k] for k in ("classifier.weight", "classifier.bias")}, start)
        probe = bias_ratio_probe("classifier", grads["classifier.weight"], grads["classifier.bias"], space="embedding")
        # the site's copy trained: its classifier inputs are captured in client_update's copy, so compare
        # each recovered input with the nearest true one among the batch's features
        truth = seen[0] if seen else None
        errors = []
        if truth is not None and probe.inputs is not None:
            for x in probe.inputs[: len(truth)]:
                errors.append(float(((truth - x).norm(dim=1) / truth.norm(dim=1)).min()))
        out[f"fedavg_B{batch}"] = {"batch": batch, "inputs": None if probe.inputs is None else len(probe.inputs),
                                   "residual": probe.residual, "relative_errors": errors}
        print(f"probe fedavg classifier B={batch}: {probe.reason}; residual {probe.residual}; per-input relative "
              f"errors {[round(e, 4) for e in errors]}", flush=True)
    return out


def section_dfs(people: People, run: Path | None, seconds: float) -> dict[str, Any]:
    cfg = config()
    model = model_for(cfg, run)
    # candidates from the client's own cameras: its people, the domain's other people, its test people
    groups = people.by_domain["campus"] + people.tests["campus"]
    out = {}
    for count in (1, 2, 5, 20):
        own = [False] * len(groups)
        chosen = people.people_with("campus", 3)[:count]
        for i in chosen:
            own[i] = True
        gallery, where = gallery_of(groups, own=own)
        judge = Judge(model, gallery)
        images = [i for g in chosen for i in where[g]]
        features = pool5_features(model, gallery.images[images])
        _, means, variances, _ = identity_statistics(features, [gallery.identities[i] for i in images])
        dfs = DomainStatistics.from_identities(means, variances).as_tensor()
        results, _ = attack_dfs(model=model, dfs=dfs, judge=judge, client_images=images, budget=BUDGETS["standard"],
                                watch=Stopwatch(seconds))
        m = next(r for r in results if r.attack == "membership:dfs")
        inv = next(r for r in results if r.attack == "inversion:dfs")
        out[count] = {"verdict": str(m.verdict), "auc": m.metrics["auc"], "tpr_at_1pct_fpr": m.metrics["tpr_at_1pct_fpr"],
                      "p": m.tests["membership"].p_value, "linkage_p": m.tests["linkage"].p_value,
                      "residual": m.residual, "candidates": m.metrics["candidates"],
                      "linked_members": len(m.metrics["linked_members"]), "inversion_verdict": str(inv.verdict),
                      "inversion_residual": inv.residual}
        print(f"dfs {count} identities: {m.verdict} AUC {m.metrics['auc']:.3f} TPR@1%FPR "
              f"{m.metrics['tpr_at_1pct_fpr']:.2f} p {m.tests['membership'].p_value:.2g} linkage p "
              f"{m.tests['linkage'].p_value:.2g} residual {m.residual:.2g} ({m.metrics['candidates']} candidates); "
              f"inversion of μ̂: {inv.verdict} (residual {inv.residual:.3g})", flush=True)
    return out


def section_negative(people: People, run: Path | None, seconds: float) -> dict[str, Any]:
    """Steps whose victims are NOT in the batch (noise images under the untrained model; photographs
    under the trained one): the attacks recover the batch, not the victims, so nothing may say LEAK.
    And a step on noise images judged against those very images: what the feature-level criterion
    says of an exact recovery of a picture of no one (it is that picture's feature, so LEAK)."""
    cfg = config()
    noise = noise_images(24, 64, 32, seed=5)
    # six "people" of four noise images each; the batch is one image of each of the first two
    groups = [("noise/0", noise[:1]), ("noise/1", noise[4:5]), ("noise/0", noise[1:4]), ("noise/1", noise[5:8])]
    groups += [(f"noise/{k}", noise[4 * k: 4 * k + 4]) for k in range(2, 6)]
    gallery, where = gallery_of(groups, own=[True] * len(groups))
    batch, labels = torch.cat([noise[:1], noise[4:5]]), torch.tensor([0, 1])
    untrained = model_for(cfg, None)
    cases = [("noise_absent", untrained, gallery, where[4][:1] + where[5][:1], batch),  # noise/2, noise/3
             ("noise_own", untrained, gallery, where[0] + where[1], batch)]
    if run is not None:
        scene, victims, images, _ = people.scene({"campus": people.people_with("campus", 4)[:4]})
        cases.insert(1, ("photographs_absent", model_for(cfg, run), scene, victims[:2], images[2:]))
    out = {}
    for name, model, judged, victims, step in cases:
        summary, _ = audit_update(model, cfg, judged, victims, step, labels, BUDGETS["standard"], seconds)
        print(f"negative {name}: {summary['verdict']} "
              + " ".join(f"{a}={v['verdict']}(res {v['residual']:.3g}, p {v['p']:.2g})"
                         for a, v in summary["attacks"].items()), flush=True)
        out[name] = summary
    return out


def section_leakage(people: People, run: Path | None, seconds: float) -> dict[str, Any]:
    """Leakage (the smallest re-identification p-value of the update's attacks) against four settings."""
    cfg = config()
    model = model_for(cfg, run)
    budget = BUDGETS["quick"]
    candidates = people.people_with("campus", 4)
    out: dict[str, list[dict[str, Any]]] = {"batch": [], "cohort": [], "beta": [], "dp_z": []}

    def record(kind: str, value: float, summary: dict[str, Any]) -> None:
        out[kind].append({"value": value, "p": summary["p"], "verdict": summary["verdict"],
                          "attacks": summary["attacks"]})
        print(f"leakage {kind}={value:g}: {summary['verdict']} p {summary['p']:.2g}", flush=True)

    for batch in (2, 4, 8, 16, 32):
        picks = candidates[:batch]
        gallery, victims, images, _ = people.scene({"campus": picks})
        record("batch", batch, audit_update(model, cfg, gallery, victims, images, torch.arange(len(picks)), budget,
                                            seconds, batch=batch)[0])
    pair = candidates[:2]
    for cohort in (1, 2, 4):
        picks = {d: people.people_with(d, 4)[:2] for d in DOMAINS[:cohort]}
        gallery, victims, _, _ = people.scene(picks)
        controls = [client_update(cfg, model, torch.cat([people.by_domain[d][p][1][:1] for p in ps]),
                                  torch.tensor([0, 1]), seed=1) for d, ps in picks.items()]
        mean = sum(c.update for c in controls) / len(controls)  # equal sizes: the weighted mean is the mean
        ctl = controls[0]
        results, _ = attack_update(model=ctl.model, layout=ctl.layout, start=ctl.start, observed=mean,
                                   clients=[SimulatedClient(c.steps) for c in controls],
                                   judge=Judge(ctl.model, gallery), victims=victims, budget=budget,
                                   watch=Stopwatch(seconds), target="sum")
        record("cohort", cohort, summarise(results))
    gallery, victims, images, _ = people.scene({"campus": pair})
    trainable = None
    for beta in (0.0, 1e-4, 1e-3, 1e-2):
        # a peer of a 2-client cohort: the global change minus its own update = the victim's update/2
        # plus the aggregate's β noise on trainable weights (the server itself sees no β noise)
        def peer_view(update: torch.Tensor, beta: float = beta) -> torch.Tensor:
            nonlocal trainable
            if trainable is None:
                trainable = base_method(cfg).layout(model).trainable_mask()
            noise = torch.randn(update.shape, generator=torch.Generator().manual_seed(7)) * beta * trainable
            return update / 2 + noise
        record("beta", beta, audit_update(model, cfg, gallery, victims, images, torch.tensor([0, 1]), budget,
                                          seconds, observed_transform=peer_view)[0])
    clip = 2.0
    for z in (0.0, 0.01, 0.1, 1.0):
        # distributed DP: the client clips its update to C and adds its share of N(0, (zC)²), K = 4
        def dp_view(update: torch.Tensor, z: float = z) -> torch.Tensor:
            clipped, _ = clip_l2(update, clip)
            return clipped + torch.randn(update.shape, generator=torch.Generator().manual_seed(9)) * z * clip / 2
        record("dp_z", z, audit_update(model, cfg, gallery, victims, images, torch.tensor([0, 1]), budget, seconds,
                                       observed_transform=dp_view)[0])
    return out


def plot(leakage: dict[str, list[dict[str, Any]]], path: Path) -> None:
    fig = Figure(figsize=(11, 3.2))
    FigureCanvasAgg(fig)
    titles = {"batch": "batch size B (one step)", "cohort": "cohort size K (sum of B = 2 steps)",
              "beta": "β (a peer of a 2-client cohort)", "dp_z": "DP z (C = 2, noise share, K = 4)"}
    for i, (kind, rows) in enumerate(leakage.items()):
        ax = fig.add_subplot(1, 4, i + 1)
        xs = list(range(len(rows)))
        ys = [-math.log10(max(r["p"], 1e-12)) for r in rows]
        ax.plot(xs, ys, "o-")
        ax.axhline(2.0, color="red", lw=0.8, ls="--")
        ax.set_xticks(xs, [f"{r['value']:g}" for r in rows])
        ax.set_title(titles[kind], fontsize=9)
        ax.set_ylabel("re-identification −log10 p" if i == 0 else "")
        ax.set_ylim(0, max(4.0, max(ys) + 0.5))
    fig.suptitle("secfed audit: leakage of one client's update (dashed: LEAK at p < 0.01)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-root", type=Path, required=True)
    parser.add_argument("--run", type=Path, help="a run of the default setting (trained start point)")
    parser.add_argument("--sections", nargs="+", default=["positive", "probes", "dfs", "negative", "leakage"])
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=40.0, help="wall-clock per attacked update")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    t0, cpu0 = time.perf_counter(), time.process_time()
    people = People(args.data_root, 64, 32)
    results: dict[str, Any] = {"date": time.strftime("%Y-%m-%d"), "run": str(args.run) if args.run else None,
                               "seconds_per_update": args.seconds}
    if "positive" in args.sections:
        results["positive"] = section_positive(people, args.run, args.pairs, args.seconds)
    if "probes" in args.sections:
        results["probes"] = section_probes(people, args.run)
    if "dfs" in args.sections:
        results["dfs"] = section_dfs(people, args.run, args.seconds)
    if "negative" in args.sections:
        results["negative"] = section_negative(people, args.run, args.seconds)
    if "leakage" in args.sections:
        results["leakage"] = section_leakage(people, args.run, args.seconds)
        args.out.mkdir(parents=True, exist_ok=True)
        plot(results["leakage"], args.out / "audit_leakage.png")
    results["wall_seconds"], results["cpu_seconds"] = time.perf_counter() - t0, time.process_time() - cpu0
    args.out.mkdir(parents=True, exist_ok=True)
    name = "audit_" + "_".join(args.sections) + ".json"
    (args.out / name).write_text(json.dumps(results, indent=2, default=str))
    print(f"done in {results['wall_seconds']:.0f} s wall, {results['cpu_seconds']:.0f} s CPU → {args.out / name}")


if __name__ == "__main__":
    main()
