"""``server`` section: the server alone in a subprocess fed wire bytes over a pipe: n clients, d large,
10 % dropping after sharing keys; its seconds and peak resident memory (``ru_maxrss``).
Representative clients: all run every phase for real except that survivors other than the first
are stand-ins (:mod:`.standins`: a uniform vector with a genuine tag and signature instead of
masking, and no re-verification of the consistency quorum the first survivor verifies, its cost
printed). The clients run through the protocol's driver over :class:`PipeTransport`."""

from __future__ import annotations

import hashlib
import json
import resource
import struct
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from secfed.protocols import (
    GraphParams, Quantizer, SecAggServer, ServerKey, Session, SessionConfig, StepTime, choose_params, decode, drive,
    encode, parallel,
)
from secfed.protocols.secagg.messages import Message

from .client import ClientTimes
from .common import Clock, after_sharing_keys, dropped_clients, fmt_s, load, new_session, update_of
from .standins import stand_in_primitives

FRONT_DOOR = Path(__file__).resolve().parents[1] / "bench_secagg.py"  # runs server_worker on --server-worker


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


class PipeTransport:
    """The driver's transport to the server in its subprocess: each client message is one frame of
    wire bytes; closing a phase is a frame the worker answers with the outbox."""

    def __init__(self, to_server, from_server) -> None:
        self.to_server, self.from_server = to_server, from_server

    def upload(self, client: int, message: Message) -> None:
        _send_frame(self.to_server, b"R", encode(message))

    def download(self, client: int, message: Message) -> Message:
        return message  # already decoded from the worker's bytes

    def close_phase(self) -> dict[int, Message]:
        _send_frame(self.to_server, b"P")
        self.to_server.flush()
        _, payload = _read_frame(self.from_server)
        (count,) = struct.unpack("<I", payload)
        out = {}
        for _ in range(count):
            _, data = _read_frame(self.from_server)
            message = decode(data)
            out[message.recipient] = message
        return out


def section_server(args) -> None:
    """The ``server`` section: the clients here (the representative real, the other survivors
    stand-ins), the server in a subprocess; its report printed."""
    n, d = args.server_clients, args.server_dim
    authenticated = args.server_mode == "authenticated"
    params = choose_params(n, dropout_rate=args.dropout, corrupt_fraction=args.corrupt_fraction,
                           authenticated=authenticated)
    session, q = new_session(params, d, authenticated)
    dropped = dropped_clients(n, args.dropout, np.random.default_rng([args.seed, 3]))
    rep = min(i for i in range(n) if i not in dropped)
    print(f"\n== server: n = {n:,}, d = {d:,}, {args.server_mode}, k = {params.degree}, t = {params.threshold}, "
          f"{len(dropped):,} clients ({args.dropout:.0%}) drop after sharing keys; server in a subprocess "
          f"(threads: {parallel.workers()}); load at start {load()}")
    for i in range(n):
        if i != rep and i not in dropped:
            session.clients[i] = session.client(i, primitives=stand_in_primitives(np.random.default_rng([args.seed, 2, i])))
    worker = subprocess.Popen([sys.executable, str(FRONT_DOOR), "--server-worker"],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    _send_frame(worker.stdin, b"C", json.dumps(_worker_spec(session, q)).encode())
    rep_times, idle = ClientTimes(), np.zeros(d, dtype=np.uint32)

    def ring_input(i: int) -> np.ndarray:
        return q.to_ring(update_of(args.seed, i, d), np.random.default_rng(1)) if i == rep else idle

    def on_step(step: StepTime) -> None:
        if step.party == "client" and step.client == rep:
            rep_times.add(step)

    main_start = time.perf_counter()
    drive(session.clients, PipeTransport(worker.stdin, worker.stdout), ring_input,
          alive=after_sharing_keys(dropped), on_step=on_step)
    _send_frame(worker.stdin, b"E")
    worker.stdin.flush()
    report = json.loads(_read_frame(worker.stdout)[1])
    worker.wait()
    print_report(report, rep, rep_times, params, authenticated, time.perf_counter() - main_start)


def _worker_spec(session: Session, q: Quantizer) -> dict:
    """What the worker needs to build the same session's server (its private key goes over a local pipe)."""
    config, params = session.config, session.config.params
    return dict(params=dict(n=params.n_clients, k=params.degree, t=params.threshold, c=params.corrupt_bound,
                            dropout=params.dropout_rate),
                authenticated=config.authenticated, session_id=config.session_id.hex(), d=config.dimension,
                ring_bits=q.bits, input_bound=q.max_abs, identity_keys=b"".join(config.identity_keys).hex(),
                server_key=session.server_key.private.private_bytes_raw().hex())


def print_report(report: dict, rep: int, rep_times: ClientTimes, params, authenticated: bool, wall: float) -> None:
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
