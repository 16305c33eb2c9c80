"""Warm ClientApp processes for a Flower deployment on this machine (``Loopback``).

Flower 1.42's SuperNode starts ``flwr-clientapp`` for every message, and each one spends ≈ 0.75 s
of CPU importing Flower, numpy, cryptography and secfed's ClientApp before it answers in ≈ 0.1 s —
four times per node per round of authenticated secure aggregation, on cores the nodes share.
Here a zygote imports all that once; the ``flwr-clientapp`` command ``make_bin`` writes for a
Loopback is then a small script that hands its arguments, environment and standard streams to the
zygote over a Unix socket, and the zygote forks a child that runs Flower's own ``flwr-clientapp``
entry point on them: the same code, the same one process per message, its imports already done.
The script exits with the child's status. When no zygote answers, the script runs the entry
point itself, as before.

The zygote starts no thread of its own (numpy's OpenBLAS keeps an idle pool; a ClientApp calls no
BLAS routine), reaps its children (SIGCHLD ignored), refuses a malformed request without forking,
and leaves when its socket is gone or on SIGTERM. A child knows its
SuperNode as Flower tells it (``--parent-pid``; Flower's own monitor stops the child when that
process dies) and passes it on as ``SECFED_SUPERNODE_PID`` to what it starts (the site host).
Everything here is standard library: no package offers a fork server for a third party's CLI.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import struct
import sys
from pathlib import Path

ENV_KEY = "SECFED_CLIENTAPP_ZYGOTE"  # the socket's path, set in the Flower processes' environment
SUPERNODE_PID_KEY = "SECFED_SUPERNODE_PID"
_FRAME = struct.Struct(">I")

# The script make_bin writes as ``flwr-clientapp`` when a zygote serves: standard library only, so
# it starts in a few milliseconds. {fallback} runs the entry point in this process.
CLIENT = '''
import json as _json, os as _os, socket as _socket, struct as _struct

def _forked():
    path = _os.environ.get("{env}")
    if not path:
        return None
    conn = _socket.socket(_socket.AF_UNIX)
    try:
        conn.connect(path)
    except OSError:
        conn.close()
        return None
    request = _json.dumps({{"argv": sys.argv, "env": dict(_os.environ), "cwd": _os.getcwd(),
                           "supernode": _os.getppid()}}).encode()
    _socket.send_fds(conn, [_struct.pack(">I", len(request)) + request], [0, 1, 2])
    status = b""
    while True:
        chunk = conn.recv(4)
        if not chunk:
            break
        status += chunk
    return _struct.unpack(">i", status[:4])[0] if len(status) >= 4 else 1

_status = _forked()
if _status is not None:
    sys.exit(_status)
'''


def serve(path: Path, pull_backoff: float | None = None) -> None:
    """Import what a ClientApp needs, then fork one child per request on ``path`` (see the docstring).
    ``pull_backoff``: the children's first back-off for a message still arriving (pulls.py)."""
    from .launch import load_clientapp_entry
    from .node import bind_private
    from .pulls import CLIENTAPP, CLIENTAPP_PULL, quicken

    entry = load_clientapp_entry()
    if pull_backoff:
        quicken(CLIENTAPP, pull_backoff, function=CLIENTAPP_PULL)
    import secfed.adapters.flower.client_app  # noqa: F401 - the app every message loads

    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # children are reaped by the kernel
    path.unlink(missing_ok=True)
    with socket.socket(socket.AF_UNIX) as listener:
        bind_private(listener, str(path))
        listener.listen(16)
        listener.settimeout(1.0)
        while path.exists():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            with conn:
                conn.settimeout(10.0)
                fds: list[int] = []
                try:
                    head, fds, _, _ = socket.recv_fds(conn, 1 << 20, 3)
                    (size,) = _FRAME.unpack(head[:4])
                    body = head[4:]
                    while len(body) < size:
                        more = conn.recv(size - len(body))
                        if not more:
                            raise ConnectionError("request cut short")
                        body += more
                    request = json.loads(body)
                    if not isinstance(request, dict) or len(fds) != 3:
                        raise ValueError("not a request of the flwr-clientapp script")
                except (OSError, ValueError, struct.error, RecursionError) as exc:
                    print(f"secfed zygote: refused a request ({exc})", file=sys.stderr, flush=True)
                    for fd in fds:
                        os.close(fd)
                    continue
                if os.fork() == 0:
                    listener.close()
                    _child(entry, request, fds, conn)
                for fd in fds:
                    os.close(fd)


def _child(entry, request: dict, fds: list[int], conn: socket.socket) -> None:
    """In the forked child: become the ``flwr-clientapp`` process the script stands for."""
    status = 1
    try:
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
            os.close(fd)
        sys.stdin, sys.stdout, sys.stderr = (os.fdopen(0, "r"), os.fdopen(1, "w", buffering=1),
                                             os.fdopen(2, "w", buffering=1))
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        os.environ[SUPERNODE_PID_KEY] = str(request["supernode"])
        sys.argv = list(request["argv"])
        entry()
        status = 0
    except SystemExit as exc:
        status = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:  # noqa: BLE001 - a child never returns into the zygote's loop
        import traceback

        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
            conn.sendall(struct.pack(">i", status))
        finally:
            os._exit(status)


def main() -> None:
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    serve(Path(sys.argv[1]), float(sys.argv[2]) if len(sys.argv) > 2 else None)


if __name__ == "__main__":
    main()
