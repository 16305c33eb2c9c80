"""export_state / from_state: a client that lives only between messages (a Flower ClientApp is a
fresh process per message) runs the round exactly like one that stays in memory, and its saved
state is a versioned, length-checked layout that refuses anything it did not write."""

from __future__ import annotations

import dataclasses
import struct

import numpy as np
import pytest

from secfed.protocols import (
    ClientState,
    ConfigMismatch,
    MalformedMessage,
    ModelMismatch,
    ReplayedMessage,
    SecAggClient,
    UnsupportedVersion,
)


def revive(r, i: int) -> SecAggClient:
    """Client i as a fresh process sees it: rebuilt from its saved bytes, nothing else kept."""
    old = r.clients[i]
    saved = old.export_state()
    new = SecAggClient.from_state(r.config, saved, identity_key=r.identities[i] if r.config.authenticated else None)
    assert new.export_state() == saved  # the layout round-trips byte for byte
    assert new.state is old.state and new.neighbours == old.neighbours
    r.clients[i] = new
    return new


def revive_all(r) -> None:
    for i in range(len(r.clients)):
        revive(r, i)


@pytest.mark.parametrize("authenticated,degree", [(True, 4), (False, 4), (False, None)])
def test_a_round_restored_between_every_step_gives_the_exact_sum(make_round, authenticated, degree):
    """Sparse (degree 4) and complete graph: the listed graph commitments are kept as ids and a
    digest, or one by one, and both survive the trip through bytes."""
    r = make_round(6, degree=degree, threshold=2, authenticated=authenticated, dimension=32)
    revive_all(r)
    commitments = r.commit()
    revive_all(r)
    rosters = r.reveal(commitments)
    revive_all(r)
    deliveries = r.share_keys(rosters)
    revive_all(r)
    outbox = r.masked_input(deliveries, skip={3})  # client 3 vanishes after sharing keys
    revive_all(r)
    if authenticated:
        outbox = r.consistency(outbox)
        revive_all(r)
    r.unmask(outbox)
    survivors = [i for i in range(6) if i != 3]
    assert r.server.result.survivors == tuple(survivors)
    np.testing.assert_array_equal(r.server.result.total, r.expected_sum(survivors))
    done = r.clients[0].export_state()
    assert r.clients[0].state is ClientState.DONE
    assert struct.unpack_from("<H", done, 6)[0] & 1 == 0  # no secrets left in a finished client's state


def test_a_restored_client_keeps_its_place_in_the_round(make_round):
    r = make_round(4, threshold=2, authenticated=True)
    rosters = r.advertise()
    r.clients[0].share_keys(rosters[0])
    client = revive(r, 0)
    with pytest.raises(ReplayedMessage):
        client.share_keys(rosters[0])  # the same roster twice is still refused
    assert client.state is ClientState.AWAIT_SHARES


def test_a_client_restored_after_sharing_keys_still_refuses_another_model(make_round):
    """The model digest is given at share_keys, after the advertisement: it must survive the trip
    through bytes, or a Flower node (a fresh process per message) would compare its neighbours'
    digests with zeros."""
    r = make_round(4, threshold=2, authenticated=True)
    r.phases.model_hashes = [b"a" * 32, b"a" * 32, b"b" * 32, b"a" * 32]  # client 2 was given another model
    deliveries = r.share_keys(r.advertise())
    client = revive(r, 0)
    assert client.model_hash == b"a" * 32
    with pytest.raises(ModelMismatch, match="neighbour 2 trained on model"):
        client.receive_shares(deliveries[0])
    assert client.state is ClientState.ABORTED


@pytest.fixture
def saved(make_round):
    """A state mid-round (shares received, secrets held) and the round it belongs to."""
    r = make_round(4, threshold=2, authenticated=True)
    deliveries = r.share_keys(r.advertise())
    r.clients[1].receive_shares(deliveries[1])
    return r, r.clients[1].export_state()


def load(r, data: bytes, i: int = 1) -> SecAggClient:
    return SecAggClient.from_state(r.config, data, identity_key=r.identities[i])


def test_every_truncation_and_any_trailing_byte_is_refused(saved):
    r, data = saved
    for cut in range(len(data)):
        with pytest.raises(MalformedMessage):
            load(r, data[:cut])
    with pytest.raises(MalformedMessage, match="body bytes"):
        load(r, data + b"\x00")


def test_other_versions_magic_flags_and_states_are_refused(saved):
    r, data = saved
    with pytest.raises(UnsupportedVersion):
        load(r, data[:4] + bytes([data[4] + 1]) + data[5:])
    with pytest.raises(MalformedMessage, match="magic"):
        load(r, b"SAGG" + data[4:])
    with pytest.raises(MalformedMessage, match="unknown state"):
        load(r, data[:5] + bytes([200]) + data[6:])
    start = struct.pack("<B", list(ClientState).index(ClientState.START))
    with pytest.raises(MalformedMessage, match="do not fit"):
        load(r, data[:5] + start + data[6:])  # secrets in a state that cannot have any
    with pytest.raises(MalformedMessage, match="flags"):
        load(r, data[:6] + struct.pack("<H", 0x80) + data[8:])


def test_a_state_from_another_session_or_identity_is_refused(saved, make_round):
    r, data = saved
    other = dataclasses.replace(r.config, round=r.config.round + 1)
    with pytest.raises(ConfigMismatch):
        SecAggClient.from_state(other, data, identity_key=r.identities[1])
    with pytest.raises(MalformedMessage, match="saved by client 1, whose identity key is not the one given"):
        load(r, data, i=2)
    # the saved client id altered (the header's last but one field): typed, not a bare ValueError (review 83)
    other_id = data[:40] + struct.pack("<I", 2) + data[44:]
    with pytest.raises(MalformedMessage, match="saved by client 2"):
        load(r, other_id)


def test_a_saved_seed_that_is_not_the_hash_of_the_saved_keys_and_roster_is_refused(saved):
    """On the complete graph the seed is the hash of the client's keys and its roster, both in the
    state: a state whose seed is another is refused at restore, not at the next message with
    DecryptionFailed (review 86)."""
    r, data = saved
    at = data.index(r.clients[1]._seed)
    with pytest.raises(MalformedMessage, match="graph seed is not the hash"):
        load(r, data[:at] + bytes([data[at] ^ 1]) + data[at + 1:])


def test_a_held_share_that_does_not_fit_the_roster_is_refused(saved):
    r, data = saved
    client = load(r, data)
    peer = min(client._held)
    entry = struct.pack("<II", peer, client._held[peer].index)
    at = data.index(entry)
    bad = data[:at] + struct.pack("<II", peer, client._held[peer].index + 1) + data[at + 8 :]
    with pytest.raises(MalformedMessage, match="held share"):
        load(r, bad)


def test_a_listed_commitment_altered_in_the_saved_state_is_refused(make_round):
    """Between the commitments and the roster a sparse-graph client keeps the ids and digest of the
    list it was shown; a saved digest that was changed is refused when the nonces are revealed.
    (The complete graph has no graph-seed phase and keeps no list.)"""
    from secfed.protocols import InconsistentShares

    r = make_round(5, degree=2, threshold=2)
    commitments = r.commit()
    r.server.receive(r.wire(r.clients[0].reveal_graph_nonce(r.wire(commitments[0]))))
    data = r.clients[0].export_state()
    assert r.clients[0].state is ClientState.AWAIT_ROSTER
    assert struct.unpack_from("<H", data, 6)[0] & 8  # the listed commitments are in the state
    digest_at = data.index(struct.pack("<6I", 5, 0, 1, 2, 3, 4)) + 4 * 6
    bad = data[:digest_at] + bytes([data[digest_at] ^ 1]) + data[digest_at + 1 :]
    r.clients[0] = SecAggClient.from_state(r.config, bad)
    rosters = r.reveal(commitments, skip={0})  # client 0 revealed above
    with pytest.raises(InconsistentShares):
        r.clients[0].share_keys(rosters[0])


def test_a_complete_graph_client_awaiting_its_roster_restores_and_shares_keys(make_round):
    """Saved right after advertising (the complete graph's next message is the roster), the state
    carries no listed commitments, and the restored client shares keys like the original."""
    r = make_round(4, threshold=2)
    rosters = r.commit()
    data = r.clients[0].export_state()
    assert not struct.unpack_from("<H", data, 6)[0] & 8
    r.clients[0] = SecAggClient.from_state(r.config, data)
    r.unmask(r.masked_input(r.share_keys(rosters)))
    assert np.array_equal(r.server.result.total, r.expected_sum(range(4)))


def test_a_signed_survivor_set_outside_the_cohort_is_refused_on_restore(make_round):
    """Saved bytes are input: a signed survivor list naming a client outside the cohort (or
    omitting the client itself) is refused on restore with a typed error, never an IndexError
    when the client later unmasks."""
    r = make_round(5, threshold=2, authenticated=True)
    lists = r.masked_input(r.share_keys(r.advertise()))
    r.clients[1].consistency_check(lists[1])
    data = r.clients[1].export_state()
    survivors = struct.pack("<I5I", 5, 0, 1, 2, 3, 4)
    assert data.endswith(survivors)  # the signed set closes the layout
    for bad, match in ((struct.pack("<I5I", 5, 0, 1, 2, 3, 5), "outside the cohort"),
                       (struct.pack("<I4I", 4, 0, 2, 3, 4), "omits client 1")):
        forged = data[: -len(survivors)] + bad
        forged = forged[:44] + struct.pack("<I", len(forged) - 48) + forged[48:]  # the header's body length
        with pytest.raises(MalformedMessage, match=match):
            load(r, forged)
    assert load(r, data).state is ClientState.AWAIT_UNMASK


def test_an_authenticated_client_awaiting_unmask_without_its_signed_set_is_refused_on_restore(make_round):
    """The parts of saved bytes must agree: an authenticated client awaiting the unmask request has
    signed a survivor set, so a state without one (flag cleared, list removed) is refused on
    restore — before, it restored, and the genuine request then failed with InconsistentView,
    blaming the server for an equivocation it never made."""
    r = make_round(5, threshold=2, authenticated=True)
    lists = r.masked_input(r.share_keys(r.advertise()))
    r.clients[1].consistency_check(lists[1])
    data = r.clients[1].export_state()
    survivors = struct.pack("<I5I", 5, 0, 1, 2, 3, 4)
    assert data.endswith(survivors)
    flags = struct.unpack_from("<H", data, 6)[0]
    body = data[48 : -len(survivors)]
    unsigned = data[:6] + struct.pack("<H", flags & ~4) + data[8:44] + struct.pack("<I", len(body)) + body
    with pytest.raises(MalformedMessage, match="do not fit state await_unmask"):
        load(r, unsigned)
    assert load(r, data).state is ClientState.AWAIT_UNMASK
