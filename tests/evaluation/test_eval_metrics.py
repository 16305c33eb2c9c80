"""CMC/mAP: hand-computed cases, agreement with a per-query implementation, input errors."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from secfed.evaluation.metrics import RetrievalScores, cmc_map, cmc_map_from_distances, cosine_distances

# Gallery (index: pid, camera). pid 0 is a distractor.
G_PIDS = np.array([1, 1, 2, 0, 2, 3])
G_CAMS = np.array([0, 1, 0, 2, 1, 1])
# Queries (pid, camera) and their distances to the six gallery images.
Q_PIDS = np.array([1, 2, 3, 1])
Q_CAMS = np.array([0, 2, 1, 2])
DISTMAT = np.array(
    [
        # q0 (1, cam 0): ranking g0 g3 g2 g4 g1 g5; g0 is junk (same id, same camera) and drops out,
        # leaving g3 g2 g4 g1 g5: the only true match g1 is 4th. AP = 1/4.
        [0.1, 0.5, 0.3, 0.2, 0.4, 0.6],
        # q1 (2, cam 2): two ties. g1/g2 at 0.2 and g4/g5 at 0.5 keep gallery order:
        # g3 g1 g2 g0 g4 g5. True matches g2 (3rd) and g4 (5th). AP = (1/3 + 2/5) / 2 = 11/30.
        [0.4, 0.2, 0.2, 0.1, 0.5, 0.5],
        # q2 (3, cam 1): the only pid-3 image, g5, is from camera 1 too: no valid match, skipped.
        [0.3, 0.3, 0.3, 0.3, 0.3, 0.0],
        # q3 (1, cam 2): g0 g3 g1 g5 g4 g2; true matches g0 (1st) and g1 (3rd). AP = (1 + 2/3) / 2 = 5/6.
        [0.1, 0.3, 0.9, 0.2, 0.8, 0.7],
    ]
)
# First true match at ranks 4, 3 and 1 for the three valid queries.
EXPECTED_CMC = np.array([1 / 3, 1 / 3, 2 / 3] + [1.0] * 47)
EXPECTED_MAP = (1 / 4 + 11 / 30 + 5 / 6) / 3  # = 29/60


def reference(distmat, q_pids, g_pids, q_cams, g_cams, max_rank=50):
    """Straightforward per-query protocol: stable sort, drop junk, cumulate matches."""
    cmcs, aps = [], []
    for i, row in enumerate(distmat):
        order = sorted(range(len(row)), key=lambda j: (row[j], j))
        kept = [j for j in order if not (g_pids[j] == q_pids[i] and g_cams[j] == q_cams[i])]
        hits = [g_pids[j] == q_pids[i] for j in kept]
        if not any(hits):
            continue
        first = hits.index(True)
        cmcs.append([1.0 if k >= first else 0.0 for k in range(max_rank)])
        found, precisions = 0, []
        for position, hit in enumerate(hits, start=1):
            if hit:
                found += 1
                precisions.append(found / position)
        aps.append(sum(precisions) / len(precisions))
    return np.mean(cmcs, axis=0), float(np.mean(aps)), len(aps)


def test_hand_computed_case() -> None:
    scores = cmc_map_from_distances(DISTMAT, Q_PIDS, G_PIDS, Q_CAMS, G_CAMS)
    assert scores.rank1 == pytest.approx(1 / 3)
    assert scores.rank5 == 1.0 and scores.rank10 == 1.0
    np.testing.assert_allclose(scores.cmc, EXPECTED_CMC, rtol=0, atol=1e-15)
    assert scores.mAP == pytest.approx(EXPECTED_MAP, abs=1e-15)
    assert scores.num_valid_queries == 3
    assert scores.num_skipped_queries == 1
    assert scores.rank(3) == pytest.approx(2 / 3)


def test_hand_computed_case_per_query_blocks_and_tensor_labels() -> None:
    scores = cmc_map_from_distances(
        torch.tensor(DISTMAT, dtype=torch.float32),
        torch.tensor(Q_PIDS),
        torch.tensor(G_PIDS),
        torch.tensor(Q_CAMS),
        torch.tensor(G_CAMS),
        chunk_size=1,
    )
    np.testing.assert_allclose(scores.cmc, EXPECTED_CMC, rtol=0, atol=1e-7)
    assert scores.mAP == pytest.approx(EXPECTED_MAP, abs=1e-12)


def test_junk_removal_is_what_makes_rank1_miss() -> None:
    # Give q0's junk image g0 another camera: it becomes a true match ranked first.
    g_cams = G_CAMS.copy()
    g_cams[0] = 5
    scores = cmc_map_from_distances(DISTMAT[:1], Q_PIDS[:1], G_PIDS, Q_CAMS[:1], g_cams)
    assert scores.rank1 == 1.0
    assert scores.mAP == pytest.approx((1 + 2 / 5) / 2)  # matches g0 (1st) and g1 (5th of 6)


def test_distractors_are_ordinary_non_matches() -> None:
    # q3's ranking with the distractor g3 moved to the top: its matches slide down one place.
    row = DISTMAT[3:4].copy()
    row[0, 3] = 0.0
    scores = cmc_map_from_distances(row, Q_PIDS[3:], G_PIDS, Q_CAMS[3:], G_CAMS)
    assert scores.rank1 == 0.0
    assert scores.mAP == pytest.approx((1 / 2 + 2 / 3) / 2)


def test_all_distances_tied_follow_gallery_order() -> None:
    # A collapsed model (every feature equal): the ranking is the gallery order.
    scores = cmc_map_from_distances(np.full((1, 6), 0.5), [1], G_PIDS, [2], G_CAMS)
    assert scores.rank1 == 1.0  # g0 first
    assert scores.mAP == pytest.approx((1 + 2 / 2) / 2)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("chunk_size", [None, 1, 7])
def test_agrees_with_per_query_reference_on_random_data(seed: int, chunk_size: int | None) -> None:
    rng = np.random.default_rng(seed)
    nq, ng = 40, 90
    q_pids = rng.integers(1, 12, nq)  # ids 10 and 11 are rare in the gallery: some queries are skipped
    g_pids = np.concatenate([rng.integers(0, 10, ng - 10), np.full(10, 0)])
    q_cams, g_cams = rng.integers(0, 3, nq), rng.integers(0, 3, ng)
    distmat = rng.integers(0, 8, (nq, ng)) / 8.0  # eight distinct values: ties everywhere
    expected_cmc, expected_map, expected_valid = reference(distmat, q_pids, g_pids, q_cams, g_cams)
    assert 0 < expected_valid < nq  # the data exercises skipping

    scores = cmc_map_from_distances(distmat, q_pids, g_pids, q_cams, g_cams, chunk_size=chunk_size)
    np.testing.assert_array_equal(scores.cmc, expected_cmc)
    assert abs(scores.mAP - expected_map) <= 1e-12
    assert scores.num_valid_queries == expected_valid
    assert scores.num_skipped_queries == nq - expected_valid


def test_features_path_matches_reference_on_cosine_distances() -> None:
    rng = np.random.default_rng(7)
    centres = rng.standard_normal((6, 16))
    q_pids, g_pids = rng.integers(1, 6, 30), rng.integers(0, 6, 120)
    qf = (centres[q_pids] + rng.standard_normal((30, 16))).astype(np.float32)
    gf = (centres[g_pids] + rng.standard_normal((120, 16))).astype(np.float32)
    q_cams, g_cams = rng.integers(0, 4, 30), rng.integers(0, 4, 120)

    distances = cosine_distances(qf, gf)
    unit_q = qf / np.linalg.norm(qf, axis=1, keepdims=True)
    unit_g = gf / np.linalg.norm(gf, axis=1, keepdims=True)
    np.testing.assert_allclose(distances, 1 - unit_q @ unit_g.T, atol=1e-6)

    scores = cmc_map(torch.from_numpy(qf), gf, q_pids, g_pids, q_cams, g_cams, chunk_size=8)
    expected_cmc, expected_map, expected_valid = reference(distances, q_pids, g_pids, q_cams, g_cams)
    np.testing.assert_array_equal(scores.cmc, expected_cmc)
    assert abs(scores.mAP - expected_map) <= 1e-12
    assert scores.num_valid_queries == expected_valid
    assert 0.3 < scores.mAP < 1.0  # identity structure is visible, not trivial

    # Cosine distance ignores feature scale (a power of two keeps the normalised features bit-equal).
    rescaled = cmc_map(4.0 * qf, gf.astype(np.float64), q_pids, g_pids, q_cams, g_cams)
    assert rescaled.cmc.tolist() == scores.cmc.tolist()
    assert rescaled.mAP == pytest.approx(scores.mAP, abs=1e-12)


def test_a_querys_score_does_not_depend_on_the_queries_scored_beside_it() -> None:
    """(found by review) Integer-valued features put gallery images at exactly equal distances; a float32
    product rounded a one-query block differently from a block of eight, so the tie broke either way and
    238 of 2000 draws scored differently with chunk_size=1. Distances are now rounded from float64."""
    rng = np.random.default_rng(0)
    changed = 0
    for trial in range(300):
        dtype = np.float32 if trial % 2 else np.float64  # float64 features too (review of the fix)
        q = rng.integers(-2, 3, (8, 5)).astype(dtype)
        g = rng.integers(-2, 3, (12, 5)).astype(dtype)
        q[np.abs(q).sum(1) == 0, 0] = g[np.abs(g).sum(1) == 0, 0] = 1
        g_pids = rng.integers(0, 2, 12)
        labels = (np.zeros(8, int), g_pids, np.zeros(8, int), np.ones(12, int))
        together, alone = cmc_map(q, g, *labels), cmc_map(q, g, *labels, chunk_size=1)
        changed += (together.mAP, together.cmc.tolist()) != (alone.mAP, alone.cmc.tolist())
    assert changed == 0


def test_parallel_and_identical_features_tie_by_gallery_order_whatever_the_blocking() -> None:
    """(found by review) Rounding the *distance* to float32 kept the product's ±1e-16 near 0: identical
    or parallel features (a collapsed model) ranked by which column of the product they fell in, so 799
    of 1000 draws scored differently with chunk_size=1, and a duplicate later in the gallery could rank
    first. Distances within 2^-40 of 0 are 0 now, and ties keep gallery order."""
    rng = np.random.default_rng(1)
    changed = 0
    for _ in range(40):
        base = rng.normal(size=64).astype(np.float32)
        q, g = base * rng.integers(1, 9, (8, 1)), base * rng.integers(1, 9, (40, 1))
        labels = (np.zeros(8, int), rng.integers(0, 3, 40), np.zeros(8, int), np.ones(40, int))
        together, alone = cmc_map(q, g, *labels), cmc_map(q, g, *labels, chunk_size=1)
        changed += (together.mAP, together.cmc.tolist()) != (alone.mAP, alone.cmc.tolist())
        # every gallery image ties with every other: the scores are those of the gallery order itself
        in_order = cmc_map_from_distances(np.zeros((8, 40)), *labels)
        changed += (together.mAP, together.cmc.tolist()) != (in_order.mAP, in_order.cmc.tolist())
    assert changed == 0


def test_features_packed_in_a_narrow_cone_keep_their_ranking() -> None:
    """(review of the fix above) Rounding the similarity to float32 tied every distance closer than
    6e-8: features 1e-4 apart around a common direction scored rank-1 0.7 % where float64 gives 100 %."""
    rng = np.random.default_rng(0)
    ids, dim = 20, 64
    q_pids, g_pids = rng.integers(0, ids, 60), rng.integers(0, ids, 300)
    centers, common = rng.standard_normal((ids, dim)), 10 * rng.standard_normal(dim)

    def features(pids: np.ndarray) -> np.ndarray:
        return (common + 1e-3 * (centers[pids] + 0.1 * rng.standard_normal((len(pids), dim)))).astype(np.float32)

    scores = cmc_map(features(q_pids), features(g_pids), q_pids, g_pids, np.zeros(60, int), np.ones(300, int))
    assert scores.rank1 == 1.0 and scores.mAP > 0.99


def test_copies_of_one_gallery_feature_tie_near_a_query_whatever_the_blocking() -> None:
    """(review of the fix above) Copies of one gallery feature ≈ 5e-9 from a query came out at distances
    ±1e-16 apart by their column: they did not tie, and mAP moved with the blocking (0.470 / 0.467)."""
    rng = np.random.default_rng(0)
    dim, groups, copies, queries = 512, 20, 5, 60
    centers = rng.standard_normal((groups, dim))
    centers /= np.linalg.norm(centers, axis=1, keepdims=True)
    g = np.repeat(centers, copies, axis=0).astype(np.float32)
    which = rng.integers(0, groups, queries)
    q = (centers[which] + 1e-4 * rng.standard_normal((queries, dim)) / np.sqrt(dim)).astype(np.float32)
    labels = (which * copies + rng.integers(0, copies, queries), np.arange(len(g)), np.ones(queries, int),
              np.zeros(len(g), int))
    distances = cosine_distances(q, g).reshape(queries, groups, copies)
    assert (distances == distances[:, :, :1]).all()
    assert len({cmc_map(q, g, *labels, chunk_size=c).mAP for c in (None, 1, 7)}) == 1
    # rows grouped by the sum of their bits: two different rows with one sum stay two, and copies placed
    # after a different row of that sum still tie (review: [1,2,3],[3,2,1],[2,1,3],[3,2,1],[1,2,3])
    swapped = cosine_distances(np.eye(2), np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 0.0]]))
    assert swapped.tolist() == [[0.0, 1.0, 0.0], [1.0, 0.0, 1.0]]
    from secfed.evaluation.metrics import _distinct_rows

    rows, inverse = _distinct_rows(torch.tensor([[1.0, 2, 3], [3, 2, 1], [2, 1, 3], [3, 2, 1], [1, 2, 3]]))
    assert len(rows) == 3 and inverse[0] == inverse[4] and inverse[1] == inverse[3] != inverse[2]


def test_a_tiny_feature_is_as_close_as_its_direction_says() -> None:
    """(found by review) F.normalize's eps left a feature of norm 1e-13 short of unit length: the
    gallery image parallel to the query came out at distance ≈ 1 and rank-1 was 0."""
    q = np.array([[1.0, 0.0]])
    g = np.array([[1e-13, 0.0], [0.0, 1.0]])
    scores = cmc_map(q, g, [1], [1, 2], [0], [1, 1], max_rank=10)
    assert scores.rank1 == 1.0
    assert cosine_distances(q, g)[0, 0] == 0.0


def test_scores_object() -> None:
    scores = cmc_map_from_distances(DISTMAT, Q_PIDS, G_PIDS, Q_CAMS, G_CAMS, max_rank=12)
    assert len(scores.cmc) == 12
    assert scores.to_dict() == {
        "rank1": scores.rank1,
        "rank5": 1.0,
        "rank10": 1.0,
        "mAP": scores.mAP,
        "num_valid_queries": 3,
        "num_skipped_queries": 1,
    }
    assert scores.to_dict(include_cmc=True)["cmc"] == scores.cmc.tolist()
    with pytest.raises(dataclasses.FrozenInstanceError):
        scores.rank1 = 1.0  # type: ignore[misc]
    with pytest.raises(ValueError):
        scores.cmc[0] = 1.0
    with pytest.raises(ValueError, match="max_rank"):
        scores.rank(13)
    assert isinstance(scores, RetrievalScores)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"gallery_camids": G_CAMS[:5]}, "gallery_camids must be 1-D with 6 entries"),
        ({"query_pids": Q_PIDS.astype(float)}, "query_pids must be integers"),
        ({"distmat": DISTMAT[0]}, "distmat must be a non-empty 2-D"),
        ({"distmat": np.where(DISTMAT > 0.8, np.nan, DISTMAT)}, "distmat contains NaN"),
        ({"max_rank": 5}, "max_rank must be an integer ≥ 10"),
        ({"chunk_size": 0}, "chunk_size must be a positive integer"),
        ({"max_rank": 10**10}, "max_rank 10000000000 is beyond the gallery's 6 images"),  # (review: 75 GiB)
        ({"distmat": DISTMAT > 0.5}, "distmat must hold real numbers of at most 64 bits, got dtype bool"),
        ({"distmat": DISTMAT.astype(np.longdouble)}, "at most 64 bits, got dtype float128"),
        ({"query_pids": np.array([7, 7, 7, 7])}, "none of the 4 queries has a true match"),
    ],
)
def test_bad_inputs_to_distances_name_the_argument(kwargs: dict, message: str) -> None:
    args = {
        "distmat": DISTMAT,
        "query_pids": Q_PIDS,
        "gallery_pids": G_PIDS,
        "query_camids": Q_CAMS,
        "gallery_camids": G_CAMS,
    } | kwargs
    with pytest.raises(ValueError, match=message):
        cmc_map_from_distances(**args)


def test_bad_features_name_the_argument() -> None:
    qf, gf = np.ones((4, 8), np.float32), np.ones((6, 8), np.float32)
    labels = (Q_PIDS, G_PIDS, Q_CAMS, G_CAMS)
    with pytest.raises(ValueError, match="query_features contain NaN"):
        cmc_map(np.full((4, 8), np.nan, np.float32), gf, *labels)
    with pytest.raises(ValueError, match="dimension 8 but gallery_features have 5"):
        cmc_map(qf, gf[:, :5], *labels)
    with pytest.raises(ValueError, match="gallery_features must be floating point"):
        cmc_map(qf, np.ones((6, 8), np.int64), *labels)
    with pytest.raises(ValueError, match="query_features must be a non-empty 2-D"):
        cmc_map(qf[0], gf, *labels)
    with pytest.raises(ValueError, match="gallery_features must be floating point of at most 64 bits"):
        cmc_map(qf, gf.astype(np.longdouble), *labels)  # (found by review: torch's TypeError)


@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.uint32])
def test_integer_distances_rank_exactly(dtype: type) -> None:
    """(found by review) int32 distances went through float32 and int64 through float64: 2^24 + 1
    and 2^24 (2^60 + 1 and 2^60) became one value and the nearer image lost its rank."""
    big = 2**24 if np.dtype(dtype).itemsize == 4 else 2**60
    distances = np.array([[big + 1, big]], dtype=dtype)  # the second image is nearer: a non-match
    assert cmc_map_from_distances(distances, [1], [1, 2], [0], [1, 1], max_rank=10).rank1 == 0.0
