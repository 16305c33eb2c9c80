"""Secure aggregation cost: secfed.protocols at scale, against raw AES-CTR and Flower's SecAgg+ helpers.

    .venv/bin/python bench/bench_secagg.py [--sections client,keystream,full,server,flower-overflow,gil,identities,params]
        client:    [--dims 1000000] [--clients 10,100] [--variants secagg,secaggplus]
                   [--modes authenticated,unauthenticated] [--repeats 1] [--flower auto|all|none] [--full]
        keystream: [--keystream-neighbours 9,38,99] [--keystream-repeats 25] (at the first of --dims)
        full:      [--full-clients 100,1000,10000] [--full-modes unauthenticated] [--full-dim 1000]
        server:    [--server-clients 10000] [--server-dim 1000000] [--server-mode authenticated]
        identities: [--server-clients 10000]
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
* ``identities`` — building an authenticated SessionConfig of n clients: every identity key checked
  (canonical, not of small order: :mod:`secfed.protocols.edwards`) and all distinct; fresh keys, then
  the same keys again (cached), and one key's check.

Flower (``flwr``, dev extra): its SecAgg+ helpers composed as in its secaggplus mod and workflow
(SECP384R1 ECDH, Fernet, Shamir via pycryptodome on padded secrets, numpy RandomState masks on
int64); ``--flower auto`` runs them where they take under about a minute.

This file is the front door (command line, header, the section loop); each section is a module of
bench/secagg/, and every round runs through the protocol's own phase driver
(:func:`secfed.protocols.drive`), timed through its ``on_step`` hook.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from secagg import client, flower_overflow, full, gil, identities, keystream, params, server  # noqa: E402
from secagg.common import load  # noqa: E402

from secfed.environment import describe  # noqa: E402
from secfed.protocols import parallel  # noqa: E402


def ints(text: str, what: str, ap) -> list[int]:
    try:
        out = [int(v) for v in text.split(",")]
    except ValueError:
        ap.error(f"{what} takes comma-separated integers, got {text!r}")
    return out


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sections", default="client",
                    help="comma-separated: client, keystream, full, server, flower-overflow, gil, identities, params")
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
    known = tuple(SECTIONS)
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


SECTIONS = {"client": client.section_client, "keystream": keystream.section_keystream, "full": full.section_full,
            "server": server.section_server, "flower-overflow": flower_overflow.section_flower_overflow,
            "gil": gil.section_gil, "identities": identities.section_identities, "params": params.section_params}


def main() -> None:
    if sys.argv[1:] == ["--server-worker"]:
        server.server_worker()
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
