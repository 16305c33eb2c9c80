"""Broadcasts and Uploads as bytes: an explicit, versioned, length-checked wire format (no pickle).

    magic "SFED" | version u8 | kind u8 (1 Broadcast, 2 Upload) | reserved u16 = 0 | header length u32
    | header: UTF-8 JSON (scalars and a table of tensors) | tensor bytes, little-endian, back to back

The header lists every tensor as ``{"name", "dtype", "shape"}`` in the order its bytes follow; only
float32 and int64 tensors exist on this wire. :func:`decode` checks the magic, version, kind,
lengths, JSON shape, dtypes, shapes against the bytes present, that nothing trails, and that every
float is finite — anything else raises :class:`CodecError` saying what is wrong. The Flower
transport sends these bytes between processes; the in-process runtime sums Upload objects in memory
and uses this codec to count the bytes a round would send, to carry the shared-not-summed part
beside secure aggregation, and to record uploads (``--record-uploads``) for the audit, which keeps
them as :func:`compress` stores them: ``"SFEZ" | version u8 | zlib(the message, each tensor's bytes
as byte planes)``, lossless; :func:`decompress` gives the message back for ``decode_*`` to check.
"""

from __future__ import annotations

import json
import math
import struct
import zlib
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from secfed.federation.messages import Broadcast, Summand, Upload

MAGIC = b"SFED"
VERSION = 1
_PREFIX = struct.Struct("<4sBBHI")
_BROADCAST, _UPLOAD, _TENSORS = 1, 2, 3  # 3: a named tensor file (pretrained weights), not a message
_DTYPES = {"float32": (torch.float32, np.dtype("<f4")), "int64": (torch.int64, np.dtype("<i8"))}
STORED_MAGIC = b"SFEZ"  # a message as kept on disk: see compress()
_STORED = struct.Struct("<4sB")  # magic, version
MAX_HEADER_BYTES = 1 << 20
MAX_TENSORS = 4096


class CodecError(ValueError):
    """Bytes that are not a valid secfed Broadcast or Upload; the message says what is wrong."""


# ---- encoding --------------------------------------------------------------------------------------


def _table(named: Mapping[str, torch.Tensor]) -> tuple[list[dict[str, Any]], list[memoryview]]:
    entries, blobs = [], []
    for name, tensor in named.items():
        t = tensor.detach().cpu().contiguous()
        dtype = str(t.dtype).removeprefix("torch.")
        if dtype not in _DTYPES:
            raise ValueError(f"tensor {name!r} is {t.dtype}; the wire carries float32 and int64 only")
        entries.append({"name": name, "dtype": dtype, "shape": list(t.shape)})
        blobs.append(memoryview(t.numpy().astype(_DTYPES[dtype][1], copy=False)).cast("B"))
    return entries, blobs


def _parts(kind: int, header: dict[str, Any], named: Mapping[str, torch.Tensor]) -> list[bytes | memoryview]:
    """The message as the pieces it is joined from: prefix, header, each tensor's bytes (no copy)."""
    entries, blobs = _table(named)
    text = json.dumps({**header, "tensors": entries}, separators=(",", ":"), allow_nan=False).encode()
    return [_PREFIX.pack(MAGIC, VERSION, kind, 0, len(text)), text, *blobs]


def _broadcast_parts(message: Broadcast) -> list[bytes | memoryview]:
    named = {"weights": message.weights, **{f"payload/{k}": v for k, v in message.payloads.items()}}
    return _parts(_BROADCAST, {"round": message.round, "layout_id": message.layout_id}, named)


def _upload_parts(message: Upload) -> list[bytes | memoryview]:
    summands = {name: {"weight": s.weight, "encoding": s.encoding, "bound": s.bound,
                       "statistics": [list(run) for run in s.statistics]} for name, s in message.summed.items()}
    named = {**{f"summed/{k}": s.vector for k, s in message.summed.items()},
             **{f"shared/{k}": v for k, v in message.shared.items()}}
    header = {"client_id": message.client_id, "round": message.round, "summands": summands,
              "model_hash": message.model_hash.hex() if message.model_hash is not None else None}
    return _parts(_UPLOAD, header, named)


def encode_broadcast(message: Broadcast) -> bytes:
    return b"".join(_broadcast_parts(message))


def encode_upload(message: Upload) -> bytes:
    return b"".join(_upload_parts(message))


def broadcast_size(message: Broadcast) -> int:
    """``len(encode_broadcast(message))``, without building the bytes."""
    return sum(len(part) for part in _broadcast_parts(message))


def upload_size(message: Upload) -> int:
    """``len(encode_upload(message))``, without building the bytes."""
    return sum(len(part) for part in _upload_parts(message))


# ---- decoding --------------------------------------------------------------------------------------


def _what(kind: int | None) -> str:
    return {_BROADCAST: "Broadcast", _UPLOAD: "Upload", None: "message"}.get(kind, "tensor file")


def _header(view: memoryview, kind: int | None) -> dict[str, Any]:
    """The message's prefix and JSON header, checked (``kind`` None: any kind); ``view`` may end there."""
    what = _what(kind)
    if len(view) < _PREFIX.size:
        raise CodecError(f"{what}: {len(view)} bytes is shorter than the {_PREFIX.size}-byte prefix")
    magic, version, got_kind, reserved, header_len = _PREFIX.unpack_from(view)
    if magic != MAGIC:
        raise CodecError(f"{what}: bad magic {bytes(magic)!r}; expected {MAGIC!r}")
    if version != VERSION:
        raise CodecError(f"{what}: wire version {version}; this secfed reads version {VERSION}")
    if kind is not None and got_kind != kind:
        raise CodecError(f"expected a {what}, got message kind {got_kind}")
    if reserved != 0:
        raise CodecError(f"{what}: reserved field must be 0")
    if header_len > MAX_HEADER_BYTES or _PREFIX.size + header_len > len(view):
        raise CodecError(f"{what}: header of {header_len} bytes does not fit the {len(view)}-byte message")
    try:
        header = json.loads(bytes(view[_PREFIX.size : _PREFIX.size + header_len]))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CodecError(f"{what}: header is not JSON ({exc})") from None
    except RecursionError:  # nesting deeper than the interpreter's stack, e.g. [[[[…]]]]
        raise CodecError(f"{what}: header nests too deeply") from None
    if not isinstance(header, dict) or not isinstance(header.get("tensors"), list):
        raise CodecError(f"{what}: header has no tensor table")
    if len(header["tensors"]) > MAX_TENSORS:
        raise CodecError(f"{what}: {len(header['tensors'])} tensors exceed {MAX_TENSORS}")
    return header


def _well_formed(entry: object) -> bool:
    """A tensor-table entry with a known dtype and a shape of non-negative ints (its name aside)."""
    return (isinstance(entry, dict) and isinstance(entry.get("dtype"), str) and entry["dtype"] in _DTYPES
            and isinstance(entry.get("shape"), list)
            and all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in entry["shape"]))


def _byte_size(entry: dict[str, Any]) -> int:
    return math.prod(entry["shape"]) * _DTYPES[entry["dtype"]][1].itemsize


def _scan(data: bytes | bytearray | memoryview, kind: int | None
          ) -> tuple[memoryview, dict[str, Any], list[tuple[dict[str, Any], int, int]]]:
    """The message's prefix, header and tensor table, checked against the bytes present (``kind``
    None: any kind). Returns the bytes, the header and, per tensor, (entry, offset, byte length)."""
    view = memoryview(data).cast("B")
    what = _what(kind)
    header = _header(view, kind)
    pos = _PREFIX.size + _PREFIX.unpack_from(view)[4]
    spans: list[tuple[dict[str, Any], int, int]] = []
    names: set[str] = set()
    for entry in header["tensors"]:
        if not (_well_formed(entry) and isinstance(entry.get("name"), str)):
            raise CodecError(f"{what}: malformed tensor entry {entry!r}")
        if entry["name"] in names:
            raise CodecError(f"{what}: tensor {entry['name']!r} appears twice")
        names.add(entry["name"])
        size = _byte_size(entry)
        if size > len(view) - pos:
            raise CodecError(f"{what}: tensor {entry['name']!r} needs {size} bytes, {len(view) - pos} left")
        spans.append((entry, pos, size))
        pos += size
    if pos != len(view):
        raise CodecError(f"{what}: {len(view) - pos} trailing bytes after the last tensor")
    return view, header, spans


def _unpack(data: bytes | bytearray | memoryview, kind: int) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    view, header, spans = _scan(data, kind)
    what = _what(kind)
    tensors: dict[str, torch.Tensor] = {}
    for entry, pos, size in spans:
        np_dtype = _DTYPES[entry["dtype"]][1]
        array = np.frombuffer(view[pos : pos + size], dtype=np_dtype).reshape(entry["shape"])
        if np_dtype.kind == "f" and not np.isfinite(array).all():
            raise CodecError(f"{what}: tensor {entry['name']!r} holds NaN or infinite values")
        tensors[entry["name"]] = torch.from_numpy(array.astype(np_dtype.newbyteorder("="), copy=True))
    return header, tensors


def _int(header: dict[str, Any], key: str, what: str) -> int:
    value = header.get(key)
    if not (isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 1 << 63):
        raise CodecError(f"{what}: {key} must be a non-negative integer, got {value!r}")
    return value


def _prefixed(tensors: dict[str, torch.Tensor], prefix: str) -> dict[str, torch.Tensor]:
    return {name[len(prefix):]: t for name, t in tensors.items() if name.startswith(prefix)}


def decode_broadcast(data: bytes | bytearray | memoryview) -> Broadcast:
    header, tensors = _unpack(data, _BROADCAST)
    weights = tensors.pop("weights", None)
    if weights is None or weights.dtype != torch.float32 or weights.dim() != 1:
        raise CodecError("Broadcast: needs a flat float32 'weights' tensor")
    if not isinstance(header.get("layout_id"), str):
        raise CodecError("Broadcast: layout_id must be a string")
    payloads = _prefixed(tensors, "payload/")
    if len(payloads) != len(tensors):
        raise CodecError(f"Broadcast: unexpected tensors {sorted(set(tensors) - {'payload/' + k for k in payloads})}")
    return Broadcast(_int(header, "round", "Broadcast"), weights, header["layout_id"], payloads)


def _statistics_runs(name: str, runs: object, numel: int) -> tuple[tuple[int, int], ...]:
    """A summand's BatchNorm-statistics runs, checked: in order, disjoint, inside the vector."""
    if not isinstance(runs, list):
        raise CodecError(f"Upload: summand {name!r}: statistics must be a list of [start, length], got {runs!r}")
    out, end = [], 0
    for run in runs:
        if not (isinstance(run, list) and len(run) == 2 and all(type(v) is int for v in run)
                and run[0] >= end and run[1] > 0 and run[0] + run[1] <= numel):
            raise CodecError(f"Upload: summand {name!r}: statistics run {run!r} is not an ordered, disjoint "
                             f"[start, length] inside its {numel} values")
        out.append((run[0], run[1]))
        end = run[0] + run[1]
    return tuple(out)


def decode_upload(data: bytes | bytearray | memoryview) -> Upload:
    header, tensors = _unpack(data, _UPLOAD)
    summands = header.get("summands")
    if not isinstance(summands, dict):
        raise CodecError("Upload: header has no summand table")
    vectors, shared = _prefixed(tensors, "summed/"), _prefixed(tensors, "shared/")
    if len(vectors) + len(shared) != len(tensors) or set(vectors) != set(summands):
        raise CodecError("Upload: the summand table and the summed tensors do not match")
    summed = {}
    for name, meta in summands.items():
        if not (isinstance(meta, dict) and meta.get("encoding") in ("float", "ring")
                and isinstance(meta.get("weight"), (int, float)) and not isinstance(meta.get("weight"), bool)
                and math.isfinite(meta["weight"])
                and (meta.get("bound") is None or (isinstance(meta["bound"], (int, float)) and meta["bound"] > 0))):
            raise CodecError(f"Upload: malformed summand {name!r}: {meta!r}")
        vector = vectors[name]
        expected = torch.float32 if meta["encoding"] == "float" else torch.int64
        if vector.dim() != 1 or vector.dtype != expected:
            raise CodecError(f"Upload: summand {name!r} must be a flat {expected} vector")
        summed[name] = Summand(vector, float(meta["weight"]), meta["encoding"], meta.get("bound"),
                               _statistics_runs(name, meta.get("statistics", []), vector.numel()))
    return Upload(_int(header, "client_id", "Upload"), _int(header, "round", "Upload"), summed, shared,
                  _model_hash(header))


def _model_hash(header: dict[str, Any]) -> bytes | None:
    digest = header.get("model_hash")
    try:
        model_hash = None if digest is None else bytes.fromhex(digest)
    except (TypeError, ValueError):
        raise CodecError(f"Upload: model_hash must be hex, got {digest!r}") from None
    if model_hash is not None and len(model_hash) != 32:
        raise CodecError("Upload: model_hash must be 32 bytes")
    return model_hash


def encode_tensors(header: dict[str, Any], named: Mapping[str, torch.Tensor]) -> bytes:
    """Named float32 / int64 tensors and a JSON header in this format (kind 3): a weights file that
    is read back without pickle. The same tensors and header give the same bytes."""
    return b"".join(_parts(_TENSORS, header, named))


def decode_tensors(data: bytes | bytearray | memoryview) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """(header, tensors) of :func:`encode_tensors`' bytes, checked as every message is."""
    return _unpack(data, _TENSORS)


# ---- on disk ---------------------------------------------------------------------------------------


def _planes(data: bytes | memoryview | np.ndarray, itemsize: int, *, inverse: bool = False) -> np.ndarray:
    """A tensor's bytes as byte planes (every value's first byte, then every second byte, ...), or back.
    In a float32 update the sign and exponent bytes of values of like size repeat, so the planes
    deflate to about half; interleaved they hardly deflate at all."""
    raw = np.frombuffer(data, dtype=np.uint8)
    shape = (itemsize, -1) if inverse else (-1, itemsize)
    return np.ascontiguousarray(raw.reshape(shape).T)


def compress(message: bytes | memoryview) -> bytes:
    """A Broadcast or Upload's bytes as kept on disk (recorded uploads), losslessly smaller:
    ``"SFEZ" | version u8 | zlib(prefix | header | each tensor's bytes as byte planes)``.
    :func:`decompress` gives back the same bytes, which ``decode_*`` then check as ever."""
    view, _, spans = _scan(message, None)
    # Run-length matches only: on an update's planes as small as level 6's output and 2-3x faster (a
    # ResNet-18 update: 0.49 of its bytes; the broadcast, mostly random mantissa bits, 0.83)
    packer = zlib.compressobj(1, zlib.DEFLATED, 15, 8, zlib.Z_RLE)
    header_end = spans[0][1] if spans else len(view)
    parts = [_STORED.pack(STORED_MAGIC, VERSION), packer.compress(view[:header_end])]
    for entry, pos, size in spans:
        parts.append(packer.compress(_planes(view[pos : pos + size], _DTYPES[entry["dtype"]][1].itemsize)))
    parts.append(packer.flush())
    return b"".join(parts)


def decompress(data: bytes | memoryview, *, limit: int | None = None) -> bytearray:
    """The message bytes :func:`compress` stored. A damaged file (zlib's checksum, a truncated stream,
    trailing bytes, a table that does not fit) is a :class:`CodecError`. The header is inflated first
    and the rest only up to the length its tensor table declares, so a crafted file cannot inflate
    beyond what it claims to hold (a decompression bomb) — nor claim more than ``limit`` bytes, what
    the reader knows a message can hold (found by review: a 1 MB file declared, and inflated to, 1 GiB)."""
    inflater, head = _inflate_header(data)
    declared = _declared_length(head)
    if limit is not None and declared > limit:
        raise CodecError(f"stored message: its header declares {declared:,} bytes, more than the {limit:,} a "
                         "message of this run can hold")
    try:
        message = bytearray(head) + inflater.decompress(inflater.unconsumed_tail, max(1, declared - len(head) + 1))
    except zlib.error as exc:
        raise CodecError(f"stored message: damaged ({exc})") from None
    if len(message) > declared or inflater.unconsumed_tail:
        raise CodecError(f"stored message: inflates beyond the {declared} bytes its header declares")
    if not inflater.eof or inflater.unused_data:
        raise CodecError("stored message: damaged (the compressed stream is truncated or followed by other bytes)")
    _, _, spans = _scan(message, None)
    out = np.frombuffer(message, dtype=np.uint8)  # writes through to `message`
    for entry, pos, size in spans:
        itemsize = _DTYPES[entry["dtype"]][1].itemsize
        out[pos : pos + size] = _planes(out[pos : pos + size], itemsize, inverse=True).reshape(-1)
    return message


def _inflate_header(data: bytes | memoryview) -> tuple[Any, bytes]:
    """A stored message's inflater and its inflated prefix and JSON header (nothing beyond)."""
    view = memoryview(data).cast("B")
    if len(view) < _STORED.size or bytes(view[:4]) != STORED_MAGIC:
        raise CodecError(f"stored message: not a compressed secfed message (expected magic {STORED_MAGIC!r})")
    if view[4] != VERSION:
        raise CodecError(f"stored message: version {view[4]}; this secfed reads version {VERSION}")
    inflater = zlib.decompressobj()
    try:
        head = inflater.decompress(view[_STORED.size :], _PREFIX.size)
        if len(head) == _PREFIX.size:
            header_len = min(_PREFIX.unpack(head)[4], MAX_HEADER_BYTES + 1)
            head += inflater.decompress(inflater.unconsumed_tail, header_len)
    except zlib.error as exc:
        raise CodecError(f"stored message: damaged ({exc})") from None
    return inflater, head


def _declared_length(head: bytes) -> int:
    """The whole message's length as its prefix, header and tensor table declare it (checked later
    against the bytes, by :func:`_scan`)."""
    header = _header(memoryview(head), None)
    return len(head) + sum(_byte_size(e) for e in header["tensors"] if _well_formed(e))


def upload_identity(data: bytes | memoryview) -> tuple[int, bytes | None]:
    """(client id, model hash) of an Upload's bytes, plain or as :func:`compress` stored them, from its
    header alone: the tensors are neither inflated nor read (the audit's protocol check needs only these)."""
    view = memoryview(data).cast("B")
    if bytes(view[:4]) == STORED_MAGIC:
        view = memoryview(_inflate_header(view)[1])
    header = _header(view, _UPLOAD)
    return _int(header, "client_id", "Upload"), _model_hash(header)
