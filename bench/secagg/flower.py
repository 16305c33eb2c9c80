"""Flower's SecAgg+ (``flwr``, dev extra) for the ``client`` section: its helpers composed as in its
secaggplus mod and workflow (SECP384R1 ECDH, Fernet, Shamir via pycryptodome on padded secrets,
numpy RandomState masks on int64); ``--flower auto`` runs them where they take under about a minute."""

from __future__ import annotations

import importlib.util
import os
import time
from typing import TYPE_CHECKING

import numpy as np

from .common import CLIP, update_of

if TYPE_CHECKING:
    from .client import Row


def flower_available() -> bool:
    return importlib.util.find_spec("flwr") is not None


def flower_cost_ok(row: Row, mode: str) -> bool:
    """Rough wall time of Flower's server: ~23 ns per mask word and ~3 ms per Shamir coefficient block."""
    if mode == "all":
        return True
    if mode == "none":
        return False
    survivors, dropped = row.n - row.dropped, row.dropped
    streams = survivors + dropped * row.k
    shamir_s = (survivors * 3 + dropped * 12) * row.t * 0.003
    return streams * row.d * 23e-9 + shamir_s < 60.0


def run_flower(row: Row, args) -> None:
    """Flower's secaggplus client and server computation, composed from its helpers as its mod/workflow do."""
    from flwr.common import ndarray_to_bytes
    from flwr.common.secure_aggregation.crypto.shamir import combine_shares, create_shares
    from flwr.common.secure_aggregation.crypto.symmetric_encryption import decrypt, encrypt, generate_shared_key
    from flwr.common.secure_aggregation.ndarrays_arithmetic import (
        parameters_addition, parameters_mod, parameters_subtraction,
    )
    from flwr.common.secure_aggregation.quantization import dequantize, quantize
    from flwr.common.secure_aggregation.secaggplus_utils import pseudo_rand_gen, share_keys_plaintext_concat
    from flwr.supercore.primitives.asymmetric import (
        bytes_to_private_key, bytes_to_public_key, generate_key_pairs, private_key_to_bytes, public_key_to_bytes,
    )

    n, d, k, t = row.n, row.d, row.k, row.t
    mod_range, target_range = 1 << 32, (1 << 32) // n  # the sum of n quantized values cannot wrap
    neighbours = [generate_key_pairs() for _ in range(k)]  # their sk1/pk1 (masks) and sk2/pk2 (channel)
    neighbours2 = [generate_key_pairs() for _ in range(k)]
    pk1 = [public_key_to_bytes(p) for _, p in neighbours]
    pk2 = [public_key_to_bytes(p) for _, p in neighbours2]

    # client setup: two key pairs, Shamir shares of the seed and of sk1, one sealed box per
    # neighbour out, and one in (the mod opens them at the start of its masking stage)
    receiver, receiver_public = generate_key_pairs()
    incoming = [encrypt(generate_shared_key(s2, receiver_public), bytes(120)) for s2, _ in neighbours2]
    t0 = time.perf_counter()
    sk1, _ = generate_key_pairs()
    sk2, _ = generate_key_pairs()
    sk1_bytes = private_key_to_bytes(sk1)
    rd_seed = os.urandom(32)
    b_shares = create_shares(rd_seed, t, k + 1)
    sk1_shares = create_shares(sk1_bytes, t, k + 1)
    for j in range(k):
        key = generate_shared_key(sk2, bytes_to_public_key(pk2[j]))
        encrypt(key, share_keys_plaintext_concat(0, j + 1, b_shares[j + 1], sk1_shares[j + 1]))
    for j in range(k):
        decrypt(generate_shared_key(receiver, bytes_to_public_key(pk2[j])), incoming[j])
    row.flower_setup_s = time.perf_counter() - t0

    # client masking: quantize, private mask, one pairwise mask per neighbour, mod
    x = update_of(args.seed, 0, d).astype(np.float64)
    t0 = time.perf_counter()
    vec = quantize([x], CLIP, target_range)
    row.flower_quantize_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    dims = [a.shape for a in vec]
    vec = parameters_addition(vec, pseudo_rand_gen(rd_seed, mod_range, dims))
    for j in range(k):
        shared = generate_shared_key(sk1, bytes_to_public_key(pk1[j]))
        mask = pseudo_rand_gen(shared, mod_range, dims)
        vec = parameters_addition(vec, mask) if j % 2 else parameters_subtraction(vec, mask)
    vec = parameters_mod(vec, mod_range)
    row.flower_client_s = time.perf_counter() - t0
    row.flower_vector_bytes = len(ndarray_to_bytes(vec[0]))
    del vec, x

    # server unmask: rebuild each client's secret from t shares; remove self masks of survivors and
    # the dropped clients' pairwise masks with their surviving neighbours (one real share set per
    # secret kind is reused across clients: the combine work per client is the same)
    survivors = n - row.dropped
    seed_shares = create_shares(os.urandom(32), t, k + 1)[:t]
    dropped_key = private_key_to_bytes(generate_key_pairs()[0])
    key_shares = create_shares(dropped_key, t, k + 1)[:t]
    masked = [np.random.default_rng(0).integers(0, mod_range, d, dtype=np.int64)]
    t0 = time.perf_counter()
    for _ in range(survivors):
        secret = combine_shares(seed_shares)
        masked = parameters_subtraction(masked, pseudo_rand_gen(secret, mod_range, [(d,)]))
    for partners in row.partners:
        secret = bytes_to_private_key(combine_shares(key_shares))
        for j in range(partners):
            shared = generate_shared_key(secret, bytes_to_public_key(pk1[j]))
            masked = parameters_addition(masked, pseudo_rand_gen(shared, mod_range, [(d,)]))
    masked = parameters_mod(masked, mod_range)
    dequantize(masked, CLIP, target_range)
    row.flower_server_s = time.perf_counter() - t0
