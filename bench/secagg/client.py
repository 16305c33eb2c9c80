"""``client`` section: for each (d, n, variant) one round through the real state machines and wire
format, per protocol mode: the whole work of one representative survivor, its mask time ÷ the raw
AES-CTR keystream of the same bytes, the server's unmask, and Flower's SecAgg+ helpers on the same
inputs. Rounds whose survivors' masking would cost more than ``--full-budget`` AES words use
stand-in survivors (:mod:`.standins`)."""

from __future__ import annotations

import os
import time
from dataclasses import astuple, dataclass, field

import numpy as np
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from secfed.protocols import Phase, SecAggServer, StepTime, WireTransport, choose_params, drive, parallel

from .common import (
    after_sharing_keys, best_of, dropped_clients, fmt_s, new_session, raw_keystream_seconds, update_of,
)
from .flower import flower_available, flower_cost_ok, run_flower
from .standins import stand_in_primitives

# The representative client's steps, by the protocol method (or "quantize") the driver reports.
STEP_OF = {"advertise_keys": "setup", "reveal_graph_nonce": "setup", "share_keys": "setup",
           "receive_shares": "setup", "quantize": "quantize", "mask": "mask",
           "consistency_check": "consistency", "unmask": "unmask"}


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

    def add(self, step: StepTime) -> None:
        name = STEP_OF[step.step]
        setattr(self, name, getattr(self, name) + step.wall)

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
    dropped = dropped_clients(n, args.dropout, np.random.default_rng(args.seed))
    survivors = [i for i in range(n) if i not in dropped]
    row = Row(variant, n, d, first.degree, first.threshold, len(dropped))
    full = args.full or len(survivors) * (first.degree + 1) * d <= args.full_budget
    row.mode = "full" if full else "representative"
    best: dict[str, Round] = {}
    for _ in range(args.repeats):
        for mode in args.modes:
            result = run_round(params[mode], mode == "authenticated", d, dropped, full, args)
            if result.checked == "MISMATCH":
                raise SystemExit(f"sum mismatch in {variant} n={n} d={d} ({mode})")
            row.client[mode] = row.client[mode].fastest(result.client) if mode in row.client else result.client
            if mode not in best or result.unmask_s < best[mode].unmask_s:
                best[mode] = result
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
    """One round through the protocol's driver, timed through its hook: the representative (the
    first survivor) step by step, the server's receiving of masked inputs and its unmask."""
    n = params.n_clients
    session, q = new_session(params, d, authenticated)
    survivors = [i for i in range(n) if i not in dropped]
    rep = survivors[0]
    if not full:
        for i in survivors[1:]:
            session.clients[i] = session.client(i, primitives=stand_in_primitives(np.random.default_rng([args.seed, 2, i])))
    plain = np.zeros(d, dtype=np.uint64) if full else None
    quant_rng, idle = np.random.default_rng([args.seed, 1]), np.zeros(d, dtype=np.uint32)
    rep_update = update_of(args.seed, rep, d)  # made outside the timed step: quantize times to_ring alone

    def ring_input(i: int) -> np.ndarray:
        if not full and i != rep:
            return idle  # a stand-in never reads it
        ring = q.to_ring(rep_update if i == rep else update_of(args.seed, i, d), quant_rng)
        if plain is not None:
            np.add(plain, ring, out=plain)
        return ring

    times, server = ClientTimes(), {"receive": 0.0, "unmask": 0.0}

    def on_step(step: StepTime) -> None:
        if step.party == "client" and step.client == rep:
            times.add(step)
        elif step.party == "server" and step.step == "receive" and step.phase is Phase.MASKED_INPUT:
            server["receive"] += step.wall
        elif step.party == "server" and step.step == "close" and step.phase is Phase.UNMASK:
            server["unmask"] += step.wall

    transport = WireTransport(session.server, n, on_step)
    drive(session.clients, transport, ring_input, alive=after_sharing_keys(dropped), on_step=on_step)
    streams = 1 + len(session.server.graph.of(rep))  # every neighbour shared keys: drops come later
    keystream_s = best_of(5, lambda: raw_keystream_seconds(streams, d))
    keystream_threads_s = best_of(5, lambda: raw_keystream_seconds(streams, d, parallel.workers()))
    if plain is not None:
        expected = (plain & ((1 << q.bits) - 1)).astype(np.uint32)
        checked = "exact" if np.array_equal(session.server.result.total, expected) else "MISMATCH"
    else:
        checked = "not checked (stand-ins)"
    return Round(times, keystream_s, keystream_threads_s, server["receive"], server["unmask"], session.server,
                 transport.sent[rep], transport.received[rep], checked)


def section_client(args) -> None:
    """The ``client`` section: a row per (d, n, variant), then the summary table."""
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
