"""A misbehaving server, client or network: every tamper, replay and over-reaching request is refused."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from secfed.protocols import (
    Aborted,
    BelowThreshold,
    BothSharesRequested,
    ClientState,
    ConfigMismatch,
    DecryptionFailed,
    InconsistentShares,
    InconsistentView,
    MalformedMessage,
    ModelMismatch,
    ProtocolError,
    ReplayedMessage,
    SessionConfig,
    SignatureInvalid,
    SecAggClient,
    UnknownClient,
    WrongPhase,
    WrongRound,
    WrongSender,
    decode,
    encode,
    simulate,
)
from secfed.protocols.secagg.messages import RevealedShare, SealedShare
from secfed.protocols.shamir import SHARE_BYTES

replace = dataclasses.replace


def flip(data: bytes, at: int = -1) -> bytes:
    out = bytearray(data)
    out[at] ^= 0x01
    return bytes(out)


def run_to_unmask(r, **skips):
    rosters = r.advertise(skip=skips.get("advertise", ()))
    deliveries = r.share_keys(rosters, skip=skips.get("share", ()))
    return r.masked_input(deliveries, skip=skips.get("masked", ()))


# ---- ciphertexts and shares -------------------------------------------------------------------


def test_tampered_sealed_share_is_detected_and_the_client_aborts(make_round):
    r = make_round(4, threshold=2)
    deliveries = r.share_keys(r.advertise())
    d = deliveries[0]
    bad = replace(d, shares=(replace(d.shares[0], ciphertext=flip(d.shares[0].ciphertext)),) + d.shares[1:])
    with pytest.raises(DecryptionFailed, match="does not authenticate"):
        r.clients[0].receive_shares(bad)
    assert r.clients[0].state is ClientState.ABORTED
    with pytest.raises(Aborted):
        r.clients[0].receive_shares(d)


def test_a_neighbours_degenerate_mask_key_aborts_the_client_that_masks_with_it(make_round, monkeypatch):
    """A colluder advertises (and signs: it is its own advertisement) the all-zero X25519 point as
    its mask key. An honest neighbour cannot derive their pairwise mask: mask() raises
    DecryptionFailed and the client aborts for good, forgetting its secrets — before, it stayed
    ready to mask, seeds in memory, contrary to "anything wrong with a message's content aborts"."""
    from secfed.protocols.crypto import sign
    from secfed.protocols.secagg import client as client_module
    from secfed.protocols.secagg import keys

    r = make_round(5, threshold=3, authenticated=True)
    genuine = r.clients[4].advertise_keys()
    low_order = bytes(32)
    colluders_key = r.clients[4]._mask_private  # the colluder's own code hashes the key it advertised
    real_public_bytes = client_module.public_bytes
    monkeypatch.setattr(client_module, "public_bytes",
                        lambda key: low_order if key is colluders_key else real_public_bytes(key))
    payload = keys.advertise_payload(r.config, 4, genuine.enc_public, low_order, genuine.self_mask_commitment,
                                     genuine.graph_commitment)
    r.clients[4].advertise_keys = lambda: replace(genuine, mask_public=low_order, signature=sign(r.identities[4], payload))
    deliveries = r.share_keys(r.advertise())
    r.clients[0].receive_shares(r.wire(deliveries[0]))
    with pytest.raises(DecryptionFailed, match="degenerate"):
        r.clients[0].mask(r.inputs[0])
    assert r.clients[0].state is ClientState.ABORTED
    with pytest.raises(Aborted):
        r.clients[0].mask(r.inputs[0])


def test_share_redirected_to_another_recipient_does_not_open(make_round):
    r = make_round(4, threshold=2)
    deliveries = r.share_keys(r.advertise())
    # Server forwards 2's share for client 1 to client 0 as if 2 had sealed it for 0.
    share_2_for_1 = next(s for s in deliveries[1].shares if s.peer == 2)
    d = deliveries[0]
    forged = replace(d, shares=tuple(share_2_for_1 if s.peer == 2 else s for s in d.shares))
    with pytest.raises(DecryptionFailed):
        r.clients[0].receive_shares(forged)


def test_bad_revealed_share_is_routed_around_when_spares_exist(make_round):
    r = make_round(5, threshold=2)
    requests = run_to_unmask(r, masked=(4,))  # client 4's key seed must be rebuilt
    for i, request in requests.items():
        response = r.clients[i].unmask(r.wire(request))
        if i == 0:
            opened = r.opened(response)
            response = r.resealed(response, replace(opened, shares=tuple(
                replace(s, value=bytes(SHARE_BYTES)) if s.owner == 4 else s for s in opened.shares)))
        r.server.receive(response)
    r.server.close_phase()
    assert np.array_equal(r.server.result.total, r.expected_sum(range(4)))


def test_bad_revealed_share_with_no_spare_raises_inconsistent_shares(make_round):
    r = make_round(5, threshold=3)
    requests = run_to_unmask(r, masked=(4,))
    for i, request in requests.items():
        if i == 3:
            continue  # 3 leaves: exactly t = 3 holders (0, 1, 2) remain for client 4's key seed
        response = r.clients[i].unmask(r.wire(request))
        if i == 1:
            opened = r.opened(response)
            response = r.resealed(response, replace(opened, shares=tuple(
                RevealedShare(s.owner, s.kind, flip(s.value)) if s.owner == 4 else s for s in opened.shares)))
        r.server.receive(response)
    with pytest.raises(InconsistentShares, match="key seed of dropped client 4"):
        r.server.close_phase()
    with pytest.raises(Aborted):
        r.server.close_phase()


def test_wrong_own_seed_is_rejected_and_rebuilt_from_neighbours(make_round):
    r = make_round(5, threshold=3)
    requests = run_to_unmask(r)
    for i, request in requests.items():
        response = r.clients[i].unmask(r.wire(request))
        if i == 2:
            with pytest.raises(InconsistentShares, match="own self-mask seed"):
                opened = r.opened(response)
                r.server.receive(r.resealed(response, replace(opened, self_mask_seed=flip(opened.self_mask_seed))))
            continue  # the server treats 2 as not answering
        r.server.receive(response)
    r.server.close_phase()
    assert np.array_equal(r.server.result.total, r.expected_sum(range(5)))


# ---- unmask requests that ask too much -------------------------------------------------------


@pytest.fixture
def at_unmask(make_round):
    r = make_round(6, threshold=3)
    requests = run_to_unmask(r, masked=(5,))
    return r, requests


def test_request_for_both_shares_of_a_neighbour_is_refused(at_unmask):
    r, requests = at_unmask
    req = requests[0]
    with pytest.raises(BothSharesRequested, match=r"\[1\]"):
        r.clients[0].unmask(replace(req, dropped=tuple(sorted(req.dropped + (1,)))))
    assert r.clients[0].state is ClientState.ABORTED


def test_request_naming_the_client_itself_as_dropped_is_refused(at_unmask):
    r, requests = at_unmask
    req = requests[0]
    with pytest.raises(BothSharesRequested, match="this client"):
        r.clients[0].unmask(replace(req, survivors=tuple(v for v in req.survivors if v), dropped=(0, 5)))


def test_request_omitting_the_client_from_survivors_is_refused(at_unmask):
    r, requests = at_unmask
    with pytest.raises(InconsistentView, match="omits client 0"):
        r.clients[0].unmask(replace(requests[0], survivors=(1, 2, 3, 4)))


@pytest.mark.parametrize("field, ids", [("dropped", (5, 77)), ("survivors", (0, 1, 2, 3, 4, 99))])
def test_request_naming_clients_outside_the_cohort_is_refused(at_unmask, field, ids):
    r, requests = at_unmask
    with pytest.raises(UnknownClient, match="outside the cohort"):
        r.clients[0].unmask(replace(requests[0], **{field: ids}))


def test_request_naming_a_neighbour_that_never_shared_keys_is_refused(make_round):
    r = make_round(6, threshold=3)
    requests = run_to_unmask(r, share=(4,))
    with pytest.raises(UnknownClient, match="never shared keys"):
        r.clients[0].unmask(replace(requests[0], dropped=(4,)))


def test_request_leaving_fewer_than_t_surviving_neighbours_is_refused(at_unmask):
    r, requests = at_unmask
    with pytest.raises(BelowThreshold, match="2 of its neighbours survive; threshold is 3"):
        r.clients[0].unmask(replace(requests[0], survivors=(0, 1, 2), dropped=(3, 4, 5)))


# ---- envelopes: replay, round, sender, phase -------------------------------------------------


def test_replays_and_misaddressed_messages_are_rejected_without_aborting(make_round):
    r = make_round(4, threshold=2)
    adverts = [c.advertise_keys() for c in r.clients]
    r.server.receive(adverts[0])
    with pytest.raises(ReplayedMessage, match="second key advertisement from client 0"):
        r.server.receive(adverts[0])
    with pytest.raises(WrongRound, match="round 6"):
        r.server.receive(replace(adverts[1], round=6))
    with pytest.raises(WrongRound):
        r.server.receive(replace(adverts[1], session_id=bytes(15) + b"\x01"))
    with pytest.raises(WrongSender, match="addressed to client 2"):
        r.server.receive(replace(adverts[1], recipient=2))
    with pytest.raises(UnknownClient, match="outside the cohort"):
        r.server.receive(replace(adverts[1], sender=9))
    for a in adverts[1:]:
        r.server.receive(a)
    rosters = r.reveal(r.server.close_phase())
    client = r.clients[1]
    with pytest.raises(WrongSender, match="reached client 1"):
        client.share_keys(rosters[2])
    with pytest.raises(WrongSender, match="only the server"):
        client.share_keys(replace(rosters[1], sender=3))
    with pytest.raises(WrongRound):
        client.share_keys(replace(rosters[1], round=8))
    reply = client.share_keys(rosters[1])  # the genuine message still works
    with pytest.raises(ReplayedMessage, match="already handled a KeyRoster"):
        client.share_keys(rosters[1])
    assert client.state is ClientState.AWAIT_SHARES and reply.sender == 1


def test_messages_out_of_phase_are_rejected(make_round):
    r = make_round(4, threshold=2)
    rosters = r.advertise()
    with pytest.raises(WrongPhase, match="comes later"):
        r.clients[0].unmask(_fake_request(r, 0))
    with pytest.raises(WrongPhase, match="MaskedInput from client 0 in phase share_keys"):
        r.server.receive(_fake_masked(r, 0))
    with pytest.raises(WrongPhase, match="not await_input"):
        r.clients[0].mask(r.inputs[0])
    for i in (0, 1, 2):
        r.server.receive(r.clients[i].share_keys(rosters[i]))
    r.server.close_phase()
    with pytest.raises(WrongSender, match="client 3 did not share keys"):
        r.server.receive(_fake_masked(r, 3))


def _fake_request(r, recipient):
    from secfed.protocols.secagg.messages import SERVER, UnmaskRequest

    c = r.config
    return UnmaskRequest(session_id=c.session_id, round=c.round, sender=SERVER, recipient=recipient,
                         survivors=(0, 1, 2, 3), dropped=(), signatures=(), self_mask_shares=())


def _fake_masked(r, sender):
    from secfed.protocols.secagg.messages import SERVER, MaskedInput

    c = r.config
    return MaskedInput(session_id=c.session_id, round=c.round, sender=sender, recipient=SERVER,
                       vector=np.zeros(c.dimension, np.uint32), self_mask_shares=(), tag=bytes(32), signature=b"")


def test_server_refuses_incomplete_share_sets_and_wrong_sizes(make_round):
    r = make_round(4, threshold=2)
    rosters = r.advertise()
    msg = r.clients[0].share_keys(rosters[0])
    with pytest.raises(MalformedMessage, match="neighbours that revealed nonces are"):
        r.server.receive(replace(msg, shares=msg.shares[1:]))  # would leave a mask uncancelled
    with pytest.raises(MalformedMessage, match="bytes, expected"):
        r.server.receive(replace(msg, shares=(SealedShare(msg.shares[0].peer, b"x" * 10),) + msg.shares[1:]))
    r.server.receive(msg)
    with pytest.raises(ReplayedMessage):
        r.server.receive(msg)


def test_masked_input_of_wrong_length_is_rejected(make_round):
    r = make_round(3, threshold=1)
    deliveries = r.share_keys(r.advertise())
    r.clients[0].receive_shares(deliveries[0])
    good = r.clients[0].mask(r.inputs[0])
    with pytest.raises(MalformedMessage, match="entries, expected 8"):
        r.server.receive(replace(good, vector=good.vector[:5]))
    r.clients[1].receive_shares(deliveries[1])
    with pytest.raises(ValueError, match="shape"):
        r.clients[1].mask(np.zeros(3, np.uint32))
    with pytest.raises(TypeError, match="quantize floats first"):
        r.clients[1].mask(np.zeros(8))
    assert r.clients[1].state is ClientState.AWAIT_INPUT  # bad local input does not abort


# ---- model and configuration consistency -----------------------------------------------------


def test_model_mismatch_is_refused_before_any_input_is_masked():
    inputs = [np.zeros(4, np.uint32)] * 4
    hashes = [b"a" * 32, b"a" * 32, b"b" * 32, b"a" * 32]
    with pytest.raises(ModelMismatch, match="trained on model"):
        simulate(inputs, model_hashes=hashes)


def test_config_mismatch_is_refused_by_the_server(make_round):
    r = make_round(4, threshold=2)
    other = SessionConfig(r.config.session_id, r.config.round, r.config.params, dimension=9, input_bound=None,
                          server_key=r.config.server_key, authenticated=False)
    stray = SecAggClient(other, 1).advertise_keys()
    with pytest.raises(ConfigMismatch, match="client 1"):
        r.server.receive(stray)


# ---- authenticated mode (malicious server) ---------------------------------------------------


def test_server_cannot_swap_advertised_keys(make_round):
    r = make_round(4, threshold=2, authenticated=True)
    rosters = r.advertise()
    entries = rosters[0].entries
    swapped = (replace(entries[0], enc_public=entries[1].enc_public), *entries[1:])
    with pytest.raises(SignatureInvalid, match="client 1's keys"):
        r.clients[0].share_keys(replace(rosters[0], entries=swapped))


def test_unsigned_advertisement_is_refused_by_the_server(make_round):
    r = make_round(4, threshold=2, authenticated=True)
    advert = r.clients[0].advertise_keys()
    with pytest.raises(SignatureInvalid):
        r.server.receive(replace(advert, signature=bytes(64)))


@pytest.mark.parametrize("alteration", ["share", "signature", "stripped"])
def test_a_key_share_message_altered_in_transit_is_refused_and_the_genuine_one_still_counts(make_round, alteration):
    """Authenticated: client 1's key-share message altered on the way — one bit of a sealed share
    flipped, one bit of its signature flipped, or the signature stripped — reaches the server first
    and is refused on arrival; the genuine copy then counts, every client masks and the sum is exact.
    (Wire version 5 carried no signature: the altered copy was accepted, the genuine one refused as
    a replay, and the altered share aborted the neighbour it was sealed for with DecryptionFailed.)"""
    r = make_round(5, threshold=3, authenticated=True)
    rosters = r.advertise()
    genuine = r.clients[1].share_keys(r.wire(rosters[1]))
    first = genuine.shares[0]
    altered = {
        "share": replace(genuine, shares=(SealedShare(first.peer, flip(first.ciphertext)), *genuine.shares[1:])),
        "signature": replace(genuine, signature=flip(genuine.signature)),
        "stripped": replace(genuine, signature=b""),
    }[alteration]
    with pytest.raises(SignatureInvalid, match="client 1's key-share message"):
        r.server.receive(r.wire(altered))
    r.server.receive(r.wire(genuine))
    deliveries = r.share_keys(rosters, skip=(1,))  # the others share keys; the phase closes
    r.unmask(r.consistency(r.masked_input(deliveries)))
    assert r.server.result.survivors == (0, 1, 2, 3, 4)
    assert np.array_equal(r.server.result.total, r.expected_sum(range(5)))


def test_a_signed_key_share_message_is_malformed_in_unauthenticated_mode(make_round):
    r = make_round(4, threshold=2)
    shares = r.clients[0].share_keys(r.wire(r.advertise()[0]))
    assert shares.signature == b""
    with pytest.raises(MalformedMessage, match="key-share message carries a signature"):
        r.server.receive(r.wire(replace(shares, signature=bytes(64))))


def test_equivocating_survivor_sets_cannot_reach_a_quorum(make_round):
    """The server shows {0..4} to clients 0, 1 and {0..3} to 2, 3: no view gathers the quorum
    ⌊(5 + max(c, t − 1))/2⌋ + 1 = 4 signatures."""
    from secfed.protocols.secagg.messages import SERVER, UnmaskRequest

    r = make_round(5, threshold=2, authenticated=True)
    lists = run_to_unmask(r)
    shown = {0: (0, 1, 2, 3, 4), 1: (0, 1, 2, 3, 4), 2: (0, 1, 2, 3), 3: (0, 1, 2, 3)}
    sigs = {i: r.clients[i].consistency_check(replace(lists[i], survivors=v)).signature for i, v in shown.items()}
    c = r.config
    full = UnmaskRequest(session_id=c.session_id, round=c.round, sender=SERVER, recipient=2,
                         survivors=(0, 1, 2, 3, 4), dropped=(), signatures=((0, sigs[0]), (1, sigs[1])),
                         self_mask_shares=())
    with pytest.raises(InconsistentView, match="differs from the one this client signed"):
        r.clients[2].unmask(full)  # 2 signed the other view
    short = replace(full, recipient=3, survivors=(0, 1, 2, 3), dropped=(4,), signatures=((2, sigs[2]), (3, sigs[3])))
    with pytest.raises(BelowThreshold, match="2 clients signed the survivor set; authenticated mode needs 4"):
        r.clients[3].unmask(short)
    forged = replace(full, recipient=0, signatures=((0, sigs[0]), (1, sigs[1]), (3, sigs[0])))
    with pytest.raises(SignatureInvalid, match="client 3's consistency check"):
        r.clients[0].unmask(forged)
    for i in (0, 2, 3):
        assert r.clients[i].state is ClientState.ABORTED  # nothing was revealed


def test_consistency_check_only_exists_in_authenticated_mode(make_round):
    r = make_round(3, threshold=1)
    lists = run_to_unmask(r)
    from secfed.protocols.secagg.messages import SurvivorList

    with pytest.raises(WrongPhase, match="only in authenticated mode"):
        r.clients[0].consistency_check(SurvivorList(**{k: getattr(lists[0], k) for k in ("session_id", "round", "sender", "recipient")}, survivors=(0, 1, 2)))


# ---- any bit flip on the wire ----------------------------------------------------------------


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.data())
def test_any_bit_flip_in_a_share_delivery_is_detected(make_round, data):
    """Every field of a ShareDelivery is checked somewhere: magic/version/lengths by the decoder,
    session/round/sender/recipient by the envelope checks, peer ids by the roster, ciphertexts
    by AES-GCM. No single flipped bit gets through."""
    r = make_round(3, threshold=1)  # a fresh round per example: a detected tamper aborts the client
    delivery = r.share_keys(r.advertise())[0]
    wire = bytearray(encode(delivery))
    bit = data.draw(st.integers(0, 8 * len(wire) - 1))
    wire[bit // 8] ^= 1 << (bit % 8)
    with pytest.raises(ProtocolError):
        r.clients[0].receive_shares(decode(bytes(wire)))
