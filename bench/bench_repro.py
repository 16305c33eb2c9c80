"""What makes a run repeatable: the same small run under each condition, and the bytes it ends with.

    python bench/bench_repro.py [--threads 1,2] [--repeats 2] [--rounds 2] [--device cpu] [--out FILE]

Generates a small synthetic federation (three domains, scale 0.15, seed 7 — the test suite's), hashes
its files (the data's own fingerprint, to tell "other data" from "other arithmetic"), then trains the
same configuration (FedPav, ResNet-18 at 32×16, B = 8, secure aggregation on) once per thread count
and repeat, and prints per condition the SHA-256 of the final shared model and the last round's mean
loss. Equal hashes: bit-identical runs. Run it on two machines and compare the JSON (``--out``): the
environment (CPU, torch kernels, versions, threads) is recorded beside every hash.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from secfed.config import RunConfig, RunSection
from secfed.data.synth import generate
from secfed.environment import describe, environment
from secfed.federation import runtime


def data_fingerprint(root: Path) -> str:
    """SHA-256 over every file's relative path and bytes, in sorted order."""
    digest = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def weights_hash(weights: torch.Tensor) -> str:
    """SHA-256 of the global shared weights (flat float32) the federation ends with."""
    return hashlib.sha256(weights.detach().cpu().contiguous().numpy().tobytes()).hexdigest()


def one_run(root: Path, threads: int, rounds: int, device: str) -> dict[str, Any]:
    torch.set_num_threads(threads)
    with tempfile.TemporaryDirectory() as out:
        cfg = RunConfig(run=RunSection(seed=3, out=out, name="repro", device=device, local_baseline=False))
        cfg.data.root = str(root)
        cfg.data.height, cfg.data.width = 32, 16
        cfg.schedule.rounds = rounds
        cfg.schedule.batch_size = 8
        start = time.perf_counter()
        result = runtime.run(cfg, Path(out) / "repro")
        history = [json.loads(line) for line in (Path(out) / "repro" / "metrics.jsonl").read_text().splitlines()]
        return {"threads": threads, "device": device, "model_sha256": weights_hash(result.federation.server.weights),
                "last_loss": history[-1].get("loss"), "seconds": round(time.perf_counter() - start, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", default="1,2", help="torch CPU thread counts, comma-separated")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--out", type=Path, help="write the results as JSON here")
    args = parser.parse_args()
    print(describe(), flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "domains"
        generate(root, domains=3, seed=7, scale=0.15, height=64, width=32)
        fingerprint = data_fingerprint(root)
        print(f"synthetic data sha256 {fingerprint[:16]}", flush=True)
        runs = []
        for threads in (int(t) for t in args.threads.split(",")):
            for _ in range(args.repeats):
                runs.append(one_run(root, threads, args.rounds, args.device))
                r = runs[-1]
                print(f"threads {r['threads']}  model {r['model_sha256'][:16]}  loss {r['last_loss']:.6f}  "
                      f"({r['seconds']} s)", flush=True)
    distinct = {r["threads"]: {x["model_sha256"] for x in runs if x["threads"] == r["threads"]} for r in runs}
    for threads, hashes in distinct.items():
        print(f"threads {threads}: {'bit-identical over repeats' if len(hashes) == 1 else 'DIFFERS between repeats'}")
    if len({h for hashes in distinct.values() for h in hashes}) > 1:
        print("thread counts give different bytes: fix --threads to repeat a run elsewhere")
    if args.out:
        # each run records its own thread count; the process's last one would misdescribe the others (review)
        env = {k: v for k, v in environment().items() if k != "torch_threads"}
        args.out.write_text(json.dumps({"environment": env, "data_sha256": fingerprint, "runs": runs}, indent=2))


if __name__ == "__main__":
    main()
