"""The server side of SecAgg / SecAgg+ as an explicit state machine with no transport inside.

The embedding feeds every client message to :meth:`SecAggServer.receive` and, when a phase's
deadline passes, calls :meth:`SecAggServer.close_phase`, which returns the messages to send for
the next phase (client id → message). After the unmask phase closes, :attr:`result` holds the
sum of the surviving clients' ring vectors.

``receive`` validates a message completely before it changes anything, so a rejected message
(typed error) leaves the server as it was; a client that misbehaves simply ends up dropped.
``close_phase`` aborts the round with :class:`BelowThreshold` as soon as some client needed later
keeps fewer than t neighbours (or, authenticated, the survivors fall below the signature quorum),
with :class:`SeedWithheld` when a sparse graph's nonce is missing, and with :class:`ForgedInput`
when a masked input's tag does not verify under its sender's self-mask seed — before any sum is
released.

What the server holds at any time: public keys, graph commitments and nonces, sealed shares it
cannot open, the running sum of masked vectors (each is added on arrival, hashed in the same
pass: memory is O(d) for the vectors, whatever the cohort) with its binding and tag per input, and
at the end the seeds it needs — self-mask seeds of survivors, key seeds of clients that dropped
after sharing keys. Unmasking regenerates the masks as a stream (:func:`~..prg.apply_masks`:
groups of keys, chunks of the vector, every core), never a mask vector per client.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from .. import parallel, shamir
from ..crypto import DIGEST_BYTES, SIGNATURE_BYTES, mac_matches, public_bytes, verify
from ..errors import (
    Aborted,
    BelowThreshold,
    ConfigMismatch,
    ForgedInput,
    InconsistentShares,
    MalformedMessage,
    ProtocolError,
    ReplayedMessage,
    SeedWithheld,
    SignatureInvalid,
    UnknownClient,
    WrongPhase,
    WrongRound,
    WrongSender,
)
from ..prg import MaskStream, accumulate, apply_masks
from .graph import NeighbourGraph
from .idtable import IdTable
from .keys import (
    SEALED_KEY_SHARE_BYTES,
    SEALED_SHARE_BYTES,
    advertise_payload,
    complete_graph_seed,
    consistency_payload,
    graph_commitment,
    graph_seed,
    input_tag_key,
    mask_private_key,
    key_shares_payload,
    masked_input_payload,
    masked_input_signed,
    pairwise_mask_key,
    open_secrets,
    pairwise_sign,
    response_key,
    self_mask_commitment,
    self_mask_key,
)
from .messages import (
    GRAPH_NONCE_BYTES,
    SERVER,
    AdvertiseKeys,
    ConsistencySignature,
    EncryptedShares,
    GraphCommitments,
    GraphReveal,
    KeyRoster,
    MaskedInput,
    Message,
    Pairs,
    RevealedSecrets,
    RosterEntry,
    SealedShare,
    ShareDelivery,
    ShareKind,
    SurvivorList,
    UnmaskRequest,
    UnmaskResponse,
    validate,
)
from .session import Phase, ServerKey, SessionConfig

_EXPECTS = {
    Phase.ADVERTISE_KEYS: AdvertiseKeys,
    Phase.GRAPH_SEED: GraphReveal,
    Phase.SHARE_KEYS: EncryptedShares,
    Phase.MASKED_INPUT: MaskedInput,
    Phase.CONSISTENCY_CHECK: ConsistencySignature,
    Phase.UNMASK: UnmaskResponse,
}


@dataclass(frozen=True, eq=False)
class AggregateResult:
    """``total``: Σ of the survivors' ring vectors mod 2^ring_bits (uint32).

    ``survivors``: clients whose inputs are in ``total``. ``dropped``: the rest of the cohort.
    ``graph_seed``: the seed the round's neighbour graph was derived from.
    """

    total: np.ndarray
    survivors: tuple[int, ...]
    dropped: tuple[int, ...]
    graph_seed: bytes


class SecAggServer:
    """The aggregation server of the session described by ``config``, holding the session's
    :class:`~.session.ServerKey` (the private half of ``config.server_key``): unmask responses are
    sealed to it, so only this server learns the seeds that unmask the sum."""

    def __init__(self, config: SessionConfig, key: ServerKey) -> None:
        """``key``: the server's key for this session, whose public half is ``config.server_key``;
        clients seal their unmask responses to it."""
        if not isinstance(key, ServerKey) or key.public != config.server_key:
            raise ValueError("the server needs the ServerKey whose public half is config.server_key")
        self.config = config
        self._key = key
        self._phase: Phase | None = Phase.ADVERTISE_KEYS  # None once finished
        self._aborted = False
        self._adverts: dict[int, AdvertiseKeys] = {}
        self._nonces: dict[int, bytes] = {}
        self._graph: NeighbourGraph | None = None
        self._seed = b""
        self._sealed: dict[int, dict[int, bytes]] = {}  # sender → recipient → sealed key-seed share
        self._acc = parallel.zeros(config.dimension)
        self._inputs: dict[int, tuple[bytes, bytes]] = {}  # sender → (binding payload, tag)
        self._self_shares: dict[int, dict[int, bytes]] = {}  # owner → holder → sealed self-mask share
        self._signatures: dict[int, bytes] = {}
        self._responses: dict[int, RevealedSecrets] = {}  # responder → what it revealed (opened)
        self._u1: frozenset[int] = frozenset()  # advertised
        self._u1r: frozenset[int] = frozenset()  # revealed their graph nonce: the share-keys cohort
        self._u2: frozenset[int] = frozenset()  # shared keys
        self._u3: tuple[int, ...] = ()  # sent a masked input: the survivors
        self._dropped: tuple[int, ...] = ()  # shared keys, sent no masked input
        self._survivor_set: frozenset[int] = frozenset()
        self._dropped_set: frozenset[int] = frozenset()
        self._askable: frozenset[int] = frozenset()  # who gets the unmask request
        self._result: AggregateResult | None = None

    @property
    def phase(self) -> Phase | None:
        """The phase whose messages are being collected (None when finished)."""
        return self._phase

    @property
    def graph(self) -> NeighbourGraph:
        """The round's neighbour graph, fixed once the graph-seed phase has closed."""
        if self._graph is None:
            raise WrongPhase("the neighbour graph exists only after the graph-seed phase is closed")
        return self._graph

    @property
    def result(self) -> AggregateResult:
        if self._result is None:
            raise WrongPhase("the aggregate exists only after the unmask phase is closed")
        return self._result

    # ---- receiving -----------------------------------------------------------------------------

    def receive(self, message: Message) -> None:
        """Validate and record one client message of the current phase (typed error if refused)."""
        validate(message)
        if self._aborted:
            raise Aborted("the server aborted this round")
        c = self.config
        if (message.session_id, message.round) != (c.session_id, c.round):
            raise WrongRound(
                f"message for session {message.session_id.hex()} round {message.round}; "
                f"server runs session {c.session_id.hex()} round {c.round}"
            )
        if message.recipient != SERVER:
            raise WrongSender(f"message addressed to client {message.recipient} reached the server")
        if not 0 <= message.sender < c.n_clients:
            raise UnknownClient(f"message from {message.sender}, outside the cohort of {c.n_clients}")
        expected = _EXPECTS.get(self._phase) if self._phase is not None else None
        if expected is None or not isinstance(message, expected):
            where = self._phase.name.lower() if self._phase is not None else "finished"
            raise WrongPhase(f"{type(message).__name__} from client {message.sender} in phase {where}")
        {
            AdvertiseKeys: self._on_advertise,
            GraphReveal: self._on_reveal,
            EncryptedShares: self._on_shares,
            MaskedInput: self._on_masked,
            ConsistencySignature: self._on_signature,
            UnmaskResponse: self._on_response,
        }[expected](message)

    def _once(self, sender: int, seen, what: str) -> None:
        if sender in seen:
            raise ReplayedMessage(f"second {what} from client {sender}")

    def _member(self, sender: int, group, what: str) -> None:
        if sender not in group:
            raise WrongSender(f"client {sender} {what}")

    def _on_advertise(self, m: AdvertiseKeys) -> None:
        self._once(m.sender, self._adverts, "key advertisement")
        c = self.config
        if m.config_digest != c.digest:
            raise ConfigMismatch(f"client {m.sender} runs this session with different parameters")
        if c.authenticated:
            payload = advertise_payload(
                c, m.sender, m.enc_public, m.mask_public, m.self_mask_commitment, m.graph_commitment
            )
            verify(c.identity_keys[m.sender], m.signature, payload, who=f"client {m.sender}'s keys")
        self._adverts[m.sender] = m

    def _on_reveal(self, m: GraphReveal) -> None:
        self._member(m.sender, self._u1, "did not advertise keys, so it has no graph nonce to reveal")
        self._once(m.sender, self._nonces, "graph nonce")
        if graph_commitment(self.config, m.sender, m.nonce) != self._adverts[m.sender].graph_commitment:
            raise InconsistentShares(f"client {m.sender}'s graph nonce does not match its commitment")
        self._nonces[m.sender] = m.nonce

    def _on_shares(self, m: EncryptedShares) -> None:
        self._member(m.sender, self._u1r, "did not reveal its graph nonce, so it cannot share keys")
        self._once(m.sender, self._sealed, "share message")
        expected = [v for v in self._graph.of(m.sender) if v in self._u1r]
        # Every neighbour in the cohort must get a share, or masks would not cancel.
        self._check_sealed(m.sender, m.shares, expected, "key-seed shares", "neighbours that revealed nonces",
                           SEALED_KEY_SHARE_BYTES)
        self._check_signed(m.sender, m.signature, lambda: key_shares_payload(self.config, m.sender, m.shares),
                           "key-share message")
        self._sealed[m.sender] = {s.peer: s.ciphertext for s in m.shares}

    def _on_masked(self, m: MaskedInput) -> None:
        self._member(m.sender, self._u2, "did not share keys, so its masked input cannot be unmasked")
        self._once(m.sender, self._inputs, "masked input")
        c = self.config
        if m.vector.shape != (c.dimension,):
            raise MalformedMessage(f"client {m.sender}'s masked input has {m.vector.size} entries, expected {c.dimension}")
        if c.ring_bits < 32 and int(m.vector.max()) >> c.ring_bits:
            raise MalformedMessage(f"client {m.sender}'s masked input has values outside Z_2^{c.ring_bits}")
        # Its self-mask seed must reach exactly the neighbours it masks with: those that shared keys.
        expected = [v for v in self._graph.of(m.sender) if v in self._u2]
        self._check_sealed(m.sender, m.self_mask_shares, expected, "self-mask shares", "neighbours that shared keys",
                           SEALED_SHARE_BYTES)
        if not c.authenticated and m.signature:
            raise MalformedMessage(f"client {m.sender}'s masked input carries a signature in unauthenticated mode")
        # Summed on arrival, hashed in the same pass (the accumulator wraps mod 2^32; reduced mod 2^b
        # at the end): the server keeps O(d) memory whatever the cohort.
        digest = accumulate(self._acc, m.vector)
        payload = masked_input_payload(c, m.sender, self._seed, digest, m.self_mask_shares)
        if c.authenticated:
            try:
                verify(c.identity_keys[m.sender], m.signature, masked_input_signed(payload, m.tag),
                       who=f"client {m.sender}'s masked input")
            except SignatureInvalid:
                np.subtract(self._acc, m.vector, out=self._acc)  # refused: the sum is as it was
                raise
        self._inputs[m.sender] = (payload, m.tag)
        self._self_shares[m.sender] = {s.peer: s.ciphertext for s in m.self_mask_shares}

    def _check_signed(self, sender: int, signature: bytes, payload: Callable[[], bytes], what: str) -> None:
        """In authenticated mode ``signature`` must verify under the sender's identity key (else
        SignatureInvalid, the message refused and nothing recorded); unauthenticated, it must be empty."""
        if self.config.authenticated:
            verify(self.config.identity_keys[sender], signature, payload(), who=f"client {sender}'s {what}")
        elif signature:
            raise MalformedMessage(f"client {sender}'s {what} carries a signature in unauthenticated mode")

    def _check_sealed(self, sender: int, shares, expected: list[int], what: str, whom: str, size: int) -> None:
        got = [s.peer for s in shares]
        if got != expected:
            raise MalformedMessage(f"client {sender} sealed {what} for {got}; its {whom} are {expected}")
        for s in shares:
            if len(s.ciphertext) != size:
                raise MalformedMessage(
                    f"client {sender}'s sealed share for {s.peer} has {len(s.ciphertext)} bytes, expected {size}"
                )

    def _on_signature(self, m: ConsistencySignature) -> None:
        self._member(m.sender, self._askable, "is not a survivor, so it has no survivor set to sign")
        self._once(m.sender, self._signatures, "consistency signature")
        verify(self.config.identity_keys[m.sender], m.signature, self._consistency_payload,
               who=f"client {m.sender}'s consistency check")
        self._signatures[m.sender] = m.signature

    def _on_response(self, response: UnmaskResponse) -> None:
        sender = response.sender
        self._member(sender, self._askable, "was not asked to unmask")
        self._once(sender, self._responses, "unmask response")
        c = self.config
        # Sealed to this server's key: DecryptionFailed if it does not open, MalformedMessage if its
        # plaintext is not well formed. Either way the response is refused and nothing changes.
        key = response_key(c, sender, self._key.private, self._adverts[sender].enc_public)
        m = open_secrets(c, sender, key, response.sealed)
        if self_mask_commitment(c, sender, m.self_mask_seed) != self._adverts[sender].self_mask_commitment:
            raise InconsistentShares(f"client {sender}'s own self-mask seed does not match its commitment")
        for s in m.shares:
            if s.owner in self._survivor_set:
                if sender not in self._self_shares[s.owner]:
                    raise UnknownClient(f"client {sender} revealed a self-mask share of {s.owner}, which it never held")
                wanted = ShareKind.SELF_MASK
            elif s.owner in self._dropped_set:
                if not self._graph.are_neighbours(sender, s.owner):
                    raise UnknownClient(f"client {sender} revealed a share of {s.owner}, not its neighbour")
                wanted = ShareKind.MASK_KEY
            else:
                raise UnknownClient(f"client {sender} revealed a share of {s.owner}, which nobody asked about")
            if s.kind is not wanted:
                raise MalformedMessage(
                    f"client {sender} revealed a {s.kind.name} share of {s.owner}; "
                    f"the request asked for its {wanted.name} share"
                )
        self._responses[sender] = m

    # ---- closing phases ------------------------------------------------------------------------

    def close_phase(self) -> dict[int, Message]:
        """End the current phase; return the next phase's messages (client id → message).

        After the unmask phase this computes :attr:`result` and returns ``{}``. Raises
        :class:`BelowThreshold` (and aborts the round) when too few clients remain.
        """
        if self._aborted:
            raise Aborted("the server aborted this round")
        if self._phase is None:
            raise WrongPhase("the round is finished")
        closer = {
            Phase.ADVERTISE_KEYS: self._close_advertise,
            Phase.GRAPH_SEED: self._close_graph_seed,
            Phase.SHARE_KEYS: self._close_share_keys,
            Phase.MASKED_INPUT: self._close_masked_input,
            Phase.CONSISTENCY_CHECK: self._close_consistency,
            Phase.UNMASK: self._close_unmask,
        }[self._phase]
        try:
            return closer()
        except ProtocolError:
            self._aborted = True
            self._acc = np.zeros(0, dtype=np.uint32)
            raise

    def _require_neighbours(self, clients, alive, when: str, purpose: str) -> None:
        t = self.config.params.threshold
        for u in sorted(clients):
            left = sum(1 for v in self._graph.of(u) if v in alive)
            if left < t:
                raise BelowThreshold(
                    f"after {when}, client {u} has {left} of its {len(self._graph.of(u))} neighbours left; "
                    f"{t} are needed to {purpose}. Round aborted"
                )

    def _require_quorum(self, count: int, when: str) -> None:
        if self.config.authenticated and count < self.config.params.signature_quorum:
            raise BelowThreshold(
                f"after {when}, {count} clients remain; authenticated mode needs "
                f"{self.config.params.signature_quorum} to sign the survivor set. Round aborted"
            )

    def _envelope(self, recipient: int) -> dict:
        c = self.config
        return dict(session_id=c.session_id, round=c.round, sender=SERVER, recipient=recipient)

    def _close_advertise(self) -> dict[int, Message]:
        u1 = frozenset(self._adverts)
        if not u1:
            raise BelowThreshold("no client advertised keys. Round aborted")
        self._require_quorum(len(u1), "advertise keys")
        self._u1 = u1
        if self.config.params.complete:  # no graph seed to agree on: straight to the key roster
            seed = complete_graph_seed(self.config, ((v, a.enc_public, a.mask_public) for v, a in self._adverts.items()))
            return self._rosters(u1, IdTable(b"", GRAPH_NONCE_BYTES), seed)
        self._phase = Phase.GRAPH_SEED
        # One table, shared by every client's message (encoding it is a copy of its bytes).
        commitments = IdTable.from_pairs(((v, self._adverts[v].graph_commitment) for v in sorted(u1)), DIGEST_BYTES)
        return {u: GraphCommitments(**self._envelope(u), commitments=commitments) for u in sorted(u1)}

    def _close_graph_seed(self) -> dict[int, Message]:
        revealed = frozenset(self._nonces)
        missing = sorted(self._u1 - revealed)
        if missing:
            raise SeedWithheld(
                f"clients {missing} committed to graph nonces and never revealed them; a sparse graph "
                "cannot be derived without them. Round aborted"
            )
        if not revealed:
            raise BelowThreshold("no client revealed its graph nonce. Round aborted")
        nonces = IdTable.from_pairs(sorted(self._nonces.items()), GRAPH_NONCE_BYTES)
        return self._rosters(revealed, nonces, graph_seed(self.config, nonces))

    def _rosters(self, revealed: frozenset[int], nonces: IdTable, seed: bytes) -> dict[int, Message]:
        """Fix the graph from ``seed``; each client in ``revealed`` gets its neighbours' keys."""
        self._seed = seed
        self._graph = NeighbourGraph(self.config.params, seed)
        self._require_neighbours(revealed, revealed, "the graph seed", "hold its secret shares")
        self._require_quorum(len(revealed), "the graph seed")
        self._u1r = revealed
        self._phase = Phase.SHARE_KEYS
        # Every client's entry is the same in each roster that lists it: build it once.
        entry = {
            v: RosterEntry(
                client=v, enc_public=a.enc_public, mask_public=a.mask_public,
                self_mask_commitment=a.self_mask_commitment, graph_commitment=a.graph_commitment,
                config_digest=a.config_digest, signature=a.signature,
            )
            for v in revealed
            for a in (self._adverts[v],)
        }
        return {
            u: KeyRoster(**self._envelope(u), nonces=nonces,
                         entries=tuple(entry[v] for v in self._graph.of(u) if v in revealed))
            for u in sorted(revealed)
        }

    def _close_share_keys(self) -> dict[int, Message]:
        u2 = frozenset(self._sealed)
        self._require_neighbours(u2, u2, "share keys", "hold its secret shares")
        self._require_quorum(len(u2), "share keys")
        self._u2 = u2
        self._phase = Phase.MASKED_INPUT
        return {
            u: ShareDelivery(
                **self._envelope(u),
                shares=tuple(SealedShare(v, self._sealed[v][u]) for v in self._graph.of(u) if v in u2),
            )
            for u in sorted(u2)
        }

    def _close_masked_input(self) -> dict[int, Message]:
        u3 = frozenset(self._inputs)
        dropped = self._u2 - u3
        if not u3:
            raise BelowThreshold("no client sent a masked input. Round aborted")
        self._require_neighbours(u3, u3, "masked input", "rebuild its self-mask seed")
        # A dropped client's key seed is needed only if some survivor masked with it.
        needed = {v for v in dropped if any(w in u3 for w in self._graph.of(v))}
        self._require_neighbours(needed, u3, "masked input", "rebuild the key of this dropped client")
        self._require_quorum(len(u3), "masked input")
        self._u3, self._dropped = tuple(sorted(u3)), tuple(sorted(dropped))
        self._survivor_set, self._dropped_set = u3, frozenset(dropped)
        self._askable = u3
        self._sealed = {}
        if self.config.authenticated:
            self._consistency_payload = consistency_payload(self.config, self._seed, self._u3)
            self._phase = Phase.CONSISTENCY_CHECK
            return {u: SurvivorList(**self._envelope(u), survivors=self._u3) for u in self._u3}
        self._phase = Phase.UNMASK
        return self._unmask_requests(IdTable(b"", SIGNATURE_BYTES))

    def _close_consistency(self) -> dict[int, Message]:
        signers = frozenset(self._signatures)
        self._require_quorum(len(signers), "the consistency check")
        self._askable = signers
        self._phase = Phase.UNMASK
        # A quorum's worth of signatures is the certificate: more would only cost every client
        # bandwidth and verifications (each client checks all it is sent).
        quorum = self.config.params.signature_quorum
        return self._unmask_requests(IdTable.from_pairs(sorted(self._signatures.items())[:quorum], SIGNATURE_BYTES))

    def _unmask_requests(self, signatures: Pairs) -> dict[int, Message]:
        survivors = self._survivor_set
        return {
            u: UnmaskRequest(
                **self._envelope(u), survivors=self._u3, dropped=self._dropped, signatures=signatures,
                self_mask_shares=tuple(  # shares sealed for u come only from its neighbours
                    SealedShare(v, self._self_shares[v][u])
                    for v in self._graph.of(u) if v in survivors and u in self._self_shares[v]
                ),
            )
            for u in sorted(self._askable)
        }

    def _close_unmask(self) -> dict[int, Message]:
        c, graph, t = self.config, self._graph, self.config.params.threshold
        responders = self._responses
        survivors = self._survivor_set
        # Shares are needed only for seeds the server must rebuild: survivors that did not answer
        # (their own seed did not arrive), and dropped clients some survivor masked with.
        rebuild = {u for u in self._u3 if u not in responders}
        rebuild.update(v for v in self._dropped if any(w in survivors for w in graph.of(v)))
        revealed: dict[tuple[int, ShareKind], list[shamir.Share]] = {}
        for holder, response in sorted(responders.items()):
            for s in response.shares:
                if s.owner in rebuild:
                    share = shamir.Share(graph.share_index(s.owner, holder), s.value)
                    revealed.setdefault((s.owner, s.kind), []).append(share)
        # Seeds rebuilt and tags checked first; then one streamed pass regenerates every mask
        # (apply_masks takes the streams a group at a time, on every core).
        streams: list[MaskStream] = []
        for u in self._u3:
            if u in responders:
                seed = responders[u].self_mask_seed  # checked against the commitment on arrival
            else:
                commitment = self._adverts[u].self_mask_commitment
                seed = shamir.recover(
                    revealed.get((u, ShareKind.SELF_MASK), []), t,
                    lambda s, u=u, commitment=commitment: self_mask_commitment(c, u, s) == commitment,
                    what=f"self-mask seed of client {u} (it left before unmasking)",
                )
            payload, tag = self._inputs[u]
            if not mac_matches(input_tag_key(c, u, seed), tag, payload):
                raise ForgedInput(
                    f"the masked input received as client {u}'s does not carry its tag: replayed, substituted "
                    "or spoofed. Round aborted; no sum is released"
                )
            streams.append(MaskStream(self_mask_key(c, u, seed), -1))
        for v in self._dropped:
            partners = [w for w in graph.of(v) if w in survivors]
            if not partners:
                continue
            mask_public = self._adverts[v].mask_public
            seed = shamir.recover(
                revealed.get((v, ShareKind.MASK_KEY), []), t,
                lambda s, v=v, pk=mask_public: public_bytes(mask_private_key(c, v, s)) == pk,
                what=f"key seed of dropped client {v}",
            )
            private = mask_private_key(c, v, seed)
            for w in partners:
                key = pairwise_mask_key(c, w, v, private, self._adverts[w].mask_public)
                streams.append(MaskStream(key, -pairwise_sign(w, v)))
        acc = self._acc
        apply_masks(acc, streams, bits=c.ring_bits)
        self._result = AggregateResult(
            total=acc,
            survivors=self._u3,
            dropped=tuple(i for i in range(c.n_clients) if i not in survivors),
            graph_seed=self._seed,
        )
        self._phase = None
        self._responses = {}
        return {}
