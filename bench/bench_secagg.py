"""Secure aggregation cost: secfed.protocols against raw AES-CTR and against Flower's SecAgg+ helpers.

    .venv/bin/python bench/bench_secagg.py [--dims 1000000,23500000] [--clients 10,100]
        [--variants secagg,secaggplus] [--modes authenticated,unauthenticated] [--repeats 1]
        [--dropout 0.1] [--flower auto|all|none] [--full]

For each (d, n, variant) one round runs through the real state machines and the real wire
format, once per protocol mode (``--modes``; authenticated is the default of the protocol layer,
unauthenticated the weaker honest-but-curious variant), ``--repeats`` times alternating the
modes: (k, t) from ``choose_params`` (SecAgg = complete graph), 10 % of the clients chosen at
random vanish after sharing keys and before uploading (the costly case: the server must rebuild
their keys and remove their masks from every surviving neighbour's vector). Reported:

* client: the whole work of one representative survivor in a round — setup (keys, graph nonce,
  checking the roster and, authenticated, its signatures; Shamir splits, sealing, opening shares),
  quantize, mask (masks, self-mask shares, the input's tag and signature), consistency check
  (authenticated) and unmask — per mode, and authenticated ÷ unauthenticated (goal ≤ 1.10 at
  d = 1M, n = 100); mask time / raw keystream time for the same number of AES-CTR bytes (goal ≤ 2×);
* server (first mode): unmask = rebuild seeds, check every input's tag, regenerate the survivors'
  self masks and the dropped clients' pairwise masks, and its time / raw keystream time for those
  streams (receiving, checking and summing the vectors is shown apart);
* bytes up / down of the representative client on the wire (first mode).

Rounds where the survivors' masking would cost more than ``--full-budget`` AES words (the big
ones: n = 100 with SecAgg, or at d = 23.5M) time the representative client for real; the other
survivors are scaffolding: they upload uniformly random vectors instead of masking and skip the
Shamir split of seeds the server will never rebuild. The server cannot tell a random vector from
a masked input and does exactly the same work, so its timing is unchanged, but the sum is then
not checked (it is checked in every other round, and with ``--full`` in all of them). The
clients that drop and the representative always run for real. Times are the fastest of the
repeats.

Flower (``flwr``, dev extra): the same inputs and (k, t) go through Flower's SecAgg+ helpers,
composed as in its secaggplus mod and workflow (SECP384R1 ECDH, Fernet, Shamir via
pycryptodome on padded secrets, numpy RandomState masks on int64). Its server work is
quadratic-ish and slow, so ``--flower auto`` (default) runs it only where it takes under about a
minute; ``--flower all`` runs it everywhere (≈ 12 min more on 2 cores). Flower's helpers have no
authenticated mode; its ratios are to secfed's first mode.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import platform
import sys
import time
from contextlib import contextmanager
from dataclasses import astuple, dataclass, field
from unittest import mock

import numpy as np
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from secfed.protocols import Quantizer, SecAggClient, SecAggServer, SessionConfig, choose_params, decode, encode
from secfed.protocols import shamir
from secfed.protocols.prg import CHUNK_WORDS
from secfed.protocols.secagg import client as client_module

CLIP = 1.0


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


def update_of(seed: int, client: int, d: int) -> np.ndarray:
    """Client ``client``'s float32 update: deterministic, generated when needed (n·d floats do not fit)."""
    return np.random.default_rng([seed, client]).normal(0.0, 0.05, d).astype(np.float32)


def raw_keystream_seconds(streams: int, d: int) -> float:
    """AES-128-CTR keystream for ``streams`` × d words, in the chunks apply_masks uses, nothing else."""
    zeros, buf = bytes(4 * CHUNK_WORDS), bytearray(4 * CHUNK_WORDS)
    ciphers = [Cipher(algorithms.AES(os.urandom(16)), modes.CTR(bytes(16))).encryptor() for _ in range(streams)]
    view = memoryview(zeros)
    start = time.perf_counter()
    for lo in range(0, d, CHUNK_WORDS):
        n = min(CHUNK_WORDS, d - lo)
        for c in ciphers:
            c.update_into(view[: 4 * n], buf)
    return time.perf_counter() - start


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
    """A scaffolding survivor uploads a uniform vector (what a masked input looks like) instead of masking."""

    def fill(acc, streams, *, bits):
        acc[:] = np.frombuffer(rng.bytes(4 * acc.size), dtype="<u4") & ((1 << bits) - 1)

    with mock.patch.object(client_module, "apply_masks", fill):
        yield


@contextmanager
def stand_in_splits():
    """A scaffolding survivor skips Shamir: the server never rebuilds its seeds (it reveals its own
    self-mask seed, and its key seed is never needed), so its shares only travel, unused."""

    def split(secret, threshold, count):
        return [shamir.Share(i, bytes(shamir.SECRET_BYTES)) for i in range(1, count + 1)]

    with mock.patch.object(client_module.shamir, "split", split):
        yield


@dataclass
class Round:
    """What one secfed round measured (for the row it belongs to)."""

    client: ClientTimes
    keystream_s: float
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
    row.keystream_s, row.receive_s, row.unmask_s = lead.keystream_s, lead.receive_s, lead.unmask_s
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
    config = SessionConfig(os.urandom(16), 0, params, dimension=d, ring_bits=q.bits, input_bound=q.max_abs,
                           authenticated=authenticated,
                           identity_keys=tuple(k.public_key().public_bytes_raw() for k in identities))
    survivors = [i for i in range(n) if i not in dropped]
    rep = survivors[0]
    clients = [SecAggClient(config, i, identity_key=identities[i] if authenticated else None) for i in range(n)]
    server = SecAggServer(config)
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
    for i, commitments in server.close_phase().items():
        send(i, timed(i, "setup", clients[i].reveal_graph_nonce, fetch(i, commitments)))
    for i, roster in server.close_phase().items():
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
    keystream_s = raw_keystream_seconds(1 + len(deliveries[rep].shares), d)
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
    return Round(times, keystream_s, receive, unmask_s, server, up[rep], down[rep], checked)


# ---- Flower ------------------------------------------------------------------------------------


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
    shamir = (survivors * 3 + dropped * 12) * row.t * 0.003
    return streams * row.d * 23e-9 + shamir < 60.0


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


# ---- report ------------------------------------------------------------------------------------


def fmt_s(v: float | None) -> str:
    return "-" if v is None else (f"{v:.3f}" if v < 10 else f"{v:.1f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dims", default="1000000,23500000", help="vector lengths, comma-separated")
    ap.add_argument("--clients", default="10,100", help="cohort sizes, comma-separated")
    ap.add_argument("--variants", default="secagg,secaggplus", help="secagg (complete graph), secaggplus")
    ap.add_argument("--modes", default="authenticated,unauthenticated",
                    help="protocol modes to time, comma-separated; the first gives the server and Flower columns")
    ap.add_argument("--repeats", type=int, default=1, help="rounds per mode, alternating; fastest kept")
    ap.add_argument("--dropout", type=float, default=0.1, help="fraction of clients that vanish (default 0.1)")
    ap.add_argument("--corrupt-fraction", type=float, default=0.2, help="γ for the (k, t) choice")
    ap.add_argument("--flower", choices=["auto", "all", "none"], default="auto")
    ap.add_argument("--full", action="store_true", help="every survivor masks for real in every round")
    ap.add_argument("--full-budget", type=float, default=5e9, help="AES words above which stand-ins are used")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    try:
        dims = [int(v) for v in args.dims.split(",")]
        cohorts = [int(v) for v in args.clients.split(",")]
    except ValueError:
        ap.error(f"--dims and --clients take comma-separated integers, got {args.dims!r} / {args.clients!r}")
    if min(dims) < 1 or min(cohorts) < 2:
        ap.error(f"--dims must be ≥ 1 and --clients ≥ 2, got {dims} / {cohorts}")
    variants = [v.strip().lower() for v in args.variants.split(",")]
    for v in variants:
        if v not in ("secagg", "secaggplus"):
            ap.error(f"--variants: unknown variant {v!r} (secagg, secaggplus)")
    if not 0 <= args.dropout < 1:
        ap.error(f"--dropout must be in [0, 1), got {args.dropout}")
    args.modes = [m.strip().lower() for m in args.modes.split(",")]
    if not args.modes or any(m not in ("authenticated", "unauthenticated") for m in args.modes) \
            or len(set(args.modes)) != len(args.modes):
        ap.error(f"--modes: authenticated and/or unauthenticated, each once; got {args.modes}")
    if args.repeats < 1:
        ap.error(f"--repeats must be ≥ 1, got {args.repeats}")
    flower = args.flower if flower_available() else "none"

    print(f"secfed.protocols secure aggregation bench — {platform.processor() or platform.machine()}, "
          f"{os.cpu_count()} CPUs, Python {sys.version.split()[0]}, numpy {np.__version__}")
    print(f"dropouts: {args.dropout:.0%} of clients vanish after sharing keys; γ = {args.corrupt_fraction}; "
          f"modes: {', '.join(args.modes)} (×{args.repeats}, fastest kept); "
          f"Flower: {flower if flower_available() else 'not installed'}")
    print(f"load average at start: {', '.join(f'{v:.2f}' for v in os.getloadavg())}")
    rows = []
    for d in dims:
        for n in cohorts:
            for variant in variants:
                row = run_secfed(variant, n, d, args)
                if flower != "none" and flower_cost_ok(row, flower):
                    run_flower(row, args)
                elif flower != "none":
                    row.flower_note = "skipped (slow; --flower all)"
                rows.append(row)
                print_row(row)
    print_summary(rows)
    print(f"load average at end: {', '.join(f'{v:.2f}' for v in os.getloadavg())}")


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
          f"{fmt_s(r.keystream_s)} s: ratio {r.mask_s / r.keystream_s:.2f}x")
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
    head = f"{'variant':10} {'n':>4} {'d':>11} {'k':>3} {'t':>3} {'client':>7} {'unauth':>7} {'ratio':>6} " \
           f"{'quant':>6} {'mask':>7} {'mask/AES':>8} {'unmask':>7} {'up/f32':>7} {'fl.mask':>8} {'x':>5} " \
           f"{'fl.unmask':>9} {'x':>5}"
    print(head)
    for r in rows:
        fc = "" if r.flower_client_s is None else f"{r.flower_client_s / r.mask_s:5.1f}"
        fs = "" if r.flower_server_s is None else f"{r.flower_server_s / r.unmask_s:5.1f}"
        unauth = r.client.get("unauthenticated")
        ratio = "" if r.auth_ratio is None else f"{r.auth_ratio:6.3f}"
        print(f"{r.variant:10} {r.n:4d} {r.d:11,d} {r.k:3d} {r.t:3d} {fmt_s(r.first.total):>7} "
              f"{fmt_s(unauth.total if unauth else None):>7} {ratio:>6} {fmt_s(r.quantize_s):>6} {fmt_s(r.mask_s):>7} "
              f"{r.mask_s / r.keystream_s:8.2f} {fmt_s(r.unmask_s):>7} {r.up_bytes / (4 * r.d):7.4f} "
              f"{fmt_s(r.flower_client_s):>8} {fc:>5} {fmt_s(r.flower_server_s):>9} {fs:>5}")
    print("goals: authenticated ÷ unauthenticated client ≤ 1.10; mask/AES ≤ 2x; upload ≤ 1.05x float32;")
    print("       Flower ≥ 5x slower client masking, ≥ 8x slower server")
    print("(client/quant/mask/unmask/up: the first mode; mask = masks + self-mask shares + tag/signature)")


if __name__ == "__main__":
    main()
