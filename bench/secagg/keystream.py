"""``keystream`` section: :func:`secfed.protocols.prg.mask_into` (the masking pass alone: bound check,
k + 1 streams, reduction, digest) ÷ raw keystream, one thread and every core."""

from __future__ import annotations

import math
import os
import time

import numpy as np

from secfed.protocols import parallel
from secfed.protocols.crypto import vector_digest
from secfed.protocols.prg import MaskStream, mask_into

from .common import best_of, raw_keystream_seconds, seconds


def section_keystream(args) -> None:
    d = args.dims[0]
    threads = parallel.workers()
    print(f"\n== keystream: mask_into (bound check, k + 1 streams, reduction, digest) ÷ raw AES-CTR, d = {d:,}")
    x = np.random.default_rng(args.seed).integers(0, 1 << 20, d, dtype=np.uint32)
    out = np.empty(d, dtype=np.uint32)
    print(f"{'k':>4} {'raw 1 thr':>10} {f'raw {threads} thr':>10} {'mask 1 thr':>11} {f'mask {threads} thr':>11} "
          f"{'1/1':>6} {f'{threads}/1':>6} {f'{threads}/{threads}':>6} {'1/1 cpu':>7} {'no-digest 1/1':>13} "
          f"{'floor 1/1':>9}")
    # The digest the masked input is signed over is BLAKE3 of every byte: a pass no keystream amortises.
    parallel.set_workers(1)
    digest = best_of(args.keystream_repeats, lambda: seconds(lambda: vector_digest(x)))
    parallel.set_workers(threads)
    for k in args.keystream_neighbours:
        streams = [MaskStream(os.urandom(16), 1 if i % 2 else -1) for i in range(k + 1)]

        def masking(workers: int) -> None:
            parallel.set_workers(workers)
            mask_into(out, x, streams, bits=32, bound=1 << 20)

        def masking_without_digest() -> None:
            parallel.set_workers(1)
            mask_into(out, x, streams, bits=32, bound=1 << 20, hasher=_NoHash)

        # Interleaved, so drift on a shared machine hits all four alike; the fastest of each is kept.
        # One-thread runs also keep their thread's CPU seconds, which other processes do not inflate.
        best = {key: math.inf for key in ("raw1", "rawn", "mask1", "maskn", "bare1", "raw1_cpu", "mask1_cpu",
                                          "bare1_cpu")}
        for _ in range(args.keystream_repeats):
            _keep(best, "raw1", lambda: raw_keystream_seconds(k + 1, d))
            _keep(best, "mask1", lambda: masking(1))
            _keep(best, "bare1", masking_without_digest)
            best["rawn"] = min(best["rawn"], raw_keystream_seconds(k + 1, d, threads))
            best["maskn"] = min(best["maskn"], seconds(lambda: masking(threads)))
        parallel.set_workers(threads)
        raw1, rawn, mask1, maskn = best["raw1"], best["rawn"], best["mask1"], best["maskn"]
        print(f"{k:4d} {raw1 * 1e3:8.2f}ms {rawn * 1e3:8.2f}ms {mask1 * 1e3:9.2f}ms {maskn * 1e3:9.2f}ms "
              f"{mask1 / raw1:6.2f} {maskn / raw1:6.2f} {maskn / rawn:6.2f} "
              f"{best['mask1_cpu'] / best['raw1_cpu']:7.2f} {best['bare1'] / raw1:13.2f} {(raw1 + digest) / raw1:9.2f}")
    print("(best of repeats; ratios: mask on 1 thread ÷ raw on 1, mask on every core ÷ raw on 1, ÷ raw on every core;")
    print(" 1/1 cpu: the same one-thread ratio in the thread's CPU seconds, for a machine other processes share;")
    print(" no-digest 1/1: the pass with its leaf hasher swapped for one that hashes nothing — the bound check,")
    print(" the k + 1 additions and the calls, which no choice of digest changes;")
    print(f" floor 1/1: (raw + the vector's BLAKE3 digest alone, {digest * 1e3:.2f} ms on 1 thread) ÷ raw — what any")
    print(" masking pass that signs a digest of the vector costs at least)")


class _NoHash:
    """The leaf hasher of the no-digest column (``mask_into``'s ``hasher=``): takes the bytes, hashes nothing."""

    def update(self, data) -> None:
        pass

    def digest(self) -> bytes:
        return bytes(32)


def _keep(best: dict[str, float], key: str, fn) -> None:
    """Run ``fn`` on this thread; keep the least wall seconds in ``best[key]`` and the least CPU
    seconds of this thread in ``best[key + "_cpu"]``."""
    wall, cpu = time.perf_counter(), time.thread_time()
    fn()
    cpu, wall = time.thread_time() - cpu, time.perf_counter() - wall
    best[key], best[key + "_cpu"] = min(best[key], wall), min(best[key + "_cpu"], cpu)
