"""Every key, commitment, tag and signed payload of the protocol, derived in one place.

Client and server must derive bit-identical values; keeping each derivation here, bound to the
session (id, round, config digest) and to the parties' ids, makes that hard to get wrong.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Iterable, Sequence

import numpy as np
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from ..crypto import MAC_BYTES, SEAL_OVERHEAD, agree, commit, hkdf, x25519_from_seed
from ..prg import MASK_KEY_BYTES
from .messages import SealedShare, ShareKind
from .session import SessionConfig

SHARE_CHANNEL_KEY_BYTES = 32
SHARE_PLAINTEXT = struct.Struct("<III16s")  # inside a sealed share: owner, holder, share index, share value
SEALED_SHARE_BYTES = SHARE_PLAINTEXT.size + SEAL_OVERHEAD


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


# ---- the neighbour graph ------------------------------------------------------------------------


def graph_commitment(config: SessionConfig, client: int, nonce: bytes) -> bytes:
    """Commitment to client's graph nonce, sent (signed, if authenticated) in its key advertisement."""
    return commit(config.binding("graph-nonce", client, nonce))


def graph_seed(config: SessionConfig, nonces: Sequence[tuple[int, bytes]]) -> bytes:
    """The round's graph seed: a hash of every (client, nonce) revealed, in client order."""
    return hashlib.sha256(config.binding("graph-seed", *(part for pair in nonces for part in pair))).digest()


# ---- sealed shares ------------------------------------------------------------------------------


def share_channel_key(
    config: SessionConfig, sender: int, recipient: int, private: X25519PrivateKey, peer_public: bytes
) -> bytes:
    """AES-256-GCM key for shares sealed by ``sender`` for ``recipient`` (one key per direction)."""
    return agree(private, peer_public, config.binding("share-channel", sender, recipient), SHARE_CHANNEL_KEY_BYTES)


def share_aad(config: SessionConfig, seed: bytes, kind: ShareKind, sender: int, recipient: int) -> bytes:
    """Associated data of a sealed share: the graph seed and the kind, so that a key-seed share
    never opens as a self-mask share (or under another graph)."""
    return config.binding("share-aad", seed, int(kind), sender, recipient)


# ---- signed and tagged payloads -----------------------------------------------------------------


def advertise_payload(
    config: SessionConfig, client: int, enc_public: bytes, mask_public: bytes, commitment: bytes,
    graph_commitment: bytes, model_hash: bytes,
) -> bytes:
    """What a client signs in authenticated mode when it advertises its keys."""
    return config.binding("advertise", client, enc_public, mask_public, commitment, graph_commitment, model_hash)


def consistency_payload(config: SessionConfig, seed: bytes, survivors: tuple[int, ...]) -> bytes:
    """What a client signs in the consistency check: the graph it used and the survivor set it was shown."""
    return config.binding("consistency", seed, *survivors)


def masked_input_payload(
    config: SessionConfig, client: int, seed: bytes, vector: np.ndarray, shares: Iterable[SealedShare]
) -> bytes:
    """What binds a masked input to its sender: session, round, config, graph, SHA-256 of the vector
    and of the sealed self-mask shares that travel with it."""
    vector_hash = hashlib.sha256(memoryview(np.ascontiguousarray(vector, dtype="<u4")).cast("B")).digest()
    shares_hash = hashlib.sha256(b"".join(
        s.peer.to_bytes(4, "little") + len(s.ciphertext).to_bytes(2, "little") + s.ciphertext for s in shares
    )).digest()
    return config.binding("masked-input", client, seed, vector_hash, shares_hash)


def input_tag_key(config: SessionConfig, client: int, self_mask_seed: bytes) -> bytes:
    """HMAC key of client's masked-input tag, from its self-mask seed b_u: secret until the server
    learns b_u while unmasking, so the server cannot make a tag for an input the client did not send."""
    return hkdf(self_mask_seed, config.binding("input-tag", client), MAC_BYTES)


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
