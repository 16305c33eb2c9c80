"""The client side of SecAgg / SecAgg+ as an explicit state machine with no transport inside.

One method per protocol step, each taking the server's typed message and returning the typed
reply (``encode``/``decode`` in :mod:`.messages` turn them into bytes)::

    adv   = client.advertise_keys()            # → AdvertiseKeys
    sh    = client.share_keys(roster)          # KeyRoster      → EncryptedShares
    client.receive_shares(delivery)            # ShareDelivery
    y     = client.mask(x)                     # ring vector    → MaskedInput
    sig   = client.consistency_check(surv)     # SurvivorList   → ConsistencySignature (authenticated)
    rsp   = client.unmask(request)             # UnmaskRequest  → UnmaskResponse

Refusals: a message for another session/round, from someone other than the server, addressed to
someone else, or of a type this step does not expect is rejected (typed error) and changes
nothing. Anything wrong with the *content* of an otherwise valid message means the server or a
neighbour misbehaves: the client raises and aborts for good, revealing nothing further.
"""

from __future__ import annotations

import contextlib
import enum
import os
import struct
from collections.abc import Iterator

import numpy as np
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from .. import shamir
from ..crypto import DIGEST_BYTES, open_sealed, public_bytes, seal, sign, verify, x25519_keypair
from ..errors import (
    Aborted,
    BelowThreshold,
    BothSharesRequested,
    ConfigMismatch,
    DecryptionFailed,
    InconsistentView,
    MalformedMessage,
    ModelMismatch,
    ProtocolError,
    ReplayedMessage,
    UnknownClient,
    WrongPhase,
    WrongRound,
    WrongSender,
)
from ..prg import MaskStream, apply_masks
from .keys import (
    advertise_payload,
    consistency_payload,
    mask_private_key,
    pairwise_mask_key,
    pairwise_sign,
    self_mask_commitment,
    self_mask_key,
    share_aad,
    share_channel_key,
)
from .messages import (
    SERVER,
    AdvertiseKeys,
    ConsistencySignature,
    EncryptedShares,
    KeyRoster,
    MaskedInput,
    Message,
    RevealedShare,
    RosterEntry,
    SealedShare,
    ShareDelivery,
    ShareKind,
    SurvivorList,
    UnmaskRequest,
    UnmaskResponse,
    validate,
)
from .session import SessionConfig

NO_MODEL_HASH = bytes(DIGEST_BYTES)
_SHARE_PLAINTEXT = struct.Struct("<III16s16s")  # owner, holder, share index, self-mask share, key share


class ClientState(enum.Enum):
    """What the client waits for next."""

    START = "start"  # call advertise_keys()
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

    ``model_hash``: digest of the global model this client trained on (see ``model_digest``);
    neighbours must carry the same one. ``identity_key``: this client's long-term Ed25519 key,
    required in authenticated mode (its public half must be ``config.identity_keys[client_id]``).
    """

    def __init__(
        self,
        config: SessionConfig,
        client_id: int,
        *,
        model_hash: bytes = NO_MODEL_HASH,
        identity_key: Ed25519PrivateKey | None = None,
    ) -> None:
        if not 0 <= client_id < config.n_clients:
            raise ValueError(f"client_id {client_id} is outside the cohort [0, {config.n_clients})")
        if len(model_hash) != DIGEST_BYTES:
            raise ValueError(f"model_hash must be {DIGEST_BYTES} bytes, got {len(model_hash)}")
        if config.authenticated:
            if identity_key is None:
                raise ValueError("authenticated mode needs the client's Ed25519 identity_key")
            if identity_key.public_key().public_bytes_raw() != config.identity_keys[client_id]:
                raise ValueError(f"identity_key does not match config.identity_keys[{client_id}]")
        elif identity_key is not None:
            raise ValueError("identity_key is only used in authenticated mode")
        self.config = config
        self.id = client_id
        self.model_hash = model_hash
        self.neighbours = config.graph.of(client_id)
        self._identity = identity_key
        self._state = ClientState.START
        self._roster: dict[int, RosterEntry] = {}
        self._held: dict[int, tuple[shamir.Share, shamir.Share]] = {}  # neighbour → (self-mask, key) shares
        self._signed_survivors: tuple[int, ...] | None = None

    @property
    def state(self) -> ClientState:
        return self._state

    # ---- phase 0 -------------------------------------------------------------------------------

    def advertise_keys(self) -> AdvertiseKeys:
        """Create this round's keys and seeds; advertise the public halves (signed if authenticated)."""
        self._expect_state(ClientState.START)
        cfg = self.config
        self._enc_private, enc_public = x25519_keypair()
        self._mask_seed = os.urandom(shamir.SECRET_BYTES)
        self._mask_private = mask_private_key(cfg, self.id, self._mask_seed)
        self._self_seed = os.urandom(shamir.SECRET_BYTES)
        mask_public = public_bytes(self._mask_private)
        commitment = self_mask_commitment(cfg, self.id, self._self_seed)
        signature = b""
        if cfg.authenticated:
            payload = advertise_payload(cfg, self.id, enc_public, mask_public, commitment, self.model_hash)
            signature = sign(self._identity, payload)
        self._state = ClientState.AWAIT_ROSTER
        return AdvertiseKeys(
            **self._envelope(), enc_public=enc_public, mask_public=mask_public,
            self_mask_commitment=commitment, model_hash=self.model_hash,
            config_digest=cfg.digest, signature=signature,
        )

    # ---- phase 1 -------------------------------------------------------------------------------

    def share_keys(self, roster: KeyRoster) -> EncryptedShares:
        """Check the neighbours' keys (config, model hash, signatures); seal t-of-k shares for each."""
        self._accept(roster, KeyRoster, ClientState.AWAIT_ROSTER)
        with self._aborting():
            cfg, t = self.config, self.config.params.threshold
            seen_keys = {public_bytes(self._enc_private), public_bytes(self._mask_private)}
            for e in roster.entries:
                self._check_neighbour(e.client, "key roster")
                if e.config_digest != cfg.digest:
                    raise ConfigMismatch(f"neighbour {e.client} runs this session with different parameters")
                if e.model_hash != self.model_hash:
                    raise ModelMismatch(
                        f"neighbour {e.client} trained on model {e.model_hash.hex()[:16]}…, "
                        f"this client on {self.model_hash.hex()[:16]}…"
                    )
                if cfg.authenticated:
                    payload = advertise_payload(
                        cfg, e.client, e.enc_public, e.mask_public, e.self_mask_commitment, e.model_hash
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
            k = len(self.neighbours)
            self_mask_shares = shamir.split(self._self_seed, t, k)
            key_shares = shamir.split(self._mask_seed, t, k)
            sealed = []
            for v, e in self._roster.items():
                index = cfg.graph.share_index(self.id, v)
                plaintext = _SHARE_PLAINTEXT.pack(
                    self.id, v, index, self_mask_shares[index - 1].value, key_shares[index - 1].value
                )
                key = share_channel_key(cfg, self.id, v, self._enc_private, e.enc_public)
                sealed.append(SealedShare(v, seal(key, plaintext, share_aad(cfg, self.id, v))))
            self._state = ClientState.AWAIT_SHARES
            return EncryptedShares(**self._envelope(), shares=tuple(sealed))

    # ---- phase 2 -------------------------------------------------------------------------------

    def receive_shares(self, delivery: ShareDelivery) -> None:
        """Open the shares neighbours sealed for this client; they decide whom it masks with."""
        self._accept(delivery, ShareDelivery, ClientState.AWAIT_SHARES)
        with self._aborting():
            cfg, t = self.config, self.config.params.threshold
            held = {}
            for s in delivery.shares:
                if s.peer not in self._roster:
                    raise UnknownClient(f"share delivery has a share from {s.peer}, not a neighbour in the roster")
                key = share_channel_key(cfg, s.peer, self.id, self._enc_private, self._roster[s.peer].enc_public)
                plaintext = open_sealed(key, s.ciphertext, share_aad(cfg, s.peer, self.id))
                if len(plaintext) != _SHARE_PLAINTEXT.size:
                    raise DecryptionFailed(f"share from {s.peer} has {len(plaintext)} bytes inside")
                owner, holder, index, self_share, key_share = _SHARE_PLAINTEXT.unpack(plaintext)
                if (owner, holder, index) != (s.peer, self.id, cfg.graph.share_index(s.peer, self.id)):
                    raise WrongSender(
                        f"sealed share from {s.peer} claims owner {owner}, holder {holder}, index {index}"
                    )
                held[s.peer] = (shamir.Share(index, self_share), shamir.Share(index, key_share))
            if len(held) < t:
                raise BelowThreshold(
                    f"client {self.id}: shares arrived from {len(held)} neighbours; threshold is {t}"
                )
            self._held = held
            self._state = ClientState.AWAIT_INPUT

    def mask(self, x: np.ndarray) -> MaskedInput:
        """Mask the ring vector ``x`` (uint values in [0, 2^ring_bits)) with the self mask and pairwise masks."""
        self._expect_state(ClientState.AWAIT_INPUT)
        cfg = self.config
        acc = self._ring_vector(x)
        streams = [MaskStream(self_mask_key(cfg, self.id, self._self_seed), 1)]
        for v in sorted(self._held):
            key = pairwise_mask_key(cfg, self.id, v, self._mask_private, self._roster[v].mask_public)
            streams.append(MaskStream(key, pairwise_sign(self.id, v)))
        apply_masks(acc, streams, bits=cfg.ring_bits)
        self._state = ClientState.AWAIT_SURVIVORS if cfg.authenticated else ClientState.AWAIT_UNMASK
        return MaskedInput(**self._envelope(), vector=acc)

    def masked_input(self, delivery: ShareDelivery, x: np.ndarray) -> MaskedInput:
        """:meth:`receive_shares` then :meth:`mask`."""
        self.receive_shares(delivery)
        return self.mask(x)

    # ---- phase 3 (authenticated) ---------------------------------------------------------------

    def consistency_check(self, survivors: SurvivorList) -> ConsistencySignature:
        """Sign the survivor set the server announces — once per round, whatever it shows later."""
        if not self.config.authenticated:
            raise WrongPhase("the consistency check exists only in authenticated mode")
        self._accept(survivors, SurvivorList, ClientState.AWAIT_SURVIVORS)
        with self._aborting():
            self._check_survivors(survivors.survivors)
            self._signed_survivors = survivors.survivors
            payload = consistency_payload(self.config, survivors.survivors)
            self._state = ClientState.AWAIT_UNMASK
            return ConsistencySignature(**self._envelope(), signature=sign(self._identity, payload))

    # ---- phase 4 -------------------------------------------------------------------------------

    def unmask(self, request: UnmaskRequest) -> UnmaskResponse:
        """Reveal, per neighbour, the self-mask share if it survived or the key share if it dropped.

        Refuses (and aborts) a request that names a client twice or names this client as dropped
        (BothSharesRequested), names clients this client has no shares of (UnknownClient), leaves
        fewer than t surviving neighbours (BelowThreshold) or, in authenticated mode, differs from
        the survivor set this client signed or lacks a quorum of valid signatures on it.
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
                if cfg.graph.are_neighbours(self.id, v) and v not in self._held:
                    raise UnknownClient(f"unmask request names neighbour {v} as dropped; it never shared keys here")
            revealed = []
            for v in sorted(self._held):
                if v in survivors:
                    revealed.append(RevealedShare(v, ShareKind.SELF_MASK, self._held[v][0].value))
                elif v in dropped:
                    revealed.append(RevealedShare(v, ShareKind.MASK_KEY, self._held[v][1].value))
            response = UnmaskResponse(**self._envelope(), self_mask_seed=self._self_seed, shares=tuple(revealed))
            self._forget_secrets()
            self._state = ClientState.DONE
            return response

    # ---- transport-style entry point -----------------------------------------------------------

    def handle(self, message: Message, *, ring_input: np.ndarray | None = None) -> Message | None:
        """Dispatch a server message to its step and return the reply (None if there is none yet).

        A ``ShareDelivery`` is answered with the masked input when ``ring_input`` is given;
        otherwise call :meth:`mask` once the input is ready.
        """
        validate(message)
        if isinstance(message, KeyRoster):
            return self.share_keys(message)
        if isinstance(message, ShareDelivery):
            self.receive_shares(message)
            return None if ring_input is None else self.mask(ring_input)
        if isinstance(message, SurvivorList):
            return self.consistency_check(message)
        if isinstance(message, UnmaskRequest):
            return self.unmask(message)
        self._check_envelope(message)
        raise WrongPhase(f"client {self.id} does not accept {type(message).__name__} from the server")

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
        if not self.config.graph.are_neighbours(self.id, client):
            raise UnknownClient(f"{where} names client {client}, not a neighbour of client {self.id}")

    def _check_survivors(self, survivors: tuple[int, ...]) -> None:
        t = self.config.params.threshold
        for v in survivors:
            self._check_cohort(v, "survivor list")
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
        payload = consistency_payload(cfg, request.survivors)
        alive = set(request.survivors)
        for signer, signature in request.signatures:
            if signer not in alive:
                raise UnknownClient(f"consistency signature from {signer}, which is not a survivor")
            verify(cfg.identity_keys[signer], signature, payload, who=f"client {signer}'s consistency check")
        quorum = cfg.params.signature_quorum
        if len(request.signatures) < quorum:
            raise BelowThreshold(
                f"{len(request.signatures)} clients signed the survivor set; authenticated mode needs {quorum}"
            )

    def _ring_vector(self, x: np.ndarray) -> np.ndarray:
        cfg = self.config
        x = np.asarray(x)
        if x.shape != (cfg.dimension,):
            raise ValueError(f"client input must have shape ({cfg.dimension},), got {x.shape}")
        if not np.issubdtype(x.dtype, np.integer):
            raise TypeError(f"client input must be ring integers (uint32), got dtype {x.dtype}; quantize floats first")
        if x.dtype != np.uint32 or cfg.ring_bits < 32:
            low, high = int(x.min()), int(x.max())
            if low < 0 or high >= 1 << cfg.ring_bits:
                raise ValueError(f"client input values must lie in [0, 2^{cfg.ring_bits}); found [{low}, {high}]")
        acc = np.array(x, dtype=np.uint32, copy=True, order="C")
        if cfg.input_bound is not None:
            # Read as signed b-bit integers, values must lie in [−M, M]: (v + M) mod 2^b ≤ 2M.
            bound = cfg.input_bound
            shifted = (acc + np.uint32(bound)) & np.uint32((1 << cfg.ring_bits) - 1)
            beyond = np.flatnonzero(shifted > 2 * bound)
            if beyond.size:
                i = int(beyond[0])
                raise ValueError(
                    f"client input at index {i} is {_signed(int(acc[i]), cfg.ring_bits)}, beyond the session's "
                    f"input bound {bound} (the ring was sized for it; quantize with the session's quantizer)"
                )
        return acc

    def _forget_secrets(self) -> None:
        for name in ("_enc_private", "_mask_private", "_mask_seed", "_self_seed"):
            self.__dict__.pop(name, None)
        self._held = {}


def _signed(value: int, bits: int) -> int:
    return value - (1 << bits) if value >= 1 << (bits - 1) else value
