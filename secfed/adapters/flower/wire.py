"""How secure aggregation rides in Flower Messages: record names, the session configuration's
bytes, protocol messages as arrays, and the digest of what a client trains on.

Every protocol message is the protocol's own wire encoding (:func:`secfed.protocols.encode`),
carried as a ``uint8`` array (Flower chunks large arrays; a masked input is 4·d bytes). The
session configuration has no encoding in ``secfed.protocols``, so it gets one here: explicit,
versioned and length-checked like the protocol's messages::

    magic "SFSC" | version u8 | flags u8 (1 authenticated, 2 input bound, 4 params authenticated)
    | ring_bits u8 | reserved u8 = 0 | session_id 16B | round u64 | n u32 | degree u32 | threshold u32
    | corrupt_bound u32 | dimension u32 | dropout_rate f64 | security_failure f64
    | correctness_failure f64 | input_bound u64 | identity key count u32 | server key 32B
    | 32-byte identity keys

(Version 2 added the server key: clients seal their unmask responses to it.)

A record that is missing or malformed raises :class:`secfed.protocols.MalformedMessage` naming it.
"""

from __future__ import annotations

import hashlib
import io
import math
import struct
from collections.abc import Iterable

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, RecordDict

from secfed.protocols import GraphParams, MalformedMessage, OverflowRefused, SessionConfig, UnsupportedVersion

CONTROL = "secfed.secagg"  # ConfigRecord: stage, the client's index, session and encoding
PAYLOAD = "secfed.secagg.message"  # ArrayRecord: one protocol message, "message" → uint8 array
# The next session's key advertisement riding on this session's unmask message (pipelining): its
# control record (as an advertise_keys message's) and, in the reply, the advertisement itself.
NEXT = "secfed.secagg.next"
NEXT_PAYLOAD = "secfed.secagg.next.message"
# Added by SecAggMod, and only by it, to what it hands the app inside the masked-input phase: the app
# may answer with a vector to be masked there (any copy arriving from the network is removed first).
INSIDE = "secfed.secagg.inside"
OURS = (CONTROL, PAYLOAD, NEXT, NEXT_PAYLOAD, INSIDE)
# Per-node records the content digest leaves out: which of a node's own sites train this round
# (secfed train --flower). They differ per node by design — no node learns which of another node's
# sites were drawn — while the model they train on stays bound. (A node in a round's session does
# learn which nodes are: the session names its members' identity keys; SECURITY.md, "Whom each ε
# protects against".)
SITES = "secfed.sites"
PERSONAL = "secfed.personal"  # ArrayRecord "site-K": the node's own sites' personal broadcasts (Eq. 15)
UNBOUND = (SITES, PERSONAL)

_SESSION = struct.Struct("<4sBBBB16sQIIIIIdddQI")
_SESSION_MAGIC = b"SFSC"
_SESSION_VERSION = 2
_AUTHENTICATED, _BOUNDED, _PARAMS_AUTHENTICATED = 1, 2, 4
KEY_BYTES = 32


# ---- the session configuration ---------------------------------------------------------------------


def encode_session(config: SessionConfig) -> bytes:
    p = config.params
    flags = (_AUTHENTICATED if config.authenticated else 0) | (_BOUNDED if config.input_bound is not None else 0) | (
        _PARAMS_AUTHENTICATED if p.authenticated else 0)
    head = _SESSION.pack(
        _SESSION_MAGIC, _SESSION_VERSION, flags, config.ring_bits, 0, config.session_id, config.round,
        p.n_clients, p.degree, p.threshold, p.corrupt_bound, config.dimension, p.dropout_rate,
        p.security_failure, p.correctness_failure, config.input_bound or 0, len(config.identity_keys),
    )
    return head + config.server_key + b"".join(config.identity_keys)


def decode_session(data: bytes) -> SessionConfig:
    """The SessionConfig :func:`encode_session` wrote; MalformedMessage for anything else."""
    if len(data) < _SESSION.size:
        raise MalformedMessage(f"session config of {len(data)} bytes is shorter than its {_SESSION.size}-byte header")
    (magic, version, flags, ring_bits, reserved, session_id, round_, n, degree, threshold, corrupt, dimension,
     dropout, security, correctness, bound, keys) = _SESSION.unpack_from(data)
    if magic != _SESSION_MAGIC:
        raise MalformedMessage(f"session config: bad magic {magic!r}")
    if version != _SESSION_VERSION:
        raise UnsupportedVersion(f"session config version {version}; this build reads {_SESSION_VERSION}")
    if reserved or flags & ~(_AUTHENTICATED | _BOUNDED | _PARAMS_AUTHENTICATED):
        raise MalformedMessage(f"session config: reserved bits set (flags {flags:#04x})")
    if len(data) != _SESSION.size + KEY_BYTES * (1 + keys):
        raise MalformedMessage(f"session config: the server key and {keys} identity keys need "
                               f"{_SESSION.size + KEY_BYTES * (1 + keys)} bytes, got {len(data)}")
    if not all(math.isfinite(v) for v in (dropout, security, correctness)):
        raise MalformedMessage("session config: non-finite graph figures")
    server_key = bytes(data[_SESSION.size : _SESSION.size + KEY_BYTES])
    at = _SESSION.size + KEY_BYTES
    identity = tuple(bytes(data[at + KEY_BYTES * i : at + KEY_BYTES * (i + 1)]) for i in range(keys))
    try:
        params = GraphParams(n, degree, threshold, corrupt, dropout, bool(flags & _PARAMS_AUTHENTICATED),
                             security, correctness)
        return SessionConfig(session_id, round_, params, dimension, input_bound=bound if flags & _BOUNDED else None,
                             server_key=server_key, ring_bits=ring_bits, authenticated=bool(flags & _AUTHENTICATED), identity_keys=identity)
    except (ValueError, OverflowRefused) as exc:
        raise MalformedMessage(f"session config: {exc}") from None


# ---- records -------------------------------------------------------------------------------------


def bytes_array(data: bytes) -> Array:
    return Array(np.frombuffer(data, dtype=np.uint8))


def array_bytes(array: Array, what: str) -> bytes:
    """The bytes a 1-D uint8 Array carries, its .npy header checked against them before anything is
    allocated (``Array.numpy()`` trusts the header: one declaring 2^40 entries made the ServerApp
    allocate 1 TiB and stop — found by review)."""
    data = array.data
    if not isinstance(data, bytes):
        raise MalformedMessage(f"{what}: not a numpy array (data of type {type(data).__name__})")
    stream = io.BytesIO(data)
    try:
        version = np.lib.format.read_magic(stream)
        read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
        shape, fortran, dtype = read(stream)
    except (ValueError, TypeError, SyntaxError, UnicodeDecodeError, RecursionError) as exc:
        raise MalformedMessage(f"{what}: not a numpy array ({type(exc).__name__}: {exc})") from None
    body = data[stream.tell():]
    if dtype != np.uint8 or len(shape) != 1 or shape[0] != len(body):
        raise MalformedMessage(f"{what}: must be a 1-D uint8 array of the bytes it carries, got {dtype} {shape} "
                               f"and {len(body)} bytes")
    return body


def put_message(content: RecordDict, data: bytes, record: str = PAYLOAD) -> None:
    """Put one protocol message (its wire bytes) into ``content`` (``record``: NEXT_PAYLOAD for the
    next session's advertisement)."""
    content[record] = ArrayRecord({"message": bytes_array(data)})


def get_message(content: RecordDict, record: str = PAYLOAD) -> bytes:
    found = content.array_records.get(record) if record in content else None
    if found is None or "message" not in found:
        raise MalformedMessage(f"Flower message carries no {record!r} record")
    return array_bytes(found["message"], record)


def control(content: RecordDict) -> ConfigRecord | None:
    """The secure-aggregation control record of a message, if it has one."""
    return content.config_records.get(CONTROL) if CONTROL in content else None


def typed(record: ConfigRecord, key: str, kind: type | tuple[type, ...]) -> object:
    """``record[key]``, refused unless it is of ``kind`` (bool is not an int here)."""
    value = record.get(key)
    if value is None or not isinstance(value, kind) or (isinstance(value, bool) and bool not in _kinds(kind)):
        raise MalformedMessage(f"{CONTROL}: {key!r} must be {_names(kind)}, got {type(value).__name__}")
    return value


def _kinds(kind: type | tuple[type, ...]) -> tuple[type, ...]:
    return kind if isinstance(kind, tuple) else (kind,)


def _names(kind: type | tuple[type, ...]) -> str:
    return " or ".join(k.__name__ for k in _kinds(kind))


def without_ours(content: RecordDict) -> RecordDict:
    """A copy of ``content`` without secfed's records: what the wrapped app and the digest see."""
    return RecordDict({name: record for name, record in content.items() if name not in OURS})


# ---- what a client trains on ---------------------------------------------------------------------


def content_digest(content: RecordDict) -> bytes:
    """SHA-256 over every record of ``content`` except secfed's own: names, keys, value types and bytes.

    The server announces it when keys are shared and every client checks it against what it is
    later given to train on: a server that gives one client a crafted model is caught either by
    the neighbours (the digests sealed in the key-seed shares differ) or by the client itself.
    """
    h = hashlib.sha256(b"secfed/flower/v1/content\x00")

    def part(data: bytes) -> None:
        h.update(len(data).to_bytes(8, "little") + data)

    for name in sorted(k for k in content.keys() if k not in OURS and k not in UNBOUND):
        record = content[name]
        part(name.encode())
        if isinstance(record, ArrayRecord):
            part(b"arrays")
            for key in sorted(record.keys()):
                a = record[key]
                for piece in (key, a.dtype, ",".join(map(str, a.shape)), a.stype):
                    part(str(piece).encode())
                part(a.data)
        else:
            part(b"config" if isinstance(record, ConfigRecord) else b"metrics")
            for key in sorted(record.keys()):
                part(key.encode())
                for piece in _scalars(record[key]):
                    part(piece)
    return h.digest()


def _scalars(value: object) -> Iterable[bytes]:
    if isinstance(value, list):
        yield b"list" + len(value).to_bytes(8, "little")
        for item in value:
            yield from _scalars(item)
    elif isinstance(value, bool):
        yield b"b" + bytes([value])
    elif isinstance(value, int):
        yield b"i" + str(value).encode()
    elif isinstance(value, float):
        yield b"f" + struct.pack("<d", value)
    elif isinstance(value, str):
        yield b"s" + value.encode()
    elif isinstance(value, bytes):
        yield b"y" + value
    else:  # Flower's records hold nothing else
        raise MalformedMessage(f"record value of type {type(value).__name__}")
