"""The wire format of Broadcasts and Uploads: what goes in comes out, sizes are exact, and every
malformed message is refused with a CodecError that says what is wrong (never misread)."""

from __future__ import annotations

import math
import struct

import pytest
import torch

from secfed.federation import codec
from secfed.federation.messages import MODEL, Broadcast, Summand, Upload


def _broadcast() -> Broadcast:
    return Broadcast(7, torch.randn(1000), "layout-a", {"dfs/3": torch.randn(4, 16)})


def _upload() -> Upload:
    return Upload(3, 7, {MODEL: Summand(torch.randn(1000), 0.25, "float", 1.5),
                         "ring": Summand(torch.arange(10, dtype=torch.int64), 1.0, "ring")},
                  {"dfs": torch.randn(4, 16)}, bytes(range(32)))


def test_a_broadcast_and_an_upload_come_back_as_they_were_sent() -> None:
    b = _broadcast()
    got = codec.decode_broadcast(codec.encode_broadcast(b))
    assert (got.round, got.layout_id) == (b.round, b.layout_id) and torch.equal(got.weights, b.weights)
    assert got.payloads.keys() == b.payloads.keys() and torch.equal(got.payloads["dfs/3"], b.payloads["dfs/3"])
    u = _upload()
    got_u = codec.decode_upload(codec.encode_upload(u))
    assert (got_u.client_id, got_u.round, got_u.model_hash) == (u.client_id, u.round, u.model_hash)
    for name, s in u.summed.items():
        g = got_u.summed[name]
        assert torch.equal(g.vector, s.vector) and (g.weight, g.encoding, g.bound) == (s.weight, s.encoding, s.bound)
    assert torch.equal(got_u.shared["dfs"], u.shared["dfs"])
    got_u.summed[MODEL].vector.add_(1)  # decoded tensors are the receiver's own, writable copies
    assert not torch.equal(got_u.summed[MODEL].vector, u.summed[MODEL].vector)


def test_sizes_are_the_encoded_lengths_without_encoding() -> None:
    assert codec.broadcast_size(_broadcast()) == len(codec.encode_broadcast(_broadcast()))
    u = _upload()
    assert codec.upload_size(u) == len(codec.encode_upload(u))
    assert codec.upload_size(Upload(0, 0, {})) == len(codec.encode_upload(Upload(0, 0, {})))


def _corrupt(data: bytes, at: int, value: bytes) -> bytes:
    return data[:at] + value + data[at + len(value):]


@pytest.mark.parametrize(("mutate", "message"), [
    (lambda d: d[:10], "shorter than"),
    (lambda d: _corrupt(d, 0, b"XXXX"), "bad magic"),
    (lambda d: _corrupt(d, 4, bytes([9])), "wire version 9"),
    (lambda d: _corrupt(d, 5, bytes([1])), "expected a Upload"),
    (lambda d: _corrupt(d, 6, b"\x01\x00"), "reserved"),
    (lambda d: _corrupt(d, 8, struct.pack("<I", 1 << 30)), "header of"),
    (lambda d: d[:-1], "needs"),
    (lambda d: d + b"\x00", "trailing bytes"),
])
def test_every_malformed_upload_is_refused_naming_the_problem(mutate, message: str) -> None:
    with pytest.raises(codec.CodecError, match=message):
        codec.decode_upload(mutate(codec.encode_upload(_upload())))


def test_non_finite_values_and_inconsistent_tables_are_refused() -> None:
    bad = Upload(0, 0, {MODEL: Summand(torch.tensor([1.0, math.nan]))})
    with pytest.raises(codec.CodecError, match="NaN or infinite"):
        codec.decode_upload(codec.encode_upload(bad))
    ring_as_float = Upload(0, 0, {MODEL: Summand(torch.ones(3), encoding="ring")})
    with pytest.raises(codec.CodecError, match="flat torch.int64"):
        codec.decode_upload(codec.encode_upload(ring_as_float))
    with pytest.raises(codec.CodecError, match="expected a Broadcast"):
        codec.decode_broadcast(codec.encode_upload(_upload()))
    with pytest.raises(ValueError, match="float32 and int64 only"):
        codec.encode_upload(Upload(0, 0, {MODEL: Summand(torch.ones(3, dtype=torch.float64))}))


def test_a_broadcast_hashes_its_own_weights_and_a_decoded_copy_agrees() -> None:
    from secfed.models.sharing import model_hash

    b = _broadcast()
    copy = codec.decode_broadcast(codec.encode_broadcast(b))
    assert b.weights_hash == model_hash(b.weights) == copy.weights_hash
    other = Broadcast(b.round, b.weights + 1e-3, b.layout_id)
    assert other.weights_hash != b.weights_hash


def test_statistics_runs_travel_with_their_summand_and_malformed_ones_are_refused() -> None:
    from secfed.federation import codec
    from secfed.federation.messages import MODEL, Summand, Upload

    upload = Upload(2, 1, {MODEL: Summand(torch.ones(30), 0.5, statistics=((3, 4), (10, 2)))}, {})
    back = codec.decode_upload(codec.encode_upload(upload))
    assert back.summed[MODEL].statistics == ((3, 4), (10, 2))
    for runs in (((10, 2), (3, 4)), ((28, 5),), ((3, 0),)):  # out of order, past the end, empty
        bad = Upload(2, 1, {MODEL: Summand(torch.ones(30), 0.5, statistics=runs)}, {})
        with pytest.raises(codec.CodecError, match="statistics run"):
            codec.decode_upload(codec.encode_upload(bad))


def _with_header(header: bytes) -> bytes:
    """An Upload whose JSON header is ``header`` (prefix rewritten to its length), no tensor bytes."""
    magic, version, kind, reserved, _ = codec._PREFIX.unpack_from(codec.encode_upload(Upload(0, 0, {})))
    return codec._PREFIX.pack(magic, version, kind, reserved, len(header)) + header


@pytest.mark.parametrize(("header", "message"), [
    (b'{"tensors": [{"name": "x", "dtype": ["f4"], "shape": [1]}]}', "malformed tensor entry"),
    (b'{"tensors": [{"name": "x", "dtype": {"a": 1}, "shape": [1]}]}', "malformed tensor entry"),
    (b"[" * 100_000 + b"]" * 100_000, "nests too deeply"),
])
def test_a_header_of_unhashable_types_or_deep_nesting_is_refused_by_name(header: bytes, message: str) -> None:
    """(found by review: TypeError 'unhashable type' and RecursionError escaped the codec)"""
    for decode in (codec.decode_upload, codec.decode_broadcast):
        data = _with_header(header)
        if decode is codec.decode_broadcast:
            data = data[:5] + bytes([codec._BROADCAST]) + data[6:]
        with pytest.raises(codec.CodecError, match=message):
            decode(data)
