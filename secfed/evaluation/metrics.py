"""Retrieval accuracy: CMC rank-k and mAP under the standard Market-1501 protocol.

The protocol (Zheng et al., ICCV 2015; torchreid's ``eval_market1501``):

* the gallery is ranked by cosine distance ``1 − q·g`` between L2-normalised features, computed in
  float64, below 2^-40 made 0, and rounded to float32 (see ``_cosine``); equal distances keep gallery
  order (the order a stable sort gives), so results are deterministic;
* gallery images of the query's identity taken by the query's camera are removed ("junk");
  every other image, distractors included, stays in the ranking — a pid of −1 too, which the
  official code removes as junk: secfed's loaders never list those images, so pass none here;
* a query left without a true match is skipped;
* CMC at rank k is the fraction of valid queries with a true match in the first k; AP is the
  precision averaged over the positions of all true matches; mAP averages AP over valid queries.

Vectorised without sorting gallery indices. A query's score depends only on where its own
identity's gallery images land in its ranking, and an image's position is the number of gallery
entries that come before it: entries with a smaller distance (one binary search in the row's sorted
distances, and sorting values alone is a fast SIMD sort) plus tied entries with a smaller index.
Removing junk shifts a match up by the number of junk images ranked before it. Queries are
processed in blocks so memory stays bounded at Market-1501 scale (3,368 × 15,913).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F

Array = np.ndarray | torch.Tensor

# Distance entries per block of queries: 2^23 float32 = 32 MiB (its float64 product 64 MiB while it is
# rounded), plus a sorted copy of the same size.
_BLOCK_ELEMENTS = 1 << 23
_DEFAULT_MAX_RANK = 50
_SAME = 2.0**-40  # a cosine distance this small is the float64 product's error (≤ 1e-13 at 2048 dims): 0
_REPORTED_RANKS = (1, 5, 10)  # the fields of RetrievalScores; max_rank must cover them


@dataclass(frozen=True)
class RetrievalScores:
    """CMC and mAP of one query set against one gallery. Rates are fractions in [0, 1]."""

    rank1: float
    rank5: float
    rank10: float
    mAP: float
    cmc: np.ndarray = field(compare=False, repr=False)  # cmc[k - 1] = rank-k rate, k = 1..max_rank
    num_valid_queries: int
    num_skipped_queries: int  # queries without a true match once junk is removed

    def rank(self, k: int) -> float:
        """The rank-k rate (CMC at k)."""
        if not 1 <= k <= len(self.cmc):
            raise ValueError(f"rank {k} is outside the computed CMC (1..{len(self.cmc)}); raise max_rank")
        return float(self.cmc[k - 1])

    def to_dict(self, *, include_cmc: bool = False) -> dict[str, float | int | list[float]]:
        """Plain JSON-ready numbers (the shape of a metrics-log ``eval`` entry)."""
        out: dict[str, float | int | list[float]] = {
            "rank1": self.rank1,
            "rank5": self.rank5,
            "rank10": self.rank10,
            "mAP": self.mAP,
            "num_valid_queries": self.num_valid_queries,
            "num_skipped_queries": self.num_skipped_queries,
        }
        if include_cmc:
            out["cmc"] = [float(x) for x in self.cmc]
        return out


def cmc_map(
    query_features: Array,
    gallery_features: Array,
    query_pids: Array,
    gallery_pids: Array,
    query_camids: Array,
    gallery_camids: Array,
    *,
    max_rank: int = _DEFAULT_MAX_RANK,
    chunk_size: int | None = None,
) -> RetrievalScores:
    """Rank-1/5/10, the CMC curve up to ``max_rank`` and mAP from query and gallery features.

    Features are L2-normalised here (a no-op up to rounding for features from
    :func:`secfed.evaluation.features.extract_features`), so the distance is the cosine distance
    ``1 − q·g`` whatever the input scale. Tensors may live on any device; distances are computed
    there, ``chunk_size`` queries at a time (default: blocks of about 2^23 distances).
    """
    q, g = _normalized_pair(
        _features(query_features, "query_features"), _features(gallery_features, "gallery_features")
    )
    rows = _block_rows(len(q), len(g), chunk_size)
    distinct, inverse = _distinct_rows(g)
    blocks = (_cosine(q[start : start + rows], distinct, inverse) for start in range(0, len(q), rows))
    same_id = _SameIdentity.build(query_pids, gallery_pids, query_camids, gallery_camids, len(q), len(g))
    return _score(blocks, same_id, max_rank)


def cmc_map_from_distances(
    distmat: Array,
    query_pids: Array,
    gallery_pids: Array,
    query_camids: Array,
    gallery_camids: Array,
    *,
    max_rank: int = _DEFAULT_MAX_RANK,
    chunk_size: int | None = None,
) -> RetrievalScores:
    """The same protocol on a precomputed (num_query × num_gallery) distance matrix (smaller = closer)."""
    d = distmat.detach().cpu().numpy() if isinstance(distmat, torch.Tensor) else np.asarray(distmat)
    if d.ndim != 2 or d.shape[0] == 0 or d.shape[1] == 0:
        raise ValueError(f"distmat must be a non-empty 2-D (query × gallery) matrix, got shape {d.shape}")
    d = _exact_distances(d)
    rows = _block_rows(d.shape[0], d.shape[1], chunk_size)
    blocks = (_finite(d[start : start + rows]) for start in range(0, d.shape[0], rows))
    same_id = _SameIdentity.build(query_pids, gallery_pids, query_camids, gallery_camids, *d.shape)
    return _score(blocks, same_id, max_rank)


def cosine_distances(query_features: Array, gallery_features: Array) -> np.ndarray:
    """The full (num_query × num_gallery) cosine-distance matrix, computed exactly as :func:`cmc_map` does."""
    q, g = _normalized_pair(
        _features(query_features, "query_features"), _features(gallery_features, "gallery_features")
    )
    return _cosine(q, *_distinct_rows(g))


# --- the vectorised core -------------------------------------------------------------------------


@dataclass(frozen=True)
class _SameIdentity:
    """For every query, the gallery entries of its identity, padded to a common width ``m``.

    Only these entries decide a query's score, and an identity has few gallery images, so the
    per-query work is O(m) once the ranking positions are known.
    """

    index: np.ndarray  # (num_query, m) gallery index; 0 in padding slots
    match: np.ndarray  # (num_query, m) same identity, other camera: a true match
    junk: np.ndarray  # (num_query, m) same identity, same camera: removed from the ranking
    num_gallery: int

    @classmethod
    def build(
        cls,
        query_pids: Array,
        gallery_pids: Array,
        query_camids: Array,
        gallery_camids: Array,
        num_query: int,
        num_gallery: int,
    ) -> _SameIdentity:
        q_pids = _labels(query_pids, "query_pids", num_query)
        g_pids = _labels(gallery_pids, "gallery_pids", num_gallery)
        q_cams = _labels(query_camids, "query_camids", num_query)
        g_cams = _labels(gallery_camids, "gallery_camids", num_gallery)

        by_pid = np.argsort(g_pids, kind="stable")
        pids, starts, counts = np.unique(g_pids[by_pid], return_index=True, return_counts=True)
        group = np.searchsorted(pids, q_pids).clip(max=len(pids) - 1)
        size = np.where(pids[group] == q_pids, counts[group], 0)
        slot = np.arange(max(int(size.max()), 1))
        filled = slot < size[:, None]
        index = by_pid[np.where(filled, starts[group][:, None] + slot, 0)]
        same_camera = g_cams[index] == q_cams[:, None]
        return cls(index=index, match=filled & ~same_camera, junk=filled & same_camera, num_gallery=num_gallery)


def _score(blocks: Iterable[np.ndarray], same_id: _SameIdentity, max_rank: int) -> RetrievalScores:
    if isinstance(max_rank, bool) or not isinstance(max_rank, int) or max_rank < max(_REPORTED_RANKS):
        raise ValueError(f"max_rank must be an integer ≥ {max(_REPORTED_RANKS)}, got {max_rank!r}")
    if max_rank > max(_DEFAULT_MAX_RANK, same_id.num_gallery):  # (found by review: 10^10 asked for 75 GiB)
        raise ValueError(f"max_rank {max_rank} is beyond the gallery's {same_id.num_gallery} images, where "
                         "the CMC curve is flat: ask for at most that many")
    num_query = len(same_id.index)
    first_hit = np.empty(num_query, dtype=np.int64)  # kept-ranking position of the best true match
    precision_sum = np.empty(num_query, dtype=np.float64)  # Σ over true matches of precision there
    start = 0
    for distances in blocks:
        stop = start + len(distances)
        rows = slice(start, stop)
        position = _positions(distances, same_id.index[rows], same_id.match[rows] | same_id.junk[rows])
        first_hit[rows], precision_sum[rows] = _match_statistics(
            position, same_id.match[rows], same_id.junk[rows]
        )
        start = stop

    num_matches = same_id.match.sum(axis=1)
    valid = num_matches > 0
    num_valid = int(valid.sum())
    if num_valid == 0:
        raise ValueError(
            f"none of the {num_query} queries has a true match in the gallery (same identity, other "
            "camera): check that query and gallery ids and camera ids come from the same dataset"
        )
    # the curve from counts, not a queries × max_rank table
    hits = np.bincount(np.minimum(first_hit[valid], max_rank), minlength=max_rank + 1)[:max_rank]
    cmc = np.cumsum(hits) / num_valid
    cmc.setflags(write=False)
    mean_ap = float(np.mean(precision_sum[valid] / num_matches[valid]))
    return RetrievalScores(
        rank1=float(cmc[0]),
        rank5=float(cmc[4]),
        rank10=float(cmc[9]),
        mAP=mean_ap,
        cmc=cmc,
        num_valid_queries=num_valid,
        num_skipped_queries=num_query - num_valid,
    )


def _positions(distances: np.ndarray, index: np.ndarray, filled: np.ndarray) -> np.ndarray:
    """0-based position of each ``index`` entry in its row's full ranking (ties: lower index first)."""
    values = np.ascontiguousarray(np.take_along_axis(distances, index, axis=1))
    ranked = torch.from_numpy(np.sort(distances, axis=1))
    smaller = torch.searchsorted(ranked, torch.from_numpy(values)).numpy()
    equal = torch.searchsorted(ranked, torch.from_numpy(values), right=True).numpy() - smaller
    tied = filled & (equal > 1)  # another entry has exactly this distance: order them by index
    if tied.any():
        rows, slots = np.nonzero(tied)
        smaller[rows, slots] += _tied_before(distances, rows, index[rows, slots], values[rows, slots])
    return smaller


def _tied_before(distances: np.ndarray, rows: np.ndarray, columns: np.ndarray, values: np.ndarray) -> np.ndarray:
    """For each (row, column), how many entries left of it in that row have exactly its distance."""
    counts = np.empty(len(rows), dtype=np.int64)
    gallery = np.arange(distances.shape[1])
    step = max(1, _BLOCK_ELEMENTS // distances.shape[1])
    for start in range(0, len(rows), step):
        part = slice(start, start + step)
        equal = distances[rows[part]] == values[part, None]
        counts[part] = (equal & (gallery < columns[part, None])).sum(axis=1)
    return counts


def _match_statistics(
    position: np.ndarray, match: np.ndarray, junk: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """First-hit position and Σ precision@match in the ranking with junk removed."""
    unused = 1 << 62  # padding sorts last and never counts; far from overflow in the arithmetic below
    position = np.where(match | junk, position, unused)
    order = np.argsort(position, axis=1, kind="stable")
    position = np.take_along_axis(position, order, axis=1)
    match = np.take_along_axis(match, order, axis=1)
    junk = np.take_along_axis(junk, order, axis=1)
    kept_position = position - (np.cumsum(junk, axis=1) - junk)  # junk ranked earlier drops out
    hits_so_far = np.cumsum(match, axis=1)
    first_hit = np.where(match, kept_position, unused).min(axis=1)
    precision_sum = np.where(match, hits_so_far / (kept_position + 1), 0.0).sum(axis=1)
    return first_hit, precision_sum


# --- inputs --------------------------------------------------------------------------------------


def _features(features: Array, name: str) -> torch.Tensor:
    if isinstance(features, torch.Tensor):
        x = features.detach()
    else:
        a = np.asarray(features)
        if a.dtype.kind != "f" or a.dtype.itemsize > 8:
            raise ValueError(f"{name} must be floating point of at most 64 bits, got {a.dtype}")
        x = torch.from_numpy(a)
    if x.ndim != 2 or x.shape[0] == 0 or x.shape[1] == 0:
        raise ValueError(
            f"{name} must be a non-empty 2-D (samples × dimension) array, got shape {tuple(x.shape)}"
        )
    if not x.is_floating_point():
        raise ValueError(f"{name} must be floating point, got {x.dtype}")
    if x.dtype not in (torch.float32, torch.float64):
        x = x.float()  # half precision from mixed-precision inference
    if not bool(torch.isfinite(x).all()):
        raise ValueError(f"{name} contain NaN or infinite values")
    return x


def _labels(labels: Array, name: str, expected: int) -> np.ndarray:
    a = labels.detach().cpu().numpy() if isinstance(labels, torch.Tensor) else np.asarray(labels)
    if a.ndim != 1 or len(a) != expected:
        raise ValueError(f"{name} must be 1-D with {expected} entries, got shape {a.shape}")
    if not np.issubdtype(a.dtype, np.integer):
        raise ValueError(f"{name} must be integers, got dtype {a.dtype}")
    return a.astype(np.int64, copy=False)


def _block_rows(num_query: int, num_gallery: int, chunk_size: int | None) -> int:
    if chunk_size is None:
        return max(1, min(num_query, _BLOCK_ELEMENTS // num_gallery))
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
        raise ValueError(f"chunk_size must be a positive integer, got {chunk_size!r}")
    return chunk_size


def _normalized_pair(q: torch.Tensor, g: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Both sides L2-normalised in float64 where the device has it (see :func:`_cosine`)."""
    if q.shape[1] != g.shape[1]:
        raise ValueError(
            f"query_features have dimension {q.shape[1]} but gallery_features have {g.shape[1]}"
        )
    dtype = torch.float32 if q.device.type == "mps" else torch.float64  # MPS has no float64
    return _unit_rows(q.to(dtype)), _unit_rows(g.to(device=q.device, dtype=dtype))


def _unit_rows(x: torch.Tensor) -> torch.Tensor:
    """Each row divided by its largest magnitude first, so its norm is ≥ 1 and nothing underflows:
    ``F.normalize`` alone leaves a row of norm below its eps (1e-12) short of unit length, which pulled
    a tiny but parallel feature to distance ≈ 1 (found by review). An all-zero row stays zero."""
    scale = x.abs().amax(dim=1, keepdim=True)
    return F.normalize(x / torch.where(scale > 0, scale, torch.ones_like(scale)), dim=1)


def _distinct_rows(g: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(the distinct rows of ``g``, each row's index among them; None when all differ). A product puts
    identical gallery columns at distances that differ by ±1e-16 with their place in the matrix, so a
    query at ≈ 1e-9 from five copies of one feature ranked them by position and its score moved with the
    blocking (found by review); computed once per distinct row, copies are equal by construction. Rows
    are grouped by a wrapping sum of their bits (one pass over the gallery: 0.01 s at 20,000 × 2048 —
    sorting every row took 1.9 s), and only rows sharing a sum are sorted by their bytes, so a different
    row with the same sum neither merges with them nor keeps copies apart (review: a permuted row first
    in the group did)."""
    a = np.ascontiguousarray(g.detach().cpu().numpy())
    key = a.view(np.uint64 if a.itemsize == 8 else np.uint32).sum(axis=1, dtype=np.uint64)
    _, key_of, counts = np.unique(key, return_inverse=True, return_counts=True)
    shared = np.flatnonzero(counts[key_of.ravel()] > 1)
    if not len(shared):
        return g, None
    representative = np.arange(len(a))
    as_bytes = np.ascontiguousarray(a[shared]).view(np.dtype((np.void, a.shape[1] * a.itemsize))).ravel()
    _, first, same_as = np.unique(as_bytes, return_index=True, return_inverse=True)
    representative[shared] = shared[first[same_as.ravel()]]
    used, inverse = np.unique(representative, return_inverse=True)
    if len(used) == len(a):
        return g, None
    return g[torch.from_numpy(used).to(g.device)], torch.from_numpy(inverse.ravel()).to(g.device)


def _cosine(q: torch.Tensor, g: torch.Tensor, inverse: torch.Tensor | None = None) -> np.ndarray:
    """``1 − q·g`` for one block of queries, in float64, with every value within ``_SAME`` of 0 made 0,
    then rounded to float32. A product rounds differently for a block of one query than for a block of
    many, so two gallery images at exactly equal distance could swap with the blocking, and a query's
    score with the queries scored beside it (found by review: 238 of 2000 integer-valued draws in
    float32, every one in float64): float32's step (6e-8 of the value) hides the float64 product's
    differences (≈ 1e-16) — but not near 0, where float32 resolves 1e-45, so identical or parallel
    features came out at ±1e-16 by column and a collapsed model's ranking followed the blocking (found
    by review); those are the values within ``_SAME`` of 0. Rounding the similarity instead tied every
    distance closer than 6e-8 and scored features packed in a narrow cone at chance (review of that
    fix): float32 near 0 keeps them apart. Between ``_SAME`` and ≈ 1e-7 two distances within ≈ 1e-15 of
    each other can still order either way; copies of one gallery feature cannot (:func:`_distinct_rows`)."""
    with torch.inference_mode():
        distances = (q @ g.T).neg_().add_(1.0)  # 1 − q·g in place: the same numbers, no second block
        distances.masked_fill_(distances.abs() < _SAME, 0.0)
        if inverse is not None:  # copies of one gallery feature: the one column it was computed in
            distances = distances[:, inverse]
        return distances.to(torch.float32).cpu().numpy()


def _exact_distances(d: np.ndarray) -> np.ndarray:
    """Distances in a dtype that ranks them as given: integers stay integers (int32 → float32 and
    int64 → float64 merged distances 2^24 + 1 and 2^24, found by review), half floats widen exactly;
    what cannot be ranked without loss is refused by name."""
    if d.dtype in (np.float32, np.float64, np.int64):
        return d
    if d.dtype.kind == "f" and d.dtype.itemsize < 4:
        return d.astype(np.float32)
    if d.dtype.kind == "i" or (d.dtype.kind == "u" and d.dtype.itemsize < 8):
        return d.astype(np.int64)
    if d.dtype.kind == "u" and int(d.max()) < 2**63:
        return d.astype(np.int64)
    if d.dtype.kind == "u":
        raise ValueError("distmat holds unsigned integers of 2^63 or more, which cannot be ranked exactly here")
    raise ValueError(f"distmat must hold real numbers of at most 64 bits, got dtype {d.dtype}")


def _finite(block: np.ndarray) -> np.ndarray:
    if not np.isfinite(block).all():
        raise ValueError("distmat contains NaN or infinite values")
    return block
