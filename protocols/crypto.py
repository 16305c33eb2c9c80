"""Small typed crypto primitives behind the protocol, all from ``cryptography`` but BLAKE3 (``blake3``).

* :func:`transcript` — the one unambiguous encoding of everything that gets hashed, signed,
  derived from or authenticated: a domain label plus length-prefixed parts. Session id, round and
  party ids are always among the parts, so nothing from one session, round or pair of parties
  is valid in another.
* X25519 agreement + HKDF-SHA256 (:func:`agree`), Ed25519 signatures (:func:`sign`/:func:`verify`,
  and :func:`verify_all` for a batch, on every core), AES-256-GCM sealing (:func:`seal`/
  :func:`open_sealed`), SHA-256 commitments (:func:`commit`), HMAC-SHA256 tags (:func:`mac`/
  :func:`mac_matches`).
* :func:`vector_digest` — BLAKE3 (the ``blake3`` package: a binding of the reference
  implementation) of a ring vector as a two-level hash: one BLAKE3 per leaf of
  ``VECTOR_LEAF_WORDS`` words, then one over a domain label, the vector's length and the leaf
  digests. Collision resistant whenever BLAKE3 is (a collision of the top hash is one of the
  leaf-digest lists, so of some leaf), and the leaves can be hashed in parallel, each while the
  pass that writes it still has it in cache (see :mod:`.prg`). BLAKE3 rather than SHA-256 because
  every byte of every masked input is hashed twice (client and server) and no keystream amortises
  that pass: on the dev VM (AVX-512, no SHA extensions) hashing 4 MB on one core costs as much as
  5.4 AES-CTR streams of it with SHA-256, 1.4 with BLAKE3 (bench/bench_secagg.py
  ``--sections keystream`` prints the digest's cost).
"""

from __future__ import annotations

import hashlib
import os
import struct
from collections.abc import Callable, Iterable, Sequence

import numpy as np
from blake3 import blake3
from cryptography.exceptions import InvalidSignature, InvalidTag
from cryptography.hazmat.primitives import hashes, hmac
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from . import parallel
from .errors import DecryptionFailed, SignatureInvalid

DOMAIN = b"secfed/secagg/v4/"
PUBLIC_KEY_BYTES = 32
SIGNATURE_BYTES = 64
DIGEST_BYTES = 32
MAC_BYTES = 32
NONCE_BYTES = 12
TAG_BYTES = 16
SEAL_OVERHEAD = NONCE_BYTES + TAG_BYTES
VECTOR_LEAF_WORDS = 1 << 16  # 256 KiB of little-endian uint32 words per leaf hash
_VERIFY_BATCH = 64  # signatures per job when verifying many: amortises the thread hand-off

Part = bytes | int
_INT_PART = struct.Struct("<cQ")
_BYTES_PART = struct.Struct("<cI")


def transcript(label: str, *parts: Part) -> bytes:
    """Encode ``label`` and ``parts`` injectively: ints as 8-byte little-endian, bytes length-prefixed.

    Injectivity is what makes binding work: two different (label, parts) tuples never produce the
    same bytes, so a signature, key or tag made for one context is useless in any other.
    """
    return DOMAIN + label.encode("ascii") + b"\x00" + encode_parts(parts)


def encode_parts(parts: Sequence[Part]) -> bytes:
    """The bytes :func:`transcript` appends for ``parts`` after its label (so a fixed prefix can be
    encoded once: ``transcript(label, *a, *b) == transcript(label, *a) + encode_parts(b)``)."""
    out = []
    for part in parts:
        if isinstance(part, int):
            if not 0 <= part < 1 << 64:
                raise ValueError(f"transcript integer {part} is outside [0, 2^64)")
            out.append(_INT_PART.pack(b"i", part))
        else:
            out.append(_BYTES_PART.pack(b"b", len(part)))
            out.append(part)
    return b"".join(out)


def encode_ints(values: Sequence[int]) -> bytes:
    """The bytes :func:`transcript` appends for ``values`` as int parts, built in one numpy pass
    (``transcript(label, *ints) == transcript(label) + encode_ints(ints)``): for id lists as long
    as a whole cohort."""
    out = np.empty(len(values), dtype=[("kind", "S1"), ("value", "<u8")])
    out["kind"] = b"i"
    try:
        out["value"] = np.asarray(values, dtype=np.uint64)
    except OverflowError:
        raise ValueError("a transcript integer is outside [0, 2^64)") from None
    return out.tobytes()


def hkdf(secret: bytes, info: bytes, length: int) -> bytes:
    """HKDF-SHA256 (RFC 5869) with an all-zero salt; ``info`` carries the binding."""
    return HKDF(algorithm=hashes.SHA256(), length=length, salt=None, info=info).derive(secret)


def x25519_keypair() -> tuple[X25519PrivateKey, bytes]:
    """A fresh X25519 key pair from the OS; the public key as its 32 raw bytes."""
    private = X25519PrivateKey.generate()
    return private, public_bytes(private)


def x25519_from_seed(seed: bytes, info: bytes) -> X25519PrivateKey:
    """The X25519 key a 16-byte seed stands for.

    The protocol secret-shares this seed rather than the 32-byte key so one Shamir block
    suffices; the seed carries 128 bits, the security level of X25519 itself.
    """
    return X25519PrivateKey.from_private_bytes(hkdf(seed, info, 32))


def public_bytes(private: X25519PrivateKey) -> bytes:
    return private.public_key().public_bytes_raw()


def agree(private: X25519PrivateKey, peer_public: bytes, info: bytes, length: int) -> bytes:
    """X25519 with ``peer_public``, then HKDF-SHA256 bound to ``info`` (session, round, both ids).

    Raises :class:`DecryptionFailed` for a peer key that yields the all-zero shared secret
    (a low-order point): such a key would make the derived key predictable.
    """
    return agree_many(private, peer_public, [info], length)[0]


def agree_many(private: X25519PrivateKey, peer_public: bytes, infos: Sequence[bytes], length: int) -> list[bytes]:
    """One X25519 exchange, one HKDF-SHA256 key per ``info`` (as :func:`agree` for each)."""
    try:
        shared = private.exchange(X25519PublicKey.from_public_bytes(peer_public))
    except ValueError as exc:  # cryptography refuses all-zero shared secrets
        raise DecryptionFailed(f"peer public key is degenerate: {exc}") from None
    return [hkdf(shared, info, length) for info in infos]


def seal(key: bytes, plaintext: bytes, aad: bytes) -> bytes:
    """AES-256-GCM with a random 96-bit nonce; returns ``nonce || ciphertext || tag``."""
    nonce = os.urandom(NONCE_BYTES)
    return nonce + AESGCM(key).encrypt(nonce, plaintext, aad)


def open_sealed(key: bytes, sealed: bytes, aad: bytes) -> bytes:
    """Inverse of :func:`seal`; a tampered ciphertext, wrong key or wrong ``aad`` raises DecryptionFailed."""
    if len(sealed) < SEAL_OVERHEAD:
        raise DecryptionFailed(f"sealed box of {len(sealed)} bytes is shorter than nonce + tag")
    try:
        return AESGCM(key).decrypt(sealed[:NONCE_BYTES], sealed[NONCE_BYTES:], aad)
    except InvalidTag:
        raise DecryptionFailed("sealed box does not authenticate (tampered, or wrong key/binding)") from None


def sign(identity: Ed25519PrivateKey, payload: bytes) -> bytes:
    return identity.sign(payload)


def verify(identity_public: bytes, signature: bytes, payload: bytes, *, who: str) -> None:
    """Verify an Ed25519 signature; raise :class:`SignatureInvalid` naming ``who`` signed it."""
    try:
        Ed25519PublicKey.from_public_bytes(identity_public).verify(signature, payload)
    except (InvalidSignature, ValueError):
        raise SignatureInvalid(f"signature of {who} does not verify") from None


def verify_all(
    items: Sequence[tuple[bytes, bytes]], payload: bytes, *, who: Callable[[int], str]
) -> None:
    """Verify many Ed25519 signatures on one ``payload``: ``items[i]`` is (public key, signature).

    Batches run on every core (verification releases the GIL). Raises :class:`SignatureInvalid`
    for the first item, in order, that does not verify, naming it with ``who(i)``.
    """

    def batch(lo: int, hi: int) -> int | None:
        for i in range(lo, hi):
            public, signature = items[i]
            try:
                Ed25519PublicKey.from_public_bytes(public).verify(signature, payload)
            except (InvalidSignature, ValueError):
                return i
        return None

    size = max(_VERIFY_BATCH, -(-len(items) // parallel.workers()))
    jobs = [lambda lo=lo: batch(lo, min(lo + size, len(items))) for lo in range(0, len(items), size)]
    failures = [i for i in parallel.run_all(jobs) if i is not None]
    if failures:
        raise SignatureInvalid(f"signature of {who(failures[0])} does not verify")


def vector_digest(words: np.ndarray) -> bytes:
    """Two-level BLAKE3 digest of a 1-D uint32 ring vector (little-endian words), leaf by leaf;
    the leaves are hashed on every core (:mod:`.parallel`), whole leaves per thread."""
    words = np.ascontiguousarray(words, dtype="<u4")

    def hash_range(lo: int, hi: int) -> list[bytes]:
        return [leaf_digest(words[at : min(at + VECTOR_LEAF_WORDS, hi)]) for at in range(lo, hi, VECTOR_LEAF_WORDS)]

    parts = parallel.run_all([lambda lo=lo, hi=hi: hash_range(lo, hi)
                              for lo, hi in parallel.ranges(words.size, VECTOR_LEAF_WORDS)])
    return digest_of_leaves(words.size, (leaf for part in parts for leaf in part))


def leaf_hasher() -> blake3:
    """A fresh hasher for one leaf, fed chunk by chunk by the passes that write the vector
    (:mod:`.prg`); its ``digest()`` equals :func:`leaf_digest` of the bytes fed."""
    return blake3()


def leaf_digest(words: np.ndarray) -> bytes:
    """BLAKE3 (32 bytes) of one leaf (at most ``VECTOR_LEAF_WORDS`` contiguous little-endian uint32 words)."""
    return blake3(memoryview(words).cast("B")).digest()


def digest_of_leaves(count: int, leaves: Iterable[bytes]) -> bytes:
    """The top hash of :func:`vector_digest`: BLAKE3 of the domain label, the vector's length, then
    its leaf digests in order (all 32 bytes, so the list parses one way)."""
    top = blake3(DOMAIN + b"vector\x00" + count.to_bytes(8, "little"))
    for leaf in leaves:
        top.update(leaf)
    return top.digest()


def commit(payload: bytes) -> bytes:
    """SHA-256 commitment; the committed secrets are 128-bit random, so hiding holds."""
    return hashlib.sha256(payload).digest()


def mac(key: bytes, payload: bytes) -> bytes:
    """HMAC-SHA256 of ``payload`` under ``key``."""
    h = hmac.HMAC(key, hashes.SHA256())
    h.update(payload)
    return h.finalize()


def mac_matches(key: bytes, tag: bytes, payload: bytes) -> bool:
    """Whether ``tag`` is the HMAC-SHA256 of ``payload`` under ``key`` (constant-time comparison)."""
    h = hmac.HMAC(key, hashes.SHA256())
    h.update(payload)
    try:
        h.verify(tag)
    except InvalidSignature:
        return False
    return True
