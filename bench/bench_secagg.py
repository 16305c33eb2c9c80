"""Secure aggregation cost: secfed.protocols at scale, against raw AES-CTR and Flower's SecAgg+ helpers.

    .venv/bin/python bench/bench_secagg.py [--sections client,keystream,full,server,flower-overflow,gil]
        client:    [--dims 1000000] [--clients 10,100] [--variants secagg,secaggplus]
                   [--modes authenticated,unauthenticated] [--repeats 1] [--flower auto|all|none] [--full]
        keystream: [--keystream-neighbours 9,38,99] [--keystream-repeats 25] (at the first of --dims)
        full:      [--full-clients 100,1000,10000] [--full-modes unauthenticated] [--full-dim 1000]
        server:    [--server-clients 10000] [--server-dim 1000000] [--server-mode authenticated]
        common:    [--dropout 0.1] [--corrupt-fraction 0.2] [--seed 0]

Sections (default: client):

* ``client`` — for each (d, n, variant) one round through the real state machines and wire format,
  per protocol mode: the whole work of one representative survivor (setup, quantize, mask —
  masks, self-mask shares, tag and signature —, consistency check, unmask), its mask time ÷ the raw
  AES-CTR keystream of the same bytes on one thread and on every core, the server's unmask and
  Flower's SecAgg+ helpers on the same inputs. 10 % of the clients vanish after sharing keys.
  Rounds whose survivors' masking would cost more than ``--full-budget`` AES words use stand-in
  survivors (uniform vectors with genuine tags, no Shamir split of seeds that are never rebuilt):
  the server cannot tell and does the same work, but the sum is then not checked.
* ``keystream`` — :func:`secfed.protocols.prg.mask_into` (the masking pass alone: bound check,
  k + 1 streams, reduction, digest) ÷ raw keystream, one thread and every core.
* ``full`` — every client real: n clients and the server, every message encoded and decoded, d
  small; CPU and wall seconds per client (setup = keys, nonce, key sharing, opening shares; mask;
  finish = consistency check + unmask), server and wire; the unmasked sum checked exactly; the
  growth exponent of the round's time in n fitted over the cohorts run.
* ``server`` — the server alone in a subprocess fed wire bytes over a pipe: n clients, d large,
  10 % dropping after sharing keys; its seconds and peak resident memory (``ru_maxrss``).
  Representative clients: all run every phase for real except that survivors other than the first
  upload a uniform vector (with a genuine tag and signature) instead of masking, and do not
  re-verify the consistency quorum the first survivor verifies (its cost is printed).
* ``flower-overflow`` — where Flower's SecAgg+ defaults wrap the aggregate, from its own
  quantize/dequantize.
* ``gil`` — whether AES-CTR, BLAKE3, SHA-256, Ed25519 verification and numpy's add release the GIL
  (a pure-Python thread keeps running during one long call), the premise of the thread pool.

Flower (``flwr``, dev extra): its SecAgg+ helpers composed as in its secaggplus mod and workflow
(SECP384R1 ECDH, Fernet, Shamir via pycryptodome on padded secrets, numpy RandomState masks on
int64); ``--flower auto`` runs them where they take under about a minute.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import math
import os
import resource
import struct
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from dataclasses import astuple, dataclass, field
from unittest import mock

import numpy as np
from blake3 import blake3
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

from secfed.environment import describe
from secfed.protocols import (
    GraphParams,
    Phase,
    Quantizer,
    SecAggClient,
    SecAggServer,
    ServerKey,
    SessionConfig,
    choose_params,
    decode,
    encode,
    parallel,
    prg,
    shamir,
)
from secfed.protocols.crypto import vector_digest
from secfed.protocols.prg import CHUNK_WORDS, MaskStream, counter_block, mask_into
from secfed.protocols.secagg import client as client_module

CLIP = 1.0


def load() -> str:
    return ", ".join(f"{v:.2f}" for v in os.getloadavg())


def fmt_s(v: float | None) -> str:
    return "-" if v is None else (f"{v:.3f}" if v < 10 else f"{v:.1f}")


def update_of(seed: int, client: int, d: int) -> np.ndarray:
    """Client ``client``'s float32 update: deterministic, generated when needed (n·d floats do not fit)."""
    return np.random.default_rng([seed, client]).normal(0.0, 0.05, d).astype(np.float32)


# ---- raw keystream: the floor masking is compared with ---------------------------------------------


def raw_keystream_seconds(streams: int, d: int, threads: int = 1) -> float:
    """AES-128-CTR keystream for ``streams`` × d words in the chunks the masking pass uses, nothing
    else; with ``threads`` > 1 each thread produces its share of the words (counter offsets)."""
    parts = [(lo, min(d, lo + -(-d // threads))) for lo in range(0, d, -(-d // threads))]

    def produce(lo: int, hi: int) -> None:
        zeros, buf = memoryview(bytes(4 * CHUNK_WORDS)), bytearray(4 * CHUNK_WORDS)
        ciphers = [Cipher(algorithms.AES(os.urandom(16)), modes.CTR(counter_block(bytes(16), lo - lo % 4))).encryptor()
                   for _ in range(streams)]
        for start in range(lo, hi, CHUNK_WORDS):
            n = min(CHUNK_WORDS, hi - start)
            for c in ciphers:
                c.update_into(zeros[: 4 * n], buf)

    start = time.perf_counter()
    if len(parts) == 1:
        produce(*parts[0])
    else:
        workers = [threading.Thread(target=produce, args=p) for p in parts]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
    return time.perf_counter() - start


def best_of(repeats: int, fn) -> float:
    return min(fn() for _ in range(repeats))


# ---- client section: one representative client's round, and Flower's helpers -----------------------


@dataclass
class ClientTimes:
    """One representative client's seconds in one round, by step."""

    setup: float = 0.0
    quantize: float = 0.0
    mask: float = 0.0
    consistency: float = 0.0
    unmask: float = 0.0

    @property
    def total(self) -> float:
        return self.setup + self.quantize + self.mask + self.consistency + self.unmask

    def fastest(self, other: ClientTimes) -> ClientTimes:
        """Step by step, the faster of two rounds: on a shared machine each step's minimum is the
        least disturbed estimate of its cost."""
        return ClientTimes(*(min(a, b) for a, b in zip(astuple(self), astuple(other))))


@dataclass
class Row:
    variant: str
    n: int
    d: int
    k: int
    t: int
    dropped: int
    mode: str = ""
    client: dict[str, ClientTimes] = field(default_factory=dict)  # protocol mode → fastest round
    keystream_s: float = 0.0
    keystream_threads_s: float = 0.0
    signature_checks: int = 0  # Ed25519 verifications by one client in authenticated mode: k + quorum
    receive_s: float = 0.0
    unmask_s: float = 0.0
    unmask_streams: int = 0
    partners: tuple[int, ...] = ()  # surviving neighbours of each dropped client
    unmask_keystream_s: float = 0.0
    up_bytes: int = 0
    down_bytes: int = 0
    checked: str = ""
    flower_quantize_s: float | None = None
    flower_client_s: float | None = None
    flower_setup_s: float | None = None
    flower_server_s: float | None = None
    flower_vector_bytes: int | None = None
    flower_note: str = ""

    @property
    def first(self) -> ClientTimes:
        return next(iter(self.client.values()))

    @property
    def quantize_s(self) -> float:
        return self.first.quantize

    @property
    def mask_s(self) -> float:
        return self.first.mask

    @property
    def setup_s(self) -> float:
        return self.first.setup

    @property
    def auth_ratio(self) -> float | None:
        if {"authenticated", "unauthenticated"} <= set(self.client):
            return self.client["authenticated"].total / self.client["unauthenticated"].total
        return None


def ed25519_verify_seconds(count: int = 300) -> float:
    """Seconds per Ed25519 verification on this machine now (the median of three batches)."""
    key = Ed25519PrivateKey.generate()
    public, payload = key.public_key(), os.urandom(200)
    signature = key.sign(payload)
    batches = []
    for _ in range(3):
        start = time.perf_counter()
        for _ in range(count):
            public.verify(signature, payload)
        batches.append((time.perf_counter() - start) / count)
    return sorted(batches)[1]


@contextmanager
def stand_in_masks(rng: np.random.Generator):
    """A scaffolding survivor uploads a uniform vector (what a masked input looks like) instead of
    masking; its digest (and so its tag and signature) is genuine."""

    def fill(out, source, streams, *, bits, bound):
        out[:] = np.frombuffer(rng.bytes(4 * out.size), dtype="<u4") & ((1 << bits) - 1)
        return vector_digest(out)

    with mock.patch.object(client_module, "mask_into", fill):
        yield


@contextmanager
def stand_in_splits():
    """A scaffolding survivor skips Shamir: the server never rebuilds its seeds (it reveals its own
    self-mask seed, and its key seed is never needed), so its shares only travel, unused."""

    def split(secret, threshold, count):
        return [shamir.Share(i, bytes(shamir.SHARE_BYTES)) for i in range(1, count + 1)]

    with mock.patch.object(client_module.shamir, "split", split):
        yield


@contextmanager
def trusting_quorum():
    """A scaffolding survivor does not re-verify the quorum's signatures (the representative does:
    every honest client's cost, printed apart); the server's work is unchanged."""
    with mock.patch.object(client_module, "verify_all", lambda items, payload, who: None):
        yield


@dataclass
class Round:
    """What one secfed round measured (for the row it belongs to)."""

    client: ClientTimes
    keystream_s: float
    keystream_threads_s: float
    receive_s: float
    unmask_s: float
    server: SecAggServer
    up_bytes: int
    down_bytes: int
    checked: str


def run_secfed(variant: str, n: int, d: int, args) -> Row:
    """Every mode in ``args.modes``, ``args.repeats`` times, alternating; per mode each client step's
    fastest time, server figures from the first mode's round with the fastest unmask."""
    params = {mode: choose_params(n, dropout_rate=args.dropout, corrupt_fraction=args.corrupt_fraction,
                                  complete=variant == "secagg", authenticated=mode == "authenticated")
              for mode in args.modes}
    first = params[args.modes[0]]
    rng = np.random.default_rng(args.seed)
    dropped = set(rng.choice(n, size=round(args.dropout * n), replace=False).tolist())
    survivors = [i for i in range(n) if i not in dropped]
    row = Row(variant, n, d, first.degree, first.threshold, len(dropped))
    work = len(survivors) * (first.degree + 1) * d
    full = args.full or work <= args.full_budget
    row.mode = "full" if full else "representative"
    best: dict[str, Round] = {}
    client: dict[str, ClientTimes] = {}
    for _ in range(args.repeats):
        for mode in args.modes:
            result = run_round(params[mode], mode == "authenticated", d, dropped, full, args)
            if result.checked == "MISMATCH":
                raise SystemExit(f"sum mismatch in {variant} n={n} d={d} ({mode})")
            client[mode] = client[mode].fastest(result.client) if mode in client else result.client
            if mode not in best or result.unmask_s < best[mode].unmask_s:
                best[mode] = result
    row.client = client
    row.signature_checks = first.degree + first.signature_quorum
    lead = best[args.modes[0]]
    row.keystream_s, row.keystream_threads_s = lead.keystream_s, lead.keystream_threads_s
    row.receive_s, row.unmask_s = lead.receive_s, lead.unmask_s
    row.up_bytes, row.down_bytes, row.checked = lead.up_bytes, lead.down_bytes, lead.checked
    # The server regenerates the survivors' self masks and each dropped client's masks with its
    # surviving neighbours; price that many keystreams at the AES rate measured now.
    alive = set(survivors)
    row.partners = tuple(sum(1 for w in lead.server.graph.of(v) if w in alive) for v in sorted(dropped))
    row.unmask_streams = len(survivors) + sum(row.partners)
    sample = min(row.unmask_streams, 8)
    row.unmask_keystream_s = raw_keystream_seconds(sample, d) * row.unmask_streams / sample
    return row


def run_round(params, authenticated: bool, d: int, dropped: set[int], full: bool, args) -> Round:
    n = params.n_clients
    q = Quantizer.for_cohort(n, CLIP)
    identities = [Ed25519PrivateKey.generate() for _ in range(n)] if authenticated else []
    server_key = ServerKey.generate()
    config = SessionConfig(os.urandom(16), 0, params, dimension=d, ring_bits=q.bits, input_bound=q.max_abs,
                           server_key=server_key.public, authenticated=authenticated,
                           identity_keys=tuple(k.public_key().public_bytes_raw() for k in identities))
    survivors = [i for i in range(n) if i not in dropped]
    rep = survivors[0]
    clients = [SecAggClient(config, i, identity_key=identities[i] if authenticated else None) for i in range(n)]
    server = SecAggServer(config, server_key)
    up, down = [0] * n, [0] * n
    times = ClientTimes()

    def send(i, message):
        data = encode(message)
        up[i] += len(data)
        server.receive(decode(data))

    def fetch(i, message):
        data = encode(message)
        down[i] += len(data)
        return decode(data)

    def timed(i, step, *call):
        """Run ``call`` for client i; the representative's time goes to ``step``."""
        t0 = time.perf_counter()
        out = call[0](*call[1:])
        if i == rep:
            setattr(times, step, getattr(times, step) + time.perf_counter() - t0)
        return out

    for i in range(n):
        send(i, timed(i, "setup", clients[i].advertise_keys))
    outbox = server.close_phase()
    if server.phase is Phase.GRAPH_SEED:  # sparse graphs only
        for i, commitments in outbox.items():
            send(i, timed(i, "setup", clients[i].reveal_graph_nonce, fetch(i, commitments)))
        outbox = server.close_phase()
    for i, roster in outbox.items():
        roster = fetch(i, roster)
        if full or i == rep or i in dropped:
            send(i, timed(i, "setup", clients[i].share_keys, roster))
        else:
            with stand_in_splits():
                send(i, clients[i].share_keys(roster))
    deliveries = server.close_phase()
    timed(rep, "setup", clients[rep].receive_shares, fetch(rep, deliveries[rep]))

    plain = np.zeros(d, dtype=np.uint64) if full else None
    quant_rng = np.random.default_rng([args.seed, 1])
    x = update_of(args.seed, rep, d)
    ring = timed(rep, "quantize", q.to_ring, x, quant_rng)
    masked = timed(rep, "mask", clients[rep].mask, ring)
    streams = 1 + len(deliveries[rep].shares)
    keystream_s = best_of(5, lambda: raw_keystream_seconds(streams, d))
    keystream_threads_s = best_of(5, lambda: raw_keystream_seconds(streams, d, parallel.workers()))
    if full:
        plain += ring
    receive = 0.0
    t0 = time.perf_counter()
    send(rep, masked)
    receive += time.perf_counter() - t0
    del masked, ring, x

    for i in range(n):
        if i == rep:
            continue
        clients[i].receive_shares(fetch(i, deliveries[i]))
        if i in dropped:
            continue
        if full:
            ring = q.to_ring(update_of(args.seed, i, d), quant_rng)
            plain += ring
            message = clients[i].mask(ring)
        else:
            with stand_in_masks(np.random.default_rng([args.seed, 2, i])), stand_in_splits():
                message = clients[i].mask(np.zeros(d, dtype=np.uint32))
        data = encode(message)
        up[i] += len(data)
        t0 = time.perf_counter()
        server.receive(decode(data))
        receive += time.perf_counter() - t0
        del message, data
    outbox = server.close_phase()
    if authenticated:
        for i, survivors_list in outbox.items():
            send(i, timed(i, "consistency", clients[i].consistency_check, fetch(i, survivors_list)))
        outbox = server.close_phase()
    for i, request in outbox.items():
        send(i, timed(i, "unmask", clients[i].unmask, fetch(i, request)))
    t0 = time.perf_counter()
    server.close_phase()
    unmask_s = time.perf_counter() - t0
    if full:
        expected = (plain & ((1 << q.bits) - 1)).astype(np.uint32)
        checked = "exact" if np.array_equal(server.result.total, expected) else "MISMATCH"
    else:
        checked = "not checked (stand-ins)"
    return Round(times, keystream_s, keystream_threads_s, receive, unmask_s, server, up[rep], down[rep], checked)


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


def section_client(args) -> None:
    flower = args.flower if flower_available() else "none"
    print(f"\n== client: one survivor's round, server unmask, Flower ({flower if flower_available() else 'not installed'})")
    print(f"   dropouts: {args.dropout:.0%} of clients vanish after sharing keys; γ = {args.corrupt_fraction}; "
          f"modes: {', '.join(args.modes)} (×{args.repeats}, fastest kept); threads: {parallel.workers()}")
    rows = []
    for d in args.dims:
        for n in args.clients:
            for variant in args.variants:
                row = run_secfed(variant, n, d, args)
                if flower != "none" and flower_cost_ok(row, flower):
                    run_flower(row, args)
                elif flower != "none":
                    row.flower_note = "skipped (slow; --flower all)"
                rows.append(row)
                print_row(row)
    print_summary(rows)


def print_row(r: Row) -> None:
    graph = " (complete: no sparse graph meets the targets)" if r.variant == "secaggplus" and r.k == r.n - 1 else ""
    print(f"\n{r.variant} n={r.n} d={r.d:,} k={r.k}{graph} t={r.t} dropped={r.dropped} [{r.mode}; sum {r.checked}]")
    for mode, c in r.client.items():
        print(f"  client  {mode:15} total {fmt_s(c.total)} s = setup {fmt_s(c.setup)} + quantize "
              f"{fmt_s(c.quantize)} + mask {fmt_s(c.mask)} + consistency {fmt_s(c.consistency)} + unmask "
              f"{fmt_s(c.unmask)}")
    if r.auth_ratio is not None:
        verify = ed25519_verify_seconds()
        print(f"          authenticated ÷ unauthenticated client time: {r.auth_ratio:.3f} (goal ≤ 1.10); "
              f"the client checks {r.signature_checks} Ed25519 signatures (k + quorum) at {verify * 1e6:.0f} µs "
              f"each ≈ {fmt_s(r.signature_checks * verify)} s")
    print(f"          mask ({next(iter(r.client))}) {fmt_s(r.mask_s)} s vs raw AES-CTR for the same bytes "
          f"{fmt_s(r.keystream_s)} s on one thread (ratio {r.mask_s / r.keystream_s:.2f}x), "
          f"{fmt_s(r.keystream_threads_s)} s on {parallel.workers()} (ratio {r.mask_s / r.keystream_threads_s:.2f}x)")
    print(f"  server  unmask {fmt_s(r.unmask_s)} s for {r.unmask_streams} mask streams (raw AES-CTR for them "
          f"{fmt_s(r.unmask_keystream_s)} s: ratio {r.unmask_s / r.unmask_keystream_s:.2f}x); "
          f"receiving, checking + summing {r.n - r.dropped} vectors: {fmt_s(r.receive_s)} s")
    print(f"  bytes   up {r.up_bytes:,} ({r.up_bytes / (4 * r.d):.4f}x float32), down {r.down_bytes:,}")
    if r.flower_client_s is not None:
        both, flower_both = r.quantize_s + r.mask_s, r.flower_quantize_s + r.flower_client_s
        print(f"  flower  client mask {fmt_s(r.flower_client_s)} s ({r.flower_client_s / r.mask_s:.1f}x ours), "
              f"quantize+mask {fmt_s(flower_both)} s ({flower_both / both:.1f}x), "
              f"setup {fmt_s(r.flower_setup_s)} s ({r.flower_setup_s / r.setup_s:.1f}x)")
        print(f"          server unmask {fmt_s(r.flower_server_s)} s ({r.flower_server_s / r.unmask_s:.1f}x ours); "
              f"vector {r.flower_vector_bytes:,} B ({r.flower_vector_bytes / (4 * r.d):.2f}x float32)")
    elif r.flower_note:
        print(f"  flower  {r.flower_note}")


def print_summary(rows: list[Row]) -> None:
    print("\nsummary (seconds; client = one survivor's whole round; x = Flower time / secfed time)")
    print(f"{'variant':10} {'n':>4} {'d':>11} {'k':>3} {'t':>3} {'client':>7} {'unauth':>7} {'ratio':>6} "
          f"{'quant':>6} {'mask':>7} {'m/AES1':>6} {'m/AESn':>6} {'unmask':>7} {'up/f32':>7} {'fl.mask':>8} "
          f"{'x':>5} {'fl.unmask':>9} {'x':>5}")
    for r in rows:
        fc = "" if r.flower_client_s is None else f"{r.flower_client_s / r.mask_s:5.1f}"
        fs = "" if r.flower_server_s is None else f"{r.flower_server_s / r.unmask_s:5.1f}"
        unauth = r.client.get("unauthenticated")
        ratio = "" if r.auth_ratio is None else f"{r.auth_ratio:6.3f}"
        print(f"{r.variant:10} {r.n:4d} {r.d:11,d} {r.k:3d} {r.t:3d} {fmt_s(r.first.total):>7} "
              f"{fmt_s(unauth.total if unauth else None):>7} {ratio:>6} {fmt_s(r.quantize_s):>6} {fmt_s(r.mask_s):>7} "
              f"{r.mask_s / r.keystream_s:6.2f} {r.mask_s / r.keystream_threads_s:6.2f} {fmt_s(r.unmask_s):>7} "
              f"{r.up_bytes / (4 * r.d):7.4f} {fmt_s(r.flower_client_s):>8} {fc:>5} {fmt_s(r.flower_server_s):>9} {fs:>5}")
    print("m/AES1, m/AESn: mask ÷ raw keystream of the same bytes on one thread / on every core (goal ≤ 1.3)")
    print("(client/quant/mask/unmask/up: the first mode; mask = key agreement, masks, self-mask shares, tag, signature)")


# ---- keystream section: the masking pass alone ------------------------------------------------------


def section_keystream(args) -> None:
    d = args.dims[0]
    threads = parallel.workers()
    print(f"\n== keystream: mask_into (bound check, k + 1 streams, reduction, digest) ÷ raw AES-CTR, d = {d:,}")
    x = np.random.default_rng(args.seed).integers(0, 1 << 20, d, dtype=np.uint32)
    out = np.empty(d, dtype=np.uint32)
    print(f"{'k':>4} {'raw 1 thr':>10} {f'raw {threads} thr':>10} {'mask 1 thr':>11} {f'mask {threads} thr':>11} "
          f"{'1/1':>6} {f'{threads}/1':>6} {f'{threads}/{threads}':>6} {'1/1 cpu':>7} {'no-digest 1/1':>13} "
          f"{'floor 1/1':>9}")
    # The digest the masked input is signed over is BLAKE3 of every byte: a pass no keystream amortises.
    parallel.set_workers(1)
    digest = best_of(args.keystream_repeats, lambda: _seconds(lambda: vector_digest(x)))
    parallel.set_workers(threads)
    for k in args.keystream_neighbours:
        streams = [MaskStream(os.urandom(16), 1 if i % 2 else -1) for i in range(k + 1)]

        def masking(workers: int) -> None:
            parallel.set_workers(workers)
            mask_into(out, x, streams, bits=32, bound=1 << 20)

        def masking_without_digest() -> None:
            with mock.patch.object(prg, "leaf_hasher", _NoHash):
                masking(1)

        # Interleaved, so drift on a shared machine hits all four alike; the fastest of each is kept.
        # One-thread runs also keep their thread's CPU seconds, which other processes do not inflate.
        best = {key: math.inf for key in ("raw1", "rawn", "mask1", "maskn", "bare1", "raw1_cpu", "mask1_cpu",
                                          "bare1_cpu")}
        for _ in range(args.keystream_repeats):
            _keep(best, "raw1", lambda: raw_keystream_seconds(k + 1, d))
            _keep(best, "mask1", lambda: masking(1))
            _keep(best, "bare1", masking_without_digest)
            best["rawn"] = min(best["rawn"], raw_keystream_seconds(k + 1, d, threads))
            best["maskn"] = min(best["maskn"], _seconds(lambda: masking(threads)))
        parallel.set_workers(threads)
        raw1, rawn, mask1, maskn = best["raw1"], best["rawn"], best["mask1"], best["maskn"]
        print(f"{k:4d} {raw1 * 1e3:8.2f}ms {rawn * 1e3:8.2f}ms {mask1 * 1e3:9.2f}ms {maskn * 1e3:9.2f}ms "
              f"{mask1 / raw1:6.2f} {maskn / raw1:6.2f} {maskn / rawn:6.2f} "
              f"{best['mask1_cpu'] / best['raw1_cpu']:7.2f} {best['bare1'] / raw1:13.2f} {(raw1 + digest) / raw1:9.2f}")
    print("(best of repeats; ratios: mask on 1 thread ÷ raw on 1, mask on every core ÷ raw on 1, ÷ raw on every core;")
    print(" 1/1 cpu: the same one-thread ratio in the thread's CPU seconds, for a machine other processes share;")
    print(" no-digest 1/1: the pass with its leaf hasher swapped for one that hashes nothing — the bound check,")
    print(" the k + 1 additions and the calls, which no choice of digest changes;")
    print(f" floor 1/1: (raw + the vector's BLAKE3 digest alone, {digest * 1e3:.2f} ms on 1 thread) ÷ raw — what any")
    print(" masking pass that signs a digest of the vector costs at least)")


class _NoHash:
    """Stands in for the leaf hasher in the no-digest column: takes the bytes, hashes nothing."""

    def update(self, data) -> None:
        pass

    def digest(self) -> bytes:
        return bytes(32)


def _keep(best: dict[str, float], key: str, fn) -> None:
    """Run ``fn`` on this thread; keep the least wall seconds in ``best[key]`` and the least CPU
    seconds of this thread in ``best[key + "_cpu"]``."""
    wall, cpu = time.perf_counter(), time.thread_time()
    fn()
    cpu, wall = time.thread_time() - cpu, time.perf_counter() - wall
    best[key], best[key + "_cpu"] = min(best[key], wall), min(best[key + "_cpu"], cpu)


def _seconds(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


# ---- full section: every client real -----------------------------------------------------------------


@dataclass
class Clock:
    """Wall and CPU seconds spent in one kind of work."""

    wall: float = 0.0
    cpu: float = 0.0

    def run(self, fn, *args):
        w, c = time.perf_counter(), time.process_time()
        out = fn(*args)
        self.wall += time.perf_counter() - w
        self.cpu += time.process_time() - c
        return out


def full_round(n: int, d: int, authenticated: bool, args) -> dict:
    """One round with every client real; returns the clocks, the parameters and whether the sum is exact."""
    start_wall, start_cpu = time.perf_counter(), time.process_time()
    params = choose_params(n, dropout_rate=args.dropout, corrupt_fraction=args.corrupt_fraction,
                           authenticated=authenticated)
    q = Quantizer.for_cohort(n, CLIP)
    identities = [Ed25519PrivateKey.generate() for _ in range(n)] if authenticated else []
    server_key = ServerKey.generate()
    config = SessionConfig(os.urandom(16), 0, params, dimension=d, ring_bits=q.bits, input_bound=q.max_abs,
                           server_key=server_key.public, authenticated=authenticated,
                           identity_keys=tuple(k.public_key().public_bytes_raw() for k in identities))
    clients = [SecAggClient(config, i, identity_key=identities[i] if authenticated else None) for i in range(n)]
    server = SecAggServer(config, server_key)
    rng = np.random.default_rng([args.seed, n])
    dropped = set(rng.choice(n, size=round(args.dropout * n), replace=False).tolist())
    clock = {k: Clock() for k in ("setup", "mask", "finish", "server", "wire")}
    wire_bytes = 0

    def send(message):
        nonlocal wire_bytes
        data = clock["wire"].run(encode, message)
        wire_bytes += len(data)
        clock["server"].run(server.receive, clock["wire"].run(decode, data))

    def fetch(message):
        nonlocal wire_bytes
        data = clock["wire"].run(encode, message)
        wire_bytes += len(data)
        return clock["wire"].run(decode, data)

    def close():
        return clock["server"].run(server.close_phase)

    for c in clients:
        send(clock["setup"].run(c.advertise_keys))
    outbox = close()
    if server.phase is Phase.GRAPH_SEED:  # sparse graphs only
        for i, m in outbox.items():
            send(clock["setup"].run(clients[i].reveal_graph_nonce, fetch(m)))
        outbox = close()
    for i, m in outbox.items():
        send(clock["setup"].run(clients[i].share_keys, fetch(m)))
    expected = np.zeros(d, dtype=np.uint64)
    quant_rng = np.random.default_rng([args.seed, 1])
    for i, m in close().items():
        clock["setup"].run(clients[i].receive_shares, fetch(m))
        if i in dropped:
            continue
        ring = q.to_ring(update_of(args.seed, i, d), quant_rng)
        expected += ring
        send(clock["mask"].run(clients[i].mask, ring))
    outbox = close()
    if authenticated:
        for i, m in outbox.items():
            send(clock["finish"].run(clients[i].consistency_check, fetch(m)))
        outbox = close()
    for i, m in outbox.items():
        send(clock["finish"].run(clients[i].unmask, fetch(m)))
    close()
    exact = np.array_equal(server.result.total, (expected & ((1 << q.bits) - 1)).astype(np.uint32))
    return dict(n=n, k=params.degree, t=params.threshold, q=params.signature_quorum if authenticated else 0,
                dropped=len(dropped), clock=clock, exact=exact, wire_bytes=wire_bytes,
                wall=time.perf_counter() - start_wall, cpu=time.process_time() - start_cpu)


def fit_exponent(xs: list[int], ys: list[float]) -> float | None:
    """Least-squares slope of log y against log x (y ∝ x^slope)."""
    if len(xs) < 2:
        return None
    lx, ly = np.log(np.array(xs, float)), np.log(np.array(ys, float))
    return float(np.polyfit(lx, ly, 1)[0])


def section_full(args) -> None:
    print(f"\n== full: every client real, d = {args.full_dim:,}, {args.dropout:.0%} vanish after sharing keys; "
          f"threads: {parallel.workers()}")
    for mode in args.full_modes:
        results = []
        print(f"\n{mode}:")
        print(f"{'n':>6} {'k':>3} {'t':>3} {'q':>5} {'client setup':>12} {'mask':>8} {'finish':>8} {'server':>9} "
              f"{'wire':>8} {'round':>9} {'round wall':>10}  sum   (seconds; client columns per client, CPU)")
        for n in args.full_clients:
            r = full_round(n, args.full_dim, mode == "authenticated", args)
            if not r["exact"]:
                raise SystemExit(f"sum mismatch in the full round n={n} ({mode})")
            c = r["clock"]
            per = {k: c[k].cpu / n for k in ("setup", "mask", "finish")}
            print(f"{n:6d} {r['k']:3d} {r['t']:3d} {r['q']:5d} {per['setup']:12.4f} {per['mask']:8.4f} "
                  f"{per['finish']:8.4f} {c['server'].cpu:9.2f} {c['wire'].cpu:8.2f} {r['cpu']:9.1f} {r['wall']:10.1f}  "
                  f"{'exact' if r['exact'] else 'MISMATCH'}   (load {load()})")
            results.append(r)
        if len(results) >= 2:
            ns = [r["n"] for r in results]
            per_client = [sum(r["clock"][k].cpu for k in ("setup", "mask", "finish")) / r["n"] for r in results]
            print(f"  growth: round CPU ∝ n^{fit_exponent(ns, [r['cpu'] for r in results]):.2f}, round wall ∝ "
                  f"n^{fit_exponent(ns, [r['wall'] for r in results]):.2f}, per-client CPU ∝ "
                  f"n^{fit_exponent(ns, per_client):.2f}, server CPU ∝ "
                  f"n^{fit_exponent(ns, [r['clock']['server'].cpu for r in results]):.2f}")


# ---- server section: the server alone, in a subprocess ----------------------------------------------


def _send_frame(stream, kind: bytes, payload: bytes = b"") -> None:
    stream.write(kind + struct.pack("<Q", len(payload)))
    stream.write(payload)


def _read_frame(stream) -> tuple[bytes, bytes]:
    head = stream.read(9)
    if len(head) != 9:
        raise EOFError("peer closed the pipe")
    (size,) = struct.unpack("<Q", head[1:])
    payload = stream.read(size)
    if len(payload) != size:
        raise EOFError("truncated frame")
    return head[:1], payload


def server_worker() -> None:
    """The server side of the ``server`` section: reads frames on stdin (C config, R message, P close
    phase, E end), writes the outboxes and, at the end, its clocks and peak memory as JSON."""
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    baseline_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    kind, payload = _read_frame(stdin)
    spec = json.loads(payload)
    p = spec["params"]
    params = GraphParams.explicit(p["n"], p["k"], p["t"], corrupt_bound=p["c"], dropout_rate=p["dropout"],
                                  authenticated=spec["authenticated"])
    keys = bytes.fromhex(spec["identity_keys"])
    server_key = ServerKey(X25519PrivateKey.from_private_bytes(bytes.fromhex(spec["server_key"])))
    config = SessionConfig(bytes.fromhex(spec["session_id"]), 0, params, dimension=spec["d"],
                           ring_bits=spec["ring_bits"], input_bound=spec["input_bound"],
                           server_key=server_key.public, authenticated=spec["authenticated"],
                           identity_keys=tuple(keys[32 * i : 32 * i + 32] for i in range(len(keys) // 32)))
    server = SecAggServer(config, server_key)
    clocks = {"receive": Clock(), "close": Clock()}
    phases = []
    while True:
        kind, payload = _read_frame(stdin)
        if kind == b"R":
            clocks["receive"].run(server.receive, decode(payload))
        elif kind == b"P":
            phase = server.phase.name.lower()
            close = Clock()
            outbox = close.run(server.close_phase)
            clocks["close"].wall += close.wall
            clocks["close"].cpu += close.cpu
            phases.append((phase, close.wall, close.cpu))
            _send_frame(stdout, b"O", struct.pack("<I", len(outbox)))
            for recipient, message in outbox.items():
                _send_frame(stdout, b"M", encode(message))
            stdout.flush()
        elif kind == b"E":
            result = server.result
            usage = resource.getrusage(resource.RUSAGE_SELF)
            report = dict(receive=[clocks["receive"].wall, clocks["receive"].cpu],
                          close=[clocks["close"].wall, clocks["close"].cpu], phases=phases,
                          peak_kib=usage.ru_maxrss, baseline_kib=baseline_kib,
                          total_digest=hashlib.sha256(result.total.tobytes()).hexdigest(),
                          survivors=len(result.survivors))
            _send_frame(stdout, b"J", json.dumps(report).encode())
            stdout.flush()
            return


def section_server(args) -> None:
    n, d = args.server_clients, args.server_dim
    authenticated = args.server_mode == "authenticated"
    params = choose_params(n, dropout_rate=args.dropout, corrupt_fraction=args.corrupt_fraction,
                           authenticated=authenticated)
    q = Quantizer.for_cohort(n, CLIP)
    identities = [Ed25519PrivateKey.generate() for _ in range(n)] if authenticated else []
    identity_keys = tuple(k.public_key().public_bytes_raw() for k in identities)
    server_key = ServerKey.generate()
    config = SessionConfig(os.urandom(16), 0, params, dimension=d, ring_bits=q.bits, input_bound=q.max_abs,
                           server_key=server_key.public, authenticated=authenticated, identity_keys=identity_keys)
    rng = np.random.default_rng([args.seed, 3])
    dropped = set(rng.choice(n, size=round(args.dropout * n), replace=False).tolist())
    rep = min(i for i in range(n) if i not in dropped)
    print(f"\n== server: n = {n:,}, d = {d:,}, {args.server_mode}, k = {params.degree}, t = {params.threshold}, "
          f"{len(dropped):,} clients ({args.dropout:.0%}) drop after sharing keys; server in a subprocess "
          f"(threads: {parallel.workers()}); load at start {load()}")
    spec = dict(params=dict(n=n, k=params.degree, t=params.threshold, c=params.corrupt_bound,
                            dropout=params.dropout_rate),
                authenticated=authenticated, session_id=config.session_id.hex(), d=d, ring_bits=q.bits,
                input_bound=q.max_abs, identity_keys=b"".join(identity_keys).hex(),
                server_key=server_key.private.private_bytes_raw().hex())  # to the worker, over a local pipe
    worker = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--server-worker"],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    to_server, from_server = worker.stdin, worker.stdout
    _send_frame(to_server, b"C", json.dumps(spec).encode())
    clients = [SecAggClient(config, i, identity_key=identities[i] if authenticated else None) for i in range(n)]
    rep_times = ClientTimes()
    main_start = time.perf_counter()

    def send(message) -> None:
        _send_frame(to_server, b"R", encode(message))

    def close() -> dict:
        _send_frame(to_server, b"P")
        to_server.flush()
        kind, payload = _read_frame(from_server)
        (count,) = struct.unpack("<I", payload)
        out = {}
        for _ in range(count):
            _, data = _read_frame(from_server)
            message = decode(data)
            out[message.recipient] = message
        return out

    def timed(i, step, fn, *a):
        t0 = time.perf_counter()
        out = fn(*a)
        if i == rep:
            setattr(rep_times, step, getattr(rep_times, step) + time.perf_counter() - t0)
        return out

    for c in clients:
        send(timed(c.id, "setup", c.advertise_keys))
    outbox = close()
    if not config.params.complete:  # the complete graph skips the graph-seed phase
        for i, m in outbox.items():
            send(timed(i, "setup", clients[i].reveal_graph_nonce, m))
        outbox = close()
    for i, m in outbox.items():
        if i == rep or i in dropped:
            send(timed(i, "setup", clients[i].share_keys, m))
        else:
            with stand_in_splits():
                send(clients[i].share_keys(m))
    for i, m in close().items():
        timed(i, "setup", clients[i].receive_shares, m)
        if i in dropped:
            continue
        if i == rep:
            ring = q.to_ring(update_of(args.seed, i, d), np.random.default_rng(1))
            send(timed(i, "mask", clients[i].mask, ring))
        else:
            with stand_in_masks(np.random.default_rng([args.seed, 2, i])), stand_in_splits():
                send(clients[i].mask(np.zeros(d, dtype=np.uint32)))
    outbox = close()
    if authenticated:
        for i, m in outbox.items():
            send(timed(i, "consistency", clients[i].consistency_check, m))
        outbox = close()
    for i, m in outbox.items():
        if i == rep:
            send(timed(i, "unmask", clients[i].unmask, m))
        else:
            with trusting_quorum():
                send(clients[i].unmask(m))
    close()
    _send_frame(to_server, b"E")
    to_server.flush()
    _, payload = _read_frame(from_server)
    report = json.loads(payload)
    worker.wait()
    wall = time.perf_counter() - main_start
    server_wall = report["receive"][0] + report["close"][0]
    server_cpu = report["receive"][1] + report["close"][1]
    print(f"  server: {server_wall:.1f} s wall, {server_cpu:.1f} s CPU (goal ≤ 600 s): receiving, checking, hashing "
          f"+ summing {report['survivors']:,} vectors {report['receive'][0]:.1f} s wall; closing phases "
          f"{report['close'][0]:.1f} s wall, of which:")
    for phase, w, c in report["phases"]:
        print(f"          close {phase:18s} {w:8.2f} s wall {c:8.2f} s CPU")
    print(f"  server peak resident memory: {report['peak_kib'] / 1024:.0f} MiB (goal ≤ 2048 MiB; the interpreter with "
          f"numpy and cryptography loaded: {report['baseline_kib'] / 1024:.0f} MiB)")
    print(f"  representative client {rep}: setup {fmt_s(rep_times.setup)} s, mask {fmt_s(rep_times.mask)} s, "
          f"consistency {fmt_s(rep_times.consistency)} s, unmask {fmt_s(rep_times.unmask)} s "
          f"(verifies the quorum of {params.signature_quorum:,} signatures)" if authenticated else
          f"  representative client {rep}: setup {fmt_s(rep_times.setup)} s, mask {fmt_s(rep_times.mask)} s, "
          f"unmask {fmt_s(rep_times.unmask)} s")
    print(f"  the whole bench run: {wall:.0f} s wall (clients, pipe and server); load at end {load()}; "
          "sum not checked (stand-in survivors)")


# ---- Flower's overflow point --------------------------------------------------------------------------


def section_flower_overflow(args) -> None:
    print("\n== flower-overflow: Flower SecAgg+ defaults (clipping_range 8, quantization_range 2^22, "
          "modulus_range 2^32)")
    if not flower_available():
        print("  flwr not installed")
        return
    from flwr.common.secure_aggregation.quantization import dequantize, quantize

    clip, qrange, modulus = 8.0, 1 << 22, 1 << 32
    print(f"  each value is quantized into [0, {qrange:,}]; the aggregate is taken mod {modulus:,}: it wraps once "
          f"n·(quantized values) ≥ 2^32 — at n ≥ {modulus // qrange:,} for updates at +clip (worst case), "
          f"n ≥ {modulus // (qrange // 2):,} for updates centred on 0")
    d = 1000
    for n in (1000, 1023, 1024, 2000, 2047, 2048, 2100, 2200):
        updates = np.random.default_rng(n).normal(0.0, 0.05, (n, d))
        total = np.zeros(d, dtype=np.int64)
        for row in updates:
            total = (total + quantize([row], clip, qrange)[0]) % modulus
        mean = (dequantize([total], clip, qrange)[0] - (n - 1) * clip) / n  # the workflow's offset
        err = float(np.max(np.abs(mean - updates.mean(axis=0))))
        worst = (n * qrange) % modulus != n * qrange
        print(f"  n = {n:5d}: centred updates decode with max error {err:9.4f} "
              f"({'wrapped' if err > 1e-3 else 'ok'}); updates at +clip would {'wrap' if worst else 'fit'}")
    print("  (Flower warns only when num_shares > modulus_range / quantization_range; it does not refuse the "
          "cohort. secfed sizes the scale to the cohort and refuses an overflowing one, naming the largest safe "
          "cohort: Quantizer.for_cohort, protocols.largest_cohort)")


# ---- the GIL ---------------------------------------------------------------------------------------------


def section_gil(args) -> None:
    print("\n== gil: does a pure-Python thread keep running during one long call?")
    big = bytes(128 << 20)
    out = bytearray(128 << 20)
    key = Ed25519PrivateKey.generate()
    public, message = key.public_key(), bytes(32 << 20)
    signature = key.sign(message)
    vector = np.ones(32 << 20, dtype=np.uint32)
    calls = {
        "AES-128-CTR update_into, 128 MiB": lambda: Cipher(algorithms.AES(bytes(16)), modes.CTR(bytes(16)))
        .encryptor().update_into(big, out),
        "SHA-256, 128 MiB": lambda: hashlib.sha256(big).digest(),
        "BLAKE3, 128 MiB": lambda: blake3(big).digest(),
        "Ed25519 verify, 32 MiB message": lambda: public.verify(signature, message),
        "numpy add, 32 Mi uint32": lambda: np.add(vector, vector, out=vector),
    }
    for name, call in calls.items():
        span = {}

        def run():
            t0 = time.perf_counter()
            call()
            span["call"] = (t0, time.perf_counter())

        thread = threading.Thread(target=run)
        thread.start()
        stamps = []
        while thread.is_alive():
            stamps.append(time.perf_counter())
        thread.join()
        t0, t1 = span["call"]
        inside = sum(1 for s in stamps if t0 <= s <= t1)
        gaps = np.diff(stamps) if len(stamps) > 1 else np.array([t1 - t0])
        held = float(gaps.max()) >= 0.9 * (t1 - t0)
        print(f"  {name:36s} call {1e3 * (t1 - t0):7.1f} ms; loop iterations meanwhile {inside:8d}; longest "
              f"stall {1e3 * float(gaps.max()):6.1f} ms -> {'HOLDS the GIL' if held else 'releases the GIL'}")


# ---- main ---------------------------------------------------------------------------------------------


def ints(text: str, what: str, ap) -> list[int]:
    try:
        out = [int(v) for v in text.split(",")]
    except ValueError:
        ap.error(f"{what} takes comma-separated integers, got {text!r}")
    return out


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sections", default="client",
                    help="comma-separated: client, keystream, full, server, flower-overflow, gil")
    ap.add_argument("--dims", default="1000000", help="client/keystream: vector lengths, comma-separated")
    ap.add_argument("--clients", default="10,100", help="client: cohort sizes, comma-separated")
    ap.add_argument("--variants", default="secagg,secaggplus", help="client: secagg (complete graph), secaggplus")
    ap.add_argument("--modes", default="authenticated,unauthenticated",
                    help="client: protocol modes, comma-separated; the first gives the server and Flower columns")
    ap.add_argument("--repeats", type=int, default=1, help="client: rounds per mode, alternating; fastest kept")
    ap.add_argument("--flower", choices=["auto", "all", "none"], default="auto")
    ap.add_argument("--full", action="store_true", help="client: every survivor masks for real in every round")
    ap.add_argument("--full-budget", type=float, default=5e9, help="client: AES words above which stand-ins are used")
    ap.add_argument("--keystream-neighbours", default="9,38,99", help="keystream: k values, comma-separated")
    ap.add_argument("--keystream-repeats", type=int, default=25, help="keystream: interleaved repeats, fastest kept")
    ap.add_argument("--full-clients", default="100,1000,10000", help="full: cohort sizes")
    ap.add_argument("--full-modes", default="unauthenticated", help="full: protocol modes, comma-separated")
    ap.add_argument("--full-dim", type=int, default=1000, help="full: vector length")
    ap.add_argument("--server-clients", type=int, default=10_000)
    ap.add_argument("--server-dim", type=int, default=1_000_000)
    ap.add_argument("--server-mode", choices=["authenticated", "unauthenticated"], default="authenticated")
    ap.add_argument("--dropout", type=float, default=0.1, help="fraction of clients that vanish (default 0.1)")
    ap.add_argument("--corrupt-fraction", type=float, default=0.2, help="γ for the (k, t) choice")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    args.sections = [s.strip() for s in args.sections.split(",")]
    known = ("client", "keystream", "full", "server", "flower-overflow", "gil")
    for s in args.sections:
        if s not in known:
            ap.error(f"--sections: unknown section {s!r} ({', '.join(known)})")
    args.dims = ints(args.dims, "--dims", ap)
    args.clients = ints(args.clients, "--clients", ap)
    args.keystream_neighbours = ints(args.keystream_neighbours, "--keystream-neighbours", ap)
    args.full_clients = ints(args.full_clients, "--full-clients", ap)
    if min(args.dims) < 1 or min(args.clients + args.full_clients) < 2 or min(args.keystream_neighbours) < 1:
        ap.error("--dims and --keystream-neighbours must be ≥ 1, cohorts ≥ 2")
    if args.full_dim < 1 or args.server_dim < 1 or args.server_clients < 2:
        ap.error("--full-dim and --server-dim must be ≥ 1, --server-clients ≥ 2")
    args.variants = [v.strip().lower() for v in args.variants.split(",")]
    for v in args.variants:
        if v not in ("secagg", "secaggplus"):
            ap.error(f"--variants: unknown variant {v!r} (secagg, secaggplus)")
    if not 0 <= args.dropout < 1:
        ap.error(f"--dropout must be in [0, 1), got {args.dropout}")
    for name in ("modes", "full_modes"):
        modes = [m.strip().lower() for m in getattr(args, name).split(",")]
        if not modes or any(m not in ("authenticated", "unauthenticated") for m in modes) or len(set(modes)) != len(modes):
            ap.error(f"--{name.replace('_', '-')}: authenticated and/or unauthenticated, each once; got {modes}")
        setattr(args, name, modes)
    if args.repeats < 1:
        ap.error(f"--repeats must be ≥ 1, got {args.repeats}")
    return args


SECTIONS = {"client": section_client, "keystream": section_keystream, "full": section_full,
            "server": section_server, "flower-overflow": section_flower_overflow, "gil": section_gil}


def main() -> None:
    if sys.argv[1:] == ["--server-worker"]:
        server_worker()
        return
    args = parse_args()
    print(f"secfed.protocols secure aggregation bench — {describe()}; protocol threads {parallel.workers()}")
    print(f"load average at start: {load()}")
    for section in args.sections:
        start = time.perf_counter()
        SECTIONS[section](args)
        print(f"   [{section}: {time.perf_counter() - start:.0f} s; load average now {load()}]")
    print(f"load average at end: {load()}")


if __name__ == "__main__":
    main()
