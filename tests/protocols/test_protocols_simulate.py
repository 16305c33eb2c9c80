"""simulate(): argument checking, byte accounting, dropout schedules, the per-step timing hook; the
client's replaceable primitives."""

from __future__ import annotations

import numpy as np
import pytest

from secfed.protocols import (
    ClientPrimitives,
    GraphParams,
    Phase,
    Quantizer,
    Session,
    WireTransport,
    drive,
    random_dropouts,
    simulate,
)
from secfed.protocols.crypto import verify_all
from secfed.protocols.prg import mask_into
from secfed.protocols.shamir import split
from secfed.protocols.secagg.messages import HEADER_BYTES


def ring(n, d, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 2**32, d, dtype=np.uint64).astype(np.uint32) for _ in range(n)]


def test_arguments_are_checked_before_anything_runs():
    with pytest.raises(ValueError, match="at least 2"):
        simulate(ring(1, 4))
    with pytest.raises(ValueError, match="one length"):
        simulate([np.zeros(3, np.uint32), np.zeros(4, np.uint32)])
    with pytest.raises(TypeError, match="need a quantizer"):
        simulate([np.zeros(3), np.zeros(3)])
    q = Quantizer.for_cohort(3, 1.0)
    with pytest.raises(ValueError, match="rng"):
        simulate([np.zeros(3)] * 3, quantizer=q)
    with pytest.raises(ValueError, match="sized for 3"):
        simulate([np.zeros(3)] * 4, quantizer=q, rng=np.random.default_rng(0))
    with pytest.raises(ValueError, match="client 7"):
        simulate(ring(3, 4), dropouts={7: "unmask"})
    with pytest.raises(ValueError, match="unknown phase 'vanish'.*masked_input"):
        simulate(ring(3, 4), dropouts={1: "vanish"})
    with pytest.raises(ValueError, match="only authenticated mode"):
        simulate(ring(3, 4), dropouts={1: "consistency_check"}, authenticated=False)
    with pytest.raises(ValueError, match="params are for 5"):
        simulate(ring(3, 4), params=GraphParams.explicit(5, 4, 2))


def test_bytes_are_counted_per_client_and_the_vector_costs_exactly_4_bytes_per_entry():
    params = GraphParams.explicit(6, 5, 2)  # quorum ⌊(6 + 1)/2⌋ + 1 = 4: two dropouts leave it
    small = simulate(ring(6, 10), params=params, dropouts={1: "advertise_keys", 2: "masked_input"})
    large = simulate(ring(6, 1010), params=params, dropouts={1: "advertise_keys", 2: "masked_input"})
    assert small.bytes_sent[1] == small.bytes_received[1] == 0  # never showed up
    for i in (0, 3, 4, 5):
        assert large.bytes_sent[i] - small.bytes_sent[i] == 4 * 1000
        assert large.bytes_received[i] == small.bytes_received[i]  # downloads do not grow with d
    assert large.bytes_sent[2] == small.bytes_sent[2] > 0  # shared keys, never uploaded a vector


def test_upload_stays_within_5_percent_of_float32_at_25m_for_100_neighbours():
    """Per-client protocol overhead grows linearly with the neighbour count; extrapolate it to
    k = 99 (plain SecAgg, n = 100, authenticated) and compare to a 25M-entry float32 upload."""
    overhead = {}
    for n in (5, 9):
        out = simulate(ring(n, 16), params=GraphParams.explicit(n, n - 1, 2, authenticated=True), authenticated=True)
        overhead[n - 1] = max(out.bytes_sent) - 4 * 16
    per_neighbour = (overhead[8] - overhead[4]) / 4
    at_99 = overhead[4] + per_neighbour * (99 - 4)
    d = 25_000_000
    assert (4 * d + at_99) / (4 * d) <= 1.05
    assert at_99 < 20_000  # a few kilobytes: keys, sealed shares, signatures, revealed shares
    assert HEADER_BYTES == 48


def test_result_partitions_the_cohort():
    out = simulate(ring(5, 3), dropouts={0: Phase.SHARE_KEYS, 4: "UNMASK"}, params=GraphParams.explicit(5, 4, 2))
    assert out.survivors == (1, 2, 3, 4) and out.dropped == (0,)
    assert out.total is out.ring_total and out.params.degree == 4


def test_random_dropouts_follow_the_rate_and_the_seed():
    assert random_dropouts(50, 0.0, np.random.default_rng(0)) == {}
    everyone = random_dropouts(50, 1.0, np.random.default_rng(0), authenticated=False)
    assert sorted(everyone) == list(range(50)) and Phase.CONSISTENCY_CHECK not in everyone.values()
    a = random_dropouts(1000, 0.1, np.random.default_rng(7))
    assert a == random_dropouts(1000, 0.1, np.random.default_rng(7))
    assert 60 < len(a) < 140
    assert Phase.CONSISTENCY_CHECK in random_dropouts(200, 1.0, np.random.default_rng(1)).values()  # default
    with pytest.raises(ValueError, match="rate"):
        random_dropouts(3, 1.5, np.random.default_rng(0))


def test_phase_parse_accepts_names_and_numbers():
    assert Phase.parse("Masked-Input") is Phase.MASKED_INPUT
    assert Phase.parse(5) is Phase.UNMASK
    assert Phase.parse("graph_seed") is Phase.GRAPH_SEED
    assert Phase.parse(Phase.SHARE_KEYS) is Phase.SHARE_KEYS


CLIENT_STEPS = ["advertise_keys", "reveal_graph_nonce", "share_keys", "receive_shares", "quantize", "mask",
                "consistency_check", "unmask"]


@pytest.mark.parametrize("n, k, t", [(8, 4, 3), (5, 4, 3)], ids=["sparse", "complete"])
def test_on_step_times_every_step_of_every_party_in_protocol_order(n, k, t):
    """The hook the benches time rounds with: each live client's steps once each, in order, with the
    phase they belong to; a client that vanishes at the masked input has no step from then on; the
    server closes each phase once (the complete graph has no graph-seed phase); the wire carries
    exactly the bytes counted."""
    steps = []
    params = GraphParams.explicit(n, k, t)
    out = simulate(ring(n, 16), dropouts={3: "masked_input"}, params=params, on_step=steps.append)
    expected = [s for s in CLIENT_STEPS if not (params.complete and s == "reveal_graph_nonce")]
    uploads_each = 5 if params.complete else 6
    assert all(s.wall >= 0 and s.cpu >= 0 for s in steps)
    for i in range(n):
        mine = [s.step for s in steps if s.party == "client" and s.client == i]
        assert mine == (expected[:expected.index("share_keys") + 1] if i == 3 else expected), i
    phases = {s.step: s.phase for s in steps if s.party == "client" and s.client == 0}
    assert phases["mask"] is phases["quantize"] is Phase.MASKED_INPUT and phases["unmask"] is Phase.UNMASK
    closed = [s.phase for s in steps if s.party == "server" and s.step == "close"]
    assert closed == [p for p in Phase if not (params.complete and p is Phase.GRAPH_SEED)]
    received = [s.client for s in steps if s.party == "server" and s.step == "receive"]
    uploads = [s.client for s in steps if s.party == "wire" and s.step == "upload"]
    assert received == uploads and received.count(3) == uploads_each - 3 and received.count(0) == uploads_each
    assert out.survivors == tuple(i for i in range(n) if i != 3)


def test_primitives_replaced_in_some_clients_are_the_ones_they_call():
    """``primitives=`` is the seam a load generator replaces (and nothing else changes): the
    replaced clients call theirs — one mask pass, two splits, one quorum check each — the others
    the protocol's, and the round is the same round (exact sum)."""
    calls = []

    def recording(name, real):
        def call(*args, **kwargs):
            calls.append(name)
            return real(*args, **kwargs)
        return call

    recorder = ClientPrimitives(mask_into=recording("mask_into", mask_into), split=recording("split", split),
                                verify_all=recording("verify_all", verify_all))
    inputs = ring(4, 32)
    session = Session.new(GraphParams.explicit(4, 3, 2), dimension=32, ring_bits=32, input_bound=None)
    session.clients[1] = session.client(1, primitives=recorder)
    drive(session.clients, WireTransport(session.server, 4), lambda i: inputs[i])
    assert sorted(calls) == ["mask_into", "split", "split", "verify_all"]
    expected = sum(x.astype(np.uint64) for x in inputs) % 2**32
    assert np.array_equal(session.server.result.total, expected)
