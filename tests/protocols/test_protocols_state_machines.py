"""The state machines refuse on their own what the wire decoder refuses: an embedding that hands
client and server objects typed messages directly (no encode/decode) gets the same typed errors,
never a TypeError/AttributeError from deep inside and never a silently wrong step."""

from __future__ import annotations

import dataclasses
import struct

import numpy as np
import pytest

from secfed.protocols import (
    BelowThreshold,
    ClientState,
    MalformedMessage,
    OverflowRefused,
    ProtocolError,
    SessionConfig,
    WrongPhase,
)
from secfed.protocols.secagg.messages import RosterEntry, SealedShare, encode_secrets
from secfed.protocols.shamir import SHARE_BYTES

replace = dataclasses.replace


def run_to_unmask(r):
    return r.masked_input(r.share_keys(r.advertise()))


# ---- wrong message types and non-messages -------------------------------------------------------


def test_client_refuses_a_message_of_the_wrong_type_with_wrong_phase(make_round):
    r = make_round(4, threshold=2)
    rosters = r.advertise()
    client = r.clients[0]
    with pytest.raises(WrongPhase, match="KeyRoster"):
        client.receive_shares(rosters[0])  # a roster where a share delivery is due
    with pytest.raises(WrongPhase):
        client.unmask(rosters[0])
    assert client.state is not ClientState.ABORTED
    client.share_keys(rosters[0])  # the right message still works


@pytest.mark.parametrize("junk", ["hello", None, 42, object(), b"SAGG"])
def test_client_and_server_refuse_non_messages_with_malformed_message(make_round, junk):
    r = make_round(3, threshold=1)
    with pytest.raises(MalformedMessage, match="not a protocol message"):
        r.server.receive(junk)
    with pytest.raises(MalformedMessage, match="not a protocol message"):
        r.clients[0].handle(junk)
    r.clients[0].advertise_keys()
    with pytest.raises(MalformedMessage, match="not a protocol message"):
        r.clients[0].share_keys(junk)


# ---- field types and structure that only the decoder used to check ------------------------------


def test_hand_built_messages_with_bad_fields_are_malformed_not_type_errors(make_round):
    r = make_round(3, threshold=1)
    advert = r.clients[0].advertise_keys()
    for bad in (dict(sender="0"), dict(round=-1), dict(session_id="x" * 16), dict(enc_public=b"short"),
                dict(signature=b"x" * 10), dict(recipient=2**32)):
        with pytest.raises(MalformedMessage):
            r.server.receive(replace(advert, **bad))
    r.server.receive(advert)  # nothing above changed the server's state


def test_masked_input_that_is_not_a_uint32_vector_is_malformed(make_round):
    r = make_round(3, threshold=1)
    deliveries = r.share_keys(r.advertise())
    r.clients[0].receive_shares(deliveries[0])
    good = r.clients[0].mask(r.inputs[0])
    for vector in ([1, 2, 3], np.zeros((2, 4), np.uint32), np.zeros(8, np.int64), np.zeros(0, np.uint32)):
        with pytest.raises(MalformedMessage):
            r.server.receive(replace(good, vector=vector))
    r.server.receive(good)


def test_roster_naming_a_neighbour_twice_cannot_reach_the_threshold(make_round):
    """Two entries for client 1 (different keys) and one for 2 count as 2 neighbours, not 3 ≥ t."""
    r = make_round(4, threshold=3)
    rosters = r.advertise()
    roster = rosters[0]
    one = next(e for e in roster.entries if e.client == 1)
    two = next(e for e in roster.entries if e.client == 2)
    other_keys = next(e for e in roster.entries if e.client == 3)
    forged = replace(roster, entries=(one, RosterEntry(**{**other_keys.__dict__, "client": 1}), two))
    with pytest.raises(MalformedMessage, match="strictly increasing"):
        r.clients[0].share_keys(forged)


def test_share_delivery_repeating_a_sender_is_malformed(make_round):
    r = make_round(4, threshold=2)
    deliveries = r.share_keys(r.advertise())
    d = deliveries[0]
    with pytest.raises(MalformedMessage, match="strictly increasing"):
        r.clients[0].receive_shares(replace(d, shares=(d.shares[0], d.shares[0]) + d.shares[1:]))


def test_unmask_request_counting_one_signer_twice_is_refused(make_round):
    """Quorum ⌊(5 + max(c, t − 1))/2⌋ + 1 = 4: signatures from 0, 1, 3 and again 3 are three
    signers, not four."""
    r = make_round(5, threshold=2, authenticated=True)
    lists = run_to_unmask(r)
    sigs = {i: r.clients[i].consistency_check(r.wire(lists[i])).signature for i in range(5)}
    survivors = lists[2].survivors
    with pytest.raises(MalformedMessage, match="strictly increasing"):
        r.clients[2].unmask(_request(r, 2, survivors=survivors,
                                     signatures=((0, sigs[0]), (1, sigs[1]), (3, sigs[3]), (3, sigs[3]))))
    # refused as malformed, so nothing changed: a genuine quorum is still answered
    reply = r.clients[2].unmask(_request(r, 2, survivors=survivors,
                                         signatures=((0, sigs[0]), (1, sigs[1]), (3, sigs[3]), (4, sigs[4]))))
    assert reply.sender == 2


def _request(r, recipient, *, survivors, signatures, dropped=()):
    from secfed.protocols.secagg.messages import SERVER, UnmaskRequest

    c = r.config
    return UnmaskRequest(session_id=c.session_id, round=c.round, sender=SERVER, recipient=recipient,
                         survivors=tuple(survivors), dropped=tuple(dropped), signatures=tuple(signatures),
                         self_mask_shares=())


def test_unmask_response_repeating_a_share_owner_is_refused_on_arrival(make_round):
    r = make_round(5, threshold=2)
    requests = run_to_unmask(r)
    response = r.clients[0].unmask(r.wire(requests[0]))
    opened = r.opened(response)
    plain = encode_secrets(opened)
    head, first = 16 + 4, 4 + 1 + SHARE_BYTES  # seed and count; one (owner, kind, value)
    doubled = plain[:16] + struct.pack("<I", len(opened.shares) + 1) + plain[head : head + first] + plain[head:]
    with pytest.raises(MalformedMessage, match="strictly increasing"):
        r.server.receive(r.resealed(response, doubled))
    r.server.receive(response)


def test_survivor_list_with_a_repeated_client_is_malformed(make_round):
    r = make_round(4, threshold=2, authenticated=True)
    lists = run_to_unmask(r)
    with pytest.raises(MalformedMessage, match="strictly increasing"):
        r.clients[0].consistency_check(replace(lists[0], survivors=(0, 0, 1, 2, 3)))


def test_sealed_share_that_is_not_bytes_is_malformed(make_round):
    r = make_round(3, threshold=1)
    rosters = r.advertise()
    msg = r.clients[0].share_keys(rosters[0])
    with pytest.raises(MalformedMessage):
        r.server.receive(replace(msg, shares=(SealedShare(msg.shares[0].peer, "text"),) + msg.shares[1:]))


def test_unmask_response_with_a_bad_share_kind_is_malformed(make_round):
    r = make_round(4, threshold=2)
    requests = run_to_unmask(r)
    response = r.clients[0].unmask(r.wire(requests[0]))
    opened = r.opened(response)
    plain = encode_secrets(replace(opened, shares=opened.shares[:1]))
    bad = plain[:-SHARE_BYTES - 1] + bytes([7]) + plain[-SHARE_BYTES:]  # the share's kind byte
    with pytest.raises(MalformedMessage, match="unknown share kind 7"):
        r.server.receive(r.resealed(response, bad))
    with pytest.raises(MalformedMessage, match="share kind must be a ShareKind"):
        encode_secrets(replace(opened, shares=(replace(opened.shares[0], kind=7),)))


# ---- the ring must hold the sum -----------------------------------------------------------------


def test_session_config_refuses_a_ring_that_cannot_hold_n_clients_sums(make_round):
    params = make_round(4, threshold=2).config.params
    with pytest.raises(OverflowRefused, match="needs 10 bits"):
        SessionConfig(bytes(16), 0, params, dimension=8, ring_bits=8, input_bound=100, server_key=bytes(32),
                      authenticated=False)
    ok = SessionConfig(bytes(16), 0, params, dimension=8, ring_bits=10, input_bound=100, server_key=bytes(32),
                       authenticated=False)
    assert ok.input_bound == 100


def test_client_refuses_an_input_beyond_the_declared_bound(make_round):
    r = make_round(4, threshold=2, ring_bits=10, input_bound=100)
    deliveries = r.share_keys(r.advertise())
    client = r.clients[0]
    client.receive_shares(deliveries[0])
    beyond = np.array([101] + [0] * 7, dtype=np.uint32)
    with pytest.raises(ValueError, match="bound 100"):
        client.mask(beyond)
    negative = np.full(8, (1 << 10) - 100, dtype=np.uint32)  # −100 in Z_2^10: allowed
    assert client.mask(negative).sender == 0
