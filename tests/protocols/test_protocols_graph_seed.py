"""The SecAgg+ neighbour graph comes from nonces every client commits to before any is revealed,
not from the session id the server picks: the server cannot grind session ids for a graph that
surrounds a victim with colluders, nor swap, add or withhold nonces once it has seen them."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from secfed.protocols import (
    ClientState,
    InconsistentShares,
    InconsistentView,
    MalformedMessage,
    Phase,
    SeedWithheld,
    UnknownClient,
)

replace = dataclasses.replace
SPARSE = dict(degree=4, threshold=2)


def graph_of(r) -> list[tuple[int, ...]]:
    return [r.graph.of(i) for i in range(len(r.clients))]


def test_same_session_id_and_round_give_unrelated_graphs(make_round):
    """Before, the ring order hashed the session id and round: a server choosing the session id chose
    the graph (and could try ids until colluders surround a victim). Now two rounds with the very
    same configuration draw independent graphs."""
    graphs = []
    for _ in range(2):
        r = make_round(12, **SPARSE)
        r.advertise()
        graphs.append(graph_of(r))
    assert graphs[0] != graphs[1]


def test_every_client_derives_the_servers_graph_from_the_nonces(make_round):
    r = make_round(12, **SPARSE)
    r.share_keys(r.advertise())
    for c in r.clients:
        assert c.neighbours == r.graph.of(c.id)


@pytest.fixture
def revealed(make_round):
    """Commitments listed, every nonce revealed; the key rosters not yet delivered."""
    r = make_round(12, **SPARSE)
    rosters = r.reveal(r.commit())
    return r, rosters


def test_a_withheld_nonce_aborts_a_sparse_round_on_both_sides(make_round):
    r = make_round(12, **SPARSE)
    commitments = r.commit()
    with pytest.raises(SeedWithheld, match=r"clients \[5\]"):
        r.reveal(commitments, skip=(5,))
    r = make_round(12, **SPARSE)
    rosters = r.reveal(r.commit())
    short = replace(rosters[0], nonces=tuple(p for p in rosters[0].nonces if p[0] != 5))
    with pytest.raises(SeedWithheld, match=r"clients \[5\]"):  # the server cannot drop one silently
        r.clients[0].share_keys(short)
    assert r.clients[0].state is ClientState.ABORTED


def test_the_complete_graph_skips_the_graph_seed_phase(make_round):
    """The complete graph does not depend on a seed: the key roster follows the advertisement
    directly (one round trip fewer) and carries no nonces; a client that advertised and then
    vanished is simply not a survivor."""
    r = make_round(5, threshold=2)
    rosters = r.commit()
    assert r.server.phase is Phase.SHARE_KEYS
    assert all(type(m).__name__ == "KeyRoster" and not m.nonces for m in rosters.values())
    assert all(c.state is ClientState.AWAIT_ROSTER for c in r.clients)
    deliveries = r.share_keys(rosters, skip=(4,))  # 4 advertised, then vanished
    r.unmask(r.masked_input(deliveries))
    assert r.server.result.survivors == (0, 1, 2, 3)
    assert np.array_equal(r.server.result.total, r.expected_sum((0, 1, 2, 3)))


def test_a_complete_graph_roster_carrying_nonces_is_refused(make_round):
    r = make_round(4, threshold=2)
    roster = r.commit()[0]
    with pytest.raises(MalformedMessage, match="complete graph uses none"):
        r.clients[0].share_keys(replace(roster, nonces=((1, bytes(16)),)))
    assert r.clients[0].state is ClientState.ABORTED


def test_two_rosters_of_the_complete_graph_give_two_seeds(make_round):
    """The seed binds the roster each client was shown into its masked input and its consistency
    signature: a server that hides client 4 from client 0 but not from client 1 leaves them with
    different seeds, so neither's signature certifies the other's view."""
    r = make_round(5, threshold=2, authenticated=True)
    rosters = r.commit()
    hidden = replace(rosters[0], entries=tuple(e for e in rosters[0].entries if e.client != 4))
    r.clients[0].share_keys(r.wire(hidden))
    r.clients[1].share_keys(r.wire(rosters[1]))
    assert r.clients[0]._seed != r.clients[1]._seed
    assert r.clients[1]._seed == r.server._seed  # the honest view is the server's own


def test_the_server_cannot_alter_or_omit_nonces(revealed):
    r, rosters = revealed
    altered = replace(rosters[0], nonces=tuple((v, bytes(16) if v == 3 else n) for v, n in rosters[0].nonces))
    with pytest.raises(InconsistentShares, match="graph nonces do not match the commitments"):
        r.clients[0].share_keys(altered)
    assert r.clients[0].state is ClientState.ABORTED
    own_missing = replace(rosters[1], nonces=tuple(p for p in rosters[1].nonces if p[0] != 1))
    with pytest.raises(InconsistentView, match="own graph nonce"):
        r.clients[1].share_keys(own_missing)


def test_the_commitments_must_include_the_clients_own_unaltered(make_round):
    r = make_round(12, **SPARSE)
    commitments = r.commit()
    listed = commitments[0]
    without = replace(listed, commitments=tuple(p for p in listed.commitments if p[0] != 0))
    with pytest.raises(InconsistentView, match="own"):
        r.clients[0].reveal_graph_nonce(without)
    swapped = replace(commitments[1], commitments=tuple((v, bytes(32)) if v == 1 else (v, c)
                                                        for v, c in commitments[1].commitments))
    with pytest.raises(InconsistentView, match="own"):
        r.clients[1].reveal_graph_nonce(swapped)


def test_a_nonce_of_a_client_that_never_committed_is_refused(make_round):
    """The server lists 11 commitments to client 0 (leaving out 7) and then tries to bring 7's
    nonce into 0's seed after seeing the reveals."""
    r = make_round(12, **SPARSE)
    commitments = r.commit()
    commitments[0] = replace(commitments[0], commitments=tuple(p for p in commitments[0].commitments if p[0] != 7))
    rosters = r.reveal(commitments)
    with pytest.raises(UnknownClient, match="client 7, which committed to none"):
        r.clients[0].share_keys(rosters[0])


def test_a_roster_entry_must_carry_the_listed_graph_commitment(revealed):
    r, rosters = revealed
    roster = rosters[0]
    entry = roster.entries[0]
    forged = replace(roster, entries=(replace(entry, graph_commitment=bytes(32)),) + roster.entries[1:])
    with pytest.raises(InconsistentView, match=f"neighbour {entry.client}'s graph commitment"):
        r.clients[0].share_keys(forged)


def test_bulk_commitments_seed_and_consistency_payload_match_their_definitions(make_round):
    """The bulk forms used for whole cohorts equal the one-at-a-time transcript definitions."""
    import hashlib

    from secfed.protocols.secagg import keys
    from secfed.protocols.secagg.idtable import IdTable

    cfg = make_round(5, threshold=2).config
    pairs = tuple((v, bytes([v % 256]) * 16) for v in (0, 3, 4, 70_000))
    nonces = IdTable.from_pairs(pairs, 16)
    assert keys.graph_commitments(cfg, nonces) == [keys.graph_commitment(cfg, v, x) for v, x in pairs]
    flat = [part for pair in pairs for part in pair]
    assert keys.graph_seed(cfg, nonces) == hashlib.sha256(cfg.binding("graph-seed", *flat)).digest()
    survivors = (0, 2, 3, 4)
    assert keys.consistency_payload(cfg, b"s" * 32, survivors) == cfg.binding("consistency", b"s" * 32, *survivors)
