"""Seconds per round on Flower's Deployment Engine (loopback): secfed's secure aggregation as a
Flower mod and workflow, against Flower's own SecAgg+ workflow — same SuperNodes, same vector, same
Flower run — and a plain message round trip (what any Flower round costs before secure
aggregation).

A SuperLink and N SuperNodes run as processes on 127.0.0.1 with TLS (launch.Loopback); every
ClientApp message is a fresh process. secfed's round is authenticated (signed keys, consistency
check); Flower's SecAgg+ has no authenticated mode.

    python bench/bench_flower.py [--nodes 3] [--dimension 100000] [--rounds 2] [--node-poll 0.2]

``--node-poll`` caps Flower's fixed SuperNode polls (3 s idle, 0.5 s for replies; 0 keeps
Flower's); ``--task-poll`` sets ``FLWR_SUPEREXEC_TASK_POLL_INTERVAL`` (Flower's default 1 s).
Prints the median seconds per round of each, secfed's per-phase times and a JSON line.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from secfed.adapters.flower import Cohort
from secfed.adapters.flower import node as node_files
from secfed.adapters.flower.launch import Loopback, write_app
from secfed.adapters.flower.mod import ALLOW_UNAUTHENTICATED_KEY
from secfed.environment import describe

APP = Path(__file__).with_name("flower_bench_app.py")


ARMS = ("plain", "plain-polled", "secfed", "secfed-unauthenticated", "flower")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nodes", type=int, default=3, help="SuperNodes (each one client)")
    p.add_argument("--dimension", type=int, default=100_000, help="float32 values each node sums")
    p.add_argument("--rounds", type=int, default=2, help="rounds of each (interleaved)")
    p.add_argument("--node-poll", type=float, default=0.2, help="cap of the SuperNodes' polls, s (0: Flower's)")
    p.add_argument("--task-poll", type=float, default=0.1, help="FLWR_SUPEREXEC_TASK_POLL_INTERVAL, s")
    p.add_argument("--workflow-poll", type=float, default=0.1, help="SecAggWorkflow's reply poll, s")
    p.add_argument("--pull-backoff", type=float, default=0.0,
                   help="the ServerApp's first back-off for a reply's payload still uploading, s, as secfed's "
                        "ServerApp sets it (adapters/flower/pulls.py); 0 keeps Flower's 1 s (every arm)")
    p.add_argument("--no-tls", action="store_true", help="insecure transport")
    p.add_argument("--cold-clientapps", action="store_true",
                   help="a fresh interpreter per ClientApp message, as a stock SuperNode runs it (default: "
                        "warm forks of the Loopback's zygote)")
    p.add_argument("--arms", nargs="+", choices=ARMS, default=list(ARMS),
                   help="which rounds to run (default: all; e.g. 'plain' at a model's size for issue 22 item 4)")
    args = p.parse_args(argv)
    if args.nodes < 2 or args.dimension < 1 or args.rounds < 1:
        p.error("--nodes ≥ 2, --dimension ≥ 1, --rounds ≥ 1")
    return args


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    machine = describe()
    print(f"machine: {machine}")
    with tempfile.TemporaryDirectory(prefix="bench-flower-") as tmp:
        tmp_path = Path(tmp)
        cohort_file, sites, configs = tmp_path / "cohort.toml", {}, []
        for p in range(args.nodes):
            folder = tmp_path / f"node-{p}"
            sites[f"site-{p}"] = node_files.public_identity(node_files.identity_key(folder))
            configs.append({node_files.STATE_DIR_KEY: str(folder), node_files.COHORT_KEY: str(cohort_file),
                            ALLOW_UNAUTHENTICATED_KEY: True})  # for the unauthenticated arm
        cohort_file.write_text(Cohort(sites).dumps())
        out = tmp_path / "out.json"
        app = write_app(tmp_path / "app", name="bench-flower", serverapp="flower_bench_app:server",
                        clientapp="flower_bench_app:client",
                        config={"cohort": str(cohort_file), "out": str(out), "nodes": args.nodes,
                                "dimension": args.dimension, "rounds": args.rounds, "poll": args.workflow_poll,
                                "pull_backoff": args.pull_backoff,
                                "arms": ",".join(args.arms)},
                        files={"flower_bench_app.py": APP.read_text()})
        env = {"FLWR_SUPEREXEC_TASK_POLL_INTERVAL": str(args.task_poll)}
        t0 = time.monotonic()
        with Loopback(tmp_path / "flower", supernodes=args.nodes, node_configs=configs, tls=not args.no_tls,
                      env=env, node_poll=args.node_poll or None, warm_clientapps=not args.cold_clientapps) as fed:
            run = fed.run(app, stream_to=tmp_path / "run.log")
            try:
                run.wait(timeout=1800)
            except subprocess.TimeoutExpired:
                run.kill()
            if run.returncode != 0 or not out.is_file():
                sys.stderr.write((tmp_path / "run.log").read_text()[-4000:])
                raise SystemExit(f"the Flower run failed (flwr exit code {run.returncode})")
        results = json.loads(out.read_text())
    total = time.monotonic() - t0
    arms = [a for a in ARMS if a in args.arms]
    median = {k: statistics.median(results[k]) for k in arms}
    phases = {arm: {name: statistics.median(p[name] for p in results[f"{arm}_phases"])
                    for name in results[f"{arm}_phases"][0]} for arm in ("secfed", "secfed-unauthenticated") if arm in arms}
    print(f"loopback Deployment Engine: {args.nodes} SuperNodes, d = {args.dimension:,} float32, "
          f"{args.rounds} round(s) each, TLS {'off' if args.no_tls else 'on'}, node poll {args.node_poll} s, "
          f"task poll {args.task_poll} s, ClientApps {'cold' if args.cold_clientapps else 'warm (zygote)'}, "
          f"ServerApp pull back-off {args.pull_backoff or 'Flower'}{' s' if args.pull_backoff else ''}")
    print(f"{'round':<44}{'median s':>10}  all")
    labels = {"plain": "plain train round trip (no secure aggregation)",
              "plain-polled": "the same, polled every 0.2 s as secfed's ServerApp",
              "secfed": "secfed (SecAggStrategy(FedAvg), authenticated)",
              "secfed-unauthenticated": "secfed, unauthenticated", "flower": "Flower SecAgg+ (FedAvg)"}
    for key in arms:
        print(f"{labels[key]:<44}{median[key]:>10.2f}  {', '.join(f'{s:.2f}' for s in results[key])}")
    print(f"secfed enrolment (once per run, before round 1): {results['enrol']:.2f} s")
    for arm, times in phases.items():
        print(f"{arm} phases (median s): " + ", ".join(f"{k} {v:.2f}" for k, v in times.items()))
    ratios = {arm: median[arm] / median["flower"] for arm in ("secfed", "secfed-unauthenticated")
              if arm in arms and "flower" in arms}
    if ratios:
        print("; ".join(f"{arm} ÷ Flower SecAgg+: {r:.2f}" for arm, r in ratios.items()) + " (goal ≤ 1.0)")
    if "secfed" in arms and "plain" in arms:
        print(f"secfed ÷ plain: {median['secfed'] / median['plain']:.2f}")
    print(f"whole bench {total:.0f} s")
    report = {"args": vars(args), "median": median, "ratio_to_flower": ratios, "rounds": results,
              "secfed_phase_median": phases, "machine": machine}
    print(json.dumps(report))
    return report


if __name__ == "__main__":
    main()
