"""One round of the protocol, phase by phase, over a transport: the driver :func:`~.simulate.simulate`,
the benches and the tests share.

A :class:`Session` holds one round's parties (identities, server key, config, clients, server).
:func:`drive` walks the phases (:class:`Phases` runs them one at a time, for tests that stop
between them): each live client's step, its message carried by a :class:`Transport`, the server
closing the phase. Every step's seconds go to an optional ``on_step`` hook as a :class:`StepTime`
— how a bench times a round without a driver of its own. :class:`WireTransport` carries messages
as a real transport would: encoded to bytes, counted, decoded by the receiver, the server in this
process.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar

import numpy as np
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from .secagg.client import NO_MODEL_HASH, PRIMITIVES, ClientPrimitives, SecAggClient
from .secagg.graph import GraphParams
from .secagg.messages import Message, decode, encode
from .secagg.server import SecAggServer
from .secagg.session import Phase, ServerKey, SessionConfig, new_session_id

T = TypeVar("T")


@dataclass(frozen=True)
class StepTime:
    """Seconds one party spent on one step of a round (what ``on_step`` receives).

    ``party``: ``"client"`` (``client`` is its index; ``step`` names its method, or ``"quantize"``
    for making its ring input), ``"server"`` (``step`` is ``"receive"`` — ``client`` the sender —
    or ``"close"``, ``client`` None) or ``"wire"`` (``step`` ``"upload"`` / ``"download"``: encoding,
    counting and decoding one message from / to ``client``). ``phase``: the phase the server is
    collecting. ``wall``: perf_counter seconds; ``cpu``: the process's CPU seconds (every thread).
    """

    party: str
    step: str
    phase: Phase | None
    client: int | None
    wall: float
    cpu: float


StepHook = Callable[[StepTime], None]


def timed(on_step: StepHook | None, party: str, step: str, phase: Phase | None, client: int | None,
          fn: Callable[..., T], *args: object) -> T:
    """``fn(*args)``, its seconds reported to ``on_step`` (when there is one) as a :class:`StepTime`."""
    if on_step is None:
        return fn(*args)
    wall, cpu = time.perf_counter(), time.process_time()
    out = fn(*args)
    on_step(StepTime(party, step, phase, client, time.perf_counter() - wall, time.process_time() - cpu))
    return out


class Transport(Protocol):
    """Carries one round's messages between the clients and the server."""

    def upload(self, client: int, message: Message) -> None:
        """Deliver ``client``'s message to the server."""

    def download(self, client: int, message: Message) -> Message:
        """``message`` from the server, as ``client`` receives it."""

    def close_phase(self) -> dict[int, Message]:
        """Close the server's phase; its outbox, by recipient."""


class WireTransport:
    """Every message encoded to bytes, counted and decoded by its receiver, exactly as a real
    transport carries it; the server runs in this process. ``sent[i]`` / ``received[i]``: the
    bytes client i uploaded / downloaded."""

    def __init__(self, server: SecAggServer, n_clients: int, on_step: StepHook | None = None) -> None:
        self.server = server
        self.on_step = on_step
        self.sent = [0] * n_clients
        self.received = [0] * n_clients

    def upload(self, client: int, message: Message) -> None:
        phase = self.server.phase
        message = timed(self.on_step, "wire", "upload", phase, client, _carry, message, self.sent, client)
        timed(self.on_step, "server", "receive", phase, client, self.server.receive, message)

    def download(self, client: int, message: Message) -> Message:
        return timed(self.on_step, "wire", "download", self.server.phase, client, _carry, message,
                     self.received, client)

    def close_phase(self) -> dict[int, Message]:
        return timed(self.on_step, "server", "close", self.server.phase, None, self.server.close_phase)


def _carry(message: Message, counts: list[int], client: int) -> Message:
    """``message`` through its wire format, its bytes added to ``counts[client]``."""
    data = encode(message)
    counts[client] += len(data)
    return decode(data)


@dataclass
class Session:
    """One round's parties: each client's Ed25519 identity (authenticated mode), the server's key,
    the session config, the digest of the model each client trains on (given at share_keys), the
    clients and the server."""

    config: SessionConfig
    server_key: ServerKey
    identities: list[Ed25519PrivateKey]
    model_hashes: list[bytes]
    clients: list[SecAggClient]
    server: SecAggServer

    @classmethod
    def new(cls, params: GraphParams, *, dimension: int, ring_bits: int, input_bound: int | None,
            authenticated: bool = True, model_hashes: Sequence[bytes] | None = None,
            session_id: bytes | None = None, round: int = 0,
            identities: Sequence[Ed25519PrivateKey] | None = None) -> Session:
        """A fresh server key, a config binding it and the clients' identities (fresh ones standing
        in for a PKI unless ``identities`` are given), and ``params.n_clients`` clients and a server."""
        n = params.n_clients
        if identities is None:
            identities = [Ed25519PrivateKey.generate() for _ in range(n)] if authenticated else []
        identities = list(identities)
        server_key = ServerKey.generate()  # fresh per session; unmask responses are sealed to it
        config = SessionConfig(
            session_id=session_id if session_id is not None else new_session_id(), round=round,
            params=params, dimension=dimension, ring_bits=ring_bits, input_bound=input_bound,
            server_key=server_key.public, authenticated=authenticated,
            identity_keys=tuple(k.public_key().public_bytes_raw() for k in identities),
        )
        hashes = list(model_hashes) if model_hashes is not None else [NO_MODEL_HASH] * n
        session = cls(config, server_key, identities, hashes, [], SecAggServer(config, server_key))
        session.clients = [session.client(i) for i in range(n)]
        return session

    def client(self, i: int, *, primitives: ClientPrimitives = PRIMITIVES) -> SecAggClient:
        """A new client ``i`` of this session (``primitives``: see :class:`ClientPrimitives`)."""
        identity = self.identities[i] if self.config.authenticated else None
        return SecAggClient(self.config, i, identity_key=identity, primitives=primitives)


def always(client: int, phase: Phase) -> bool:
    """Every client takes part in every phase."""
    return True


class Phases:
    """The round's phases one at a time, for a caller that stops between them (tests that tamper
    with what flows); :func:`drive` runs them all. Each takes the server's previous outbox, lets
    every addressed client for which ``alive(i, phase)`` holds and that is not in ``skip`` take its
    step and upload the reply, and returns the server's next outbox. ``model_hashes[i]``: the model
    digest client i seals into its shares (none: :data:`NO_MODEL_HASH` for all)."""

    def __init__(self, clients: Sequence[SecAggClient], transport: Transport, *,
                 alive: Callable[[int, Phase], bool] = always, on_step: StepHook | None = None,
                 model_hashes: Sequence[bytes] | None = None) -> None:
        self.clients, self.transport, self.alive, self.on_step = clients, transport, alive, on_step
        self.model_hashes = list(model_hashes) if model_hashes is not None else [NO_MODEL_HASH] * len(clients)

    def advertise(self, skip: Collection[int] = ()) -> dict[int, Message]:
        """Key advertisements (with graph commitments) in; the commitment lists out (with the complete
        graph, which skips the graph-seed phase, the key rosters)."""
        for i in range(len(self.clients)):
            if self._takes_part(i, Phase.ADVERTISE_KEYS, skip):
                self.transport.upload(i, self._step(i, Phase.ADVERTISE_KEYS, "advertise_keys"))
        return self.transport.close_phase()

    def reveal(self, outbox: dict[int, Message], skip: Collection[int] = ()) -> dict[int, Message]:
        """Graph nonces in; the key rosters out. The complete graph has no graph-seed phase: its
        ``outbox`` holds the rosters already and is returned as it is."""
        if self.clients[0].config.params.complete:
            return outbox
        return self._answer(outbox, Phase.GRAPH_SEED, "reveal_graph_nonce", skip)

    def share_keys(self, outbox: dict[int, Message], skip: Collection[int] = ()) -> dict[int, Message]:
        """Sealed key-seed shares (with each client's model digest inside) in; each client's share
        delivery out."""
        for i, roster in outbox.items():
            if self._takes_part(i, Phase.SHARE_KEYS, skip):
                share = functools.partial(self.clients[i].share_keys, model_hash=self.model_hashes[i])
                reply = timed(self.on_step, "client", "share_keys", Phase.SHARE_KEYS, i, share,
                              self.transport.download(i, roster))
                self.transport.upload(i, reply)
        return self.transport.close_phase()

    def masked_input(self, outbox: dict[int, Message], ring_input: Callable[[int], np.ndarray],
                     skip: Collection[int] = ()) -> dict[int, Message]:
        """Masked inputs of ``ring_input(i)`` in; the survivor lists (authenticated) or unmask requests out."""
        for i, delivery in outbox.items():
            if self._takes_part(i, Phase.MASKED_INPUT, skip):
                self._step(i, Phase.MASKED_INPUT, "receive_shares", self.transport.download(i, delivery))
                x = timed(self.on_step, "client", "quantize", Phase.MASKED_INPUT, i, ring_input, i)
                self.transport.upload(i, self._step(i, Phase.MASKED_INPUT, "mask", x))
        return self.transport.close_phase()

    def consistency(self, outbox: dict[int, Message], skip: Collection[int] = ()) -> dict[int, Message]:
        """Signatures on the survivor set in (authenticated mode); the unmask requests out."""
        return self._answer(outbox, Phase.CONSISTENCY_CHECK, "consistency_check", skip)

    def unmask(self, outbox: dict[int, Message], skip: Collection[int] = ()) -> None:
        """Unmask responses in; the server's result is then ready."""
        self._answer(outbox, Phase.UNMASK, "unmask", skip)

    def _takes_part(self, i: int, phase: Phase, skip: Collection[int]) -> bool:
        return i not in skip and self.alive(i, phase)

    def _step(self, i: int, phase: Phase, name: str, *args: object) -> Message:
        return timed(self.on_step, "client", name, phase, i, getattr(self.clients[i], name), *args)

    def _answer(self, outbox: dict[int, Message], phase: Phase, name: str, skip: Collection[int]) -> dict[int, Message]:
        for i, message in outbox.items():
            if self._takes_part(i, phase, skip):
                self.transport.upload(i, self._step(i, phase, name, self.transport.download(i, message)))
        return self.transport.close_phase()


def drive(clients: Sequence[SecAggClient], transport: Transport, ring_input: Callable[[int], np.ndarray], *,
          alive: Callable[[int, Phase], bool] = always, on_step: StepHook | None = None,
          model_hashes: Sequence[bytes] | None = None) -> None:
    """Run every phase of one round (:class:`Phases`): each client for which ``alive(i, phase)``
    holds takes its step and uploads the reply; the others send nothing at that phase (to vanish
    for good, ``alive`` says so for the later phases too). ``ring_input(i)`` makes client i's ring
    vector when it masks; ``model_hashes[i]`` is the model digest it seals into its shares. The
    result is the server's (``server.result``); protocol refusals propagate as their typed errors."""
    phases = Phases(clients, transport, alive=alive, on_step=on_step, model_hashes=model_hashes)
    outbox = phases.masked_input(phases.share_keys(phases.reveal(phases.advertise())), ring_input)
    if clients[0].config.authenticated:
        outbox = phases.consistency(outbox)
    phases.unmask(outbox)
