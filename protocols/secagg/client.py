"""The client side of SecAgg / SecAgg+ as an explicit state machine with no transport inside.

One method per protocol step, each taking the server's typed message and returning the typed
reply (``encode``/``decode`` in :mod:`.messages` turn them into bytes)::

    adv   = client.advertise_keys()              # → AdvertiseKeys
    rev   = client.reveal_graph_nonce(commits)   # GraphCommitments → GraphReveal
    sh    = client.share_keys(roster, model_hash=h)  # KeyRoster    → EncryptedShares
    client.receive_shares(delivery)              # ShareDelivery
    y     = client.mask(x)                       # ring vector      → MaskedInput
    sig   = client.consistency_check(surv)       # SurvivorList     → ConsistencySignature (authenticated)
    rsp   = client.unmask(request)               # UnmaskRequest    → UnmaskResponse

Refusals: a message that is not well formed (:func:`.messages.validate`), of a type this step
does not expect, for another session/round, from someone other than the server or addressed to
someone else is rejected (typed error) and changes nothing. Anything wrong with the *content* of
an otherwise valid message means the server or a neighbour misbehaves: the client raises and
aborts for good, revealing nothing further.

Where the secrets go. The key-agreement seed s_u is shared t-of-k among u's neighbours when keys
are shared. The self-mask seed b_u is shared only with the neighbours u actually masks with
(those whose key shares reached it), and only inside u's masked input: a neighbour the server
kept out of u's masks never holds a share of b_u. Without that, a lying server could withhold
honest neighbours' shares from u, declare the neighbours u did mask with dropped (their key seeds
are then rebuilt) and collect b_u from the others — u's input alone. (Tested in
``test_protocols_malicious_server.py``.)

The model binding. The digest of the model a client trains on (``share_keys(..., model_hash=)``)
is sealed inside every key-seed share it sends (AES-GCM under the pair's channel key, from keys the signed
advertisement fixed: the server can neither read nor change it), and :meth:`receive_shares`
refuses (ModelMismatch) a neighbour's share that carries another digest — before anything is
masked or released. A server that gives one client another model therefore gets refusals and
unmasks nothing; to make a victim see only shares carrying the victim's digest it must withhold
the honest neighbours' shares and supply t of its own, i.e. hold t colluding neighbours — the
threshold, as before. The digest is not in the advertisement, so a client can advertise its keys
before its model exists (the Flower adapter sends round t+1's advertisement with round t's unmask
response).
"""

from __future__ import annotations

import contextlib
import enum
import os
import struct
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

import numpy as np
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from .. import parallel, shamir
from ..crypto import (
    DIGEST_BYTES,
    PUBLIC_KEY_BYTES,
    SIGNATURE_BYTES,
    mac,
    open_sealed,
    public_bytes,
    seal,
    sign,
    verify,
    verify_all,
    x25519_keypair,
)
from ..errors import (
    Aborted,
    BelowThreshold,
    BothSharesRequested,
    ConfigMismatch,
    DecryptionFailed,
    InconsistentShares,
    InconsistentView,
    MalformedMessage,
    ModelMismatch,
    ProtocolError,
    ReplayedMessage,
    SeedWithheld,
    UnknownClient,
    UnsupportedVersion,
    WrongPhase,
    WrongRound,
    WrongSender,
)
from ..prg import BoundExceeded, MaskStream, mask_into
from .graph import NeighbourGraph
from .idtable import IdTable, as_table, not_in
from .keys import (
    KEY_SHARE_PLAINTEXT,
    SHARE_PLAINTEXT,
    ListedCommitments,
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
    pairwise_sign,
    response_key,
    seal_secrets,
    self_mask_commitment,
    self_mask_key,
    share_aad,
    share_channel_keys,
)
from .messages import (
    GRAPH_NONCE_BYTES,
    HEADER_BYTES,
    SERVER,
    AdvertiseKeys,
    ConsistencySignature,
    EncryptedShares,
    GraphCommitments,
    GraphReveal,
    KeyRoster,
    MaskedInput,
    Message,
    RevealedSecrets,
    RevealedShare,
    RosterEntry,
    SealedShare,
    ShareDelivery,
    ShareKind,
    SurvivorList,
    UnmaskRequest,
    UnmaskResponse,
    _ids,
    _key_body,
    _key_fields,
    _Reader,
    validate,
)
from .session import SessionConfig

NO_MODEL_HASH = bytes(DIGEST_BYTES)


@dataclass(frozen=True)
class ClientPrimitives:
    """The three bulk primitives a client calls: the masking pass (:func:`~..prg.mask_into`), the
    Shamir split of its two seeds (:func:`~..shamir.split`) and the batch check of the consistency
    quorum's signatures (:func:`~..crypto.verify_all`).

    Only a load generator replaces them: bench/secagg/standins.py gives a server thousands of
    survivors' traffic by letting clients whose input nobody reads upload a uniform vector, split
    nothing and trust the quorum. Such a client protects nothing of its own (its input is not in
    the sum) and weakens its neighbours' protection against a lying server, so it is never built
    with a real input; the default, :data:`PRIMITIVES`, is the protocol.
    """

    mask_into: Callable[..., bytes] = mask_into
    split: Callable[[bytes, int, int], list[shamir.Share]] = shamir.split
    verify_all: Callable[..., None] = verify_all


PRIMITIVES = ClientPrimitives()


class ClientState(enum.Enum):
    """What the client waits for next."""

    START = "start"  # call advertise_keys()
    AWAIT_COMMITMENTS = "await_commitments"
    AWAIT_ROSTER = "await_roster"
    AWAIT_SHARES = "await_shares"
    AWAIT_INPUT = "await_input"  # call mask(x)
    AWAIT_SURVIVORS = "await_survivors"  # authenticated mode
    AWAIT_UNMASK = "await_unmask"
    DONE = "done"
    ABORTED = "aborted"


_ORDER = list(ClientState)


class SecAggClient:
    """Client ``client_id`` of the session described by ``config``.

    ``model_hash`` (given at :meth:`share_keys`): digest of the global model this client trains on
    (see ``model_digest``); neighbours must carry the same one. ``identity_key``: this client's long-term Ed25519 key,
    required in authenticated mode (its public half must be ``config.identity_keys[client_id]``).
    ``neighbours`` is known once the key roster has fixed the graph (empty before).
    ``primitives``: leave at :data:`PRIMITIVES` (see :class:`ClientPrimitives`).
    """

    def __init__(
        self,
        config: SessionConfig,
        client_id: int,
        *,
        identity_key: Ed25519PrivateKey | None = None,
        primitives: ClientPrimitives = PRIMITIVES,
    ) -> None:
        if not 0 <= client_id < config.n_clients:
            raise ValueError(f"client_id {client_id} is outside the cohort [0, {config.n_clients})")
        if config.authenticated:
            if identity_key is None:
                raise ValueError("authenticated mode needs the client's Ed25519 identity_key")
            if identity_key.public_key().public_bytes_raw() != config.identity_keys[client_id]:
                raise ValueError(f"identity_key does not match config.identity_keys[{client_id}]")
        elif identity_key is not None:
            raise ValueError("identity_key is only used in authenticated mode")
        self.config = config
        self.id = client_id
        self.model_hash = NO_MODEL_HASH  # set by share_keys
        self.neighbours: tuple[int, ...] = ()
        self._identity = identity_key
        self._primitives = primitives
        self._state = ClientState.START
        self._commitments: ListedCommitments | None = None  # graph commitments, as the server listed them
        self._seed = b""  # the graph seed, once known
        self._graph: NeighbourGraph | None = None
        self._roster: dict[int, RosterEntry] = {}
        self._held: dict[int, shamir.Share] = {}  # masking partner → its key-seed share held here
        self._channels: dict[tuple[int, int], bytes] = {}  # (sender, recipient) → share-channel key
        self._signed_survivors: tuple[int, ...] | None = None

    @property
    def state(self) -> ClientState:
        return self._state

    # ---- between messages: the whole state as bytes ---------------------------------------------

    def export_state(self) -> bytes:
        """This client's protocol state as bytes, for embeddings that keep no process alive between
        messages (a Flower ClientApp is a fresh process per message); :meth:`from_state` restores it.

        The bytes hold the round's secrets — the encryption key, the key seed, the self-mask seed,
        the graph nonce, the shares held for neighbours — so store them sealed (e.g. AES-GCM under
        a key that never leaves the client's machine), never in the clear. Left out: the session
        configuration (its digest is kept and checked on restore), the long-term identity key (pass
        both to :meth:`from_state`) and what is derived again on demand (the mask key from its seed,
        the share-channel keys, the graph from its seed). Explicit, versioned, length-checked
        layout (``_STATE_HEADER``), no pickle.
        """
        secrets = "_enc_private" in self.__dict__
        listed = self._commitments if self._state is ClientState.AWAIT_ROSTER else None
        flags = (_HAS_SECRETS if secrets else 0) | (_HAS_SEED if self._seed else 0) | (
            _HAS_SIGNED if self._signed_survivors is not None else 0) | (_HAS_LISTED if listed is not None else 0)
        body: list[bytes] = [self.model_hash]
        if secrets:
            body += [self._enc_private.private_bytes_raw(), self._mask_seed, self._self_seed, self._graph_nonce]
        if listed is not None:  # graph commitments as shown (sparse graph): ids and digest
            ids = listed.ids.astype("<u4")
            body += [struct.pack("<I", len(ids)), ids.tobytes(), listed.digest]
        if self._seed:
            body.append(self._seed)
        body.append(struct.pack("<I", len(self._roster)))
        for v in sorted(self._roster):
            body += [struct.pack("<I", v), *_key_fields(self._roster[v])]
        body.append(struct.pack("<I", len(self._held)))
        for v in sorted(self._held):
            body.append(_HELD.pack(v, self._held[v].index, self._held[v].value))
        if self._signed_survivors is not None:
            body.append(_ids(self._signed_survivors))
        payload = b"".join(body)
        header = _STATE_HEADER.pack(_STATE_MAGIC, _STATE_VERSION, _ORDER.index(self._state), flags,
                                    self.config.digest, self.id, len(payload))
        return header + payload

    @classmethod
    def from_state(
        cls, config: SessionConfig, data: bytes, *, identity_key: Ed25519PrivateKey | None = None
    ) -> SecAggClient:
        """The client :meth:`export_state` saved, in the same session ``config`` (else ConfigMismatch).

        Bytes that do not parse, or whose parts contradict each other or the config, raise
        :class:`MalformedMessage` (:class:`UnsupportedVersion` for another layout version).
        """
        view = memoryview(data).cast("B")
        if len(view) < _STATE_HEADER.size:
            raise MalformedMessage(f"client state of {len(view)} bytes is shorter than its {_STATE_HEADER.size}-byte header")
        magic, version, state_index, flags, digest, client_id, length = _STATE_HEADER.unpack_from(view)
        if magic != _STATE_MAGIC:
            raise MalformedMessage(f"client state: bad magic {magic!r}; expected {_STATE_MAGIC!r}")
        if version != _STATE_VERSION:
            raise UnsupportedVersion(f"client state layout {version}; this build reads {_STATE_VERSION} only")
        if length != len(view) - _STATE_HEADER.size:
            raise MalformedMessage(f"client state: header says {length} body bytes, {len(view) - _STATE_HEADER.size} present")
        if state_index >= len(_ORDER) or flags & ~(_HAS_SECRETS | _HAS_SEED | _HAS_SIGNED | _HAS_LISTED):
            raise MalformedMessage(f"client state: unknown state {state_index} or flags {flags:#06x}")
        if digest != config.digest:
            raise ConfigMismatch("client state was saved in a session with other parameters")
        if not 0 <= client_id < config.n_clients:
            raise MalformedMessage(f"client state: client {client_id} is outside the cohort of {config.n_clients}")
        state = _ORDER[state_index]
        live = state not in (ClientState.START, ClientState.DONE, ClientState.ABORTED)
        seeded = _ORDER.index(ClientState.AWAIT_SHARES) <= state_index <= _ORDER.index(ClientState.AWAIT_UNMASK)
        if bool(flags & _HAS_SECRETS) != live or (seeded and not flags & _HAS_SEED) or (
                flags & _HAS_SEED and state_index < _ORDER.index(ClientState.AWAIT_SHARES)) or (
                bool(flags & _HAS_LISTED) != (state is ClientState.AWAIT_ROSTER and not config.params.complete)) or (
                # an authenticated client awaiting the unmask request has signed the survivor set it checks
                config.authenticated and state is ClientState.AWAIT_UNMASK and not flags & _HAS_SIGNED):
            raise MalformedMessage(f"client state: flags {flags:#06x} do not fit state {state.value}")
        if (config.authenticated and identity_key is not None
                and identity_key.public_key().public_bytes_raw() != config.identity_keys[client_id]):
            raise MalformedMessage(f"client state: saved by client {client_id}, whose identity key is not the one given")
        r = _Reader(view[_STATE_HEADER.size :], "client state")
        client = cls(config, client_id, identity_key=identity_key)
        client.model_hash = r.fixed(DIGEST_BYTES, "model hash")
        client._state = state
        if flags & _HAS_SECRETS:
            client._enc_private = X25519PrivateKey.from_private_bytes(r.fixed(32, "encryption key"))
            client._mask_seed = r.fixed(shamir.SECRET_BYTES, "mask seed")
            client._mask_private = mask_private_key(config, client_id, client._mask_seed)
            client._self_seed = r.fixed(shamir.SECRET_BYTES, "self-mask seed")
            client._graph_nonce = r.fixed(GRAPH_NONCE_BYTES, "graph nonce")
        if flags & _HAS_LISTED:
            ids = np.asarray(r.ids("listed clients"), dtype=np.int64)
            listed_digest = r.fixed(DIGEST_BYTES, "graph commitments digest")
            if len(ids) and ids[-1] >= config.n_clients:
                raise MalformedMessage(f"client state: listed client {ids[-1]} is outside the cohort")
            try:
                client._commitments = ListedCommitments.restore(ids, listed_digest)
            except ValueError as exc:
                raise MalformedMessage(f"client state: {exc}") from None
        if flags & _HAS_SEED:
            client._seed = r.fixed(DIGEST_BYTES, "graph seed")
            client._graph = NeighbourGraph(config.params, client._seed, focus=client_id)
            client.neighbours = client._graph.of(client_id)
        for _ in range(r.count("roster entries", 4 + 2 * PUBLIC_KEY_BYTES + 3 * DIGEST_BYTES + 2)):
            entry = RosterEntry(client=r.u32("roster client"), **_key_body(r))
            if client._graph is None or not client._graph.are_neighbours(client_id, entry.client):
                raise MalformedMessage(f"client state: roster entry {entry.client} is not a neighbour")
            if entry.client in client._roster:
                raise MalformedMessage(f"client state: roster entry {entry.client} appears twice")
            client._roster[entry.client] = entry
        for _ in range(r.count("held shares", _HELD.size)):
            peer, index, value = _HELD.unpack(r.fixed(_HELD.size, "held share"))
            if peer not in client._roster or peer in client._held or index != client._graph.share_index(peer, client_id):
                raise MalformedMessage(f"client state: held share of {peer} does not fit the roster")
            client._held[peer] = shamir.Share(index, value)
        if config.params.complete and flags & _HAS_SEED and flags & _HAS_SECRETS and (
                client._seed != client._roster_seed(client._roster.values())):
            raise MalformedMessage("client state: the graph seed is not the hash of the saved keys and roster")
        if flags & _HAS_SIGNED:
            client._signed_survivors = _restored_survivors(config, client_id, state, r.ids("signed survivors"))
        r.end()
        return client

    # ---- phase 0: keys and the graph commitment -------------------------------------------------

    def advertise_keys(self) -> AdvertiseKeys:
        """Create this round's keys, seeds and graph nonce; advertise the public halves and the
        commitments (signed if authenticated). With the complete graph the next message is the key
        roster (no graph seed to agree on; the nonce's commitment is never opened)."""
        self._expect_state(ClientState.START)
        cfg = self.config
        self._enc_private, enc_public = x25519_keypair()
        self._mask_seed = os.urandom(shamir.SECRET_BYTES)
        self._mask_private = mask_private_key(cfg, self.id, self._mask_seed)
        self._self_seed = os.urandom(shamir.SECRET_BYTES)
        self._graph_nonce = os.urandom(GRAPH_NONCE_BYTES)
        mask_public = public_bytes(self._mask_private)
        commitment = self_mask_commitment(cfg, self.id, self._self_seed)
        nonce_commitment = graph_commitment(cfg, self.id, self._graph_nonce)
        signature = b""
        if cfg.authenticated:
            payload = advertise_payload(cfg, self.id, enc_public, mask_public, commitment, nonce_commitment)
            signature = sign(self._identity, payload)
        self._state = ClientState.AWAIT_ROSTER if cfg.params.complete else ClientState.AWAIT_COMMITMENTS
        return AdvertiseKeys(
            **self._envelope(), enc_public=enc_public, mask_public=mask_public,
            self_mask_commitment=commitment, graph_commitment=nonce_commitment, config_digest=cfg.digest,
            signature=signature,
        )

    # ---- phase 1: the graph seed ----------------------------------------------------------------

    def reveal_graph_nonce(self, commitments: GraphCommitments) -> GraphReveal:
        """Reveal the graph nonce once the server has fixed everyone's commitments.

        The graph seed will hash every listed client's nonce, this client's included, and the
        list is fixed before this client's nonce is known to anyone: however the server picks the
        list, the graph this client ends up in is uniformly random from its point of view.
        """
        self._accept(commitments, GraphCommitments, ClientState.AWAIT_COMMITMENTS)
        with self._aborting():
            listed = as_table(commitments.commitments, DIGEST_BYTES)  # validated: ids increasing
            if len(listed):
                self._check_cohort(int(listed.ids[-1]), "graph commitments")
            if listed.value_of(self.id) != graph_commitment(self.config, self.id, self._graph_nonce):
                raise InconsistentView(f"the graph commitments omit or alter client {self.id}'s own")
            self._commitments = ListedCommitments(listed)
            self._state = ClientState.AWAIT_ROSTER
            return GraphReveal(**self._envelope(), nonce=self._graph_nonce)

    # ---- phase 2: share the key seed ------------------------------------------------------------

    def share_keys(self, roster: KeyRoster, *, model_hash: bytes = NO_MODEL_HASH) -> EncryptedShares:
        """Derive the graph (from the revealed nonces; the complete graph needs none); check the
        neighbours' keys (config, signatures, graph commitments); seal a t-of-k share of the key seed
        for each, with ``model_hash`` (the digest of the model this client trains on this round)
        inside: the neighbours compare it with theirs in :meth:`receive_shares`."""
        if len(model_hash) != DIGEST_BYTES:
            raise ValueError(f"model_hash must be {DIGEST_BYTES} bytes, got {len(model_hash)}")
        self._accept(roster, KeyRoster, ClientState.AWAIT_ROSTER)
        with self._aborting():
            self.model_hash = model_hash
            cfg, t, complete = self.config, self.config.params.threshold, self.config.params.complete
            revealed = as_table(roster.nonces, GRAPH_NONCE_BYTES)  # validated: ids increasing
            if complete:  # the graph does not depend on a seed; the roster's own seed is set below
                if len(revealed):
                    raise MalformedMessage("key roster reveals graph nonces; the complete graph uses none")
                self._graph = NeighbourGraph(cfg.params, b"", focus=self.id)
            else:
                self._seed = self._check_nonces(revealed)
                self._graph = NeighbourGraph(cfg.params, self._seed, focus=self.id)
            self.neighbours = self._graph.of(self.id)
            seen_keys = {public_bytes(self._enc_private), public_bytes(self._mask_private)}
            for e in roster.entries:
                self._check_neighbour(e.client, "key roster")
                if not complete:  # the entry carries the commitment its revealed nonce opens
                    if revealed.position(e.client) is None:
                        raise UnknownClient(f"key roster lists neighbour {e.client}, which revealed no graph nonce")
                    if e.graph_commitment != graph_commitment(cfg, e.client, revealed.value_of(e.client)):
                        raise InconsistentView(f"neighbour {e.client}'s graph commitment differs from the one listed")
                if e.config_digest != cfg.digest:
                    raise ConfigMismatch(f"neighbour {e.client} runs this session with different parameters")
                if cfg.authenticated:
                    payload = advertise_payload(
                        cfg, e.client, e.enc_public, e.mask_public, e.self_mask_commitment, e.graph_commitment
                    )
                    verify(cfg.identity_keys[e.client], e.signature, payload, who=f"client {e.client}'s keys")
                if e.enc_public in seen_keys or e.mask_public in seen_keys or e.enc_public == e.mask_public:
                    raise MalformedMessage(f"key roster repeats a public key (at neighbour {e.client})")
                seen_keys |= {e.enc_public, e.mask_public}
            if len(roster.entries) < t:
                raise BelowThreshold(
                    f"client {self.id}: {len(roster.entries)} of its {len(self.neighbours)} neighbours "
                    f"advertised keys; threshold is {t}"
                )
            self._roster = {e.client: e for e in roster.entries}
            if complete:  # the roster as shown, bound into the masked input and the signature
                self._seed = self._roster_seed(roster.entries)
            self._commitments = None  # the nonces are checked: the list is no longer needed
            key_shares = self._primitives.split(self._mask_seed, t, len(self.neighbours))
            sealed = tuple(self._seal_share(v, ShareKind.MASK_KEY, key_shares) for v in self._roster)
            signature = sign(self._identity, key_shares_payload(cfg, self.id, sealed)) if cfg.authenticated else b""
            self._state = ClientState.AWAIT_SHARES
            return EncryptedShares(**self._envelope(), shares=sealed, signature=signature)

    def _roster_seed(self, entries: Iterable[RosterEntry]) -> bytes:
        """The complete graph's seed: this client's advertised keys and the roster it was shown."""
        own = (self.id, public_bytes(self._enc_private), public_bytes(self._mask_private))
        return complete_graph_seed(self.config, [own, *((e.client, e.enc_public, e.mask_public) for e in entries)])

    # ---- phase 3: masked input ------------------------------------------------------------------

    def receive_shares(self, delivery: ShareDelivery) -> None:
        """Open the key-seed shares neighbours sealed for this client; they decide whom it masks with.
        A share that carries another model digest than this client's aborts it (ModelMismatch)
        before it masks anything."""
        self._accept(delivery, ShareDelivery, ClientState.AWAIT_SHARES)
        with self._aborting():
            held = {}
            for s in delivery.shares:
                if s.peer not in self._roster:
                    raise UnknownClient(f"share delivery has a share from {s.peer}, not a neighbour in the roster")
                held[s.peer] = self._open_share(s.peer, ShareKind.MASK_KEY, s.ciphertext)
            if len(held) < self.config.params.threshold:
                raise BelowThreshold(
                    f"client {self.id}: shares arrived from {len(held)} neighbours; "
                    f"threshold is {self.config.params.threshold}"
                )
            self._held = held
            self._state = ClientState.AWAIT_INPUT

    def mask(self, x: np.ndarray) -> MaskedInput:
        """Mask the ring vector ``x`` (uint values in [0, 2^ring_bits)) with the self mask and pairwise
        masks; attach shares of the self-mask seed for the masking partners, and the binding tag
        (plus an Ed25519 signature in authenticated mode)."""
        self._expect_state(ClientState.AWAIT_INPUT)
        cfg = self.config
        source = self._ring_vector(x)  # a bad input is the caller's error: the client stays ready
        streams = [MaskStream(self_mask_key(cfg, self.id, self._self_seed), 1)]
        with self._aborting():  # a neighbour's unusable mask key (e.g. a low-order point) is the roster's
            for v in sorted(self._held):
                key = pairwise_mask_key(cfg, self.id, v, self._mask_private, self._roster[v].mask_public)
                streams.append(MaskStream(key, pairwise_sign(self.id, v)))
        acc = parallel.zeros(cfg.dimension)
        try:  # one pass: bound check, masks, reduction and the vector's digest
            digest = self._primitives.mask_into(acc, source, streams, bits=cfg.ring_bits, bound=cfg.input_bound)
        except BoundExceeded as exc:
            raise ValueError(
                f"client input at index {exc.index} is {_signed(exc.value, cfg.ring_bits)}, beyond the session's "
                f"input bound {cfg.input_bound} (the ring was sized for it; quantize with the session's quantizer)"
            ) from None
        self_shares = self._primitives.split(self._self_seed, cfg.params.threshold, len(self.neighbours))
        sealed = tuple(self._seal_share(v, ShareKind.SELF_MASK, self_shares) for v in sorted(self._held))
        payload = masked_input_payload(cfg, self.id, self._seed, digest, sealed)
        tag = mac(input_tag_key(cfg, self.id, self._self_seed), payload)
        signature = sign(self._identity, masked_input_signed(payload, tag)) if cfg.authenticated else b""
        self._state = ClientState.AWAIT_SURVIVORS if cfg.authenticated else ClientState.AWAIT_UNMASK
        return MaskedInput(**self._envelope(), vector=acc, self_mask_shares=sealed, tag=tag, signature=signature)

    def masked_input(self, delivery: ShareDelivery, x: np.ndarray) -> MaskedInput:
        """:meth:`receive_shares` then :meth:`mask`."""
        self.receive_shares(delivery)
        return self.mask(x)

    # ---- phase 4 (authenticated): consistency check ---------------------------------------------

    def consistency_check(self, survivors: SurvivorList) -> ConsistencySignature:
        """Sign the survivor set the server announces (and the graph seed) — once per round,
        whatever it shows later."""
        if not self.config.authenticated:
            raise WrongPhase("the consistency check exists only in authenticated mode")
        self._accept(survivors, SurvivorList, ClientState.AWAIT_SURVIVORS)
        with self._aborting():
            self._check_survivors(survivors.survivors)
            self._signed_survivors = survivors.survivors
            payload = consistency_payload(self.config, self._seed, survivors.survivors)
            self._state = ClientState.AWAIT_UNMASK
            return ConsistencySignature(**self._envelope(), signature=sign(self._identity, payload))

    # ---- phase 5: unmask ------------------------------------------------------------------------

    def unmask(self, request: UnmaskRequest) -> UnmaskResponse:
        """Reveal, per masking partner, the self-mask share if it survived or the key share if it dropped,
        and this client's own self-mask seed — all sealed to the server (``config.server_key``).

        Refuses (and aborts) a request that names a client twice or names this client as dropped
        (BothSharesRequested), names clients this client has no shares of (UnknownClient), leaves
        fewer than t surviving neighbours (BelowThreshold), forwards a self-mask share from a
        client it lists as dropped (InconsistentView) or, in authenticated mode, differs from the
        survivor set this client signed or lacks a quorum of valid signatures on it.
        """
        self._accept(request, UnmaskRequest, ClientState.AWAIT_UNMASK)
        with self._aborting():
            cfg = self.config
            survivors, dropped = set(request.survivors), set(request.dropped)
            both = survivors & dropped
            if both:
                raise BothSharesRequested(f"unmask request lists {sorted(both)} as both survived and dropped")
            if self.id in dropped:
                raise BothSharesRequested(
                    f"unmask request lists this client ({self.id}) as dropped after it sent its masked input"
                )
            if cfg.authenticated:
                self._check_quorum(request)
            self._check_survivors(request.survivors)
            for v in dropped:
                self._check_cohort(v, "dropped list")
                if self._graph.are_neighbours(self.id, v) and v not in self._held:
                    raise UnknownClient(f"unmask request names neighbour {v} as dropped; it never shared keys here")
            self_shares = {}
            for s in request.self_mask_shares:
                if s.peer in dropped:
                    raise InconsistentView(
                        f"unmask request forwards a masked input's self-mask share from {s.peer}, "
                        "which it lists as dropped"
                    )
                if s.peer not in survivors or s.peer not in self._held:
                    raise UnknownClient(f"unmask request forwards a self-mask share from {s.peer}, "
                                        "not a surviving masking partner of this client")
                self_shares[s.peer] = self._open_share(s.peer, ShareKind.SELF_MASK, s.ciphertext)
            revealed = []
            for v in sorted(self._held):
                if v in self_shares:
                    revealed.append(RevealedShare(v, ShareKind.SELF_MASK, self_shares[v].value))
                elif v in dropped:
                    revealed.append(RevealedShare(v, ShareKind.MASK_KEY, self._held[v].value))
            # Sealed to the server: in the clear these seeds and shares give whoever sees the wire the sum.
            secrets = RevealedSecrets(self_mask_seed=self._self_seed, shares=tuple(revealed))
            key = response_key(cfg, self.id, self._enc_private, cfg.server_key)
            response = UnmaskResponse(**self._envelope(), sealed=seal_secrets(cfg, self.id, key, secrets))
            self._forget_secrets()
            self._state = ClientState.DONE
            return response

    # ---- transport-style entry point -----------------------------------------------------------

    def handle(self, message: Message, *, ring_input: np.ndarray | None = None,
               model_hash: bytes = NO_MODEL_HASH) -> Message | None:
        """Dispatch a server message to its step and return the reply (None if there is none yet).

        A ``KeyRoster`` is answered with shares carrying ``model_hash``; a ``ShareDelivery`` with the
        masked input when ``ring_input`` is given, otherwise call :meth:`mask` once the input is ready.
        """
        validate(message)
        if isinstance(message, GraphCommitments):
            return self.reveal_graph_nonce(message)
        if isinstance(message, KeyRoster):
            return self.share_keys(message, model_hash=model_hash)
        if isinstance(message, ShareDelivery):
            self.receive_shares(message)
            return None if ring_input is None else self.mask(ring_input)
        if isinstance(message, SurvivorList):
            return self.consistency_check(message)
        if isinstance(message, UnmaskRequest):
            return self.unmask(message)
        self._check_envelope(message)
        raise WrongPhase(f"client {self.id} does not accept {type(message).__name__} from the server")

    # ---- shares ---------------------------------------------------------------------------------

    def _seal_share(self, holder: int, kind: ShareKind, shares: list[shamir.Share]) -> SealedShare:
        """Seal this client's share for ``holder`` (at holder's place in the neighbour list)."""
        index = self._graph.share_index(self.id, holder)
        value = shares[index - 1].value
        plaintext = (KEY_SHARE_PLAINTEXT.pack(self.id, holder, index, value, self.model_hash)
                     if kind is ShareKind.MASK_KEY else SHARE_PLAINTEXT.pack(self.id, holder, index, value))
        aad = share_aad(self.config, self._seed, kind, self.id, holder)
        return SealedShare(holder, seal(self._channel(self.id, holder), plaintext, aad))

    def _open_share(self, owner: int, kind: ShareKind, ciphertext: bytes) -> shamir.Share:
        aad = share_aad(self.config, self._seed, kind, owner, self.id)
        plaintext = open_sealed(self._channel(owner, self.id), ciphertext, aad)
        layout = KEY_SHARE_PLAINTEXT if kind is ShareKind.MASK_KEY else SHARE_PLAINTEXT
        if len(plaintext) != layout.size:
            raise DecryptionFailed(f"share from {owner} has {len(plaintext)} bytes inside")
        claimed_owner, holder, index, value, *model_hash = layout.unpack(plaintext)
        if (claimed_owner, holder, index) != (owner, self.id, self._graph.share_index(owner, self.id)):
            raise WrongSender(f"sealed share from {owner} claims owner {claimed_owner}, holder {holder}, index {index}")
        if model_hash and model_hash[0] != self.model_hash:  # a key-seed share: the model binding
            raise ModelMismatch(f"neighbour {owner} trained on model {model_hash[0].hex()[:16]}…, "
                                f"this client on {self.model_hash.hex()[:16]}…")
        return shamir.Share(index, value)

    def _channel(self, sender: int, recipient: int) -> bytes:
        """The AES-GCM key of shares from ``sender`` to ``recipient`` (one of them is this client);
        both directions' keys come from one exchange, once per round, and serve both kinds of share."""
        key = self._channels.get((sender, recipient))
        if key is None:
            peer = recipient if sender == self.id else sender
            out, back = share_channel_keys(self.config, self.id, peer, self._enc_private, self._roster[peer].enc_public)
            self._channels[(self.id, peer)], self._channels[(peer, self.id)] = out, back
            key = self._channels[(sender, recipient)]
        return key

    # ---- checks --------------------------------------------------------------------------------

    def _envelope(self) -> dict:
        c = self.config
        return dict(session_id=c.session_id, round=c.round, sender=self.id, recipient=SERVER)

    def _expect_state(self, state: ClientState) -> None:
        if self._state is ClientState.ABORTED:
            raise Aborted(f"client {self.id} aborted this round")
        if self._state is not state:
            raise WrongPhase(f"client {self.id} is in state {self._state.value}, not {state.value}")

    def _check_envelope(self, message: Message) -> None:
        c = self.config
        if (message.session_id, message.round) != (c.session_id, c.round):
            raise WrongRound(
                f"message for session {message.session_id.hex()} round {message.round}; "
                f"client {self.id} is in session {c.session_id.hex()} round {c.round}"
            )
        if message.sender != SERVER:
            raise WrongSender(f"message claims sender {message.sender}; only the server talks to clients")
        if message.recipient != self.id:
            raise WrongSender(f"message for client {message.recipient} reached client {self.id}")

    def _accept(self, message: Message, kind: type, state: ClientState) -> None:
        """Shape, type, envelope and phase checks: failures reject the message without changing state."""
        validate(message)
        if not isinstance(message, kind):
            raise WrongPhase(f"client {self.id} expects a {kind.__name__} now, got a {type(message).__name__}")
        if self._state is ClientState.ABORTED:
            raise Aborted(f"client {self.id} aborted this round")
        self._check_envelope(message)
        if self._state is not state:
            if _ORDER.index(self._state) > _ORDER.index(state):
                raise ReplayedMessage(f"client {self.id} already handled a {kind.__name__} this round")
            raise WrongPhase(f"client {self.id} is in state {self._state.value}; {kind.__name__} comes later")

    @contextlib.contextmanager
    def _aborting(self) -> Iterator[None]:
        """A ProtocolError while processing message content aborts the client for good."""
        try:
            yield
        except ProtocolError:
            self._state = ClientState.ABORTED
            self._forget_secrets()
            raise

    def _check_cohort(self, client: int, where: str) -> None:
        if not 0 <= client < self.config.n_clients:
            raise UnknownClient(f"{where} names client {client}, outside the cohort of {self.config.n_clients}")

    def _check_neighbour(self, client: int, where: str) -> None:
        self._check_cohort(client, where)
        if not self._graph.are_neighbours(self.id, client):
            raise UnknownClient(f"{where} names client {client}, not a neighbour of client {self.id}")

    def _check_nonces(self, nonces: IdTable) -> bytes:
        """The graph seed from the revealed nonces, each checked against the commitment listed earlier.

        A sparse graph needs every listed nonce: were some allowed to go missing, whoever
        withholds them (colluding clients, or the server claiming they never arrived) could pick
        the graph among all the subsets.
        """
        cfg, listed = self.config, self._commitments
        unknown = not_in(nonces.ids, listed.ids)
        if unknown.size:
            raise UnknownClient(f"key roster reveals a graph nonce of client {unknown[0]}, which committed to none")
        if nonces.value_of(self.id) != self._graph_nonce:
            raise InconsistentView(f"key roster omits or alters client {self.id}'s own graph nonce")
        missing = not_in(listed.ids, nonces.ids).tolist()
        if missing:
            raise SeedWithheld(
                f"clients {missing} committed to graph nonces that the key roster does not reveal; "
                "a sparse graph cannot be derived without them. Round aborted"
            )
        listed.check(cfg, nonces)
        return graph_seed(cfg, nonces)

    def _check_survivors(self, survivors: tuple[int, ...]) -> None:
        t = self.config.params.threshold
        if survivors:  # strictly increasing (validated): the last id is the largest
            self._check_cohort(survivors[-1], "survivor list")
        alive = set(survivors)
        if self.id not in alive:
            raise InconsistentView(f"survivor list omits client {self.id}, which sent its masked input")
        for v in self.neighbours:
            if v in alive and v not in self._held:
                raise UnknownClient(f"survivor list names neighbour {v}, which never shared keys with client {self.id}")
        surviving = sum(1 for v in self.neighbours if v in alive)
        if surviving < t:
            raise BelowThreshold(
                f"client {self.id}: {surviving} of its neighbours survive; threshold is {t}. "
                f"Revealing shares now could expose inputs"
            )

    def _check_quorum(self, request: UnmaskRequest) -> None:
        cfg = self.config
        if request.survivors != self._signed_survivors:
            raise InconsistentView("unmask request's survivor set differs from the one this client signed")
        payload = consistency_payload(cfg, self._seed, request.survivors)
        signatures = as_table(request.signatures, SIGNATURE_BYTES)  # validated: signers increasing
        strangers = not_in(signatures.ids, np.asarray(request.survivors, dtype=np.int64))
        if strangers.size:
            raise UnknownClient(f"consistency signature from {strangers[0]}, which is not a survivor")
        self._primitives.verify_all(
            [(cfg.identity_keys[signer], signature) for signer, signature in signatures], payload,
            who=lambda i: f"client {signatures.ids[i]}'s consistency check",
        )
        quorum = cfg.params.signature_quorum
        signers = len(signatures)
        if signers < quorum:
            raise BelowThreshold(f"{signers} clients signed the survivor set; authenticated mode needs {quorum}")

    def _ring_vector(self, x: np.ndarray) -> np.ndarray:
        """``x`` as a uint32 vector (no copy when it is one); values and the input bound are checked
        while masking (:func:`~..prg.mask_into`)."""
        cfg = self.config
        x = np.asarray(x)
        if x.shape != (cfg.dimension,):
            raise ValueError(f"client input must have shape ({cfg.dimension},), got {x.shape}")
        if not np.issubdtype(x.dtype, np.integer):
            raise TypeError(f"client input must be ring integers (uint32), got dtype {x.dtype}; quantize floats first")
        if x.dtype != np.uint32:
            low, high = int(x.min()), int(x.max())
            if low < 0 or high >= 1 << cfg.ring_bits:
                raise ValueError(f"client input values must lie in [0, 2^{cfg.ring_bits}); found [{low}, {high}]")
        return np.ascontiguousarray(x, dtype=np.uint32)

    def _forget_secrets(self) -> None:
        for name in ("_enc_private", "_mask_private", "_mask_seed", "_self_seed"):
            self.__dict__.pop(name, None)
        self._held, self._channels = {}, {}


_STATE_MAGIC = b"SACS"
_STATE_VERSION = 4  # roster entries as in wire versions 5 and 6 (no model digest); shares of GF(2^31 − 1) (20 bytes);
# v3: no listed commitments kept with the complete graph (it skips the graph-seed phase); v4: roster entries
# without the model digest, which is the one given at share_keys (zeros before)
# magic | version u8 | state u8 (index in ClientState) | flags u16 | config digest 32B | client id u32
# | body length u32 (48 bytes, like a message header); the body follows export_state's order.
_STATE_HEADER = struct.Struct("<4sBBH32sII")
assert _STATE_HEADER.size == HEADER_BYTES  # so _Reader's offsets in errors are the state's own
_HAS_SECRETS, _HAS_SEED, _HAS_SIGNED, _HAS_LISTED = 1, 2, 4, 8
_HELD = struct.Struct(f"<II{shamir.SHARE_BYTES}s")  # peer, share index, share value


def _restored_survivors(config: SessionConfig, client_id: int, state: ClientState,
                        survivors: tuple[int, ...]) -> tuple[int, ...]:
    """The survivor set a restored client signed, checked like the SurvivorList it signed: saved
    bytes are input too, and an id outside the cohort would surface later as an IndexError."""
    if not config.authenticated or _ORDER.index(state) < _ORDER.index(ClientState.AWAIT_UNMASK):
        raise MalformedMessage(f"client state: a signed survivor set does not fit state {state.value} "
                               f"({'authenticated' if config.authenticated else 'unauthenticated'} mode)")
    if survivors and survivors[-1] >= config.n_clients:  # strictly increasing: the last is the largest
        raise MalformedMessage(f"client state: signed survivor {survivors[-1]} is outside the cohort of {config.n_clients}")
    if client_id not in survivors:
        raise MalformedMessage(f"client state: the signed survivor set omits client {client_id} itself")
    return survivors


def _signed(value: int, bits: int) -> int:
    return value - (1 << bits) if value >= 1 << (bits - 1) else value

