"""``full`` section: every client real — n clients and the server, every message encoded and decoded,
d small; CPU and wall seconds per client (setup = keys, nonce, key sharing, opening shares; mask;
finish = consistency check + unmask), server and wire, from the protocol driver's ``on_step`` hook;
the unmasked sum checked exactly; the growth exponent of the round's time in n fitted over the
cohorts run."""

from __future__ import annotations

import time

import numpy as np

from secfed.protocols import StepTime, WireTransport, choose_params, drive, parallel

from .common import Clock, after_sharing_keys, dropped_clients, load, new_session, update_of

# The clock each step of the driver's goes to (the ring input's quantization is in none but the round's).
CLOCK_OF = {("client", "advertise_keys"): "setup", ("client", "reveal_graph_nonce"): "setup",
            ("client", "share_keys"): "setup", ("client", "receive_shares"): "setup", ("client", "mask"): "mask",
            ("client", "consistency_check"): "finish", ("client", "unmask"): "finish",
            ("server", "receive"): "server", ("server", "close"): "server",
            ("wire", "upload"): "wire", ("wire", "download"): "wire"}


def full_round(n: int, d: int, authenticated: bool, args) -> dict:
    """One round with every client real; returns the clocks, the parameters and whether the sum is exact."""
    start_wall, start_cpu = time.perf_counter(), time.process_time()
    params = choose_params(n, dropout_rate=args.dropout, corrupt_fraction=args.corrupt_fraction,
                           authenticated=authenticated)
    session, q = new_session(params, d, authenticated)
    dropped = dropped_clients(n, args.dropout, np.random.default_rng([args.seed, n]))
    clock = {k: Clock() for k in ("setup", "mask", "finish", "server", "wire")}
    expected = np.zeros(d, dtype=np.uint64)
    quant_rng = np.random.default_rng([args.seed, 1])

    def ring_input(i: int) -> np.ndarray:
        ring = q.to_ring(update_of(args.seed, i, d), quant_rng)
        np.add(expected, ring, out=expected)
        return ring

    def on_step(step: StepTime) -> None:
        kind = CLOCK_OF.get((step.party, step.step))
        if kind is not None:
            clock[kind].add(step)

    transport = WireTransport(session.server, n, on_step)
    drive(session.clients, transport, ring_input, alive=after_sharing_keys(dropped), on_step=on_step)
    exact = np.array_equal(session.server.result.total, (expected & ((1 << q.bits) - 1)).astype(np.uint32))
    return dict(n=n, k=params.degree, t=params.threshold, q=params.signature_quorum if authenticated else 0,
                dropped=len(dropped), clock=clock, exact=exact,
                wire_bytes=sum(transport.sent) + sum(transport.received),
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
