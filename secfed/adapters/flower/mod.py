"""The client side: secfed's secure aggregation as a Flower ClientApp mod.

    app = ClientApp(mods=[SecAggMod()])

The mod answers the train messages that carry secfed's control record (everything else goes to
the app untouched) and runs one :class:`~secfed.protocols.SecAggClient` across them:

    enrol              prove the node's Ed25519 identity (authenticated mode); riding on an app
                       message (the run's first), the app answers that message in the same reply
    advertise_keys     check the session against this node's policy, create keys → AdvertiseKeys
    share_keys         the model digest the server announces for the round goes sealed into every
                       share (the neighbours refuse shares carrying another) → EncryptedShares
    graph_seed, consistency_check, unmask      the protocol's next step
    unmask+advertise_keys    (pipelining) the unmask, then the next session's advertise_keys (NEXT
                       record): the reply carries both; the next session's sealed client replaces
                       this one's. A refused advertisement leaves the unmask reply alone.
    masked_input       open the neighbours' shares, check the model is the one announced, run the
                       wrapped app on the message (secfed's records removed), encode its reply
                       (encoding.py) and mask it → MaskedInput. The reply's values never leave.

A ClientApp is a fresh process for every message, so between messages the client lives in
``context.state`` as :meth:`SecAggClient.export_state` bytes, sealed with AES-256-GCM under the
node's own key (node.py: ``STATE_DIR/node.key``, on the SuperNode's machine only) and bound to
the run and node. A refusal (any protocol error, a reply that cannot be encoded) is answered with
an error reply; the client is then aborted for the round and reveals nothing more.

Node policy (node config, or the constructor): ``secfed-cohort`` — in authenticated mode every
identity key of the session must belong to this cohort file, so the server cannot bring in
identities of its own; unauthenticated sessions are refused unless
``secfed-allow-unauthenticated`` is true; authenticated sessions on a sparse (SecAgg+) graph are
refused unless ``secfed-allow-sparse`` is true — authenticated mode is for a server that may lie, and
such a server learns sums over small groups of honest clients on a sparse graph (SECURITY.md);
sessions smaller than ``secfed-min-clients`` (default 2) are refused — the smallest crowd a node's
input hides in against a lying server, which may write a session of just the group it wants; so are
sessions whose parameters withstand fewer colluders than the node assumes, ⌊``secfed-corrupt-fraction``
· n⌋ (default 0.2, :func:`~secfed.protocols.choose_params`'s), judged by
:func:`~secfed.protocols.withstands` at a dropout rate of at least 0.1 — the server writes the
session, so a threshold of 1 would hand one colluding neighbour a node's seeds. A refusal by this
policy (:class:`PolicyRefused`) stops secfed's Flower server: the next session would be refused too.
``SecAggMod(
require_secagg=True)`` refuses a train message that does not run the protocol (or rides on an
enrolment) instead of passing it to the app, whose reply would leave unmasked — for your own ClientApp, all of whose train messages
run it (secfed's own sends some that do not, and holds its own policy: adapters/flower/sites.py).
"""

from __future__ import annotations

import json
import logging
import math
import struct
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from pathlib import Path

import numpy as np
from flwr.app import ConfigRecord, Context, Error, Message, MessageType, RecordDict
from flwr.clientapp.typing import ClientAppCallable
from flwr.common.constant import ErrorCode

from secfed.protocols import (
    BelowThreshold,
    ClientState,
    MalformedMessage,
    ModelMismatch,
    ProtocolError,
    SecAggClient,
    SessionConfig,
    UnknownClient,
    decode,
    encode,
    withstands,
)
from secfed.protocols.crypto import sign, transcript
from secfed.protocols.secagg.client import NO_MODEL_HASH

from . import node
from .encoding import Encoding, ReplyRefused
from .wire import (
    CONTROL,
    INSIDE,
    NEXT,
    NEXT_PAYLOAD,
    content_digest,
    control,
    decode_session,
    get_message,
    put_message,
    typed,
    without_ours,
)

log = logging.getLogger("secfed.flower")
STATE_RECORD = "secfed.secagg.state"  # in context.state: {"sealed": bytes}
ALLOW_UNAUTHENTICATED_KEY = "secfed-allow-unauthenticated"
MIN_CLIENTS_KEY = "secfed-min-clients"
CORRUPT_FRACTION_KEY = "secfed-corrupt-fraction"
ALLOW_SPARSE_KEY = "secfed-allow-sparse"
DROPOUT_FLOOR = 0.1  # the dropout rate a session is judged at, whatever lower rate it declares (the workflow's)
ENROL, ADVERTISE, SHARE_KEYS, MASKED_INPUT, UNMASK = "enrol", "advertise_keys", "share_keys", "masked_input", "unmask"
REFUSED = "refused"  # a NEXT record's stage when the node refused the next session
_STATE_MAGIC, _STATE_VERSION = b"SFMS", 1
_NONCE_BYTES = 16


class SessionRefused(ProtocolError):
    """The session breaks this node's policy (an identity it does not trust, unauthenticated, too
    small), or a masked input was asked for twice: the node takes no part."""


class PolicyRefused(SessionRefused):
    """The session breaks this node's policy (:meth:`SecAggMod.check_session`): the next session the
    server writes the same way is refused too, so the server stops rather than retry."""


def refusal_reason(exc: Exception, roots: Sequence[str] = ()) -> str:
    """What a node answers when it refuses a message (an error reply's reason); a policy refusal begins
    with :data:`POLICY_REFUSAL`. It names no path of the node's (:func:`node.public_text`; ``roots``: its
    folders, :func:`node.private_roots`)."""
    return f"secfed secure aggregation refused: {type(exc).__name__}: {node.public_text(str(exc), roots)}"


POLICY_REFUSAL = refusal_reason(PolicyRefused(""))  # the prefix a server recognises a node's policy by


def enrol_payload(run_id: int, node_id: int, nonce: bytes) -> bytes:
    """What a node signs to prove it holds the identity it enrols with."""
    return transcript("flower-enrol", run_id, node_id, nonce)


class SecAggMod:
    """Flower mod running secfed's secure-aggregation client (see the module docstring).

    Arguments override the node config; leave them out on a SuperNode and set the node config:
    ``secfed-state-dir``, ``secfed-cohort``, ``secfed-allow-unauthenticated``, ``secfed-min-clients``,
    ``secfed-corrupt-fraction``, ``secfed-allow-sparse``; ``require_secagg`` (constructor only, see the
    module docstring).
    """

    def __init__(self, *, state_dir: str | Path | None = None, cohort: node.Cohort | str | Path | None = None,
                 allow_unauthenticated: bool | None = None, min_clients: int | None = None,
                 corrupt_fraction: float | None = None, allow_sparse: bool | None = None,
                 require_secagg: bool | None = None) -> None:
        self.state_dir, self.cohort = state_dir, cohort
        self.allow_unauthenticated, self.min_clients = allow_unauthenticated, min_clients
        self.corrupt_fraction, self.allow_sparse, self.require_secagg = corrupt_fraction, allow_sparse, require_secagg

    def __call__(self, msg: Message, context: Context, call_next: ClientAppCallable) -> Message:
        ctl = control(msg.content) if msg.metadata.message_type == MessageType.TRAIN else None
        if ctl is None:
            if msg.metadata.message_type == MessageType.TRAIN and self.require_secagg:
                return Message(Error(ErrorCode.MOD_FAILED_PRECONDITION, "secfed secure aggregation refused: this "
                                     "node requires it (require_secagg) and the train message does not run it"),
                               reply_to=msg)
            msg.content = without_ours(msg.content)  # a forged "inside the masked-input phase" marker goes
            return call_next(msg, context)
        run = _NodeRun(self, context)
        try:
            stage = typed(ctl, "stage", str)
            if stage == ENROL:
                return run.enrol(msg, ctl, call_next)
            if stage == ADVERTISE:
                return run.advertise(msg, ctl)
            reply = run.step(msg, ctl, stage, call_next)
        except (ProtocolError, ReplyRefused, node.NodeSetupError) as exc:
            run.abort()
            log.warning("refused: %s: %s", type(exc).__name__, exc)  # the whole text, paths too, stays here
            return Message(Error(ErrorCode.MOD_FAILED_PRECONDITION,
                                 refusal_reason(exc, node.private_roots(context.node_config))), reply_to=msg)
        if stage == UNMASK and NEXT in msg.content:
            self._advertise_next(msg, reply, context)
        return reply

    def _advertise_next(self, msg: Message, reply: Message, context: Context) -> None:
        """The next session's advertisement (pipelining) added to the unmask reply. A refusal (policy,
        a malformed record) only leaves this node out of the next session: the unmask reply stands."""
        run = _NodeRun(self, context)
        try:
            ctl = msg.content.config_records.get(NEXT)
            if ctl is None:
                raise MalformedMessage(f"{NEXT} must be a config record")
            data = run.advertise_keys(ctl)
        except (ProtocolError, node.NodeSetupError) as exc:
            run.abort()
            log.warning("next session refused: %s: %s", type(exc).__name__, exc)
            # said in the reply: a policy refusal must reach the server, which stops the run on it when the
            # next round aborts (found by review: swallowed here, the run "finished" with a lost round)
            reason = refusal_reason(exc, node.private_roots(context.node_config))
            reply.content[NEXT] = ConfigRecord({"stage": REFUSED, "reason": reason[:2000]})
            return
        reply.content[NEXT] = ConfigRecord({"stage": ADVERTISE})
        put_message(reply.content, data, NEXT_PAYLOAD)

    # ---- node policy -------------------------------------------------------------------------------

    def _setting(self, context: Context, own: object, key: str, default: object) -> object:
        return own if own is not None else context.node_config.get(key, default)

    def check_settings(self, context: Context) -> tuple[int, float]:
        """This node's policy settings (minimum clients, corrupt fraction), each checked, and its cohort
        file read where one is named. A bad one is a refusal by policy naming its key, which stops the
        run (found by review: ``secfed-min-clients='abc'`` raised a bare ValueError at the first
        session, a missing cohort file went unnamed, and each run "finished" having aggregated nothing).
        Checked at enrolment too, so a misconfigured node stops the run before anyone trains."""
        try:
            minimum = node.whole(self._setting(context, self.min_clients, MIN_CLIENTS_KEY, 2), MIN_CLIENTS_KEY)
            fraction = node.number(self._setting(context, self.corrupt_fraction, CORRUPT_FRACTION_KEY, 0.2),
                                   CORRUPT_FRACTION_KEY, below=1.0)
            if self.cohort is not None or node.COHORT_KEY in context.node_config:
                self.trusted(context)
        except node.NodeSetupError as exc:
            raise PolicyRefused(str(exc)) from None
        return minimum, fraction

    def check_session(self, context: Context, config: SessionConfig) -> None:
        minimum, fraction = self.check_settings(context)
        if config.n_clients < minimum:
            raise PolicyRefused(f"session of {config.n_clients} clients; this node needs at least {minimum}")
        self._check_collusion(config, fraction)
        if config.authenticated and not config.params.complete and \
                not node.yes(self._setting(context, self.allow_sparse, ALLOW_SPARSE_KEY, False)):
            # Authenticated mode is for a server that may lie; on a sparse graph such a server can
            # declare a small group's outside neighbours dropped and learn the group's sum (SECURITY.md)
            raise PolicyRefused(
                f"session on a sparse graph (k = {config.params.degree} of {config.n_clients - 1}) refused: a "
                "malicious server can learn sums over small groups of honest clients on one (SECURITY.md, "
                f"'Against a malicious server'); run the server with --secagg-graph complete, or set "
                f"{ALLOW_SPARSE_KEY}=true to accept that")
        if not config.authenticated:
            allowed = self._setting(context, self.allow_unauthenticated, ALLOW_UNAUTHENTICATED_KEY, False)
            if not node.yes(allowed):
                raise PolicyRefused(f"unauthenticated session refused (set {ALLOW_UNAUTHENTICATED_KEY}=true to allow "
                                     "a server trusted to follow the protocol)")
            return
        cohort = self.trusted(context)
        strangers = [i for i, key in enumerate(config.identity_keys) if key not in cohort]
        if strangers:
            raise PolicyRefused(f"session lists identity keys this node does not trust (clients {strangers})")

    def _check_collusion(self, config: SessionConfig, fraction: float) -> None:
        """The session must withstand the colluders this node assumes (see the module docstring)."""
        params, assumed = config.params, math.floor(fraction * config.n_clients)
        if not withstands(params, assumed, dropout_floor=DROPOUT_FLOOR):
            raise PolicyRefused(
                f"session (k = {params.degree}, threshold {params.threshold}, bound {params.collusion_bound}) does not "
                f"withstand {assumed} colluding clients, as this node assumes ({CORRUPT_FRACTION_KEY}={fraction} of "
                f"{config.n_clients})")

    def trusted(self, context: Context) -> node.Cohort:
        cohort = self.cohort if self.cohort is not None else context.node_config.get(node.COHORT_KEY)
        if cohort is None:  # the node's own setting: a refusal by policy, which stops the run
            raise PolicyRefused(f"authenticated secure aggregation needs the node config {node.COHORT_KEY} "
                                "(the cohort file of trusted identity keys)")
        if isinstance(cohort, node.Cohort):
            return cohort
        try:
            return node.Cohort.load(cohort)
        except node.NodeSetupError as exc:
            raise PolicyRefused(f"node config {node.COHORT_KEY}: {exc}") from None

    def folder(self, context: Context) -> Path:
        if self.state_dir is not None:
            return node.state_dir({node.STATE_DIR_KEY: str(self.state_dir)})
        return node.state_dir(context.node_config)


class _NodeRun:
    """One message's work: the sealed client state of this (run, node), loaded and saved."""

    def __init__(self, mod: SecAggMod, context: Context) -> None:
        self.mod, self.context = mod, context
        self.ids = dict(run_id=context.run_id, node_id=context.node_id)
        self.client: SecAggClient | None = None
        self.session = b""
        self.encoding: Encoding | None = None

    @property
    def folder(self) -> Path:
        return self.mod.folder(self.context)

    def enrol(self, msg: Message, ctl: ConfigRecord, call_next: ClientAppCallable) -> Message:
        """Prove the node's identity; a message that also carries the app's content (the run's first
        message, e.g. ``secfed train --flower``'s hello) is answered by the app too, in the same reply:
        enrolment then costs no round trip of its own."""
        nonce = typed(ctl, "nonce", bytes)
        if len(nonce) != _NONCE_BYTES:
            raise MalformedMessage(f"{CONTROL}: enrolment nonce must be {_NONCE_BYTES} bytes")
        self.mod.check_settings(self.context)
        identity = node.identity_key(self.folder)
        proof = sign(identity, enrol_payload(self.context.run_id, self.context.node_id, nonce))
        clear = None
        if len(without_ours(msg.content)):
            if self.mod.require_secagg and msg.metadata.message_type == MessageType.TRAIN:
                # the app's reply would leave in the clear (found by review: an enrol record riding on
                # any train message bypassed require_secagg)
                raise SessionRefused("a train message riding on enrolment: this node requires secure aggregation "
                                     "(require_secagg), and the app answers train messages only masked")
            msg.content = without_ours(msg.content)
            reply = call_next(msg, self.context)
            if reply.has_error():
                raise ReplyRefused(f"the app failed: {reply.error.reason}")
            clear = without_ours(reply.content)
        return _reply(msg, ConfigRecord({"stage": ENROL, "identity": node.public_identity(identity), "proof": proof}),
                      clear=clear)

    def advertise(self, msg: Message, ctl: ConfigRecord) -> Message:
        return _reply(msg, ConfigRecord({"stage": ADVERTISE}), self.advertise_keys(ctl))

    def advertise_keys(self, ctl: ConfigRecord) -> bytes:
        """Check the session ``ctl`` names against the node's policy, create the client and its keys,
        seal its state: the advertisement's wire bytes."""
        config = decode_session(typed(ctl, "session", bytes))
        index = typed(ctl, "index", int)
        if not 0 <= index < config.n_clients:
            raise UnknownClient(f"{CONTROL}: index {index} is outside the session's {config.n_clients} clients")
        self.mod.check_session(self.context, config)
        used = self.context.state.config_records.get(STATE_RECORD, ConfigRecord()).get("sessions", [])
        if config.session_id in used:
            raise SessionRefused("this node already took part in this session")
        identity = node.identity_key(self.folder) if config.authenticated else None
        if identity is not None and node.public_identity(identity) != config.identity_keys[index]:
            raise SessionRefused(f"index {index} carries another node's identity key")
        self.client = SecAggClient(config, index, identity_key=identity)
        self.session, self.encoding = typed(ctl, "session", bytes), Encoding.read(ctl)
        if self.encoding.dimension != config.dimension:
            raise MalformedMessage(f"encoding needs {self.encoding.dimension} ring words; session has {config.dimension}")
        out = self.client.advertise_keys()
        self.save(extra_session=config.session_id)
        return encode(out)

    def step(self, msg: Message, ctl: ConfigRecord, stage: str, call_next: ClientAppCallable) -> Message:
        self.load()
        message = decode(get_message(msg.content))
        if stage != MASKED_INPUT:
            out = self.client.handle(message, model_hash=_model_hash(ctl) if stage == SHARE_KEYS else NO_MODEL_HASH)
            self.save()
            return _reply(msg, ConfigRecord({"stage": stage}), encode(out))
        client, config = self.client, self.client.config
        client.receive_shares(message)
        self.save()  # the shares are held now, whatever the app does next
        if client.model_hash != NO_MODEL_HASH and content_digest(msg.content) != client.model_hash:
            raise ModelMismatch("the model to train on is not the one announced when keys were shared")
        msg.content = without_ours(msg.content)
        # the app may answer with its vector; it learns whether the session is authenticated (a
        # personal model, outside the digest, may be trained on only where it is not: client_app)
        msg.content[INSIDE] = ConfigRecord({"stage": MASKED_INPUT, "authenticated": config.authenticated})
        reply = call_next(msg, self.context)
        if reply.has_error():
            raise ReplyRefused(f"the app failed: {reply.error.reason}")
        vector, clear = self.encoding.encode(reply.content, config.n_clients, np.random.default_rng())
        out = client.mask(vector)
        self.save()
        return _reply(msg, ConfigRecord({"stage": stage}), encode(out), clear)

    def abort(self) -> None:
        """Keep a refusal: the sealed state is dropped, so the secrets are gone and every later
        message of the round is refused (there is nothing to answer it with)."""
        self.client = None
        self.save()

    # ---- the sealed state ------------------------------------------------------------------------

    def load(self) -> None:
        record = self.context.state.config_records.get(STATE_RECORD)
        sealed = record.get("sealed") if record is not None else None
        if not isinstance(sealed, bytes):
            raise BelowThreshold("this node holds no secure-aggregation state for the round (it did not advertise keys)")
        plain = node.open_state(node.sealing_key(self.folder), sealed, purpose="secagg-client", **self.ids)
        self.session, state, encoding = _unframe(plain)
        config = decode_session(self.session)
        identity = node.identity_key(self.folder) if config.authenticated else None
        self.client = SecAggClient.from_state(config, state, identity_key=identity)
        self.encoding = Encoding(**_from_json(encoding))

    def save(self, extra_session: bytes | None = None) -> None:
        """Seal the client into context.state (nothing once it is finished or aborted)."""
        old = self.context.state.config_records.get(STATE_RECORD, ConfigRecord())
        record = ConfigRecord({"sessions": list(old.get("sessions", [])) + ([extra_session] if extra_session else [])})
        if self.client is not None and self.client.state not in (ClientState.DONE, ClientState.ABORTED):
            plain = _frame(self.session, self.client.export_state(), json.dumps(asdict(self.encoding)).encode())
            record["sealed"] = node.seal_state(node.sealing_key(self.folder), plain, purpose="secagg-client", **self.ids)
        self.context.state.config_records[STATE_RECORD] = record


def _model_hash(ctl: ConfigRecord) -> bytes:
    """The digest of the content the node will train on, as the server announces it at share_keys
    (none: the round binds no model)."""
    model_hash = ctl.get("model-hash", NO_MODEL_HASH)
    if not isinstance(model_hash, bytes) or len(model_hash) != 32:
        raise MalformedMessage(f"{CONTROL}: model-hash must be 32 bytes")
    return model_hash


def _reply(msg: Message, ctl: ConfigRecord, message: bytes | None = None, clear: RecordDict | None = None) -> Message:
    content = RecordDict(dict(clear.items())) if clear is not None else RecordDict()
    content[CONTROL] = ctl
    if message is not None:
        put_message(content, message)
    return Message(content, reply_to=msg)


def _frame(*parts: bytes) -> bytes:
    return _STATE_MAGIC + bytes([_STATE_VERSION]) + b"".join(struct.pack("<I", len(p)) + p for p in parts)


def _unframe(data: bytes) -> tuple[bytes, bytes, bytes]:
    if data[:4] != _STATE_MAGIC or data[4:5] != bytes([_STATE_VERSION]):
        raise MalformedMessage("sealed node state: unknown layout")
    parts, at = [], 5
    for _ in range(3):
        if at + 4 > len(data):
            raise MalformedMessage("sealed node state: truncated")
        (n,) = struct.unpack_from("<I", data, at)
        if at + 4 + n > len(data):
            raise MalformedMessage("sealed node state: truncated")
        parts.append(data[at + 4 : at + 4 + n])
        at += 4 + n
    if at != len(data):
        raise MalformedMessage("sealed node state: trailing bytes")
    return parts[0], parts[1], parts[2]


def _from_json(data: bytes) -> Mapping[str, object]:
    raw = json.loads(data)
    raw["metrics"] = tuple(raw["metrics"])
    raw["layout"] = tuple((k, tuple(s), d) for k, s, d in raw["layout"])
    return raw

