"""``identities`` section: what checking an authenticated session's identity keys costs — each key
decoded and multiplied by the cofactor (:func:`secfed.protocols.edwards.weak_identity_key`), all of
them distinct — when a party builds or decodes the session config of ``--server-clients`` clients."""

from __future__ import annotations

import time

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from secfed.protocols import SessionConfig, choose_params
from secfed.protocols.edwards import weak_identity_key
from secfed.protocols.secagg.session import ServerKey


def section_identities(args) -> None:
    n = args.server_clients
    print(f"\n== identities: SessionConfig of n = {n:,} authenticated clients (keys checked, distinct)")
    keys = tuple(Ed25519PrivateKey.generate().public_key().public_bytes_raw() for _ in range(n))
    params, server = choose_params(n), ServerKey.generate().public
    weak_identity_key.cache_clear()
    for label in ("keys unseen", "keys seen (cached)"):
        start = time.perf_counter()
        SessionConfig(bytes(16), 0, params, args.server_dim, input_bound=None, server_key=server, identity_keys=keys)
        print(f"   {label:>20}: {time.perf_counter() - start:.2f} s")
    print(f"   one key checked: {_per_key(keys):.0f} µs")


def _per_key(keys: tuple[bytes, ...]) -> float:
    weak_identity_key.cache_clear()
    start = time.perf_counter()
    for key in keys:
        weak_identity_key(key)
    return 1e6 * (time.perf_counter() - start) / len(keys)
