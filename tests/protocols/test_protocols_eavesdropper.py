"""A passive network observer: every byte of a round, and the public SessionConfig.

Unmask responses carry what unmasks the sum — survivors' self-mask seeds, the key-seed shares of
dropped clients — so they are sealed to the server's per-session key (``ServerKey``, public half
in the config). An observer who replays everything the server received into a server of its own
(the public config, a key of its own) opens none of them and gets no sum."""

from __future__ import annotations

import dataclasses
from unittest import mock

import numpy as np
import pytest

from secfed.protocols import (
    DecryptionFailed,
    GraphParams,
    Phase,
    ProtocolError,
    SecAggServer,
    ServerKey,
    WrongPhase,
    choose_params,
    decode,
    encode,
)
from secfed.protocols.secagg.messages import (
    SERVER,
    AdvertiseKeys,
    ConsistencySignature,
    EncryptedShares,
    GraphReveal,
    MaskedInput,
    UnmaskResponse,
)

PHASES = (AdvertiseKeys, GraphReveal, EncryptedShares, MaskedInput, ConsistencySignature, UnmaskResponse)

# The review's settings: a complete graph of 8 and choose_params(25), each with a client that drops
# before its masked input (its key seed is rebuilt) and one that leaves before unmasking (its
# self-mask seed is rebuilt from shares).
ROUNDS = {"complete, n = 8": GraphParams.explicit(8, 7, 3, corrupt_bound=1), "choose_params(25)": choose_params(25)}


def captured_round(make_round, params: GraphParams) -> tuple[object, list[bytes]]:
    """A full authenticated round whose every message, both ways, is recorded as wire bytes."""
    r = make_round(params.n_clients, degree=params.degree, threshold=params.threshold,
                   corrupt_bound=params.corrupt_bound, authenticated=True, dimension=16)
    wire: list[bytes] = []

    def recorded(message):
        data = encode(message)
        wire.append(data)
        return decode(data)

    r.wire = recorded
    lists = r.masked_input(r.share_keys(r.advertise()), skip={5})
    r.unmask(r.consistency(lists), skip={2})
    survivors = [i for i in range(params.n_clients) if i != 5]
    assert np.array_equal(r.server.result.total, r.expected_sum(survivors))  # the server gets the sum
    return r, wire


@pytest.mark.parametrize("name", ROUNDS)
def test_no_revealed_seed_or_share_is_in_the_wire_bytes(make_round, name):
    """Every secret the server opens — each responder's self-mask seed, each revealed share — is
    absent from every byte that crossed the network. (Before, unmask responses carried them in
    the clear, and the observer recomputed the exact sum.)"""
    r, wire = captured_round(make_round, ROUNDS[name])
    responses = [m for m in map(decode, wire) if isinstance(m, UnmaskResponse)]
    assert responses
    secrets = []
    for response in responses:
        opened = r.opened(response)
        secrets += [opened.self_mask_seed, *(s.value for s in opened.shares)]
    assert any(len(r.opened(m).shares) for m in responses)  # shares were revealed, and are sealed
    everything = b"".join(wire)
    assert not [s for s in secrets if s in everything]


@pytest.mark.parametrize("name", ROUNDS)
def test_replaying_every_message_without_the_server_key_releases_no_sum(make_round, name):
    """The observer feeds everything the server received, phase by phase, into a server of its
    own built from the public config. Lacking the private key it lets its server claim the
    config's public key: every unmask response fails to open, and no sum is released."""
    r, wire = captured_round(make_round, ROUNDS[name])
    uploads = [m for m in map(decode, wire) if m.recipient == SERVER]
    with mock.patch.object(ServerKey, "public", property(lambda key: r.config.server_key)):
        spy = SecAggServer(r.config, ServerKey.generate())
    refused = 0
    with pytest.raises(ProtocolError):
        for phase in PHASES:
            if phase is GraphReveal and spy.phase is not Phase.GRAPH_SEED:
                continue  # the complete graph has no graph-seed phase
            for message in (m for m in uploads if isinstance(m, phase)):
                try:
                    spy.receive(message)
                except DecryptionFailed:
                    refused += 1
            spy.close_phase()
    assert refused == sum(isinstance(m, UnmaskResponse) for m in uploads) > 0
    with pytest.raises(WrongPhase):
        spy.result


def test_a_sealed_response_altered_or_moved_to_another_sender_is_refused(make_round):
    """The sealed box is bound to its responder, session and round: a flipped bit, or the box of
    client 0 presented as client 1's, does not open (DecryptionFailed), changes nothing, and the
    genuine responses still give the exact sum."""
    r = make_round(4, threshold=2, authenticated=True)
    requests = r.consistency(r.masked_input(r.share_keys(r.advertise())))
    responses = {i: r.clients[i].unmask(r.wire(request)) for i, request in requests.items()}
    flipped = bytearray(responses[0].sealed)
    flipped[-1] ^= 1
    for forged in (dataclasses.replace(responses[0], sealed=bytes(flipped)),
                   dataclasses.replace(responses[1], sealed=responses[0].sealed)):
        with pytest.raises(DecryptionFailed):
            r.server.receive(r.wire(forged))
    for response in responses.values():
        r.server.receive(r.wire(response))
    r.server.close_phase()
    assert np.array_equal(r.server.result.total, r.expected_sum(range(4)))


@pytest.mark.parametrize("name", ROUNDS)
def test_what_the_server_opens_never_rebuilds_a_survivors_pairwise_key(make_round, name):
    """SECURITY.md, "nothing about any individual x_u": the server opens each survivor's self-mask seed
    and the key-seed shares of the dropped, never a survivor's key seed. (Found by review: a client
    whose self-mask seed was its key seed passed every protocol test, and gave the honest-but-curious
    server every survivor's pairwise masks.) From all it opened, no survivor's advertised mask key
    follows, and no survivor's key seed has t shares revealed."""
    from secfed.protocols.crypto import public_bytes
    from secfed.protocols.secagg.keys import mask_private_key
    from secfed.protocols.secagg.messages import ShareKind

    r, wire = captured_round(make_round, ROUNDS[name])
    advertised = {m.sender: m.mask_public for m in map(decode, wire) if isinstance(m, AdvertiseKeys)}
    opened = [r.opened(m) for m in map(decode, wire) if isinstance(m, UnmaskResponse)]
    survivors = [i for i in range(ROUNDS[name].n_clients) if i != 5]
    for o in opened:
        assert not {public_bytes(mask_private_key(r.config, u, o.self_mask_seed)) for u in survivors} & \
            {advertised[u] for u in survivors}
        assert all(s.kind is ShareKind.SELF_MASK or s.owner not in survivors for s in o.shares)


@pytest.mark.parametrize("name", ROUNDS)
def test_every_sealed_share_of_a_kind_has_one_size(make_round, name):
    """SECURITY.md: the server sees sealed shares "and their sizes, which are fixed" — one length for
    every key-seed share of the round and one for every self-mask share, whatever their values."""
    _, wire = captured_round(make_round, ROUNDS[name])
    messages = list(map(decode, wire))
    key_seed = {len(s.ciphertext) for m in messages if isinstance(m, EncryptedShares) for s in m.shares}
    self_mask = {len(s.ciphertext) for m in messages if isinstance(m, MaskedInput) for s in m.self_mask_shares}
    assert len(key_seed) == 1 and len(self_mask) == 1, (key_seed, self_mask)
