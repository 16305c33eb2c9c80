"""A hand-driven protocol round, so tests can stop between phases and tamper with what flows."""

from __future__ import annotations

import copy

import numpy as np
import pytest

from secfed.protocols import GraphParams, Phases, SecAggClient, SecAggServer, Session, decode, encode
from secfed.protocols.crypto import seal
from secfed.protocols.secagg import keys


class _Wire:
    """The round's transport: every message through ``round.wire`` (which a test may replace, to
    record or alter the bytes), uploads to the round's server."""

    def __init__(self, round_: Round) -> None:
        self.round = round_

    def upload(self, client: int, message):
        self.round.server.receive(self.round.wire(message))

    def download(self, client: int, message):
        return self.round.wire(message)

    def close_phase(self) -> dict:
        return self.round.server.close_phase()


class Round:
    """n clients and a server over the wire format, driven by the protocol's own phase driver
    (:class:`Phases`); each method runs one phase and returns the outbox, so a test can stop between
    phases and tamper with what flows. Clients in ``skip`` send nothing at that phase."""

    def __init__(self, n: int, *, degree: int | None = None, threshold: int, authenticated: bool = False,
                 dimension: int = 8, ring_bits: int = 32, input_bound: int | None = None, seed: int = 0,
                 round_: int = 7, corrupt_bound: int = 0, identities=None) -> None:
        params = GraphParams.explicit(n, degree or n - 1, threshold, corrupt_bound=corrupt_bound,
                                      authenticated=authenticated)
        session = Session.new(params, dimension=dimension, ring_bits=ring_bits, input_bound=input_bound,
                              authenticated=authenticated, session_id=bytes(range(16)), round=round_,
                              identities=identities)
        self.identities, self.server_key, self.config = session.identities, session.server_key, session.config
        self.clients, self.server = session.clients, session.server
        self.phases = Phases(self.clients, _Wire(self))
        rng = np.random.default_rng(seed)
        self.inputs = [rng.integers(0, 1 << ring_bits, dimension, dtype=np.uint64).astype(np.uint32) for _ in range(n)]

    def again(self) -> Round:
        """The same session config run a second time — what a server that repeats a config gets:
        fresh clients (fresh round keys) and server, the same identities, server key and inputs."""
        other = copy.copy(self)
        identity = (lambda i: self.identities[i]) if self.config.authenticated else (lambda i: None)
        other.clients = [SecAggClient(self.config, i, identity_key=identity(i)) for i in range(len(self.clients))]
        other.server = SecAggServer(self.config, self.server_key)
        other.phases = Phases(other.clients, _Wire(other))
        return other

    @staticmethod
    def wire(message):
        return decode(encode(message))

    def commit(self, skip=()) -> dict:
        """Key advertisements (with graph commitments) in; the commitment lists out."""
        return self.phases.advertise(skip)

    def reveal(self, commitments: dict, skip=()) -> dict:
        """Graph nonces in; the key rosters out."""
        return self.phases.reveal(commitments, skip)

    def advertise(self, skip=()) -> dict:
        """Both: clients in ``skip`` never advertise; the key rosters out."""
        return self.reveal(self.commit(skip))

    @property
    def graph(self):
        return self.server.graph

    def share_keys(self, rosters: dict, skip=()) -> dict:
        return self.phases.share_keys(rosters, skip)

    def masked_input(self, deliveries: dict, skip=()) -> dict:
        return self.phases.masked_input(deliveries, lambda i: self.inputs[i], skip)

    def consistency(self, lists: dict, skip=()) -> dict:
        return self.phases.consistency(lists, skip)

    def unmask(self, requests: dict, skip=()) -> None:
        self.phases.unmask(requests, skip)

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
