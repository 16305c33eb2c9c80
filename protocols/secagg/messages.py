"""Typed protocol messages and their versioned binary wire format (no pickle, no self-description).

Every message is a 48-byte header followed by a type-specific body, all little-endian::

    magic "SAGG" | version u8 | type u8 | flags u16 (= 0) | session_id 16B | round u64
    | sender u32 | recipient u32 | body_length u64 | body

The server's id is ``SERVER`` (0xFFFFFFFF); clients are 0 … n−1. :func:`decode` checks magic,
version, type, flags, the exact body length, every count and length field against the bytes
that remain, the fixed sizes of keys/signatures/shares, and that id lists are strictly increasing
(no duplicates); anything else raises :class:`MalformedMessage`. :func:`validate` checks the same
rules on a typed message built by hand, so the state machines — which call it on everything they
receive — refuse what the decoder refuses even when an embedding skips the wire. Whether a
well-formed message is *acceptable* (right session, round, phase, sender) is the state machines' job.
"""

from __future__ import annotations

import enum
import struct
from dataclasses import dataclass

import numpy as np

from ..crypto import DIGEST_BYTES, PUBLIC_KEY_BYTES, SIGNATURE_BYTES
from ..errors import MalformedMessage
from ..shamir import SECRET_BYTES

MAGIC = b"SAGG"
VERSION = 1
SERVER = 0xFFFFFFFF
_HEADER = struct.Struct("<4sBBH16sQIIQ")
HEADER_BYTES = _HEADER.size  # 48
MAX_SEALED_SHARE_BYTES = 1024


class MessageType(enum.IntEnum):
    ADVERTISE_KEYS = 1  # client → server
    KEY_ROSTER = 2  # server → client
    ENCRYPTED_SHARES = 3  # client → server
    SHARE_DELIVERY = 4  # server → client
    MASKED_INPUT = 5  # client → server
    SURVIVOR_LIST = 6  # server → client (authenticated mode)
    CONSISTENCY_SIGNATURE = 7  # client → server (authenticated mode)
    UNMASK_REQUEST = 8  # server → client
    UNMASK_RESPONSE = 9  # client → server


class ShareKind(enum.IntEnum):
    SELF_MASK = 0  # share of a survivor's self-mask seed
    MASK_KEY = 1  # share of a dropped client's key-agreement seed


@dataclass(frozen=True)
class Envelope:
    """Fields every message carries: where it belongs (session, round) and who sends it to whom."""

    session_id: bytes
    round: int
    sender: int
    recipient: int


@dataclass(frozen=True)
class AdvertiseKeys(Envelope):
    enc_public: bytes  # X25519 key for sealing shares
    mask_public: bytes  # X25519 key for pairwise masks; also the commitment to its seed
    self_mask_commitment: bytes  # SHA-256 commitment to the self-mask seed
    model_hash: bytes  # hash of the global model this client trained on
    config_digest: bytes
    signature: bytes  # Ed25519 over all of the above (empty when unauthenticated)


@dataclass(frozen=True)
class RosterEntry:
    client: int
    enc_public: bytes
    mask_public: bytes
    self_mask_commitment: bytes
    model_hash: bytes
    config_digest: bytes
    signature: bytes


@dataclass(frozen=True)
class KeyRoster(Envelope):
    entries: tuple[RosterEntry, ...]  # the recipient's neighbours that advertised, by id


@dataclass(frozen=True)
class SealedShare:
    peer: int  # recipient (in EncryptedShares) or sender (in ShareDelivery)
    ciphertext: bytes


@dataclass(frozen=True)
class EncryptedShares(Envelope):
    shares: tuple[SealedShare, ...]


@dataclass(frozen=True)
class ShareDelivery(Envelope):
    shares: tuple[SealedShare, ...]


@dataclass(frozen=True, eq=False)
class MaskedInput(Envelope):
    vector: np.ndarray  # uint32, values in Z_{2^ring_bits}


@dataclass(frozen=True)
class SurvivorList(Envelope):
    survivors: tuple[int, ...]


@dataclass(frozen=True)
class ConsistencySignature(Envelope):
    signature: bytes


@dataclass(frozen=True)
class UnmaskRequest(Envelope):
    survivors: tuple[int, ...]  # clients whose masked input is in the sum
    dropped: tuple[int, ...]  # clients that shared keys but sent no masked input
    signatures: tuple[tuple[int, bytes], ...]  # (signer, consistency signature), authenticated mode


@dataclass(frozen=True)
class RevealedShare:
    owner: int
    kind: ShareKind
    value: bytes


@dataclass(frozen=True)
class UnmaskResponse(Envelope):
    self_mask_seed: bytes  # the responder's own self-mask seed (it is a survivor)
    shares: tuple[RevealedShare, ...]


Message = (
    AdvertiseKeys | KeyRoster | EncryptedShares | ShareDelivery | MaskedInput | SurvivorList
    | ConsistencySignature | UnmaskRequest | UnmaskResponse
)

_TYPE_OF: dict[type, MessageType] = {
    AdvertiseKeys: MessageType.ADVERTISE_KEYS,
    KeyRoster: MessageType.KEY_ROSTER,
    EncryptedShares: MessageType.ENCRYPTED_SHARES,
    ShareDelivery: MessageType.SHARE_DELIVERY,
    MaskedInput: MessageType.MASKED_INPUT,
    SurvivorList: MessageType.SURVIVOR_LIST,
    ConsistencySignature: MessageType.CONSISTENCY_SIGNATURE,
    UnmaskRequest: MessageType.UNMASK_REQUEST,
    UnmaskResponse: MessageType.UNMASK_RESPONSE,
}


def message_type(message: Message) -> MessageType:
    try:
        return _TYPE_OF[type(message)]
    except KeyError:
        raise TypeError(f"not a protocol message: {type(message).__name__}") from None


def validate(message: object) -> MessageType:
    """Check that ``message`` has the shape :func:`decode` guarantees; return its type.

    Field types and sizes, id lists strictly increasing, share kinds, the vector's dtype and shape.
    Anything else raises :class:`MalformedMessage` — including objects that are not protocol
    messages at all — so a hand-built message is refused exactly like its corrupted wire bytes.
    """
    kind = _TYPE_OF.get(type(message))
    if kind is None:
        raise MalformedMessage(f"not a protocol message: {type(message).__name__}")
    check = _Check(kind.name)
    check.raw(message.session_id, (16,), "session_id")
    check.uint(message.round, 64, "round")
    check.uint(message.sender, 32, "sender")
    check.uint(message.recipient, 32, "recipient")
    _VALIDATORS[kind](message, check)
    return kind


class _Check:
    """Field checks for :func:`validate`, each raising MalformedMessage that names the field."""

    def __init__(self, what: str) -> None:
        self.what = what

    def fail(self, text: str) -> None:
        raise MalformedMessage(f"{self.what}: {text}")

    def raw(self, value: object, sizes: tuple[int, ...] | range, field: str) -> None:
        if not isinstance(value, bytes):
            self.fail(f"{field} must be bytes, got {type(value).__name__}")
        if len(value) not in sizes:
            allowed = f"at most {sizes.stop - 1}" if isinstance(sizes, range) else " or ".join(map(str, sizes))
            self.fail(f"{field} has {len(value)} bytes; must be {allowed}")

    def uint(self, value: object, bits: int, field: str) -> None:
        if type(value) is not int:
            self.fail(f"{field} must be an int, got {type(value).__name__}")
        if not 0 <= value < 1 << bits:
            self.fail(f"{field} = {value} is outside [0, 2^{bits})")

    def items(self, value: object, kind: type, field: str) -> tuple:
        if not isinstance(value, tuple) or not all(isinstance(v, kind) for v in value):
            self.fail(f"{field} must be a tuple of {kind.__name__}")
        return value

    def ids(self, value: object, field: str) -> None:
        for v in self.items(value, int, field):
            self.uint(v, 32, field)
        _strictly_increasing(value, field, self.what)

    def sealed(self, shares: object) -> None:
        for s in self.items(shares, SealedShare, "shares"):
            self.uint(s.peer, 32, "share peer id")
            self.raw(s.ciphertext, range(MAX_SEALED_SHARE_BYTES + 1), "ciphertext")
        _strictly_increasing([s.peer for s in shares], "share peer ids", self.what)


def _keys_valid(m: AdvertiseKeys | RosterEntry, c: _Check) -> None:
    for field in ("enc_public", "mask_public"):
        c.raw(getattr(m, field), (PUBLIC_KEY_BYTES,), field)
    for field in ("self_mask_commitment", "model_hash", "config_digest"):
        c.raw(getattr(m, field), (DIGEST_BYTES,), field)
    c.raw(m.signature, (0, SIGNATURE_BYTES), "signature")


def _roster_valid(m: KeyRoster, c: _Check) -> None:
    for e in c.items(m.entries, RosterEntry, "entries"):
        c.uint(e.client, 32, "roster client id")
        _keys_valid(e, c)
    _strictly_increasing([e.client for e in m.entries], "roster client ids", c.what)


def _masked_valid(m: MaskedInput, c: _Check) -> None:
    v = m.vector
    if not isinstance(v, np.ndarray) or v.ndim != 1 or v.dtype.kind != "u" or v.dtype.itemsize != 4:
        c.fail(f"vector must be a 1-D uint32 numpy array, got {type(v).__name__} {getattr(v, 'dtype', '')}")
    if not 1 <= v.size < 1 << 32:
        c.fail(f"vector has {v.size} entries; must be in [1, 2^32)")


def _request_valid(m: UnmaskRequest, c: _Check) -> None:
    c.ids(m.survivors, "survivors")
    c.ids(m.dropped, "dropped")
    for pair in c.items(m.signatures, tuple, "signatures"):
        if len(pair) != 2:
            c.fail("each signature must be a (signer, signature) pair")
        c.uint(pair[0], 32, "signer id")
        c.raw(pair[1], (SIGNATURE_BYTES,), "signature")
    _strictly_increasing([s for s, _ in m.signatures], "signer ids", c.what)


def _response_valid(m: UnmaskResponse, c: _Check) -> None:
    c.raw(m.self_mask_seed, (SECRET_BYTES,), "self-mask seed")
    for s in c.items(m.shares, RevealedShare, "shares"):
        c.uint(s.owner, 32, "share owner")
        if not isinstance(s.kind, ShareKind):
            c.fail(f"share kind must be a ShareKind, got {s.kind!r}")
        c.raw(s.value, (SECRET_BYTES,), "share value")
    _strictly_increasing([s.owner for s in m.shares], "share owners", c.what)


_VALIDATORS = {
    MessageType.ADVERTISE_KEYS: _keys_valid,
    MessageType.KEY_ROSTER: _roster_valid,
    MessageType.ENCRYPTED_SHARES: lambda m, c: c.sealed(m.shares),
    MessageType.SHARE_DELIVERY: lambda m, c: c.sealed(m.shares),
    MessageType.MASKED_INPUT: _masked_valid,
    MessageType.SURVIVOR_LIST: lambda m, c: c.ids(m.survivors, "survivors"),
    MessageType.CONSISTENCY_SIGNATURE: lambda m, c: c.raw(m.signature, (SIGNATURE_BYTES,), "signature"),
    MessageType.UNMASK_REQUEST: _request_valid,
    MessageType.UNMASK_RESPONSE: _response_valid,
}


# ---- encoding ------------------------------------------------------------------------------------


def _u32(v: int) -> bytes:
    return struct.pack("<I", v)


def _ids(ids: tuple[int, ...]) -> bytes:
    return _u32(len(ids)) + struct.pack(f"<{len(ids)}I", *ids)


def _signature(sig: bytes) -> bytes:
    return struct.pack("<H", len(sig)) + sig


def _body_parts(m: Message) -> list[bytes | memoryview]:
    if isinstance(m, AdvertiseKeys):
        return [m.enc_public, m.mask_public, m.self_mask_commitment, m.model_hash, m.config_digest,
                _signature(m.signature)]
    if isinstance(m, KeyRoster):
        parts: list[bytes | memoryview] = [_u32(len(m.entries))]
        for e in m.entries:
            parts += [_u32(e.client), e.enc_public, e.mask_public, e.self_mask_commitment, e.model_hash,
                      e.config_digest, _signature(e.signature)]
        return parts
    if isinstance(m, (EncryptedShares, ShareDelivery)):
        parts = [_u32(len(m.shares))]
        for s in m.shares:
            parts += [struct.pack("<IH", s.peer, len(s.ciphertext)), s.ciphertext]
        return parts
    if isinstance(m, MaskedInput):
        vec = np.ascontiguousarray(m.vector, dtype="<u4")
        return [_u32(vec.size), memoryview(vec).cast("B")]
    if isinstance(m, SurvivorList):
        return [_ids(m.survivors)]
    if isinstance(m, ConsistencySignature):
        return [m.signature]
    if isinstance(m, UnmaskRequest):
        parts = [_ids(m.survivors), _ids(m.dropped), _u32(len(m.signatures))]
        for signer, sig in m.signatures:
            parts += [_u32(signer), sig]
        return parts
    if isinstance(m, UnmaskResponse):
        parts = [struct.pack("<B", len(m.self_mask_seed)), m.self_mask_seed, _u32(len(m.shares))]
        for s in m.shares:
            parts += [struct.pack("<IB", s.owner, int(s.kind)), s.value]
        return parts
    raise TypeError(f"not a protocol message: {type(m).__name__}")


def encode(message: Message) -> bytes:
    """The wire bytes of ``message``; raises ValueError for fields a peer's :func:`decode` would refuse."""
    what = message_type(message).name  # TypeError for anything that is not a protocol message
    if len(message.session_id) != 16:
        raise ValueError(f"cannot encode {what}: session_id must be 16 bytes, got {len(message.session_id)}")
    try:
        body = _body_parts(message)
        length = sum(len(p) if isinstance(p, bytes) else p.nbytes for p in body)
        header = _HEADER.pack(
            MAGIC, VERSION, message_type(message), 0, message.session_id, message.round,
            message.sender, message.recipient, length,
        )
        data = b"".join([header, *body])
        _parse(data, check_only=True)
    except (struct.error, OverflowError, MalformedMessage) as exc:
        raise ValueError(f"cannot encode {what}: {exc}") from None
    return data


def encoded_size(message: Message) -> int:
    """Exact length of :func:`encode` (``message``), computed without building the bytes."""
    return HEADER_BYTES + sum(len(p) if isinstance(p, bytes) else p.nbytes for p in _body_parts(message))


# ---- decoding ------------------------------------------------------------------------------------


class _Reader:
    """Bounds-checked cursor over a message body."""

    def __init__(self, data: memoryview, what: str) -> None:
        self.data, self.pos, self.what = data, 0, what

    def take(self, n: int, field: str) -> memoryview:
        if n > len(self.data) - self.pos:
            raise MalformedMessage(
                f"{self.what}: truncated at {field}: needs {n} bytes at offset {HEADER_BYTES + self.pos}, "
                f"{len(self.data) - self.pos} left"
            )
        out = self.data[self.pos : self.pos + n]
        self.pos += n
        return out

    def fixed(self, n: int, field: str) -> bytes:
        return bytes(self.take(n, field))

    def u8(self, field: str) -> int:
        return self.take(1, field)[0]

    def u16(self, field: str) -> int:
        return int.from_bytes(self.take(2, field), "little")

    def u32(self, field: str) -> int:
        return int.from_bytes(self.take(4, field), "little")

    def count(self, field: str, min_entry_bytes: int) -> int:
        n = self.u32(field)
        if n * min_entry_bytes > len(self.data) - self.pos:
            raise MalformedMessage(f"{self.what}: {field} = {n} cannot fit in the {len(self.data) - self.pos} bytes left")
        return n

    def ids(self, field: str) -> tuple[int, ...]:
        n = self.count(field, 4)
        ids = struct.unpack(f"<{n}I", self.take(4 * n, field))
        _strictly_increasing(ids, field, self.what)
        return ids

    def signature(self, field: str) -> bytes:
        n = self.u16(field)
        if n not in (0, SIGNATURE_BYTES):
            raise MalformedMessage(f"{self.what}: {field} has {n} bytes; must be 0 or {SIGNATURE_BYTES}")
        return self.fixed(n, field)

    def end(self) -> None:
        if self.pos != len(self.data):
            raise MalformedMessage(f"{self.what}: {len(self.data) - self.pos} trailing bytes after the body")


def _strictly_increasing(ids: tuple[int, ...] | list[int], field: str, what: str) -> None:
    for a, b in zip(ids, ids[1:]):
        if b <= a:
            raise MalformedMessage(f"{what}: {field} must be strictly increasing (no repeats); saw {a} then {b}")


def decode(data: bytes | bytearray | memoryview) -> Message:
    """Parse wire bytes into a typed message, or raise :class:`MalformedMessage` saying what is wrong.

    A masked-input vector is returned as a read-only view into ``data`` (no copy).
    """
    return _parse(data, check_only=False)


def _parse(data: bytes | bytearray | memoryview, *, check_only: bool) -> Message:
    view = memoryview(data).cast("B")
    if len(view) < HEADER_BYTES:
        raise MalformedMessage(f"message of {len(view)} bytes is shorter than the {HEADER_BYTES}-byte header")
    magic, version, mtype, flags, session_id, round_, sender, recipient, length = _HEADER.unpack_from(view)
    if magic != MAGIC:
        raise MalformedMessage(f"bad magic {magic!r}; expected {MAGIC!r}")
    if version != VERSION:
        raise MalformedMessage(f"unsupported wire version {version}; this build speaks {VERSION}")
    try:
        kind = MessageType(mtype)
    except ValueError:
        raise MalformedMessage(f"unknown message type {mtype}") from None
    if flags != 0:
        raise MalformedMessage(f"{kind.name}: reserved flags must be 0, got {flags:#06x}")
    if length != len(view) - HEADER_BYTES:
        raise MalformedMessage(
            f"{kind.name}: header says {length} body bytes, {len(view) - HEADER_BYTES} present"
        )
    env = dict(session_id=session_id, round=round_, sender=sender, recipient=recipient)
    r = _Reader(view[HEADER_BYTES:], kind.name)
    msg = _DECODERS[kind](r, env, check_only)
    r.end()
    return msg


def _decode_advertise(r: _Reader, env: dict, _: bool) -> AdvertiseKeys:
    e = _roster_entry_body(r)
    return AdvertiseKeys(**env, **e)


def _roster_entry_body(r: _Reader) -> dict:
    return dict(
        enc_public=r.fixed(PUBLIC_KEY_BYTES, "encryption key"),
        mask_public=r.fixed(PUBLIC_KEY_BYTES, "mask key"),
        self_mask_commitment=r.fixed(DIGEST_BYTES, "self-mask commitment"),
        model_hash=r.fixed(DIGEST_BYTES, "model hash"),
        config_digest=r.fixed(DIGEST_BYTES, "config digest"),
        signature=r.signature("signature"),
    )


def _decode_roster(r: _Reader, env: dict, _: bool) -> KeyRoster:
    n = r.count("entry count", 4 + 5 * 32 + 2)
    entries = tuple(RosterEntry(client=r.u32("client id"), **_roster_entry_body(r)) for _ in range(n))
    _strictly_increasing([e.client for e in entries], "roster client ids", r.what)
    return KeyRoster(**env, entries=entries)


def _sealed_shares(r: _Reader) -> tuple[SealedShare, ...]:
    n = r.count("share count", 6)
    shares = []
    for _ in range(n):
        peer, size = r.u32("peer id"), r.u16("ciphertext length")
        if size > MAX_SEALED_SHARE_BYTES:
            raise MalformedMessage(f"{r.what}: ciphertext of {size} bytes exceeds {MAX_SEALED_SHARE_BYTES}")
        shares.append(SealedShare(peer, r.fixed(size, "ciphertext")))
    _strictly_increasing([s.peer for s in shares], "share peer ids", r.what)
    return tuple(shares)


def _decode_encrypted(r: _Reader, env: dict, _: bool) -> EncryptedShares:
    return EncryptedShares(**env, shares=_sealed_shares(r))


def _decode_delivery(r: _Reader, env: dict, _: bool) -> ShareDelivery:
    return ShareDelivery(**env, shares=_sealed_shares(r))


def _decode_masked(r: _Reader, env: dict, check_only: bool) -> MaskedInput:
    d = r.count("dimension", 4)
    if d == 0:
        raise MalformedMessage(f"{r.what}: empty vector")
    raw = r.take(4 * d, "vector")
    vec = np.empty(0, np.uint32) if check_only else np.frombuffer(raw, dtype="<u4")
    return MaskedInput(**env, vector=vec)


def _decode_survivors(r: _Reader, env: dict, _: bool) -> SurvivorList:
    return SurvivorList(**env, survivors=r.ids("survivors"))


def _decode_signature(r: _Reader, env: dict, _: bool) -> ConsistencySignature:
    return ConsistencySignature(**env, signature=r.fixed(SIGNATURE_BYTES, "signature"))


def _decode_request(r: _Reader, env: dict, _: bool) -> UnmaskRequest:
    survivors, dropped = r.ids("survivors"), r.ids("dropped")
    n = r.count("signature count", 4 + SIGNATURE_BYTES)
    sigs = tuple((r.u32("signer id"), r.fixed(SIGNATURE_BYTES, "signature")) for _ in range(n))
    _strictly_increasing([s for s, _ in sigs], "signer ids", r.what)
    return UnmaskRequest(**env, survivors=survivors, dropped=dropped, signatures=sigs)


def _decode_response(r: _Reader, env: dict, _: bool) -> UnmaskResponse:
    seed_len = r.u8("seed length")
    if seed_len != SECRET_BYTES:
        raise MalformedMessage(f"{r.what}: self-mask seed has {seed_len} bytes; must be {SECRET_BYTES}")
    seed = r.fixed(seed_len, "self-mask seed")
    n = r.count("share count", 5 + SECRET_BYTES)
    shares = []
    for _ in range(n):
        owner, kind = r.u32("share owner"), r.u8("share kind")
        if kind not in (ShareKind.SELF_MASK, ShareKind.MASK_KEY):
            raise MalformedMessage(f"{r.what}: unknown share kind {kind}")
        shares.append(RevealedShare(owner, ShareKind(kind), r.fixed(SECRET_BYTES, "share value")))
    _strictly_increasing([s.owner for s in shares], "share owners", r.what)
    return UnmaskResponse(**env, self_mask_seed=seed, shares=tuple(shares))


_DECODERS = {
    MessageType.ADVERTISE_KEYS: _decode_advertise,
    MessageType.KEY_ROSTER: _decode_roster,
    MessageType.ENCRYPTED_SHARES: _decode_encrypted,
    MessageType.SHARE_DELIVERY: _decode_delivery,
    MessageType.MASKED_INPUT: _decode_masked,
    MessageType.SURVIVOR_LIST: _decode_survivors,
    MessageType.CONSISTENCY_SIGNATURE: _decode_signature,
    MessageType.UNMASK_REQUEST: _decode_request,
    MessageType.UNMASK_RESPONSE: _decode_response,
}
