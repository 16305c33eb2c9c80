"""Known-answer and tamper tests for the crypto primitives (secfed.protocols.crypto)."""

from __future__ import annotations

import hashlib
import hmac

import numpy as np
import pytest
from blake3 import blake3
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from secfed.protocols.crypto import (
    DOMAIN,
    VECTOR_LEAF_WORDS,
    agree,
    encode_ints,
    hkdf,
    leaf_digest,
    mac,
    mac_matches,
    open_sealed,
    public_bytes,
    seal,
    sign,
    transcript,
    vector_digest,
    verify,
    verify_all,
)
from secfed.protocols.errors import DecryptionFailed, SignatureInvalid

# RFC 7748 §6.1: Alice's private key, Bob's public key and their shared secret.
ALICE = bytes.fromhex("77076d0a7318a57d3c16c17251b26645df4c2f87ebc0992ab177fba51db92c2a")
BOB_PUBLIC = bytes.fromhex("de9edb7d7b7dc1b4d35b61c2ece435373f8343c85b78674dadfc7e146f882b4f")
SHARED = bytes.fromhex("4a5d9d5ba4ce2de1728e3bf480350f25e07e21c947d19e3376f09b3c1e161742")
# BLAKE3 reference test vectors (BLAKE3-team/BLAKE3, test_vectors/test_vectors.json, "hash", first 32
# bytes): the input is bytes 0, 1, ..., 250 repeated, of the given length.
BLAKE3_KAT = {
    1024: bytes.fromhex("42214739f095a406f3fc83deb889744ac00df831c10daa55189b5d121c855af7"),
    4096: bytes.fromhex("015094013f57a5277b59d8475c0501042c0b642e531b0a1c8f58d2163229e969"),
}


def reference_hkdf(ikm: bytes, info: bytes, length: int) -> bytes:
    """RFC 5869 written out with hmac, independent of `cryptography`."""
    prk = hmac.new(bytes(32), ikm, hashlib.sha256).digest()
    okm, block, counter = b"", b"", 1
    while len(okm) < length:
        block = hmac.new(prk, block + info + bytes([counter]), hashlib.sha256).digest()
        okm += block
        counter += 1
    return okm[:length]


def test_hkdf_matches_rfc5869_test_case_3():
    okm = hkdf(bytes([0x0B]) * 22, b"", 42)
    assert okm.hex() == (
        "8da4e775a563c18f715f802a063c5a31b8a11f5c5ee1879ec3454e5f3c738d2d9d201395faa4b61a96c8"
    )


def test_agree_is_x25519_then_hkdf_bound_to_info():
    info = transcript("pairwise-mask", b"session", 3, 1, 2)
    key = agree(X25519PrivateKey.from_private_bytes(ALICE), BOB_PUBLIC, info, 16)
    assert key == reference_hkdf(SHARED, info, 16)
    other = agree(X25519PrivateKey.from_private_bytes(ALICE), BOB_PUBLIC, transcript("pairwise-mask", b"session", 4, 1, 2), 16)
    assert other != key  # another round derives another key


def test_agree_is_symmetric():
    a, b = X25519PrivateKey.generate(), X25519PrivateKey.generate()
    info = transcript("x", 1)
    assert agree(a, public_bytes(b), info, 32) == agree(b, public_bytes(a), info, 32)


def test_agree_refuses_a_low_order_public_key():
    with pytest.raises(DecryptionFailed, match="degenerate"):
        agree(X25519PrivateKey.generate(), bytes(32), b"info", 16)


def test_transcript_is_injective_on_part_boundaries():
    assert transcript("l", b"ab", b"c") != transcript("l", b"a", b"bc")
    assert transcript("l", 1) != transcript("l", b"\x01" + bytes(7))
    assert transcript("l1", b"") != transcript("l", b"1")
    assert transcript("label", 5).startswith(b"secfed/secagg/v4/label\x00")
    with pytest.raises(ValueError, match="outside"):
        transcript("l", -1)


def test_seal_roundtrip_and_every_tamper_is_detected():
    key, aad = bytes(range(32)), b"context"
    sealed = seal(key, b"secret share", aad)
    assert open_sealed(key, sealed, aad) == b"secret share"
    assert seal(key, b"secret share", aad) != sealed  # fresh nonce each time
    for i in range(len(sealed)):
        flipped = bytearray(sealed)
        flipped[i] ^= 0x01
        with pytest.raises(DecryptionFailed):
            open_sealed(key, bytes(flipped), aad)
    with pytest.raises(DecryptionFailed):
        open_sealed(key, sealed, b"other context")
    with pytest.raises(DecryptionFailed):
        open_sealed(bytes(32), sealed, aad)
    with pytest.raises(DecryptionFailed, match="shorter"):
        open_sealed(key, sealed[:20], aad)


def test_signature_binds_payload_and_signer():
    alice, mallory = Ed25519PrivateKey.generate(), Ed25519PrivateKey.generate()
    alice_public = alice.public_key().public_bytes_raw()
    signature = sign(alice, b"payload")
    verify(alice_public, signature, b"payload", who="alice")
    with pytest.raises(SignatureInvalid, match="alice"):
        verify(alice_public, signature, b"payload!", who="alice")
    with pytest.raises(SignatureInvalid):
        verify(alice_public, sign(mallory, b"payload"), b"payload", who="alice")


def test_mac_is_hmac_sha256_rfc4231_case_2_and_detects_any_change():
    tag = mac(b"Jefe", b"what do ya want for nothing?")
    assert tag.hex() == "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
    assert mac_matches(b"Jefe", tag, b"what do ya want for nothing?")
    assert not mac_matches(b"Jefe", tag, b"what do ya want for nothing!")
    assert not mac_matches(b"Jeff", tag, b"what do ya want for nothing?")
    assert not mac_matches(b"Jefe", tag[:-1] + bytes([tag[-1] ^ 1]), b"what do ya want for nothing?")


def test_encode_ints_is_what_transcript_appends_for_int_parts():
    ids = (0, 1, 7, 2**32 - 1, 2**63)
    assert transcript("x", b"s", *ids) == transcript("x", b"s") + encode_ints(ids)
    assert encode_ints(()) == b""
    with pytest.raises(ValueError, match="outside"):
        encode_ints((1, -1))


def test_leaf_digest_is_blake3_on_the_reference_test_vectors():
    """The leaf hash is the reference BLAKE3 (its published vectors), on the words' little-endian bytes."""
    for length, expected in BLAKE3_KAT.items():
        words = np.frombuffer(bytes(i % 251 for i in range(length)), dtype="<u4")
        assert leaf_digest(words) == expected
        top = DOMAIN + b"vector\x00" + words.size.to_bytes(8, "little") + expected
        assert vector_digest(words) == blake3(top).digest()


def test_vector_digest_is_blake3_over_the_length_and_each_leafs_blake3():
    """Written out with the blake3 package: leaves of 2^16 little-endian words, then one hash over
    the domain, the length and the leaf digests; the last leaf may be short."""
    words = np.arange(2 * VECTOR_LEAF_WORDS + 5, dtype=np.uint32) * np.uint32(2654435761)
    raw = words.astype("<u4").tobytes()
    leaves = [blake3(raw[i : i + 4 * VECTOR_LEAF_WORDS]).digest() for i in range(0, len(raw), 4 * VECTOR_LEAF_WORDS)]
    expected = blake3(DOMAIN + b"vector\x00" + words.size.to_bytes(8, "little") + b"".join(leaves)).digest()
    assert len(leaves) == 3 and vector_digest(words) == expected
    changed = words.copy()
    changed[-1] ^= 1
    assert vector_digest(changed) != expected
    assert vector_digest(words[:-1]) != vector_digest(words)  # the length is bound too
    assert vector_digest(words) != blake3(raw).digest()  # domain-separated from a plain hash of the bytes


def test_verify_all_checks_every_signature_and_names_the_first_bad_one():
    payload = b"survivors"
    keys = [Ed25519PrivateKey.generate() for _ in range(150)]
    items = [(k.public_key().public_bytes_raw(), k.sign(payload)) for k in keys]
    verify_all(items, payload, who=lambda i: f"client {i}")
    for bad in (0, 70, 149):  # in the first, a middle and the last batch
        tampered = list(items)
        tampered[bad] = (items[bad][0], items[(bad + 1) % 150][1])
        with pytest.raises(SignatureInvalid, match=f"client {bad}'s|client {bad} "):
            verify_all(tampered, payload, who=lambda i: f"client {i}")
    two_bad = list(items)
    two_bad[90], two_bad[20] = (items[90][0], bytes(64)), (items[20][0], bytes(64))
    with pytest.raises(SignatureInvalid, match="client 20 "):
        verify_all(two_bad, payload, who=lambda i: f"client {i}")
