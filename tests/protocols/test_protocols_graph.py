"""The SecAgg+ neighbour graph and the (k, t) choice: structure, exact tails, targets met."""

from __future__ import annotations

import math

import pytest
from scipy import stats

from secfed.protocols import GraphParams, NeighbourGraph, choose_params
from secfed.protocols.secagg import graph as g


def test_harary_graph_is_k_regular_symmetric_and_a_ring():
    params = GraphParams.explicit(30, 6, 3)
    graph = NeighbourGraph(params, bytes(32))
    for i in range(30):
        assert len(graph.of(i)) == 6 and i not in graph.of(i)
        assert graph.of(i) == tuple(sorted(graph.of(i)))
        for j in graph.of(i):
            assert graph.are_neighbours(j, i)
            assert graph.share_index(i, j) == graph.of(i).index(j) + 1
    # Walking "first new neighbour" from 0 visits everyone: the graph is one ring.
    seen, node = {0}, 0
    edges = {frozenset((i, j)) for i in range(30) for j in graph.of(i)}
    assert len(edges) == 30 * 6 // 2
    frontier = [0]
    while frontier:
        node = frontier.pop()
        for j in graph.of(node):
            if j not in seen:
                seen.add(j)
                frontier.append(j)
    assert seen == set(range(30))


def test_ring_order_depends_on_the_graph_seed_only():
    params = GraphParams.explicit(40, 4, 2)
    a = NeighbourGraph(params, bytes(32))
    assert [a.of(i) for i in range(40)] == [NeighbourGraph(params, bytes(32)).of(i) for i in range(40)]
    assert [a.of(i) for i in range(40)] != [NeighbourGraph(params, b"\x01" + bytes(31)).of(i) for i in range(40)]


def test_complete_graph_is_plain_secagg():
    graph = NeighbourGraph(GraphParams.explicit(5, 4, 3), bytes(32))
    assert graph.params.complete
    assert graph.of(2) == (0, 1, 3, 4)


@pytest.mark.parametrize("n, k, c, t", [(100, 20, 10, 5), (1000, 40, 200, 20), (50, 49, 7, 3)])
def test_tails_match_scipy(n, k, c, t):
    exposure = g._exposure_tails(n, k, c)[t]
    assert math.isclose(exposure, min(1.0, (n - c) * stats.hypergeom(n - 1, c, k).sf(t - 1)), rel_tol=1e-9, abs_tol=1e-300)
    aborts = g._abort_tails(n, k, 0.1)[t]
    assert math.isclose(aborts, min(1.0, n * stats.binom(k, 0.9).cdf(t - 1)), rel_tol=1e-9, abs_tol=1e-300)
    if k < n - 1:
        gone = sum(stats.hypergeom(n, c, k).pmf(j) * 0.1 ** (k - j) for j in range(min(k, c) + 1))
        assert math.isclose(g._split_bound(n, k, c, 0.1), min(1.0, math.comb(n, 2) * gone), rel_tol=1e-9)


@pytest.mark.parametrize("n", [30, 100, 1000, 5000])
@pytest.mark.parametrize("gamma", [0.05, 0.2, 1 / 3])
def test_chosen_params_meet_both_targets_and_k_is_minimal(n, gamma):
    p = choose_params(n, dropout_rate=0.1, corrupt_fraction=gamma, authenticated=False)
    assert p.security_failure <= 2.0**-40
    assert p.correctness_failure <= 2.0**-20
    assert p.corrupt_bound == math.floor(gamma * n)
    if not p.complete:
        assert p.degree % 2 == 0 and p.degree < 2 * 20 * math.log2(n)  # O(log n) neighbours
        smaller = p.degree - 2
        if smaller >= 2:  # no smaller degree admits a threshold meeting both targets
            ok = any(
                GraphParams.explicit(n, smaller, t, corrupt_bound=p.corrupt_bound, dropout_rate=0.1,
                                     authenticated=False).security_failure <= 2.0**-40
                and GraphParams.explicit(n, smaller, t, corrupt_bound=p.corrupt_bound, dropout_rate=0.1,
                                         authenticated=False).correctness_failure <= 2.0**-20
                for t in range(1, smaller + 1)
            )
            assert not ok


def test_small_cohorts_fall_back_to_the_complete_graph_with_honest_figures():
    p = choose_params(10, dropout_rate=0.1, corrupt_fraction=0.2, authenticated=False)
    assert p.complete and p.threshold == 3  # c + 1: nothing larger meets the correctness target
    assert p.security_failure == 0.0
    assert p.correctness_failure > 2.0**-20  # reported, not hidden
    assert choose_params(1000, complete=True).complete


def test_authenticated_quorum_and_validation():
    p = choose_params(100)  # authenticated is the default
    assert p.authenticated and p.signature_quorum == (100 + p.corrupt_bound) // 2 + 1
    # the quorum's failure figure is counted: at n = 30 it dominates, and is reported, not hidden
    small = choose_params(30, corrupt_fraction=0.2)
    plain = choose_params(30, corrupt_fraction=0.2, authenticated=False)
    assert small.correctness_failure > plain.correctness_failure
    with pytest.raises(ValueError, match="even"):
        GraphParams(10, 3, 2)
    with pytest.raises(ValueError, match="threshold"):
        GraphParams(10, 4, 5)
    with pytest.raises(ValueError, match="at least 2"):
        choose_params(1)
    with pytest.raises(ValueError, match="no threshold"):
        choose_params(3, corrupt_fraction=0.9)


def test_two_clients_use_the_complete_graph_and_a_lone_survivor_is_never_unmasked():
    import numpy as np

    from secfed.protocols import BelowThreshold, simulate

    params = choose_params(2)
    assert (params.degree, params.threshold) == (1, 1)
    inputs = [np.arange(4, dtype=np.uint32), np.full(4, 7, dtype=np.uint32)]
    assert simulate(inputs).total.tolist() == [7, 8, 9, 10]
    with pytest.raises(BelowThreshold):  # the "sum" of one client would be its input
        simulate(inputs, dropouts={0: "masked_input"})
