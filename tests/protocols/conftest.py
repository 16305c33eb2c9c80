"""A hand-driven protocol round, so tests can stop between phases and tamper with what flows."""

from __future__ import annotations

import numpy as np
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from secfed.protocols import GraphParams, Phase, SecAggClient, SecAggServer, ServerKey, SessionConfig, decode, encode
from secfed.protocols.crypto import seal
from secfed.protocols.secagg import keys


class Round:
    """n clients and a server over the wire format; each method runs one phase and returns the outbox."""

    def __init__(self, n: int, *, degree: int | None = None, threshold: int, authenticated: bool = False,
                 dimension: int = 8, ring_bits: int = 32, input_bound: int | None = None, seed: int = 0,
                 round_: int = 7, corrupt_bound: int = 0, identities=None) -> None:
        params = GraphParams.explicit(n, degree or n - 1, threshold, corrupt_bound=corrupt_bound,
                                      authenticated=authenticated)
        if identities is None:
            identities = [Ed25519PrivateKey.generate() for _ in range(n)] if authenticated else []
        self.identities = identities
        self.server_key = ServerKey.generate()
        self.config = SessionConfig(
            session_id=bytes(range(16)), round=round_, params=params, dimension=dimension,
            server_key=self.server_key.public,
            ring_bits=ring_bits, input_bound=input_bound, authenticated=authenticated,
            identity_keys=tuple(k.public_key().public_bytes_raw() for k in self.identities),
        )
        self.clients = [
            SecAggClient(self.config, i, identity_key=self.identities[i] if authenticated else None)
            for i in range(n)
        ]
        self.server = SecAggServer(self.config, self.server_key)
        rng = np.random.default_rng(seed)
        self.inputs = [rng.integers(0, 1 << ring_bits, dimension, dtype=np.uint64).astype(np.uint32) for _ in range(n)]

    @staticmethod
    def wire(message):
        return decode(encode(message))

    def commit(self, skip=()) -> dict:
        """Key advertisements (with graph commitments) in; the commitment lists out."""
        for c in self.clients:
            if c.id not in skip:
                self.server.receive(self.wire(c.advertise_keys()))
        return self.server.close_phase()

    def reveal(self, commitments: dict, skip=()) -> dict:
        """Graph nonces in; the key rosters out (the complete graph skips this phase: ``commitments``
        are then the rosters already)."""
        if self.server.phase is not Phase.GRAPH_SEED:
            return commitments
        for i, listed in commitments.items():
            if i not in skip:
                self.server.receive(self.wire(self.clients[i].reveal_graph_nonce(self.wire(listed))))
        return self.server.close_phase()

    def advertise(self, skip=()) -> dict:
        """Both: clients in ``skip`` never advertise; the key rosters out."""
        return self.reveal(self.commit(skip))

    @property
    def graph(self):
        return self.server.graph

    def share_keys(self, rosters: dict, skip=()) -> dict:
        for i, roster in rosters.items():
            if i not in skip:
                self.server.receive(self.wire(self.clients[i].share_keys(self.wire(roster))))
        return self.server.close_phase()

    def masked_input(self, deliveries: dict, skip=()) -> dict:
        for i, delivery in deliveries.items():
            if i not in skip:
                self.clients[i].receive_shares(self.wire(delivery))
                self.server.receive(self.wire(self.clients[i].mask(self.inputs[i])))
        return self.server.close_phase()

    def consistency(self, lists: dict, skip=()) -> dict:
        for i, survivors in lists.items():
            if i not in skip:
                self.server.receive(self.wire(self.clients[i].consistency_check(self.wire(survivors))))
        return self.server.close_phase()

    def unmask(self, requests: dict, skip=()) -> None:
        for i, request in requests.items():
            if i not in skip:
                self.server.receive(self.wire(self.clients[i].unmask(self.wire(request))))
        self.server.close_phase()

    def response_key(self, client: int) -> bytes:
        """The key client's unmask response is sealed under, as the server derives it."""
        enc_public = self.server._adverts[client].enc_public
        return keys.response_key(self.config, client, self.server_key.private, enc_public)

    def opened(self, response):
        """What an unmask response reveals, opened with the server's key (the server's view)."""
        return keys.open_secrets(self.config, response.sender, self.response_key(response.sender), response.sealed)

    def resealed(self, response, secrets):
        """``response`` carrying ``secrets`` instead (RevealedSecrets, or raw plaintext bytes), sealed
        as its client would: what a client that lies about its secrets sends."""
        key, sender = self.response_key(response.sender), response.sender
        sealed = (seal(key, secrets, keys.response_aad(self.config, sender)) if isinstance(secrets, bytes)
                  else keys.seal_secrets(self.config, sender, key, secrets))
        return type(response)(**{**response.__dict__, "sealed": sealed})

    def expected_sum(self, survivors) -> np.ndarray:
        total = sum(self.inputs[i].astype(np.uint64) for i in survivors)
        return (total % (1 << self.config.ring_bits)).astype(np.uint32)


@pytest.fixture
def make_round():
    return Round
