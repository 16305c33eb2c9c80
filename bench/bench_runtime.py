"""The round loop's overhead against a plain PyTorch loop doing the same local steps.

Both sides train the same clients (the synthetic default: 4 domains, ResNet-18 at 64×32) for the
same rounds with the same batches, augmentation, optimiser and seeds, and average the backbone
with n_k/n weights. The plain loop is what one would write by hand: load the global state, SGD
over the batches, average the state dicts. secfed's runtime adds its messages, flattening, the
channel, checkpoints and metrics. Evaluation is excluded from both. Both run in one process with
the allocator settings of the ``secfed`` command (:func:`secfed.memory.reuse_freed_memory`).

    python bench/bench_runtime.py [--rounds 3] [--repeats 3] [--secagg]

Prints the median seconds per round of each and the overhead ratio (goal: ≤ 5 % with the plain
channel); with --secagg also the runtime with secure aggregation.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from secfed.algorithms.base import make_optimizer
from secfed.config import RunConfig, RunSection
from secfed.data.augment import TrainAugment, epoch_batches
from secfed.federation.builder import build
from secfed.federation.runtime import SilentReporter, run, schedule_for, train_seed
from secfed.environment import describe
from secfed.memory import reuse_freed_memory


class Clock(SilentReporter):
    """Timestamps of round starts and ends, from the runtime's own hooks."""

    def __init__(self) -> None:
        self.starts: list[float] = []

    def round_started(self, round_number: int, cohort: list[str]) -> None:
        self.starts.append(time.perf_counter())


def runtime_seconds(cfg: RunConfig, out: Path) -> list[float]:
    """Per-round wall time of secfed's runtime, checkpoint and metrics included, evaluation excluded."""
    clock, ends = Clock(), []
    run(cfg, out, reporter=clock, on_round_end=lambda r: ends.append(time.perf_counter()))
    evals = [json.loads(line)["seconds"]["eval"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [end - start - ev for start, end, ev in zip(clock.starts, ends, evals)]


def plain_seconds(cfg: RunConfig) -> list[float]:
    """The same local steps in a hand-written loop: state dicts in, SGD, weighted average out."""
    fed = build(cfg)
    shared = list(fed.layout.names)
    sites = fed.sites
    global_state = {k: v.clone() for k, v in sites[0].model.state_dict().items() if k in shared}
    n_total = sum(len(s.images) for s in sites)
    augment = TrainAugment()
    times = []
    for t in range(cfg.schedule.rounds):
        start = time.perf_counter()
        schedule = schedule_for(cfg, t)
        states = []
        for client in sites:
            model = client.model
            model.load_state_dict(global_state, strict=False)
            seed = train_seed(cfg, t, client.id)
            torch.manual_seed(seed)
            generator = torch.Generator().manual_seed(seed)
            model.train()
            optimizer = make_optimizer(model, schedule)
            for _ in range(schedule.epochs):
                for index in epoch_batches(len(client.images), schedule.batch_size, generator):
                    optimizer.zero_grad(set_to_none=True)
                    loss = F.cross_entropy(model(augment(client.images[index], generator)), client.labels[index])
                    loss.backward()
                    optimizer.step()
            states.append((len(client.images) / n_total, {k: v for k, v in model.state_dict().items() if k in shared}))
        global_state = {k: sum(w * s[k].float() for w, s in states) for k in shared}
        times.append(time.perf_counter() - start)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--secagg", action="store_true", help="measure the runtime with secure aggregation too")
    parser.add_argument("--repeats", type=int, default=3, help="alternating repetitions of each side")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    tuned = reuse_freed_memory()  # as the `secfed` command does, for both sides alike

    cfg = RunConfig(run=RunSection(seed=0))
    cfg.schedule.rounds = args.rounds
    cfg.run.local_baseline = False
    cfg.run.eval_every = 0
    cfg.secagg.enabled = False
    print(f"machine: {describe()}; freed memory reused: {tuned}")
    print(f"workload: synthetic default, 4 clients, {cfg.model.backbone} {cfg.data.height}x{cfg.data.width}, "
          f"{args.rounds} rounds, B={cfg.schedule.batch_size}, E={cfg.schedule.local_epochs}")

    plain_seconds(cfg)  # warm-up: first-touch allocations, oneDNN kernels, the synthetic cache
    # Alternate the two sides so drift on a shared machine hits both alike; compare medians per round.
    plain, ours, secure = [], [], []
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(args.repeats):
            plain += plain_seconds(cfg)
            ours += runtime_seconds(cfg, Path(tmp) / f"plain-channel-{rep}")
            if args.secagg:
                secure_cfg = cfg.model_copy(deep=True)
                secure_cfg.secagg.enabled = True
                secure += runtime_seconds(secure_cfg, Path(tmp) / f"secagg-{rep}")
    base = statistics.median(plain)
    rows = [("plain PyTorch loop", plain), ("secfed runtime, plain channel", ours)]
    if secure:
        rows.append(("secfed runtime, secure aggregation", secure))
    for name, times in rows:
        median = statistics.median(times)
        print(f"{name:38s} {median:7.2f} s/round (median of {len(times)}; {min(times):.2f}–{max(times):.2f})   "
              f"ratio {median / base:5.3f}")
    print(f"runtime overhead (plain channel): {100 * (statistics.median(ours) / base - 1):+.1f} %  (goal ≤ 5 %)")
    if secure:
        print(f"secure aggregation on a secfed round: {100 * (statistics.median(secure) / statistics.median(ours) - 1):+.1f} %"
              "  (goal ≤ 10 %)")

if __name__ == "__main__":
    main()
