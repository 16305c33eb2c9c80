"""The protocol end to end (property-based): the sum is exact in the ring for random cohorts and
dropouts at every phase, and the round aborts exactly when some needed client keeps fewer than t
neighbours (or, authenticated, the survivors fall below the signature quorum, or a sparse graph's
nonce is withheld)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from secfed.protocols import (
    BelowThreshold,
    GraphParams,
    Phase,
    Quantizer,
    SeedWithheld,
    Session,
    WireTransport,
    drive,
    simulate,
)
PHASES = [Phase.ADVERTISE_KEYS, Phase.GRAPH_SEED, Phase.SHARE_KEYS, Phase.MASKED_INPUT, Phase.UNMASK]


@st.composite
def cohorts(draw, authenticated=False):
    n = draw(st.integers(3, 12))
    sparse = n >= 5 and draw(st.booleans())
    k = draw(st.sampled_from([d for d in range(2, n - 1, 2)])) if sparse else n - 1
    t = draw(st.integers(1, k))
    c = draw(st.integers(0, n // 3))
    params = GraphParams.explicit(n, k, t, corrupt_bound=c, authenticated=authenticated)
    phases = PHASES + ([Phase.CONSISTENCY_CHECK] if authenticated else [])
    dropouts = draw(st.dictionaries(st.integers(0, n - 1), st.sampled_from(phases), min_size=1, max_size=n // 2 + 1))
    bits = draw(st.integers(1, 32))
    d = draw(st.integers(1, 40))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    inputs = [rng.integers(0, 1 << bits, d, dtype=np.uint64).astype(np.uint32) for _ in range(n)]
    return params, dropouts, bits, inputs


def expected_abort(params, graph, dropouts, authenticated) -> bool:
    """The spec, restated with sets: who must keep t neighbours after each phase. ``graph()`` gives
    the round's neighbour graph (known only once the nonces are in)."""
    n, t = params.n_clients, params.threshold

    def left(phase):
        return {i for i in range(n) if dropouts.get(i, 99) > phase}

    def thin(clients, alive):
        return any(sum(v in alive for v in graph().of(u)) < t for u in clients)

    u1, revealed = left(Phase.ADVERTISE_KEYS), left(Phase.GRAPH_SEED)
    u2, u3 = left(Phase.SHARE_KEYS), left(Phase.MASKED_INPUT)
    quorum = params.signature_quorum if authenticated else 0
    if not u1 or len(u1) < quorum:
        return True
    if revealed != u1 and not params.complete:
        return True  # a withheld nonce: the sparse graph cannot be derived
    if not revealed or thin(revealed, revealed) or len(revealed) < quorum:
        return True
    if thin(u2, u2) or len(u2) < quorum:
        return True
    dropped = u2 - u3
    needed = {v for v in dropped if any(w in u3 for w in graph().of(v))}
    if not u3 or thin(u3, u3) or thin(needed, u3) or len(u3) < quorum:
        return True
    asked = u3 & left(Phase.CONSISTENCY_CHECK) if authenticated else u3
    if len(asked) < quorum:
        return True
    responders = asked & left(Phase.UNMASK)
    return thin(u3 - responders, responders) or thin(needed, responders)


def run(params, dropouts, bits, inputs, authenticated=False):
    """One round through the phase driver simulate uses, the server kept to read the round's graph
    even when the round aborts."""
    session = Session.new(params, dimension=len(inputs[0]), ring_bits=bits, input_bound=None,
                          authenticated=authenticated)
    aborted = None
    try:
        drive(session.clients, WireTransport(session.server, params.n_clients), lambda i: inputs[i],
              alive=lambda i, phase: dropouts.get(i, 99) > phase)
        out = session.server.result
    except BelowThreshold as exc:
        aborted = exc
    must_abort = expected_abort(params, lambda: session.server.graph, dropouts, authenticated)
    if aborted is not None:
        assert must_abort, f"spurious abort with dropouts {dropouts}: {aborted}"
        if isinstance(aborted, SeedWithheld):
            assert not params.complete and any(p is Phase.GRAPH_SEED for p in map(Phase.parse, dropouts.values()))
        return
    assert not must_abort, f"round finished although it should have aborted (dropouts {dropouts})"
    survivors = [i for i in range(params.n_clients) if dropouts.get(i, 99) > Phase.MASKED_INPUT]
    assert list(out.survivors) == survivors
    expected = sum(inputs[i].astype(np.uint64) for i in survivors) % (1 << bits)
    assert np.array_equal(out.total, expected.astype(np.uint32))


@settings(max_examples=250, deadline=None)
@given(cohorts())
def test_sum_is_exact_or_round_aborts_exactly_when_below_threshold(case):
    run(*case)


@settings(max_examples=80, deadline=None)
@given(cohorts(authenticated=True))
def test_authenticated_mode_same_property(case):
    run(*case, authenticated=True)


@pytest.mark.parametrize("phase", list(Phase))
def test_one_dropout_at_each_phase_is_survived(phase):
    rng = np.random.default_rng(3)
    inputs = [rng.integers(0, 2**32, 64, dtype=np.uint64).astype(np.uint32) for _ in range(6)]
    out = simulate(inputs, dropouts={2: phase}, params=GraphParams.explicit(6, 5, 3))  # authenticated by default
    in_sum = phase > Phase.MASKED_INPUT
    assert (2 in out.survivors) == in_sum
    expected = sum(inputs[i].astype(np.uint64) for i in out.survivors) % 2**32
    assert np.array_equal(out.total, expected)


def test_sparse_graph_with_many_clients_and_dropouts():
    rng = np.random.default_rng(11)
    n = 40
    params = GraphParams.explicit(n, 10, 4)
    inputs = [rng.integers(0, 2**16, 300, dtype=np.uint32) for _ in range(n)]
    dropouts = {0: "advertise_keys", 9: "share_keys", 17: "masked_input", 25: "masked_input", 33: "unmask"}
    out = simulate(inputs, dropouts=dropouts, ring_bits=16, params=params, authenticated=False)
    expected = sum(inputs[i].astype(np.uint64) for i in out.survivors) % 2**16
    assert len(out.survivors) == n - 4 and np.array_equal(out.total, expected)


def test_below_threshold_aborts_with_a_clear_error():
    inputs = [np.arange(4, dtype=np.uint32)] * 5
    with pytest.raises(BelowThreshold, match=r"neighbours left; 4 are needed.*Round aborted"):
        simulate(inputs, params=GraphParams.explicit(5, 4, 4), dropouts={1: "masked_input"}, authenticated=False)


def test_float_aggregate_is_bit_identical_across_runs_with_fresh_keys():
    rng = np.random.default_rng(0)
    updates = [rng.normal(0, 0.1, 500) for _ in range(6)]
    q = Quantizer.for_cohort(6, clip=0.5)
    runs = [simulate(updates, quantizer=q, rng=np.random.default_rng(42), dropouts={4: "masked_input"})
            for _ in range(2)]
    assert runs[0].config.session_id != runs[1].config.session_id  # different keys, graphs, masks
    assert np.array_equal(runs[0].total, runs[1].total)
    plain = sum(np.clip(updates[i], -0.5, 0.5) for i in runs[0].survivors)
    assert np.abs(runs[0].total - plain).max() < 6 / q.scale


def test_the_server_keeps_no_masked_vector_once_it_is_summed(make_round):
    """Server memory is O(d): each masked vector is added into the running sum on arrival (and
    hashed in the same pass) and then dropped — none is referenced after ``receive`` returns."""
    import weakref

    r = make_round(5, threshold=2, dimension=1000)
    deliveries = r.share_keys(r.advertise())
    vectors = []
    for i, delivery in deliveries.items():
        r.clients[i].receive_shares(delivery)
        message = r.clients[i].mask(r.inputs[i])
        vectors.append(weakref.ref(message.vector))
        r.server.receive(message)
        del message  # the last reference outside the server: no cycles, so freed now unless the server kept it
    assert [ref() for ref in vectors] == [None] * 5
    r.unmask(r.server.close_phase())
    assert np.array_equal(r.server.result.total, r.expected_sum(range(5)))
