"""Every key, commitment, tag and signed payload of the protocol, derived in one place.

Client and server must derive bit-identical values; keeping each derivation here, bound to the
session (id, round, config digest) and to the parties' ids, makes that hard to get wrong.
"""

from __future__ import annotations

import hashlib
import itertools
import struct
from collections.abc import Iterable, Sequence

import numpy as np
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from ..crypto import (
    DIGEST_BYTES,
    MAC_BYTES,
    SEAL_OVERHEAD,
    agree,
    agree_many,
    commit,
    encode_ints,
    hkdf,
    open_sealed,
    seal,
    x25519_from_seed,
)
from ..errors import InconsistentShares
from ..prg import MASK_KEY_BYTES
from ..shamir import SHARE_BYTES
from .idtable import IdTable
from .messages import GRAPH_NONCE_BYTES, RevealedSecrets, SealedShare, ShareKind, decode_secrets, encode_secrets
from .session import SessionConfig

SHARE_CHANNEL_KEY_BYTES = 32
# inside a sealed self-mask share: owner, holder, share index, share value
SHARE_PLAINTEXT = struct.Struct(f"<III{SHARE_BYTES}s")
SEALED_SHARE_BYTES = SHARE_PLAINTEXT.size + SEAL_OVERHEAD
# inside a sealed key-seed share: the same, then the digest of the model the owner trains on (its
# holder refuses it unless that is its own: the model binding, checked before anything is masked)
KEY_SHARE_PLAINTEXT = struct.Struct(f"<III{SHARE_BYTES}s{DIGEST_BYTES}s")
SEALED_KEY_SHARE_BYTES = KEY_SHARE_PLAINTEXT.size + SEAL_OVERHEAD
# transcript() encoding of an (int, 16-byte nonce) pair of parts, one entry of _id_nonce_parts
_ID_NONCE_PARTS = struct.Struct(f"{1 + 8 + 1 + 4 + GRAPH_NONCE_BYTES}s")


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


def graph_commitments(config: SessionConfig, nonces: IdTable) -> list[bytes]:
    """:func:`graph_commitment` of every (client, nonce) in ``nonces``: the shared hash prefix is
    absorbed once, the parts of all entries are laid out by one numpy pass, and the loop runs in C."""
    prefix = hashlib.sha256(config.binding("graph-nonce"))

    def commitment(parts: tuple[bytes], copy=prefix.copy) -> bytes:
        h = copy()
        h.update(parts[0])
        return h.digest()

    return list(map(commitment, _ID_NONCE_PARTS.iter_unpack(_id_nonce_parts(nonces))))


def graph_seed(config: SessionConfig, nonces: IdTable) -> bytes:
    """The round's graph seed: a hash of every (client, nonce) revealed, in client order."""
    return hashlib.sha256(config.binding("graph-seed") + _id_nonce_parts(nonces)).digest()


def complete_graph_seed(config: SessionConfig, members: Iterable[tuple[int, bytes, bytes]]) -> bytes:
    """The complete graph's seed: a hash of the key roster as shown — every member's id and its two
    advertised public keys (encryption, mask), in client order.

    The complete graph does not depend on a seed, so no nonce is committed to or revealed (one
    round trip fewer). What the seed still does is bind each client's view of who shares keys into
    its masked input and its consistency signature: a server that shows two clients different
    rosters gets two seeds, and their signatures do not certify each other's survivor set. The keys
    are fresh in every run, so the seed is too: a server that runs one session config twice cannot
    present one run's consistency signatures in the other (with ids alone it could, and with no
    colluder recover an input).
    """
    parts = sorted((int(client), bytes(enc), bytes(mask)) for client, enc, mask in members)
    return hashlib.sha256(config.binding("complete-graph-seed", *itertools.chain.from_iterable(parts))).digest()


def _id_nonce_parts(nonces: IdTable) -> bytes:
    """transcript()'s bytes for the parts (client, nonce) of every entry, concatenated."""
    if nonces.width != GRAPH_NONCE_BYTES:
        raise ValueError(f"graph nonces must be {GRAPH_NONCE_BYTES} bytes, got {nonces.width}")
    out = np.empty(len(nonces), dtype=[("int", "S1"), ("client", "<u8"), ("bytes", "S1"), ("length", "<u4"),
                                       ("nonce", f"V{GRAPH_NONCE_BYTES}")])
    out["int"], out["client"], out["bytes"], out["length"] = b"i", nonces.ids, b"b", GRAPH_NONCE_BYTES
    out["nonce"] = nonces.values
    return out.tobytes()


class ListedCommitments:
    """The graph-nonce commitments one client was shown, kept until the nonces are revealed (sparse
    graphs only: the complete graph needs no nonces, see :func:`complete_graph_seed`).

    Every listed client must reveal, so the listed ids and one SHA-256 of the whole list are
    enough: the revealed nonces must hash to exactly that list (4 bytes per client kept instead of
    36 — a client of a 10,000-cohort keeps 40 kB).
    """

    def __init__(self, listed: IdTable) -> None:
        self.ids = listed.ids.astype(np.int64)  # a copy: the list's bytes are not kept
        self._digest = hashlib.sha256(listed.raw).digest()

    @property
    def digest(self) -> bytes:
        """SHA-256 of the list's bytes as shown (what the revealed nonces must rebuild)."""
        return self._digest

    @classmethod
    def restore(cls, ids: np.ndarray, digest: bytes) -> ListedCommitments:
        """The list a client kept, from its parts (a client's saved state)."""
        listed = cls.__new__(cls)
        listed.ids = np.asarray(ids, dtype=np.int64)
        listed._digest = bytes(digest)
        return listed

    def check(self, config: SessionConfig, nonces: IdTable) -> None:
        """Raise InconsistentShares unless the revealed nonces open exactly the listed commitments
        (check the ids first)."""
        computed = graph_commitments(config, nonces)
        shown = np.empty(len(nonces), dtype=[("client", "<u4"), ("commitment", f"V{DIGEST_BYTES}")])
        shown["client"], shown["commitment"] = nonces.ids, np.frombuffer(b"".join(computed), f"V{DIGEST_BYTES}")
        if hashlib.sha256(shown.tobytes()).digest() != self._digest:  # the list rebuilt from the nonces
            raise InconsistentShares(
                "the revealed graph nonces do not match the commitments listed before the reveal "
                "(some client's graph nonce was altered)"
            )


# ---- sealed shares ------------------------------------------------------------------------------


def share_channel_keys(
    config: SessionConfig, me: int, peer: int, private: X25519PrivateKey, peer_public: bytes
) -> tuple[bytes, bytes]:
    """AES-256-GCM keys for shares sealed ``me`` → ``peer`` and ``peer`` → ``me`` (one key per
    direction, both from one X25519 exchange)."""
    out = agree_many(
        private, peer_public,
        [config.binding("share-channel", me, peer), config.binding("share-channel", peer, me)],
        SHARE_CHANNEL_KEY_BYTES,
    )
    return out[0], out[1]


def share_aad(config: SessionConfig, seed: bytes, kind: ShareKind, sender: int, recipient: int) -> bytes:
    """Associated data of a sealed share: the graph seed and the kind, so that a key-seed share
    never opens as a self-mask share (or under another graph)."""
    return config.binding("share-aad", seed, int(kind), sender, recipient)


# ---- unmask responses, sealed to the server ------------------------------------------------------

RESPONSE_KEY_BYTES = 32


def response_key(config: SessionConfig, client: int, private: X25519PrivateKey, peer_public: bytes) -> bytes:
    """AES-256-GCM key of client's unmask response: X25519 between the client's round encryption
    key (advertised, signed when authenticated) and the session's server key, HKDF-bound to the
    session, round, config digest and the client. Either end computes it: the client with its
    private key and the server's public one, the server with its private key and the client's."""
    return agree(private, peer_public, config.binding("unmask-response", client), RESPONSE_KEY_BYTES)


def response_aad(config: SessionConfig, client: int) -> bytes:
    """Associated data of client's sealed unmask response (the key is bound the same way)."""
    return config.binding("unmask-response-aad", client)


def seal_secrets(config: SessionConfig, client: int, key: bytes, secrets: RevealedSecrets) -> bytes:
    """What ``client`` reveals in its unmask response, sealed under :func:`response_key`."""
    return seal(key, encode_secrets(secrets), response_aad(config, client))


def open_secrets(config: SessionConfig, client: int, key: bytes, sealed: bytes) -> RevealedSecrets:
    """Inverse of :func:`seal_secrets`: DecryptionFailed when it does not authenticate (another key,
    client, session or round, or tampered), MalformedMessage when its plaintext is not well formed."""
    return decode_secrets(open_sealed(key, sealed, response_aad(config, client)))


# ---- signed and tagged payloads -----------------------------------------------------------------


def advertise_payload(
    config: SessionConfig, client: int, enc_public: bytes, mask_public: bytes, commitment: bytes,
    graph_commitment: bytes,
) -> bytes:
    """What a client signs in authenticated mode when it advertises its keys. No model digest: the
    advertisement may go out before the model is known (the next round's, pipelined into this
    round's unmask); the digest travels sealed in the key-seed shares instead (:data:`KEY_SHARE_PLAINTEXT`)."""
    return config.binding("advertise", client, enc_public, mask_public, commitment, graph_commitment)


def consistency_payload(config: SessionConfig, seed: bytes, survivors: Sequence[int]) -> bytes:
    """What a client signs in the consistency check: the graph it used and the survivor set it was shown."""
    return config.binding("consistency", seed) + encode_ints(survivors)


def masked_input_payload(
    config: SessionConfig, client: int, seed: bytes, vector_digest: bytes, shares: Iterable[SealedShare]
) -> bytes:
    """What binds a masked input to its sender: session, round, config, graph, the vector's digest
    (:func:`~..crypto.vector_digest`, computed while masking and while summing on arrival) and a
    SHA-256 of the sealed self-mask shares that travel with it."""
    return config.binding("masked-input", client, seed, vector_digest, _shares_hash(shares))


def key_shares_payload(config: SessionConfig, client: int, shares: Iterable[SealedShare]) -> bytes:
    """What an authenticated client signs for its key-share message: session, round, config and a
    SHA-256 of the sealed key-seed shares. The server cannot open the shares, so without the
    signature a copy altered in transit would be accepted, the genuine one refused as a replay, and
    the altered share would abort the neighbour it is sealed for."""
    return config.binding("key-shares", client, _shares_hash(shares))


def _shares_hash(shares: Iterable[SealedShare]) -> bytes:
    """SHA-256 of sealed shares as (peer, length, ciphertext) records: what a binding says about them."""
    return hashlib.sha256(b"".join(
        s.peer.to_bytes(4, "little") + len(s.ciphertext).to_bytes(2, "little") + s.ciphertext for s in shares
    )).digest()


def masked_input_signed(payload: bytes, tag: bytes) -> bytes:
    """What an authenticated client signs for its masked input: the binding and the tag over it.

    The tag is under the signature so that what the server checks on arrival covers everything it
    checks later: a copy with an altered tag is refused on arrival (its signature fails) instead of
    being accepted, turning the genuine copy away as a replay and aborting the round at the tag check."""
    return payload + tag


def input_tag_key(config: SessionConfig, client: int, self_mask_seed: bytes) -> bytes:
    """HMAC key of client's masked-input tag, from its self-mask seed b_u: secret until the server
    learns b_u while unmasking, so the server cannot make a tag for an input the client did not send."""
    return hkdf(self_mask_seed, config.binding("input-tag", client), MAC_BYTES)


def model_digest(arrays: Iterable[np.ndarray]) -> bytes:
    """SHA-256 of the global model a client trained on: dtype, shape and bytes of each array, in order.

    Pass the result as ``model_hash`` to :meth:`~.client.SecAggClient.share_keys`; it is sealed into
    every key-seed share the client sends, and clients refuse a neighbour's share that carries another digest
    before they mask anything (the model-inconsistency attack on secure aggregation).
    """
    h = hashlib.sha256(b"secfed/secagg/v1/model\x00")
    for a in arrays:
        a = np.ascontiguousarray(a)
        header = f"{a.dtype.str}|{','.join(map(str, a.shape))}|".encode()
        h.update(len(header).to_bytes(4, "little") + header)
        h.update(memoryview(a).cast("B"))
    return h.digest()
