"""Masked inputs are bound to sender, session, round and graph: a replayed, spoofed or substituted
one is detected — refused on arrival in authenticated mode (signature), and in either mode caught
by its tag once the server learns the sender's self-mask seed, before any sum is released."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from secfed.protocols import (
    BelowThreshold,
    DecryptionFailed,
    ForgedInput,
    ReplayedMessage,
    SignatureInvalid,
    WrongPhase,
)
from secfed.protocols.secagg.keys import SEALED_SHARE_BYTES
from secfed.protocols.secagg.messages import SERVER, MaskedInput, SealedShare

replace = dataclasses.replace


def to_masked_phase(r):
    deliveries = r.share_keys(r.advertise())
    for i, d in deliveries.items():
        r.clients[i].receive_shares(r.wire(d))
    return deliveries


def finish(r, first: dict) -> list[int]:
    """Every client uploads its masked input (after whatever ``first`` the attacker got in), then
    the round runs to the end. Returns the clients that refused to unmask (a forwarded self-mask
    share that does not open: DecryptionFailed), as an embedding would carry on without them."""
    for i, message in first.items():
        r.server.receive(r.wire(message))
    for c in r.clients:
        message = r.wire(c.mask(r.inputs[c.id]))
        if c.id in first:
            with pytest.raises(ReplayedMessage):  # the server already holds "its" input
                r.server.receive(message)
        else:
            r.server.receive(message)
    outbox = r.server.close_phase()
    if r.config.authenticated:
        outbox = r.consistency(outbox)
    refused = []
    for i, request in outbox.items():
        try:
            r.server.receive(r.wire(r.clients[i].unmask(r.wire(request))))
        except DecryptionFailed:
            refused.append(i)
    r.server.close_phase()
    return refused


def spoofed(r, sender: int) -> MaskedInput:
    """A masked input in sender's name made by someone without its seeds: a uniform vector (as a
    real one looks), a random tag, self-mask shares of the right sizes for the right holders."""
    rng = np.random.default_rng(99)
    vector = rng.integers(0, 2**32, r.config.dimension, dtype=np.uint64).astype(np.uint32)
    shares = tuple(SealedShare(v, rng.bytes(SEALED_SHARE_BYTES)) for v in r.graph.of(sender))
    return MaskedInput(session_id=r.config.session_id, round=r.config.round, sender=sender, recipient=SERVER,
                       vector=vector, self_mask_shares=shares, tag=rng.bytes(32), signature=b"")


def assert_never_summed(r, first: dict) -> None:
    """Unauthenticated mode: the server takes ``first`` on arrival (it cannot tell), then either the
    holders of the sender's self-mask shares refuse them (they do not open) or the tag fails
    under the sender's self-mask seed. Either way the round aborts and no sum is released."""
    with pytest.raises((ForgedInput, BelowThreshold)):
        finish(r, first)
    with pytest.raises(WrongPhase):
        r.server.result


def test_spoofed_input_is_detected_and_no_sum_is_released(make_round):
    """Unauthenticated mode: someone sends an input in client 1's name before client 1 does. The
    server cannot tell on arrival; once it has b_1 the tag fails and the round aborts. Before the
    fix the forged vector was summed and a wrong total released silently."""
    r = make_round(4, threshold=2)
    to_masked_phase(r)
    assert_never_summed(r, {1: spoofed(r, 1)})


def test_spoofed_input_is_refused_on_arrival_in_authenticated_mode(make_round):
    r = make_round(4, threshold=2, authenticated=True)
    to_masked_phase(r)
    with pytest.raises(SignatureInvalid, match="client 1's masked input"):
        r.server.receive(spoofed(r, 1))
    finish(r, {})  # the genuine input still gets in: the sum is exact
    assert np.array_equal(r.server.result.total, r.expected_sum(range(4)))


@pytest.mark.parametrize("authenticated", [False, True])
def test_input_replayed_from_another_round_is_never_summed(make_round, authenticated):
    """Client 1's masked input of round 7, its header rewritten to round 8, sent into round 8 of the
    same session (same identities) before client 1 answers."""
    old = make_round(4, threshold=2, authenticated=authenticated, round_=7)
    to_masked_phase(old)
    replayed = replace(old.clients[1].mask(old.inputs[1]), round=8)
    new = make_round(4, threshold=2, authenticated=authenticated, round_=8, identities=old.identities)
    to_masked_phase(new)
    if authenticated:
        with pytest.raises(SignatureInvalid):
            new.server.receive(new.wire(replayed))
        finish(new, {})
        assert np.array_equal(new.server.result.total, new.expected_sum(range(4)))
    else:
        assert_never_summed(new, {1: replayed})


@pytest.mark.parametrize("authenticated", [False, True])
def test_substituted_vector_under_a_genuine_tag_is_detected(make_round, authenticated):
    r = make_round(4, threshold=2, authenticated=authenticated)
    to_masked_phase(r)
    genuine = r.clients[2].mask(r.inputs[2])
    tampered = replace(genuine, vector=genuine.vector ^ np.uint32(1))
    r.clients[2].mask = lambda x: genuine  # client 2 has masked already; finish() sends the genuine one
    if authenticated:
        with pytest.raises(SignatureInvalid):
            r.server.receive(r.wire(tampered))
        finish(r, {})
        assert np.array_equal(r.server.result.total, r.expected_sum(range(4)))
    else:
        with pytest.raises(ForgedInput, match="client 2's"):
            finish(r, {2: tampered})


@pytest.mark.parametrize("field", ["tag", "vector", "signature"])
def test_a_copy_altered_in_transit_is_refused_and_the_genuine_one_still_counts(make_round, field):
    """Authenticated: one bit of client 2's masked input flipped in transit — in the tag, the
    vector or the signature. The altered copy arrives first and is refused on arrival (the tag is
    under the signature); the genuine copy then counts and the sum is exact. (With the tag outside
    the signature, the altered copy was accepted, the genuine one refused as a replay, and the
    round ended in ForgedInput.)"""
    r = make_round(4, threshold=2, authenticated=True)
    to_masked_phase(r)
    genuine = r.clients[2].mask(r.inputs[2])
    value = getattr(genuine, field)
    flipped = value ^ np.uint32(1 << 7) if field == "vector" else bytes([value[0] ^ 1]) + value[1:]
    r.clients[2].mask = lambda x: genuine  # client 2 has masked already; finish() sends the genuine one
    with pytest.raises(SignatureInvalid, match="client 2's masked input"):
        r.server.receive(r.wire(replace(genuine, **{field: flipped})))
    finish(r, {})
    assert r.server.result.survivors == (0, 1, 2, 3)
    assert np.array_equal(r.server.result.total, r.expected_sum(range(4)))
