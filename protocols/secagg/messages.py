"""Typed protocol messages and their versioned binary wire format (no pickle, no self-description).

Every message is a 48-byte header followed by a type-specific body, all little-endian::

    magic "SAGG" | version u8 | type u8 | flags u16 (= 0) | session_id 16B | round u64
    | sender u32 | recipient u32 | body_length u64 | body

The server's id is ``SERVER`` (0xFFFFFFFF); clients are 0 … n−1. :func:`decode` checks magic,
version (another version raises :class:`UnsupportedVersion`, never a misreading), type, flags,
the exact body length, every count and length field against the bytes that remain, the fixed
sizes of keys/signatures/shares, and that id lists are strictly increasing (no duplicates);
anything else raises :class:`MalformedMessage`. :func:`validate` checks the same rules on a typed
message built by hand, so the state machines — which call it on everything they receive — refuse
what the decoder refuses even when an embedding skips the wire. Whether a well-formed message is
*acceptable* (right session, round, phase, sender) is the state machines' job.

Version 2 added the graph-nonce commitment and reveal messages, the self-mask shares and the
sender binding (tag, signature) of a masked input, and the self-mask shares forwarded in an
unmask request. Version 3 carries Shamir shares over GF(2^31 − 1): a revealed share
value is 20 bytes (five field elements), not 16 (one GF(2^128) element), and sealed shares grow
by the same 4 bytes; the vector digest in the input binding and the ring order of the graph are
computed differently too. Version 4 signs a masked input's tag together with its
binding, and an unmask response carries its contents sealed to the server (AES-256-GCM under a
key from the responder's round key and the session's server key): an observer of every message
no longer learns the survivors' self-mask seeds and the dropped clients' key shares, and with
them the sum. Version 5 takes the model digest out of the key advertisement and the
key roster (an advertisement can then go out before the model is known: the next round's rides
on this round's unmask response); the digest travels sealed inside every share instead, so a
sealed share is 32 bytes longer. Version 6 (this one) adds the sender's Ed25519 signature to the
key-share message in authenticated mode (empty otherwise), over a binding of its sealed shares: a
copy altered in transit is refused on arrival and the genuine one still counts, where version 5's
server took the altered copy, refused the genuine one as a replay and the altered share aborted
its recipient. Messages of versions 1 to 5 are refused by version number
(:class:`UnsupportedVersion`), never misread.

Lists that grow with the cohort are never walked entry by entry in Python: (id, value) lists —
graph commitments and nonces, the quorum's signatures — decode to an :class:`~.idtable.IdTable`
(the wire bytes and a numpy view of the ids), and id lists are packed and checked with C-level
passes. A client of a 10,000-cohort receives several such lists.
"""

from __future__ import annotations

import enum
import itertools
import operator
import struct
from dataclasses import dataclass

import numpy as np

from ..crypto import DIGEST_BYTES, MAC_BYTES, PUBLIC_KEY_BYTES, SEAL_OVERHEAD, SIGNATURE_BYTES
from ..errors import MalformedMessage, UnsupportedVersion
from ..shamir import SECRET_BYTES, SHARE_BYTES
from .idtable import IdTable

MAGIC = b"SAGG"
VERSION = 7
SERVER = 0xFFFFFFFF
_HEADER = struct.Struct("<4sBBH16sQIIQ")
HEADER_BYTES = _HEADER.size  # 48
MAX_SEALED_SHARE_BYTES = 1024
GRAPH_NONCE_BYTES = 16
_SEALED_HEAD = struct.Struct("<IH")  # peer id, ciphertext length
_KEYS = struct.Struct(f"<{PUBLIC_KEY_BYTES}s{PUBLIC_KEY_BYTES}s{DIGEST_BYTES}s{DIGEST_BYTES}s{DIGEST_BYTES}s")
_REVEALED = struct.Struct(f"<IB{SHARE_BYTES}s")  # owner, kind, share value
_SECRETS_HEAD = struct.Struct(f"<{SECRET_BYTES}sI")  # inside a sealed unmask response: seed, share count


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
    GRAPH_COMMITMENTS = 10  # server → client
    GRAPH_REVEAL = 11  # client → server


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
    graph_commitment: bytes  # SHA-256 commitment to this round's graph nonce
    config_digest: bytes
    signature: bytes  # Ed25519 over all of the above (empty when unauthenticated)


Pairs = tuple[tuple[int, bytes], ...] | IdTable  # (id, fixed-size bytes), ids strictly increasing


@dataclass(frozen=True)
class GraphCommitments(Envelope):
    commitments: Pairs  # (client, graph commitment) of every advertiser, by id


@dataclass(frozen=True)
class GraphReveal(Envelope):
    nonce: bytes  # the graph nonce the sender committed to


@dataclass(frozen=True)
class RosterEntry:
    client: int
    enc_public: bytes
    mask_public: bytes
    self_mask_commitment: bytes
    graph_commitment: bytes
    config_digest: bytes
    signature: bytes


@dataclass(frozen=True)
class KeyRoster(Envelope):
    nonces: Pairs  # (client, graph nonce) of every revealer: the graph seed
    entries: tuple[RosterEntry, ...]  # the recipient's neighbours that revealed, by id


@dataclass(frozen=True)
class SealedShare:
    peer: int  # the other end: recipient when a client sends it, owner when the server forwards it
    ciphertext: bytes


@dataclass(frozen=True)
class EncryptedShares(Envelope):
    shares: tuple[SealedShare, ...]  # key-seed shares, one per neighbour
    signature: bytes  # Ed25519 over the sender's binding of the shares (empty when unauthenticated)


@dataclass(frozen=True)
class ShareDelivery(Envelope):
    shares: tuple[SealedShare, ...]


@dataclass(frozen=True, eq=False)
class MaskedInput(Envelope):
    vector: np.ndarray  # uint32, values in Z_{2^ring_bits}
    self_mask_shares: tuple[SealedShare, ...]  # self-mask-seed shares, one per masking partner
    tag: bytes  # HMAC binding the input to sender, session, round and graph (key from the self-mask seed)
    signature: bytes  # Ed25519 over the same binding (empty when unauthenticated)


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
    signatures: Pairs  # (signer, consistency signature), authenticated mode
    self_mask_shares: tuple[SealedShare, ...]  # survivors' self-mask shares sealed for the recipient


@dataclass(frozen=True)
class RevealedShare:
    owner: int
    kind: ShareKind
    value: bytes


@dataclass(frozen=True)
class RevealedSecrets:
    """What an unmask response reveals; on the wire only sealed to the server
    (:func:`encode_secrets`, then :func:`~.keys.seal_secrets`)."""

    self_mask_seed: bytes  # the responder's own self-mask seed (it is a survivor)
    shares: tuple[RevealedShare, ...]


@dataclass(frozen=True)
class UnmaskResponse(Envelope):
    sealed: bytes  # RevealedSecrets sealed to the server: AES-256-GCM nonce ‖ ciphertext ‖ tag


Message = (
    AdvertiseKeys | GraphCommitments | GraphReveal | KeyRoster | EncryptedShares | ShareDelivery
    | MaskedInput | SurvivorList | ConsistencySignature | UnmaskRequest | UnmaskResponse
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
    GraphCommitments: MessageType.GRAPH_COMMITMENTS,
    GraphReveal: MessageType.GRAPH_REVEAL,
}


def message_type(message: Message) -> MessageType:
    try:
        return _TYPE_OF[type(message)]
    except KeyError:
        raise TypeError(f"not a protocol message: {type(message).__name__}") from None


# ---- checking typed messages ---------------------------------------------------------------------


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
        if type(value) is not tuple:
            self.fail(f"{field} must be a tuple of int")
        if value and not (set(map(type, value)) == {int} and value[0] >= 0 and value[-1] < 1 << 32
                          and _increasing(value)):
            for v in self.items(value, int, field):  # slow path: say what is wrong
                self.uint(v, 32, field)
            _strictly_increasing(value, field, self.what)

    def pairs(self, value: object, size: int, field: str) -> None:
        """(id, fixed-size bytes) pairs, ids strictly increasing: an IdTable (checked when built) or a tuple."""
        if isinstance(value, IdTable):
            if value.width != size:
                self.fail(f"{field} hold {value.width}-byte values; must be {size}")
            return
        if type(value) is not tuple:
            self.fail(f"{field} must be a tuple of tuple")
        if not value:
            return
        if set(map(type, value)) == {tuple} and set(map(len, value)) == {2}:
            ids, blobs = zip(*value)
            if (set(map(type, ids)) == {int} and ids[0] >= 0 and ids[-1] < 1 << 32 and _increasing(ids)
                    and set(map(type, blobs)) == {bytes} and set(map(len, blobs)) == {size}):
                return
        for pair in self.items(value, tuple, field):  # slow path: say what is wrong
            if len(pair) != 2:
                self.fail(f"each entry of {field} must be an (id, bytes) pair")
            self.uint(pair[0], 32, f"{field} id")
            self.raw(pair[1], (size,), field)
        _strictly_increasing([p[0] for p in value], f"{field} ids", self.what)

    def sealed(self, shares: object, field: str = "shares") -> None:
        if type(shares) is tuple and all(
            type(s) is SealedShare and type(s.peer) is int and type(s.ciphertext) is bytes
            and len(s.ciphertext) <= MAX_SEALED_SHARE_BYTES for s in shares
        ) and (not shares or (shares[0].peer >= 0 and shares[-1].peer < 1 << 32)) \
                and _increasing([s.peer for s in shares]):
            return
        for s in self.items(shares, SealedShare, field):  # slow path: say what is wrong
            self.uint(s.peer, 32, "share peer id")
            self.raw(s.ciphertext, range(MAX_SEALED_SHARE_BYTES + 1), "ciphertext")
        _strictly_increasing([s.peer for s in shares], "share peer ids", self.what)


_KEY_FIELDS = (("enc_public", PUBLIC_KEY_BYTES), ("mask_public", PUBLIC_KEY_BYTES),
               ("self_mask_commitment", DIGEST_BYTES), ("graph_commitment", DIGEST_BYTES),
               ("config_digest", DIGEST_BYTES))


def _keys_valid(m: AdvertiseKeys | RosterEntry, c: _Check) -> None:
    fields = (m.enc_public, m.mask_public, m.self_mask_commitment, m.graph_commitment, m.config_digest)
    if all(type(v) is bytes and len(v) == 32 for v in fields) and type(m.signature) is bytes \
            and len(m.signature) in (0, SIGNATURE_BYTES):
        return
    for field in ("enc_public", "mask_public"):  # slow path: say what is wrong
        c.raw(getattr(m, field), (PUBLIC_KEY_BYTES,), field)
    for field in ("self_mask_commitment", "graph_commitment", "config_digest"):
        c.raw(getattr(m, field), (DIGEST_BYTES,), field)
    c.raw(m.signature, (0, SIGNATURE_BYTES), "signature")


def _roster_valid(m: KeyRoster, c: _Check) -> None:
    c.pairs(m.nonces, GRAPH_NONCE_BYTES, "graph nonces")
    for e in c.items(m.entries, RosterEntry, "entries"):
        c.uint(e.client, 32, "roster client id")
        _keys_valid(e, c)
    _strictly_increasing([e.client for e in m.entries], "roster client ids", c.what)


def _shares_valid(m: EncryptedShares, c: _Check) -> None:
    c.sealed(m.shares)
    c.raw(m.signature, (0, SIGNATURE_BYTES), "signature")


def _masked_valid(m: MaskedInput, c: _Check) -> None:
    v = m.vector
    if not isinstance(v, np.ndarray) or v.ndim != 1 or v.dtype.kind != "u" or v.dtype.itemsize != 4:
        c.fail(f"vector must be a 1-D uint32 numpy array, got {type(v).__name__} {getattr(v, 'dtype', '')}")
    if not 1 <= v.size < 1 << 32:
        c.fail(f"vector has {v.size} entries; must be in [1, 2^32)")
    c.sealed(m.self_mask_shares, "self-mask shares")
    c.raw(m.tag, (MAC_BYTES,), "tag")
    c.raw(m.signature, (0, SIGNATURE_BYTES), "signature")


def _request_valid(m: UnmaskRequest, c: _Check) -> None:
    c.ids(m.survivors, "survivors")
    c.ids(m.dropped, "dropped")
    c.pairs(m.signatures, SIGNATURE_BYTES, "signatures")
    c.sealed(m.self_mask_shares, "self-mask shares")


def _response_valid(m: UnmaskResponse, c: _Check) -> None:
    if not isinstance(m.sealed, bytes):
        c.fail(f"sealed secrets must be bytes, got {type(m.sealed).__name__}")
    _check_sealed_size(len(m.sealed), c.fail)


def _check_sealed_size(size: int, fail) -> None:
    """Sealed RevealedSecrets hold the seed and whole revealed shares, nothing else."""
    inner = size - SEAL_OVERHEAD - _SECRETS_HEAD.size
    if inner < 0 or inner % _REVEALED.size or inner // _REVEALED.size >= 1 << 32:
        fail(f"sealed secrets of {size} bytes: must be {SEAL_OVERHEAD + _SECRETS_HEAD.size} bytes + "
             f"{_REVEALED.size} per revealed share")


def _secrets_valid(m: RevealedSecrets, c: _Check) -> None:
    if type(m) is not RevealedSecrets:
        c.fail(f"not revealed secrets: {type(m).__name__}")
    c.raw(m.self_mask_seed, (SECRET_BYTES,), "self-mask seed")
    for s in c.items(m.shares, RevealedShare, "shares"):
        c.uint(s.owner, 32, "share owner")
        if not isinstance(s.kind, ShareKind):
            c.fail(f"share kind must be a ShareKind, got {s.kind!r}")
        c.raw(s.value, (SHARE_BYTES,), "share value")
    _strictly_increasing([s.owner for s in m.shares], "share owners", c.what)


_VALIDATORS = {
    MessageType.ADVERTISE_KEYS: _keys_valid,
    MessageType.GRAPH_COMMITMENTS: lambda m, c: c.pairs(m.commitments, DIGEST_BYTES, "graph commitments"),
    MessageType.GRAPH_REVEAL: lambda m, c: c.raw(m.nonce, (GRAPH_NONCE_BYTES,), "graph nonce"),
    MessageType.KEY_ROSTER: _roster_valid,
    MessageType.ENCRYPTED_SHARES: _shares_valid,
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


def _pairs(pairs: Pairs) -> list[bytes]:
    if isinstance(pairs, IdTable):
        return [_u32(len(pairs)), pairs.raw]
    if not pairs:
        return [_u32(0)]
    entry = _pair_struct(len(pairs[0][1]))  # validate() has checked every value has this size
    return [_u32(len(pairs)), b"".join(itertools.starmap(entry.pack, pairs))]


def _pair_struct(size: int) -> struct.Struct:
    return struct.Struct(f"<I{size}s")


def _signature(sig: bytes) -> bytes:
    return struct.pack("<H", len(sig)) + sig


def _sealed(shares: tuple[SealedShare, ...]) -> list[bytes]:
    parts = [_u32(len(shares))]
    for s in shares:
        parts += [struct.pack("<IH", s.peer, len(s.ciphertext)), s.ciphertext]
    return parts


def _key_fields(m: AdvertiseKeys | RosterEntry) -> list[bytes]:
    return [m.enc_public, m.mask_public, m.self_mask_commitment, m.graph_commitment,
            m.config_digest, _signature(m.signature)]


def _body_parts(m: Message) -> list[bytes | memoryview]:
    if isinstance(m, AdvertiseKeys):
        return _key_fields(m)
    if isinstance(m, GraphCommitments):
        return _pairs(m.commitments)
    if isinstance(m, GraphReveal):
        return [m.nonce]
    if isinstance(m, KeyRoster):
        parts: list[bytes | memoryview] = [*_pairs(m.nonces), _u32(len(m.entries))]
        for e in m.entries:
            parts += [_u32(e.client), *_key_fields(e)]
        return parts
    if isinstance(m, EncryptedShares):
        return [*_sealed(m.shares), _signature(m.signature)]
    if isinstance(m, ShareDelivery):
        return _sealed(m.shares)
    if isinstance(m, MaskedInput):
        vec = np.ascontiguousarray(m.vector, dtype="<u4")
        return [*_sealed(m.self_mask_shares), m.tag, _signature(m.signature), _u32(vec.size), memoryview(vec).cast("B")]
    if isinstance(m, SurvivorList):
        return [_ids(m.survivors)]
    if isinstance(m, ConsistencySignature):
        return [m.signature]
    if isinstance(m, UnmaskRequest):
        return [_ids(m.survivors), _ids(m.dropped), *_pairs(m.signatures), *_sealed(m.self_mask_shares)]
    if isinstance(m, UnmaskResponse):
        return [_u32(len(m.sealed)), m.sealed]
    raise TypeError(f"not a protocol message: {type(m).__name__}")


def encode(message: Message) -> bytes:
    """The wire bytes of ``message``; raises ValueError for fields a peer's :func:`decode` would refuse."""
    what = message_type(message).name  # TypeError for anything that is not a protocol message
    try:
        validate(message)
        body = _body_parts(message)
        length = sum(len(p) if isinstance(p, bytes) else p.nbytes for p in body)
        header = _HEADER.pack(
            MAGIC, VERSION, message_type(message), 0, message.session_id, message.round,
            message.sender, message.recipient, length,
        )
        data = b"".join([header, *body])
        _parse(data, check_only=True)
    except MalformedMessage as exc:  # its text starts with the message type
        raise ValueError(f"cannot encode {exc}") from None
    except (struct.error, OverflowError) as exc:
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
        if not _increasing(ids):
            _strictly_increasing(ids, field, self.what)
        return ids

    def pairs(self, field: str, size: int) -> IdTable:
        n = self.count(f"{field} count", 4 + size)
        try:
            return IdTable(bytes(self.take(n * (4 + size), field)), size)
        except ValueError as exc:
            raise MalformedMessage(f"{self.what}: {field} {exc}") from None

    def signature(self, field: str) -> bytes:
        n = self.u16(field)
        if n not in (0, SIGNATURE_BYTES):
            raise MalformedMessage(f"{self.what}: {field} has {n} bytes; must be 0 or {SIGNATURE_BYTES}")
        return self.fixed(n, field)

    def sealed(self) -> tuple[SealedShare, ...]:
        n = self.count("share count", 6)
        shares = []
        for _ in range(n):
            peer, size = _SEALED_HEAD.unpack(self.take(6, "share peer id and length"))
            if size > MAX_SEALED_SHARE_BYTES:
                raise MalformedMessage(f"{self.what}: ciphertext of {size} bytes exceeds {MAX_SEALED_SHARE_BYTES}")
            shares.append(SealedShare(peer, self.fixed(size, "ciphertext")))
        peers = [s.peer for s in shares]
        if not _increasing(peers):
            _strictly_increasing(peers, "share peer ids", self.what)
        return tuple(shares)

    def fail(self, text: str) -> None:
        raise MalformedMessage(f"{self.what}: {text}")

    def end(self) -> None:
        if self.pos != len(self.data):
            raise MalformedMessage(f"{self.what}: {len(self.data) - self.pos} trailing bytes after the body")


def _increasing(ids: tuple[int, ...] | list[int]) -> bool:
    """Whether ``ids`` is strictly increasing (a C-level pass; the caller reports what is wrong)."""
    return all(map(operator.lt, ids, itertools.islice(ids, 1, None)))


def _strictly_increasing(ids: tuple[int, ...] | list[int], field: str, what: str) -> None:
    for a, b in zip(ids, ids[1:]):
        if b <= a:
            raise MalformedMessage(f"{what}: {field} must be strictly increasing (no repeats); saw {a} then {b}")


def decode(data: bytes | bytearray | memoryview) -> Message:
    """Parse wire bytes into a typed message, or raise :class:`MalformedMessage` saying what is wrong.

    A masked-input vector is returned as a read-only view into ``data`` (no copy; read-only even
    when ``data`` is a bytearray). A non-contiguous memoryview is copied first.
    """
    return _parse(data, check_only=False)


def _parse(data: bytes | bytearray | memoryview, *, check_only: bool) -> Message:
    view = memoryview(data)
    view = (view if view.contiguous else memoryview(view.tobytes())).cast("B")
    if len(view) < HEADER_BYTES:
        raise MalformedMessage(f"message of {len(view)} bytes is shorter than the {HEADER_BYTES}-byte header")
    magic, version, mtype, flags, session_id, round_, sender, recipient, length = _HEADER.unpack_from(view)
    if magic != MAGIC:
        raise MalformedMessage(f"bad magic {magic!r}; expected {MAGIC!r}")
    if version != VERSION:
        raise UnsupportedVersion(f"unsupported wire version {version}; this build speaks {VERSION} only")
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


def _key_body(r: _Reader) -> dict:
    fields = _KEYS.unpack(r.take(_KEYS.size, "keys, commitments and config digest"))
    return dict(zip(("enc_public", "mask_public", "self_mask_commitment", "graph_commitment",
                     "config_digest"), fields), signature=r.signature("signature"))


def _decode_roster(r: _Reader, env: dict, _: bool) -> KeyRoster:
    nonces = r.pairs("graph nonces", GRAPH_NONCE_BYTES)
    n = r.count("entry count", 4 + _KEYS.size + 2)
    entries = tuple(RosterEntry(client=r.u32("client id"), **_key_body(r)) for _ in range(n))
    _strictly_increasing([e.client for e in entries], "roster client ids", r.what)
    return KeyRoster(**env, nonces=nonces, entries=entries)


def _decode_masked(r: _Reader, env: dict, check_only: bool) -> MaskedInput:
    shares, tag, signature = r.sealed(), r.fixed(MAC_BYTES, "tag"), r.signature("signature")
    d = r.count("dimension", 4)
    if d == 0:
        raise MalformedMessage(f"{r.what}: empty vector")
    raw = r.take(4 * d, "vector")
    vec = np.empty(0, np.uint32) if check_only else np.frombuffer(raw, dtype="<u4")
    vec.flags.writeable = False  # a view into the caller's buffer: documented read-only, whatever it is
    return MaskedInput(**env, vector=vec, self_mask_shares=shares, tag=tag, signature=signature)


def _decode_request(r: _Reader, env: dict, _: bool) -> UnmaskRequest:
    survivors, dropped = r.ids("survivors"), r.ids("dropped")
    signatures = r.pairs("signatures", SIGNATURE_BYTES)
    return UnmaskRequest(**env, survivors=survivors, dropped=dropped, signatures=signatures,
                         self_mask_shares=r.sealed())


def _decode_response(r: _Reader, env: dict, _: bool) -> UnmaskResponse:
    size = r.count("sealed secrets length", 1)
    _check_sealed_size(size, r.fail)
    return UnmaskResponse(**env, sealed=r.fixed(size, "sealed secrets"))


def encode_secrets(secrets: RevealedSecrets) -> bytes:
    """The plaintext an unmask response seals: seed, share count, then (owner, kind, value) each."""
    check = _Check("revealed secrets")
    _secrets_valid(secrets, check)
    return _SECRETS_HEAD.pack(secrets.self_mask_seed, len(secrets.shares)) + b"".join(
        _REVEALED.pack(s.owner, int(s.kind), s.value) for s in secrets.shares)


def decode_secrets(data: bytes) -> RevealedSecrets:
    """Inverse of :func:`encode_secrets`, with the decoder's rules (:class:`MalformedMessage`): an
    authenticated plaintext is still only as well formed as its sender made it."""
    r = _Reader(memoryview(data), "UNMASK_RESPONSE (sealed secrets)")
    seed, n = _SECRETS_HEAD.unpack(r.take(_SECRETS_HEAD.size, "self-mask seed and share count"))
    if n * _REVEALED.size != len(data) - _SECRETS_HEAD.size:
        r.fail(f"{n} revealed shares do not fill the {len(data) - _SECRETS_HEAD.size} bytes that follow")
    shares = []
    for _ in range(n):
        owner, kind, value = _REVEALED.unpack(r.take(_REVEALED.size, "revealed share"))
        if kind not in (ShareKind.SELF_MASK, ShareKind.MASK_KEY):
            r.fail(f"unknown share kind {kind}")
        shares.append(RevealedShare(owner, ShareKind(kind), value))
    _strictly_increasing([s.owner for s in shares], "share owners", r.what)
    r.end()
    return RevealedSecrets(self_mask_seed=seed, shares=tuple(shares))


_DECODERS = {
    MessageType.ADVERTISE_KEYS: lambda r, env, _: AdvertiseKeys(**env, **_key_body(r)),
    MessageType.GRAPH_COMMITMENTS: lambda r, env, _: GraphCommitments(
        **env, commitments=r.pairs("graph commitments", DIGEST_BYTES)),
    MessageType.GRAPH_REVEAL: lambda r, env, _: GraphReveal(**env, nonce=r.fixed(GRAPH_NONCE_BYTES, "graph nonce")),
    MessageType.KEY_ROSTER: _decode_roster,
    MessageType.ENCRYPTED_SHARES: lambda r, env, _: EncryptedShares(
        **env, shares=r.sealed(), signature=r.signature("signature")),
    MessageType.SHARE_DELIVERY: lambda r, env, _: ShareDelivery(**env, shares=r.sealed()),
    MessageType.MASKED_INPUT: _decode_masked,
    MessageType.SURVIVOR_LIST: lambda r, env, _: SurvivorList(**env, survivors=r.ids("survivors")),
    MessageType.CONSISTENCY_SIGNATURE: lambda r, env, _: ConsistencySignature(
        **env, signature=r.fixed(SIGNATURE_BYTES, "signature")),
    MessageType.UNMASK_REQUEST: _decode_request,
    MessageType.UNMASK_RESPONSE: _decode_response,
}
