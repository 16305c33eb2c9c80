"""Every key, commitment and signed payload of the protocol, derived in one place.

Client and server must derive bit-identical values; keeping each derivation here, bound to the
session (id, round, config digest) and to the parties' ids, makes that hard to get wrong.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

import numpy as np
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from ..crypto import agree, commit, hkdf, x25519_from_seed
from ..prg import MASK_KEY_BYTES
from .session import SessionConfig

SHARE_CHANNEL_KEY_BYTES = 32


def self_mask_key(config: SessionConfig, client: int, seed: bytes) -> bytes:
    """AES key of client's self mask, expanded from its secret-shared 16-byte seed b_u."""
    return hkdf(seed, config.binding("self-mask", client), MASK_KEY_BYTES)


def self_mask_commitment(config: SessionConfig, client: int, seed: bytes) -> bytes:
    return commit(config.binding("self-mask-commitment", client, seed))


def mask_private_key(config: SessionConfig, client: int, seed: bytes) -> X25519PrivateKey:
    """Client's key-agreement key for pairwise masks, from its secret-shared 16-byte seed."""
    return x25519_from_seed(seed, config.binding("mask-key", client))


def pairwise_mask_key(
    config: SessionConfig, a: int, b: int, private: X25519PrivateKey, peer_public: bytes
) -> bytes:
    """AES key of the mask shared by clients a and b (symmetric in a, b)."""
    lo, hi = min(a, b), max(a, b)
    return agree(private, peer_public, config.binding("pairwise-mask", lo, hi), MASK_KEY_BYTES)


def pairwise_sign(owner: int, peer: int) -> int:
    """+1 if ``owner`` adds the pair's mask, −1 if it subtracts it; opposite for the two ends."""
    return 1 if owner < peer else -1


def share_channel_key(
    config: SessionConfig, sender: int, recipient: int, private: X25519PrivateKey, peer_public: bytes
) -> bytes:
    """AES-256-GCM key for shares sealed by ``sender`` for ``recipient`` (one key per direction)."""
    return agree(private, peer_public, config.binding("share-channel", sender, recipient), SHARE_CHANNEL_KEY_BYTES)


def share_aad(config: SessionConfig, sender: int, recipient: int) -> bytes:
    return config.binding("share-aad", sender, recipient)


def advertise_payload(
    config: SessionConfig, client: int, enc_public: bytes, mask_public: bytes, commitment: bytes, model_hash: bytes
) -> bytes:
    """What a client signs in authenticated mode when it advertises its keys."""
    return config.binding("advertise", client, enc_public, mask_public, commitment, model_hash)


def consistency_payload(config: SessionConfig, survivors: tuple[int, ...]) -> bytes:
    """What a client signs in the consistency check: the survivor set it was shown."""
    return config.binding("consistency", *survivors)


def model_digest(arrays: Iterable[np.ndarray]) -> bytes:
    """SHA-256 of the global model a client trained on: dtype, shape and bytes of each array, in order.

    Pass the result as ``model_hash``; clients then refuse to reveal shares to a neighbour that
    trained on a different model (the model-inconsistency attack on secure aggregation).
    """
    h = hashlib.sha256(b"secfed/secagg/v1/model\x00")
    for a in arrays:
        a = np.ascontiguousarray(a)
        header = f"{a.dtype.str}|{','.join(map(str, a.shape))}|".encode()
        h.update(len(header).to_bytes(4, "little") + header)
        h.update(memoryview(a).cast("B"))
    return h.digest()
