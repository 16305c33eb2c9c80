"""Wire format: round trips, exact sizes, and fuzzed / truncated / corrupted bytes → MalformedMessage only."""

from __future__ import annotations

import struct
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from secfed.protocols import MalformedMessage, UnsupportedVersion, decode, encode, encoded_size
from secfed.protocols.crypto import SEAL_OVERHEAD
from secfed.protocols.shamir import SHARE_BYTES
from secfed.protocols.secagg.messages import (
    HEADER_BYTES,
    SERVER,
    VERSION,
    AdvertiseKeys,
    ConsistencySignature,
    EncryptedShares,
    GraphCommitments,
    GraphReveal,
    KeyRoster,
    MaskedInput,
    RevealedSecrets,
    RevealedShare,
    RosterEntry,
    SealedShare,
    ShareDelivery,
    ShareKind,
    SurvivorList,
    UnmaskRequest,
    UnmaskResponse,
    decode_secrets,
    encode_secrets,
)

ids = st.integers(0, 2**32 - 2)
b32 = st.binary(min_size=32, max_size=32)
sig = st.sampled_from([b"", bytes(64)]) | st.binary(min_size=64, max_size=64)
sorted_ids = st.lists(ids, max_size=6, unique=True).map(lambda v: tuple(sorted(v)))
envelope = st.fixed_dictionaries(
    dict(session_id=st.binary(min_size=16, max_size=16), round=st.integers(0, 2**64 - 1), sender=ids | st.just(SERVER),
         recipient=ids | st.just(SERVER))
)


def pairs(draw, size):
    return tuple((c, draw(st.binary(min_size=size, max_size=size))) for c in draw(sorted_ids))


def sealed(draw):
    return tuple(SealedShare(p, draw(st.binary(max_size=100))) for p in draw(sorted_ids))


@st.composite
def messages(draw):
    env = draw(envelope)
    kind = draw(st.integers(0, 10))
    if kind == 0:
        return AdvertiseKeys(**env, enc_public=draw(b32), mask_public=draw(b32), self_mask_commitment=draw(b32),
                             graph_commitment=draw(b32), config_digest=draw(b32),
                             signature=draw(sig))
    if kind == 1:
        clients = draw(sorted_ids)
        return KeyRoster(**env, nonces=pairs(draw, 16), entries=tuple(
            RosterEntry(c, draw(b32), draw(b32), draw(b32), draw(b32), draw(b32), draw(sig))
            for c in clients))
    if kind == 2:
        return EncryptedShares(**env, shares=sealed(draw), signature=draw(sig))
    if kind == 3:
        return ShareDelivery(**env, shares=sealed(draw))
    if kind == 4:
        vec = np.array(draw(st.lists(st.integers(0, 2**32 - 1), min_size=1, max_size=20)), dtype=np.uint32)
        return MaskedInput(**env, vector=vec, self_mask_shares=sealed(draw), tag=draw(b32), signature=draw(sig))
    if kind == 5:
        return SurvivorList(**env, survivors=draw(sorted_ids))
    if kind == 6:
        return ConsistencySignature(**env, signature=draw(st.binary(min_size=64, max_size=64)))
    if kind == 7:
        return UnmaskRequest(**env, survivors=draw(sorted_ids), dropped=draw(sorted_ids), signatures=pairs(draw, 64),
                             self_mask_shares=sealed(draw))
    if kind == 8:
        return GraphCommitments(**env, commitments=pairs(draw, 32))
    if kind == 9:
        return GraphReveal(**env, nonce=draw(st.binary(min_size=16, max_size=16)))
    size = SEAL_OVERHEAD + 16 + 4 + (4 + 1 + SHARE_BYTES) * draw(st.integers(0, 4))  # sealed RevealedSecrets
    return UnmaskResponse(**env, sealed=draw(st.binary(min_size=size, max_size=size)))


@st.composite
def revealed_secrets(draw):
    owners = draw(sorted_ids)
    return RevealedSecrets(self_mask_seed=draw(st.binary(min_size=16, max_size=16)), shares=tuple(
        RevealedShare(o, draw(st.sampled_from(list(ShareKind))), draw(st.binary(min_size=SHARE_BYTES, max_size=SHARE_BYTES)))
        for o in owners))


def same(a, b) -> bool:
    if isinstance(a, MaskedInput):
        return isinstance(b, MaskedInput) and a.__dict__.keys() == b.__dict__.keys() and all(
            np.array_equal(v, b.__dict__[k]) if k == "vector" else v == b.__dict__[k] for k, v in a.__dict__.items())
    return a == b


@settings(max_examples=150, deadline=None)
@given(messages())
def test_roundtrip_and_exact_size(message):
    data = encode(message)
    assert len(data) == encoded_size(message)
    assert same(decode(data), message)
    assert same(decode(bytearray(data)), message)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(messages(), st.data())
def test_every_truncation_and_extension_is_refused(message, data):
    wire = encode(message)
    cut = data.draw(st.integers(0, len(wire) - 1))
    with pytest.raises(MalformedMessage):
        decode(wire[:cut])
    with pytest.raises(MalformedMessage):
        decode(wire + data.draw(st.binary(min_size=1, max_size=8)))


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=400))
def test_arbitrary_bytes_raise_only_malformed(blob):
    try:
        decode(blob)
    except MalformedMessage:
        pass


@settings(max_examples=300, deadline=None)
@given(messages(), st.data())
def test_corrupted_bytes_decode_or_raise_malformed(message, data):
    wire = bytearray(encode(message))
    for _ in range(data.draw(st.integers(1, 4))):
        i = data.draw(st.integers(0, len(wire) - 1))
        wire[i] ^= data.draw(st.integers(1, 255))
    try:
        decode(bytes(wire))
    except MalformedMessage:
        pass


@settings(max_examples=200, deadline=None)
@given(messages(), st.binary(min_size=HEADER_BYTES, max_size=HEADER_BYTES))
def test_fuzzed_headers_on_valid_bodies(message, header):
    try:
        decode(header + encode(message)[HEADER_BYTES:])
    except MalformedMessage:
        pass


def _header(message, **changes) -> bytes:
    wire = bytearray(encode(message))
    fields = dict(zip(["magic", "version", "type", "flags"], struct.unpack_from("<4sBBH", wire)))
    fields.update(changes)
    struct.pack_into("<4sBBH", wire, 0, fields["magic"], fields["version"], fields["type"], fields["flags"])
    return bytes(wire)


def test_header_checks_say_what_is_wrong():
    m = SurvivorList(session_id=bytes(16), round=1, sender=SERVER, recipient=3, survivors=(1, 2))
    with pytest.raises(MalformedMessage, match="magic"):
        decode(_header(m, magic=b"JUNK"))
    for old in (1, 2, 3, 4, 5, 6):  # the previous wire formats are refused, never misread
        with pytest.raises(UnsupportedVersion, match=f"version {old}; this build speaks 7"):
            decode(_header(m, version=old))
    with pytest.raises(UnsupportedVersion, match="version 8"):
        decode(_header(m, version=8))
    with pytest.raises(MalformedMessage, match="unknown message type 99"):
        decode(_header(m, type=99))
    with pytest.raises(MalformedMessage, match="flags"):
        decode(_header(m, flags=1))
    with pytest.raises(MalformedMessage, match="shorter than"):
        decode(b"SAGG")
    with pytest.raises(MalformedMessage, match="body bytes"):
        decode(encode(m)[:-1])


def test_structural_rules_are_enforced_both_ways():
    env = dict(session_id=bytes(16), round=0, sender=SERVER, recipient=0)
    unsorted = SurvivorList(**env, survivors=(3, 1))
    with pytest.raises(ValueError, match="strictly increasing"):
        encode(unsorted)
    wire = bytearray(encode(SurvivorList(**env, survivors=(1, 3))))
    struct.pack_into("<II", wire, HEADER_BYTES + 4, 3, 3)  # duplicate ids
    with pytest.raises(MalformedMessage, match="strictly increasing"):
        decode(bytes(wire))
    bad_sig = ConsistencySignature(**env, signature=b"short")
    with pytest.raises(ValueError, match="signature"):
        encode(bad_sig)
    with pytest.raises(ValueError, match="session_id has 15 bytes"):
        encode(SurvivorList(**{**env, "session_id": bytes(15)}, survivors=()))
    with pytest.raises(ValueError, match="cannot encode SURVIVOR_LIST"):
        encode(SurvivorList(**env, survivors=(2**32,)))
    with pytest.raises(TypeError, match="not a protocol message"):
        encode("hello")
    huge = bytearray(encode(SurvivorList(**env, survivors=())))
    struct.pack_into("<I", huge, HEADER_BYTES, 2**30)  # a count that cannot fit
    with pytest.raises(MalformedMessage, match="cannot fit"):
        decode(bytes(huge))


def test_masked_vector_decodes_without_copy():
    vec = np.arange(1000, dtype=np.uint32)
    wire = encode(MaskedInput(session_id=bytes(16), round=0, sender=1, recipient=SERVER, vector=vec,
                              self_mask_shares=(), tag=bytes(32), signature=b""))
    got = decode(wire).vector
    assert np.array_equal(got, vec) and not got.flags.writeable and got.base is not None
    # header, share count, tag, signature length, dimension, the vector
    assert len(wire) == HEADER_BYTES + 4 + 32 + 2 + 4 + 4 * vec.size


def test_decode_takes_any_buffer_and_its_vector_is_always_read_only():
    """A bytearray's vector is read-only as documented (not a writable alias of the caller's buffer);
    a non-contiguous memoryview decodes (copied), never a TypeError."""
    vec = np.arange(10, dtype=np.uint32)
    wire = encode(MaskedInput(session_id=bytes(16), round=0, sender=1, recipient=SERVER, vector=vec,
                              self_mask_shares=(), tag=bytes(32), signature=b""))
    got = decode(bytearray(wire)).vector
    assert np.array_equal(got, vec) and not got.flags.writeable
    with pytest.raises(ValueError, match="read-only"):
        got[0] = 1
    strided = memoryview(bytes(b for byte in wire for b in (byte, 0)))[::2]
    assert not strided.contiguous
    assert np.array_equal(decode(strided).vector, vec)
    with pytest.raises(MalformedMessage):
        decode(memoryview(bytes(b for byte in wire[:-1] for b in (byte, 0)))[::2])


def test_a_version_2_unmask_response_is_refused_not_misread():
    """Version 2 carried 16-byte GF(2^128) share values, version 3 20-byte ones, both in the clear;
    versions 4 to 6 carry them sealed to the server. Older bytes must be refused as a whole, by their
    version number, before any field is read — and an old body under a current header is refused
    as malformed, never read as a sealed box."""
    env = dict(session_id=bytes(16), round=3, sender=4, recipient=SERVER)
    for version, width in ((2, 16), (3, SHARE_BYTES)):  # one share value in the clear, as that version sent it
        body = struct.pack("<B", 16) + bytes(16) + struct.pack("<I", 1) + struct.pack("<IB", 1, 0) + bytes(range(width))
        old = struct.pack("<4sBBH16sQIIQ", b"SAGG", version, 9, 0, bytes(16), 3, 4, SERVER, len(body)) + body
        with pytest.raises(UnsupportedVersion, match=f"version {version}; this build speaks 7"):
            decode(old)
        with pytest.raises(MalformedMessage):
            decode(old[:4] + bytes([VERSION]) + old[5:])
    current = UnmaskResponse(**env, sealed=bytes(SEAL_OVERHEAD + 16 + 4 + 4 + 1 + SHARE_BYTES))
    wire = encode(current)
    assert wire[4] == VERSION == 7 and decode(wire) == current
    with pytest.raises(ValueError, match="sealed secrets of 49 bytes"):  # no whole share inside
        encode(UnmaskResponse(**env, sealed=bytes(SEAL_OVERHEAD + 16 + 4 + 1)))


@settings(max_examples=100, deadline=None)
@given(revealed_secrets())
def test_revealed_secrets_round_trip_and_every_truncation_is_refused(secrets):
    """The plaintext sealed inside an unmask response has the decoder's rules too."""
    plain = encode_secrets(secrets)
    assert decode_secrets(plain) == secrets
    for cut in range(len(plain)):
        with pytest.raises(MalformedMessage):
            decode_secrets(plain[:cut])
    with pytest.raises(MalformedMessage):
        decode_secrets(plain + bytes(1))


def test_long_id_lists_round_trip_and_refuse_repeats_at_any_position():
    """The array passes over cohort-sized lists keep every rule the per-entry loop had: order,
    repeats, sizes, types."""
    env = dict(session_id=bytes(16), round=0, sender=SERVER, recipient=0)
    n = 2_000
    commitments = tuple((2 * i, i.to_bytes(32, "little")) for i in range(n))
    m = GraphCommitments(**env, commitments=commitments)
    assert decode(encode(m)) == m
    survivors = SurvivorList(**env, survivors=tuple(range(0, 3 * n, 3)))
    assert decode(encode(survivors)) == survivors
    for at in (1, n // 2, n - 1):
        repeated = commitments[:at] + ((commitments[at - 1][0], bytes(32)),) + commitments[at + 1 :]
        with pytest.raises(ValueError, match="strictly increasing"):
            encode(replace(m, commitments=repeated))
        wire = bytearray(encode(m))
        struct.pack_into("<I", wire, HEADER_BYTES + 4 + 36 * at, commitments[at - 1][0])
        with pytest.raises(MalformedMessage, match="strictly increasing"):
            decode(bytes(wire))
    with pytest.raises(ValueError, match="has 31 bytes"):
        encode(replace(m, commitments=commitments[:-1] + ((commitments[-1][0], bytes(31)),)))
    with pytest.raises(ValueError, match="must be an int"):
        encode(replace(m, commitments=commitments[:-1] + ((True, bytes(32)),)))
    with pytest.raises(ValueError, match="outside"):
        encode(replace(survivors, survivors=survivors.survivors[:-1] + (2**32,)))
