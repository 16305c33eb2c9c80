"""The public description of one aggregation that every party must agree on, and the phases.

A :class:`SessionConfig` travels to the clients with the global model. Its :attr:`digest`
is bound into every key derivation, ciphertext, commitment and signature, and each client
checks its neighbours advertised the same digest — so two parties that disagree on any
parameter (dimension, ring, bound, graph parameters, identities) fail loudly instead of
producing garbage. The config holds no graph: who neighbours whom is derived during the round
from nonces every client commits to (:class:`~.graph.NeighbourGraph`), so the server, which
picks the session id, cannot pick the graph.
"""

from __future__ import annotations

import enum
import hashlib
import os
from dataclasses import KW_ONLY, dataclass, field
from functools import cached_property

from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from ..crypto import PUBLIC_KEY_BYTES, encode_parts, public_bytes, transcript
from ..edwards import weak_identity_key
from ..errors import OverflowRefused
from ..quantize import largest_cohort
from ..quantize import ring_bits as bits_for_sum
from .graph import GraphParams

SESSION_ID_BYTES = 16
MAX_DIMENSION = (1 << 32) - 1


class Phase(enum.IntEnum):
    """Protocol phases, in order. A dropout schedule names the phase whose message a client never sends."""

    ADVERTISE_KEYS = 0
    GRAPH_SEED = 1  # the client reveals the graph nonce it committed to
    SHARE_KEYS = 2
    MASKED_INPUT = 3
    CONSISTENCY_CHECK = 4  # authenticated mode only
    UNMASK = 5

    @classmethod
    def parse(cls, value: Phase | str | int) -> Phase:
        """Accept a Phase, its name in any case (``"masked_input"``), or its number."""
        if isinstance(value, Phase):
            return value
        if isinstance(value, str):
            try:
                return cls[value.strip().upper().replace("-", "_")]
            except KeyError:
                names = ", ".join(p.name.lower() for p in cls)
                raise ValueError(f"unknown phase {value!r}; expected one of {names}") from None
        return cls(value)


def new_session_id() -> bytes:
    """A fresh random session id (derive one from the run seed instead for reproducible graphs)."""
    return os.urandom(SESSION_ID_BYTES)


@dataclass(frozen=True, eq=False, repr=False)
class ServerKey:
    """The aggregation server's X25519 key for one session (make a fresh one per session).

    Its :attr:`public` half goes into the :class:`SessionConfig` (``server_key=``), so it is bound
    into the config digest every party checks; the :class:`~.server.SecAggServer` holds the private
    half. Clients seal their unmask responses to it — the survivors' self-mask seeds and the key
    shares of dropped clients — so that only the server, not whoever sees the wire, can open them.
    """

    private: X25519PrivateKey

    @classmethod
    def generate(cls) -> ServerKey:
        """A fresh key from the OS's randomness."""
        return cls(X25519PrivateKey.generate())

    @property
    def public(self) -> bytes:
        """The public half, 32 raw bytes: pass it as ``SessionConfig(server_key=...)``."""
        return public_bytes(self.private)


def check_distinct(identity_keys: tuple[bytes, ...]) -> None:
    """ValueError unless every slot of an authenticated session is a distinct identity: one identity in
    several slots holds each slot's shares, so with t of a victim's neighbour slots it opens the victim's
    seeds, however t, c and the consistency quorum count slots (found by review)."""
    first: dict[bytes, int] = {}
    for i, key in enumerate(identity_keys):
        if (earlier := first.setdefault(key, i)) != i:
            raise ValueError(f"identity key of client {i} repeats client {earlier}'s: each slot of an authenticated "
                             "session must be a distinct identity")


@dataclass(frozen=True)
class SessionConfig:
    """Everything public about one aggregation.

    ``session_id`` (16 bytes) and ``round`` must never repeat for the same cohort keys.
    ``dimension``: length of every ring vector. ``ring_bits``: the ring is Z_{2^ring_bits}.

    ``input_bound`` (keyword, required): the largest magnitude M of any one client's input value,
    read as a signed integer of the ring — ``quantizer.max_abs`` for quantized floats. The config
    refuses (:class:`OverflowRefused`) a ring in which a sum of ``n_clients`` such values could
    wrap, and each client refuses to mask an input beyond M. ``None`` declares that the sum is
    wanted mod 2^ring_bits on purpose (e.g. distributed DP with modular clipping): then no
    overflow guarantee is given and inputs are only checked to lie in the ring.

    ``server_key`` (keyword, required): the public half of the server's :class:`ServerKey` for this
    session (32 raw bytes); unmask responses are sealed to it.

    ``authenticated`` (default True): Bonawitz's malicious-server variant; ``identity_keys[i]`` is
    then client i's Ed25519 public key (raw 32 bytes) from the PKI the deployment trusts.
    ``authenticated=False`` is the weaker variant, private only against an honest-but-curious server.
    """

    session_id: bytes
    round: int
    params: GraphParams
    dimension: int
    _: KW_ONLY
    input_bound: int | None
    server_key: bytes
    ring_bits: int = 32
    authenticated: bool = True
    identity_keys: tuple[bytes, ...] = field(default=())

    def __post_init__(self) -> None:
        if not isinstance(self.session_id, bytes) or len(self.session_id) != SESSION_ID_BYTES:
            raise ValueError(f"session_id must be {SESSION_ID_BYTES} bytes")
        if not 0 <= self.round < 1 << 64:
            raise ValueError(f"round must be in [0, 2^64), got {self.round}")
        if not 1 <= self.dimension <= MAX_DIMENSION:
            raise ValueError(f"dimension must be in [1, {MAX_DIMENSION}], got {self.dimension}")
        if not 1 <= self.ring_bits <= 32:
            raise ValueError(f"ring_bits must be in [1, 32], got {self.ring_bits}")
        if self.input_bound is not None:
            if isinstance(self.input_bound, bool) or not isinstance(self.input_bound, int) or self.input_bound < 0:
                raise ValueError(f"input_bound must be a non-negative int or None, got {self.input_bound!r}")
            needed = bits_for_sum(self.n_clients, self.input_bound)  # OverflowRefused beyond 32 bits
            if needed > self.ring_bits:
                raise OverflowRefused(
                    f"a sum of {self.n_clients} inputs of magnitude up to {self.input_bound} needs {needed} bits; "
                    f"the session's ring has {self.ring_bits}: the largest safe cohort at this bound is "
                    f"{largest_cohort(self.input_bound, self.ring_bits):,} (raise ring_bits, or lower the bound)"
                )
        if not isinstance(self.server_key, bytes) or len(self.server_key) != PUBLIC_KEY_BYTES:
            raise ValueError(
                f"server_key must be the {PUBLIC_KEY_BYTES} raw bytes of the server's X25519 public key "
                "(ServerKey.generate().public), got {type(self.server_key).__name__} "
                f"{len(self.server_key) if isinstance(self.server_key, bytes) else ''}".rstrip()
            )
        if self.authenticated:
            if len(self.identity_keys) != self.n_clients:
                raise ValueError(
                    f"authenticated mode needs one identity key per client: "
                    f"{len(self.identity_keys)} keys for {self.n_clients} clients "
                    "(authenticated=False is the weaker, honest-but-curious-server variant)"
                )
            for i, key in enumerate(self.identity_keys):
                if len(key) != PUBLIC_KEY_BYTES:
                    raise ValueError(f"identity key of client {i} must be 32 raw bytes, got {len(key)}")
                if weak := weak_identity_key(bytes(key)):
                    raise ValueError(f"identity key of client {i} is {weak}: it can stand for no one identity")
            check_distinct(self.identity_keys)
        elif self.identity_keys:
            raise ValueError("identity_keys are only used in authenticated mode")

    @property
    def n_clients(self) -> int:
        return self.params.n_clients

    @cached_property
    def digest(self) -> bytes:
        """SHA-256 over every field that changes what the parties compute."""
        p = self.params
        return hashlib.sha256(
            transcript(
                "session-config",
                self.session_id, self.round, p.n_clients, p.degree, p.threshold, p.corrupt_bound,
                self.dimension, self.ring_bits, b"" if self.input_bound is None else self.input_bound,
                int(self.authenticated), self.server_key, *self.identity_keys,
            )
        ).digest()

    def binding(self, label: str, *parts: bytes | int) -> bytes:
        """:func:`transcript` of ``label`` bound to this session: id, round and config digest first."""
        prefix = self._binding_prefixes.get(label)
        if prefix is None:  # a handful of labels, each encoded once per session
            prefix = self._binding_prefixes[label] = transcript(label, self.session_id, self.round, self.digest)
        return prefix + encode_parts(parts)

    @cached_property
    def _binding_prefixes(self) -> dict[str, bytes]:
        return {}
