"""The server side: one secure aggregation over a Flower Grid, driven by secfed's SecAggServer.

    workflow = SecAggWorkflow(cohort=Cohort.load("cohort.toml"))
    result = workflow.aggregate(grid, messages, encoding)   # one train message per node
    result.total, result.survivors                          # Σ of the survivors' ring vectors, who

Every node in ``messages`` becomes one protocol client (index = its place in node-id order).
The workflow sends each phase's messages (train messages carrying secfed's control record and
the protocol message, see wire.py), collects the replies until all are in or the phase's
deadline passes, feeds them to :class:`~secfed.protocols.SecAggServer` and closes the phase. A
node that does not answer in time, answers with an error or sends a message the server refuses
is a dropout; the protocol decides whether the round survives it (``BelowThreshold`` and the other
typed errors abort it, before any sum is released). The masked-input phase carries the node's
message content: the app trains on it there, and its deadline is ``input_timeout``.

Authenticated mode (the default) first enrols nodes it has not seen: a node proves it holds an
Ed25519 identity from the cohort file by signing a fresh nonce bound to the run and its node id;
the session's identity keys are those. Nodes outside the cohort take no part. The challenge can ride
on the run's first app message (:meth:`SecAggWorkflow.challenges` / :meth:`~SecAggWorkflow.accept`:
``secfed train --flower`` sends it with its hello), so enrolment costs no round trip of its own.
A node that restarted comes back under a new node id and takes its identity over; two live nodes
proving one identity raise :class:`IdentityClash`.

Pipelining (``aggregate(..., next_round=NextRound(nodes, encoding, round))``): when the caller
knows the next aggregation's nodes and encoding at this one's unmask, the next session's key
advertisement rides on the unmask message (``unmask+advertise_keys``: the node answers with its
unmask response and its next advertisement); a node of the next session that gets no unmask
message is sent the advertisement alone in the same exchange. The next :meth:`aggregate` with the
same nodes, encoding and round then starts at share_keys: one round trip fewer. A node that misses
the unmask is absent from the next session's roster (an advertise-phase dropout). The model digest
is not in the advertisement: it is announced at share_keys and sealed into the key-seed shares.

Flower's ``Grid.send_and_receive`` polls every 3 s; this workflow pushes and pulls itself every
``poll_interval`` seconds, so a phase ends as soon as its last reply is in.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
from flwr.app import ConfigRecord, Message, MessageType, RecordDict
from flwr.common.constant import ErrorCode
from flwr.serverapp import Grid

from secfed.protocols import (
    BelowThreshold,
    GraphParams,
    MalformedMessage,
    ProtocolError,
    SecAggServer,
    ServerKey,
    SessionConfig,
    WrongSender,
    choose_params,
    decode,
    encode,
    new_session_id,
)
from secfed.protocols.crypto import verify

from .encoding import Encoding
from .mod import ADVERTISE, ENROL, MASKED_INPUT, POLICY_REFUSAL, REFUSED, SHARE_KEYS, UNMASK, enrol_payload
from .node import Cohort
from .wire import (
    CONTROL,
    NEXT,
    NEXT_PAYLOAD,
    OURS,
    PAYLOAD,
    content_digest,
    control,
    encode_session,
    get_message,
    put_message,
    typed,
)

log = logging.getLogger("secfed.flower")


class IdentityClash(RuntimeError):
    """Two live SuperNodes prove one site's identity key: a copied state folder, a stolen key, or a
    restart whose old SuperNode still runs. The server cannot tell which is the site, so the run stops
    (found by review: the two displaced each other at every enrolment, and the run waited until its
    start timeout without saying why)."""


@dataclass(frozen=True, eq=False)
class SecAggResult:
    """One finished aggregation. ``total``: Σ of the survivors' ring vectors (uint32, mod 2^ring_bits).
    ``survivors`` / ``dropped``: node ids whose input is / is not in it. ``clear``: what each
    survivor's masked-input reply carried besides secfed's records (``ring`` encoding only).
    ``bytes_up`` / ``bytes_down``: protocol-message bytes sent by / to the nodes."""

    total: np.ndarray
    survivors: tuple[int, ...]
    dropped: tuple[int, ...]
    config: SessionConfig
    clear: Mapping[int, RecordDict] = field(default_factory=dict)
    bytes_up: int = 0
    bytes_down: int = 0


@dataclass(frozen=True)
class NextRound:
    """The next aggregation, as known at this one's unmask: its nodes, encoding and round."""

    nodes: tuple[int, ...]
    encoding: Encoding
    round: int


@dataclass(eq=False)
class _Prepared:
    """One session's parties: config, server key, nodes (index = place in the list), encoding and
    the server state machine. Made by :meth:`SecAggWorkflow.aggregate` (advertised in its first
    phase) or, pipelined, at the previous session's unmask (its server then holds the
    advertisements that came back with the unmask replies)."""

    config: SessionConfig
    key: ServerKey
    nodes: list[int]
    encoding: Encoding
    server: SecAggServer
    up: int = 0

    def fits(self, nodes: Sequence[int], encoding: Encoding, round: int) -> bool:
        return list(nodes) == self.nodes and encoding == self.encoding and round == self.config.round

    def control(self, node: int) -> ConfigRecord:
        """The advertise_keys control record node ``node`` gets (alone, or as the NEXT record)."""
        ctl = ConfigRecord({"stage": ADVERTISE, "index": self.nodes.index(node), "session": encode_session(self.config)})
        self.encoding.write(ctl)
        return ctl

    def receive(self, node: int, data: bytes) -> None:
        """Node ``node``'s advertisement (its wire bytes) to this session's server."""
        message = decode(data)
        if message.sender != self.nodes.index(node):
            raise WrongSender(f"node {node} advertised as client {message.sender}")
        self.server.receive(message)
        self.up += len(data)


class SecAggWorkflow:
    """Drives secfed's secure aggregation over a Flower Grid (see the module docstring).

    ``params(n)`` picks the neighbour graph for n nodes (default: SecAgg+ by ``choose_params`` at
    ``dropout_rate`` and ``corrupt_fraction``; ``complete=True`` for plain SecAgg).
    ``phase_timeout``: seconds a protocol phase waits for replies; ``input_timeout``: the
    masked-input phase, in which nodes train (default: ``phase_timeout``). ``on_phase(name, nodes)``
    is called before each phase's messages go out (progress, logging, tests).
    """

    def __init__(
        self,
        *,
        cohort: Cohort | None = None,
        authenticated: bool = True,
        params: Callable[[int], GraphParams] | None = None,
        dropout_rate: float = 0.1,
        corrupt_fraction: float = 0.2,
        complete: bool = False,
        phase_timeout: float = 120.0,
        input_timeout: float | None = None,
        poll_interval: float = 0.2,
        on_phase: Callable[[str, Sequence[int]], None] | None = None,
    ) -> None:
        if authenticated and cohort is None:
            raise ValueError("authenticated secure aggregation needs the cohort of trusted identity keys "
                             "(authenticated=False is the weaker, honest-but-curious-server mode)")
        self.cohort, self.authenticated = cohort, authenticated
        self.params = params or (lambda n: choose_params(
            n, dropout_rate=dropout_rate, corrupt_fraction=corrupt_fraction, authenticated=authenticated,
            complete=complete))
        self.phase_timeout = phase_timeout
        self.input_timeout = input_timeout if input_timeout is not None else phase_timeout
        self.poll_interval = poll_interval
        self.on_phase = on_phase
        self.identities: dict[int, bytes] = {}  # node id → enrolled identity key
        self._displaced: dict[int, bytes] = {}  # node id → the identity a newer node proved since
        self.errors: dict[int, str] = {}  # node id → why it refused a message, since the last aggregate began
        self._refused_next: dict[int, str] = {}  # policy refusals of the next session, seen in this one
        self._next: _Prepared | None = None  # advertised with the last unmask, for the next aggregate

    # ---- enrolment --------------------------------------------------------------------------------

    def enrol(self, grid: Grid, node_ids: Sequence[int]) -> dict[int, bytes]:
        """Identity keys of ``node_ids`` (cached; new nodes prove theirs). Nodes that fail are left out."""
        challenges = self.challenges(node_ids)
        if challenges:
            self._notify(ENROL, list(challenges))
            replies = self._exchange(grid, {n: RecordDict({CONTROL: c}) for n, c in challenges.items()},
                                     self.phase_timeout, "0")
            self.accept(replies, challenges)
        return {n: self.identities[n] for n in node_ids if n in self.identities}

    def challenges(self, node_ids: Sequence[int]) -> dict[int, ConfigRecord]:
        """The enrolment challenge (a fresh nonce) for each of ``node_ids`` not enrolled yet: a control
        record to send alone (:meth:`enrol`) or on the node's first app message (the SecAggMod then
        answers both in one reply) and to hand back to :meth:`accept` with the replies."""
        if not self.authenticated:
            return {}
        return {n: ConfigRecord({"stage": ENROL, "nonce": os.urandom(16)}) for n in node_ids
                if n not in self.identities}

    def accept(self, replies: Mapping[int, Message], challenges: Mapping[int, ConfigRecord]) -> None:
        """Enrol the nodes whose replies prove an identity of the cohort for their challenge. A node
        proving an identity another live node proves raises :class:`IdentityClash`."""
        proven: dict[bytes, int] = {}  # in these replies: identity → node
        for n, reply in replies.items():
            if n not in challenges:
                continue
            try:
                ctl = _reply_control(reply, ENROL)
                key, proof = typed(ctl, "identity", bytes), typed(ctl, "proof", bytes)
                if key not in self.cohort:
                    raise WrongSender(f"node {n} enrols with an identity key outside the cohort")
                nonce = typed(challenges[n], "nonce", bytes)
                verify(key, proof, enrol_payload(reply.metadata.run_id, n, nonce), who=f"node {n}'s enrolment")
            except ProtocolError as exc:
                log.warning("node %s not enrolled: %s", n, exc)
                continue
            # A site whose SuperNode restarted comes back under a new node id: the newest proof wins. Only a
            # live node answers a challenge, so one displaced proving again, or two proving at once, are two.
            holder = proven.get(key, next((m for m, k in self.identities.items() if k == key and m != n), None))
            if holder is not None and (key in proven or self._displaced.get(n) == key):
                # no grace: one would let a stolen key speak for the site meanwhile (review of a first one)
                raise IdentityClash(f"SuperNodes {holder} and {n} both prove {self.cohort.name_of(key)}'s identity "
                                    "key: two SuperNodes run with one identity (a copied state folder, a stolen key, "
                                    "or a restart whose old SuperNode still runs: stop it before starting the new "
                                    "one). Give the site a new key (secfed flower keys) unless it was a copy")
            proven[key] = n
            if holder is not None:
                log.info("node %s now holds %s's identity (was node %s)", n, self.cohort.name_of(key), holder)
                del self.identities[holder]
                self._displaced[holder] = key
            self.identities[n] = key

    # ---- one aggregation --------------------------------------------------------------------------

    def aggregate(self, grid: Grid, messages: Sequence[Message], encoding: Encoding, *, round: int = 0,
                  bind_model: bool = True, next_round: NextRound | None = None) -> SecAggResult:
        """Securely sum what the apps of ``messages``' nodes reply to them (``encoding`` says how a
        reply becomes a ring vector). ``bind_model``: clients check that they all train on the same
        content (the announced digest); turn it off only when contents differ per node on purpose.
        ``next_round``: the next aggregation, whose key advertisements then ride on this one's
        unmask (see the module docstring). Raises a :class:`~secfed.protocols.ProtocolError` when
        the round aborts."""
        content = {m.metadata.dst_node_id: m.content for m in messages}
        if len(content) != len(messages):
            raise ValueError("aggregate takes one message per node")
        # a node's policy refusal of this session, said while the last one ran (a refused advertisement alone,
        # or riding on its unmask), counts as this session's (found by review: lost, the run "finished")
        self.errors, self._refused_next = self._refused_next, {}
        nodes = sorted(content)
        identities = self.enrol(grid, nodes) if self.authenticated else {}
        if self.authenticated:
            nodes = [n for n in nodes if n in identities]
        if len(nodes) < 2:
            raise BelowThreshold(f"{len(nodes)} node(s) can take part; secure aggregation needs 2 or more")
        digest = b""
        if bind_model:
            digests = {content_digest(content[n]) for n in nodes}
            if len(digests) != 1:
                raise ValueError("the nodes' messages carry different contents; pass bind_model=False if meant")
            digest = digests.pop()
        advertised, self._next = self._next, None
        if advertised is None or not advertised.fits(nodes, encoding, round):
            advertised = None  # keys advertised for another cohort or encoding: advertise afresh
        follow = self._prepare(next_round) if next_round is not None else None
        try:
            return _Session(self, grid, advertised or self._new_session(nodes, encoding, round), content, digest,
                            str(round), advertised is not None, follow).run()
        finally:
            if follow is not None:  # refusals of the next session's advertisement sent alone land here
                self._refused_next |= {n: r for n, r in self.errors.items()
                                       if n in follow.nodes and r.startswith(POLICY_REFUSAL)}

    def _new_session(self, nodes: list[int], encoding: Encoding, round: int) -> _Prepared:
        """A fresh session among ``nodes`` (enrolled ones, in authenticated mode), nothing advertised yet."""
        quantizer = encoding.quantizer(len(nodes))
        key = ServerKey.generate()  # per session: the nodes seal their unmask responses to it
        config = SessionConfig(
            new_session_id(), round, self.params(len(nodes)), encoding.dimension,
            input_bound=quantizer.max_abs if quantizer else None, ring_bits=quantizer.bits if quantizer else 32,
            server_key=key.public, authenticated=self.authenticated,
            identity_keys=tuple(self.identities[n] for n in nodes if self.authenticated),
        )
        return _Prepared(config, key, nodes, encoding, SecAggServer(config, key))

    def _prepare(self, next_round: NextRound) -> _Prepared | None:
        """The next session, to advertise with this one's unmask: among the next nodes already
        enrolled (a node not enrolled yet makes the next aggregate advertise afresh)."""
        nodes = sorted(n for n in next_round.nodes if not self.authenticated or n in self.identities)
        if len(nodes) < 2:
            return None
        return self._new_session(nodes, next_round.encoding, next_round.round)

    # ---- transport --------------------------------------------------------------------------------

    def _notify(self, phase: str, nodes: Sequence[int]) -> None:
        log.info("secure aggregation: %s (%d nodes)", phase, len(nodes))
        if self.on_phase is not None:
            self.on_phase(phase, list(nodes))

    def _exchange(self, grid: Grid, contents: Mapping[int, RecordDict], timeout: float,
                  group: str) -> dict[int, Message]:
        return collect(grid, send(grid, contents, timeout=timeout, group=group), poll=self.poll_interval,
                       errors=self.errors)


def exchange(grid: Grid, contents: Mapping[int, RecordDict], *, timeout: float, poll: float = 0.2, group: str = "",
             message_type: str = MessageType.TRAIN) -> dict[int, Message]:
    """Send one message per node (``contents``: node id → content); the replies that arrive before
    the deadline, by node. Error replies and silence are logged and left out."""
    return collect(grid, send(grid, contents, timeout=timeout, group=group, message_type=message_type), poll=poll)


@dataclass
class Sent:
    """Messages pushed and not yet answered: message id → node, and when to stop waiting."""

    pending: dict[str, int]
    deadline: float  # time.monotonic(); a caller may move it earlier
    sent_at: float


def send(grid: Grid, contents: Mapping[int, RecordDict], *, timeout: float, group: str = "",
         message_type: str = MessageType.TRAIN) -> Sent:
    """Push one message per node without waiting (:func:`collect` the replies later)."""
    out = [Message(c, dst_node_id=n, message_type=message_type, group_id=group, ttl=timeout + 60)
           for n, c in contents.items()]
    ids = list(grid.push_messages(out)) if out else []
    now = time.monotonic()
    return Sent({mid: n for mid, n in zip(ids, contents) if mid}, now + timeout, now)


# Error replies a node's own code sent: its ClientApp raised, or a mod (SecAggMod) refused. Flower's
# others (a node unavailable, a reply not there) say nothing of what the node decided (found by review).
NODE_REFUSALS = frozenset({ErrorCode.CLIENT_APP_RAISED_EXCEPTION, ErrorCode.MOD_FAILED_PRECONDITION})


def collect(grid: Grid, sent: Sent, *, poll: float = 0.2, errors: dict[int, str] | None = None,
            refused: set[int] | None = None) -> dict[int, Message]:
    """The replies to ``sent`` that arrive before its deadline, by node; errors and silence logged
    (and each error's reason kept in ``errors``, by node; in ``refused``, the nodes whose own code
    answered with an error — not the SuperLink's word that a node was unavailable)."""
    pending, deadline = dict(sent.pending), sent.deadline
    replies: dict[int, Message] = {}
    while pending and time.monotonic() < deadline:
        for reply in grid.pull_messages(list(pending)):
            node = pending.pop(reply.metadata.reply_to_message_id, None)
            if node is None:
                continue
            if reply.has_error():
                log.warning("node %s: %s", node, reply.error.reason)
                if errors is not None:
                    errors[node] = reply.error.reason
                if refused is not None and reply.error.code in NODE_REFUSALS:
                    refused.add(node)
            else:
                replies[node] = reply
        if pending:
            time.sleep(poll)
    for node in pending.values():
        log.warning("node %s did not answer within %.0f s", node, max(0.0, deadline - sent.sent_at))
    return replies


class _Session:
    """One protocol session over the grid: the server state machine and the node ↔ index map.
    ``advertised``: the nodes' advertisements came with the previous session's unmask replies.
    ``follow``: the next session, whose advertisements ride on this one's unmask."""

    def __init__(self, flow: SecAggWorkflow, grid: Grid, session: _Prepared, content: Mapping[int, RecordDict],
                 digest: bytes, group: str, advertised: bool, follow: _Prepared | None) -> None:
        self.flow, self.grid, self.config, self.group = flow, grid, session.config, group
        self.session, self.advertised, self.follow = session, advertised, follow
        self.nodes, self.index = session.nodes, {n: i for i, n in enumerate(session.nodes)}
        self.content, self.encoding, self.digest = content, session.encoding, digest
        self.server = session.server
        self.clear: dict[int, RecordDict] = {}
        self.up, self.down = session.up, 0

    def run(self) -> SecAggResult:
        if not self.advertised:
            self._phase(ADVERTISE, {n: RecordDict({CONTROL: self.session.control(n)}) for n in self.nodes},
                        self.flow.phase_timeout)
        # The server says which phase comes next: the complete graph skips the graph seed, the
        # unauthenticated mode the consistency check.
        while (messages := self.server.close_phase()):
            phase = self.server.phase.name.lower()
            outbox = {self.nodes[i]: self._content(phase, self.nodes[i], message) for i, message in messages.items()}
            if phase == UNMASK and self.follow is not None:
                self._with_next(outbox)
            self._phase(phase, outbox, self.flow.input_timeout if phase == MASKED_INPUT else self.flow.phase_timeout)
            if phase == UNMASK and self.follow is not None:
                self.flow._next = self.follow  # whatever this session's end, the next one's keys are out
        result = self.server.result
        survivors = tuple(self.nodes[i] for i in result.survivors)
        return SecAggResult(
            total=result.total, survivors=survivors, dropped=tuple(n for n in self.nodes if n not in survivors),
            config=self.config, clear={n: c for n, c in self.clear.items() if n in survivors},
            bytes_up=self.up, bytes_down=self.down,
        )

    def _content(self, phase: str, node: int, message: Message) -> RecordDict:
        """Node ``node``'s message for ``phase``: the protocol message, with the app's content in the
        masked-input phase and the announced model digest at share_keys."""
        base = self.content[node] if phase == MASKED_INPUT else RecordDict()
        content = RecordDict({name: r for name, r in base.items() if name not in OURS})
        content[CONTROL] = ConfigRecord({"stage": phase})
        if phase == SHARE_KEYS and self.digest:  # sealed into the node's key-seed shares, checked by its neighbours
            content[CONTROL]["model-hash"] = self.digest
        data = encode(message)
        self.down += len(data)
        put_message(content, data)
        return content

    def _with_next(self, outbox: dict[int, RecordDict]) -> None:
        """The next session's advertise_keys riding on the unmask messages; a next node that gets no
        unmask message (not in this session, or dropped from it) gets it alone in the same exchange."""
        for n in self.follow.nodes:
            if n in outbox:
                outbox[n][NEXT] = self.follow.control(n)
            else:
                outbox[n] = RecordDict({CONTROL: self.follow.control(n)})

    def _phase(self, phase: str, outbox: dict[int, RecordDict], timeout: float) -> None:
        self.flow._notify(phase, [n for n, c in outbox.items() if control(c)["stage"] == phase])
        for n, reply in self.flow._exchange(self.grid, outbox, timeout, self.group).items():
            if self.follow is not None and phase == UNMASK:
                self._next_advertisement(n, reply)
                if control(outbox[n])["stage"] != phase:
                    continue  # a next node's advertisement alone
            try:
                _reply_control(reply, phase)
                data = get_message(reply.content)
                message = decode(data)
                if message.sender != self.index[n]:
                    raise WrongSender(f"node {n} (client {self.index[n]}) sent a message as client {message.sender}")
                self.server.receive(message)
            except ProtocolError as exc:
                log.warning("node %s dropped at %s: %s", n, phase, exc)
                continue
            self.up += len(data)
            if phase == MASKED_INPUT:
                self.clear[n] = RecordDict({name: r for name, r in reply.content.items() if name not in OURS})

    def _next_advertisement(self, node: int, reply: Message) -> None:
        """The next session's advertisement in an unmask reply (NEXT records) or alone; a node that
        sends none is absent from the next session's roster."""
        if node not in self.follow.nodes:
            return
        try:
            alone = control(reply.content) is not None and control(reply.content).get("stage") == ADVERTISE
            ctl = reply.content.config_records.get(NEXT) if NEXT in reply.content else None
            if not alone and ctl is not None and ctl.get("stage") == REFUSED:
                reason = str(ctl.get("reason", ""))[:2000]
                if reason.startswith(POLICY_REFUSAL):
                    self.flow._refused_next[node] = reason
                raise MalformedMessage(f"node {node} refused the next session: {reason}")
            if not alone and (ctl is None or ctl.get("stage") != ADVERTISE):
                raise MalformedMessage(f"node {node} sent no advertisement for the next session")
            self.follow.receive(node, get_message(reply.content, NEXT_PAYLOAD if not alone else PAYLOAD))
        except ProtocolError as exc:
            log.warning("node %s left out of the next session: %s", node, exc)


def _reply_control(reply: Message, stage: str) -> ConfigRecord:
    ctl = control(reply.content)
    if ctl is None or ctl.get("stage") != stage:
        raise MalformedMessage(f"reply is not a {stage} reply (control record {ctl!r})")
    return ctl
