"""CMC/mAP at Market-1501 scale: secfed's vectorised evaluation against a per-query numpy loop.

    .venv/bin/python bench/bench_eval.py [--seed 0] [--repeats 3]

Synthetic features with Market-1501's test-set shape: 3,368 queries and 15,913 gallery images
(750 identities, 6 cameras, 2,793 distractors with id 0), 512-d. A feature is its identity's centre
plus a camera offset plus noise, so rank-1 (~78%) and mAP (~54%) land where a federated ReID model
puts them on Market-1501, and junk removal and distractors matter.

The reference is the straightforward implementation of the same protocol, one query at a time,
as in torchreid's ``eval_market1501`` (with a stable argsort so ties resolve as in secfed).
Both score the same distance matrix; the bench fails unless CMC is identical and mAP agrees to 1e-12.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time

import numpy as np
import torch

from secfed.environment import cpu
from secfed.evaluation.metrics import cmc_map, cmc_map_from_distances, cosine_distances
from secfed.seeding import numpy_rng


def cmc_map_reference(
    distmat: np.ndarray,
    query_pids: np.ndarray,
    gallery_pids: np.ndarray,
    query_camids: np.ndarray,
    gallery_camids: np.ndarray,
    max_rank: int = 50,
) -> tuple[np.ndarray, float, int]:
    """(CMC[:max_rank], mAP, number of valid queries), one query at a time."""
    all_cmc, all_ap = [], []
    for q in range(distmat.shape[0]):
        order = np.argsort(distmat[q], kind="stable")
        junk = (gallery_pids[order] == query_pids[q]) & (gallery_camids[order] == query_camids[q])
        matches = (gallery_pids[order] == query_pids[q])[~junk]
        if not matches.any():
            continue
        cmc = np.minimum(matches.cumsum(), 1)
        cmc = np.pad(cmc, (0, max(0, max_rank - len(cmc))), constant_values=1)  # tiny galleries
        all_cmc.append(cmc[:max_rank])
        precision = matches.cumsum() / np.arange(1, len(matches) + 1)
        all_ap.append((precision * matches).sum() / matches.sum())
    return np.mean(np.asarray(all_cmc, dtype=np.float64), axis=0), float(np.mean(all_ap)), len(all_ap)


def market_like(seed: int, queries: int, gallery: int, ids: int, distractors: int, cameras: int, dim: int):
    """Synthetic (query features, gallery features, q_pids, g_pids, q_cams, g_cams)."""
    rng = numpy_rng(seed, "bench-eval")
    centres = rng.standard_normal((ids + 1, dim)).astype(np.float32)
    camera_offsets = rng.standard_normal((cameras, dim)).astype(np.float32)

    def images(pids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        cams = rng.integers(0, cameras, len(pids))
        features = 0.8 * camera_offsets[cams] + 1.2 * rng.standard_normal((len(pids), dim), dtype=np.float32)
        features[pids > 0] += centres[pids[pids > 0]]
        return features, cams

    q_pids = rng.integers(1, ids + 1, queries)
    g_pids = np.concatenate([rng.integers(1, ids + 1, gallery - distractors), np.zeros(distractors, np.int64)])
    qf, q_cams = images(q_pids)
    gf, g_cams = images(g_pids)
    return qf, gf, q_pids, g_pids, q_cams, g_cams


def timed(fn, repeats: int):
    times, result = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
    return result, min(times), statistics.median(times)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--repeats", type=int, default=3, help="runs of the vectorised version (best reported)")
    parser.add_argument("--queries", type=int, default=3368)
    parser.add_argument("--gallery", type=int, default=15913)
    parser.add_argument("--ids", type=int, default=750)
    parser.add_argument("--distractors", type=int, default=2793)
    parser.add_argument("--dim", type=int, default=512)
    args = parser.parse_args()
    if args.repeats < 1 or args.queries < 1 or args.ids < 1 or not 0 <= args.distractors < args.gallery:
        parser.error("need --repeats ≥ 1, --queries ≥ 1, --ids ≥ 1 and 0 ≤ --distractors < --gallery")

    qf, gf, q_pids, g_pids, q_cams, g_cams = market_like(
        args.seed, args.queries, args.gallery, args.ids, args.distractors, 6, args.dim
    )
    labels = (q_pids, g_pids, q_cams, g_cams)
    print(f"machine: {cpu()['model']}, {os.cpu_count()} cores, torch threads {torch.get_num_threads()}, "
          f"load average {os.getloadavg()[0]:.1f} at start, python {platform.python_version()}, "
          f"numpy {np.__version__}, torch {torch.__version__}")
    print(f"problem: {args.queries} queries x {args.gallery} gallery ({args.distractors} distractors), "
          f"{args.ids} ids, 6 cameras, {args.dim}-d float32, seed {args.seed}")

    fast, t_fast, t_fast_median = timed(lambda: cmc_map(qf, gf, *labels), args.repeats)
    distmat, t_dist, _ = timed(lambda: cosine_distances(qf, gf), 1)
    from_dist, t_from_dist, _ = timed(lambda: cmc_map_from_distances(distmat, *labels), args.repeats)
    (ref_cmc, ref_map, ref_valid), t_ref, _ = timed(lambda: cmc_map_reference(distmat, *labels), 1)

    print(f"scores: rank-1 {fast.rank1:.4f}  rank-5 {fast.rank5:.4f}  rank-10 {fast.rank10:.4f}  "
          f"mAP {fast.mAP:.4f}  valid queries {fast.num_valid_queries}  skipped {fast.num_skipped_queries}")
    print(f"vectorised cmc_map (features -> scores)   {t_fast:7.3f} s  "
          f"(best of {args.repeats}, median {t_fast_median:.3f} s)")
    print(f"  distance matrix alone                   {t_dist:7.3f} s")
    print(f"vectorised scoring of the distance matrix {t_from_dist:7.3f} s  (best of {args.repeats})")
    print(f"per-query reference scoring               {t_ref:7.3f} s  (1 run)")
    print(f"speed-up, scoring the same matrix:        {t_ref / t_from_dist:6.1f}x  (goal >= 5x)")
    print(f"speed-up, features to scores:             {(t_dist + t_ref) / t_fast:6.1f}x")

    ok = True
    for name, scores in (("cmc_map", fast), ("cmc_map_from_distances", from_dist)):
        same_cmc = np.array_equal(scores.cmc, ref_cmc)
        map_gap = abs(scores.mAP - ref_map)
        same = same_cmc and map_gap <= 1e-12 and scores.num_valid_queries == ref_valid
        print(f"{name} vs reference: CMC {'identical' if same_cmc else 'DIFFERENT'}, "
              f"|mAP diff| {map_gap:.1e}, valid queries {scores.num_valid_queries} vs {ref_valid} -> "
              f"{'OK' if same else 'MISMATCH'}")
        ok &= same
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
