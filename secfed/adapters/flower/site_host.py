"""A node's site host: one process per SuperNode that keeps the node's sites open between messages.

Flower 1.42 answers every message with a fresh ``flwr-clientapp`` process that serves it and exits.
For secfed's protocol phases that is cheap (no torch, ≈ 0.8 s CPU), but a train message would then
import torch and torchvision (≈ 3 s), rebuild the federation (every model, the splits) and load the
sites' state (≈ 2 s) to train for 0.6 s at toy size. So the messages that need the sites — hello,
train, evaluate (client_app.py) — run in this host instead: the ClientApp process hands it the
message's content and the node's context over a Unix socket in the node's state folder (created
0600: this user only) and relays the answer. Nothing of the node's data or state leaves the machine.

Lifecycle: the first message that needs the sites starts the host (a process of its own session,
so stopping the ClientApp's process group does not stop it). It serves one message at a time and
exits when the SuperNode that started it is gone, after ``secfed-host-idle`` seconds (node config,
default 600; 0 runs every message in its own process, as before), when a ClientApp of another
secfed build asks it (the code it would run is stale), or on :func:`stop`. Two ClientApps that start
a host at once end up with one: a host holds a lock on ``host.lock`` for its life, and a second exits.

What a host keeps equals what a fresh process would load: site state is still saved after every
training, a kept evaluation view reloads the sites' state before every use, and a message that
fails (or a site that diverges) makes the host forget the run's sites, so the next message opens
them from the folders. Between host and ClientApp only this module's frames cross: a JSON manifest
and raw byte blobs (no pickle). Everything here is standard library, for the socket and process
handling no package does better.
"""

from __future__ import annotations

import json
import os
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

from flwr.app import Array, ArrayRecord, ConfigRecord, Context, RecordDict

from secfed import locking

from . import node

IDLE_KEY = "secfed-host-idle"
DEFAULT_IDLE = 600.0
SOCKET_NAME = "host.sock"
LOG_NAME = "host.log"
LOCK_NAME = "host.lock"
START_TIMEOUT = 180.0  # a cold start imports torch and torchvision; a loaded machine takes a while
_FRAME = struct.Struct(">Q")
_MAX_BYTES = 1 << 36  # one frame or blob (64 GiB): a length past it is garbage, not a model
_CHUNK = 1 << 22
_READ_TIMEOUT = 60.0  # a ClientApp sends its message at once; a silent peer is not one
_PROTOCOL = 1

Handler = Callable[[str, RecordDict, Context], RecordDict]


class HostError(node.NodeSetupError):
    """The site host failed a message or was lost during one; names why."""


class HostUnavailable(HostError):
    """No site host could be started for this node (the ClientApp then does the work itself)."""


# ---- what the host keeps -----------------------------------------------------------------------------

_kept: dict[tuple[str, ...], Any] | None = None  # None outside a host: nothing is kept


def kept(key: tuple[str, ...]) -> Any:
    """The sites a host opened under ``key`` (None outside a host, or never opened)."""
    return None if _kept is None else _kept.get(key)


def keep(key: tuple[str, ...], value: Any) -> None:
    """In a host: keep ``value`` for the next message of the same run (at most one view per kind)."""
    if _kept is not None:
        for other in [k for k in _kept if k[-1] == key[-1] and k != key]:
            del _kept[other]  # another run's (or another configuration's) view of the same kind
        _kept[key] = value
        _log(f"opened the sites ({key[-1]} view)")


def forget() -> None:
    """Drop everything kept: the next message opens the sites from their folders."""
    if _kept is not None:
        _kept.clear()


# ---- settings and identity ---------------------------------------------------------------------------


def idle_seconds(node_config: Mapping[str, object]) -> float:
    """``secfed-host-idle`` from the node config: seconds a host waits for the next message (0: no host)."""
    return node.number(node_config.get(IDLE_KEY, DEFAULT_IDLE), IDLE_KEY, unit=" of seconds")


def identity() -> str:
    """This secfed build as a host sees it: a ClientApp of another build gets a fresh host."""
    import secfed
    import secfed.protocols

    roots = sorted({Path(m.__file__).resolve().parent for m in (secfed, secfed.protocols)})
    newest = max(f.stat().st_mtime_ns for root in roots for f in root.rglob("*.py"))
    return json.dumps([_PROTOCOL, secfed.__version__, sys.executable, [str(r) for r in roots], newest])


@contextmanager
def _address(folder: Path) -> Iterator[str]:
    """The socket's address: its path, or where that path is too long for AF_UNIX (≈ 108 bytes),
    the same file reached through an open descriptor of the folder (Linux)."""
    path = str(folder / SOCKET_NAME)
    if len(path) < 100:
        yield path
        return
    if not Path("/proc/self/fd").is_dir():
        raise HostUnavailable(f"{path}: too long for a Unix socket on this system")
    fd = os.open(folder, os.O_RDONLY)
    try:
        yield f"/proc/self/fd/{fd}/{SOCKET_NAME}"
    finally:
        os.close(fd)


# ---- frames: a JSON manifest, then raw blobs ---------------------------------------------------------


def _send(conn: socket.socket, header: dict, content: RecordDict | None = None) -> None:
    blobs: list[bytes] = []
    records = []
    for name, record in (content or RecordDict()).items():
        if isinstance(record, ConfigRecord):
            values = {}
            for key, value in record.items():
                if isinstance(value, bytes):
                    values[key] = ["bytes", len(blobs)]
                    blobs.append(value)
                else:
                    values[key] = ["json", value]
            records.append({"name": name, "config": values})
        elif isinstance(record, ArrayRecord):
            arrays = []
            for key, array in record.items():
                arrays.append([key, array.dtype, list(array.shape), array.stype, len(blobs)])
                blobs.append(array.data)
            records.append({"name": name, "arrays": arrays})
        else:
            raise HostError(f"record {name!r}: a {type(record).__name__} cannot go to the site host")
    manifest = json.dumps({**header, "records": records, "blobs": [len(b) for b in blobs]}).encode()
    conn.sendall(_FRAME.pack(len(manifest)) + manifest)
    for blob in blobs:
        conn.sendall(blob)


def _read(conn: socket.socket, n: int) -> bytes:
    if n > _MAX_BYTES:
        raise HostError(f"a frame of {n} bytes is over the limit")
    buffer = bytearray()  # grows with what arrives: a length alone allocates nothing
    while len(buffer) < n:
        chunk = conn.recv(min(n - len(buffer), _CHUNK))
        if not chunk:
            raise HostError("the peer closed the connection mid-message")
        buffer += chunk
    return bytes(buffer)


def _receive(conn: socket.socket) -> tuple[dict, RecordDict]:
    (size,) = _FRAME.unpack(_read(conn, _FRAME.size))
    try:
        manifest = json.loads(_read(conn, size))
        lengths = manifest.pop("blobs")
        if not isinstance(lengths, list) or not all(type(n) is int for n in lengths):
            raise TypeError("blob lengths must be integers")
    except (ValueError, TypeError, KeyError, AttributeError, RecursionError) as exc:
        raise HostError(f"a malformed manifest ({type(exc).__name__}: {exc})") from None
    blobs = [_read(conn, n) for n in lengths]
    try:
        content = RecordDict()
        for record in manifest.pop("records"):
            if "config" in record:
                content[record["name"]] = ConfigRecord({k: blobs[v] if kind == "bytes" else v
                                                        for k, (kind, v) in record["config"].items()})
            else:
                content[record["name"]] = ArrayRecord({key: Array(dtype=dtype, shape=tuple(shape), stype=stype,
                                                                  data=blobs[i])
                                                       for key, dtype, shape, stype, i in record["arrays"]})
    except Exception as exc:  # noqa: BLE001 - whatever a malformed manifest trips, it is named, not raised
        raise HostError(f"a malformed manifest ({type(exc).__name__}: {exc})") from None
    return manifest, content


# ---- the ClientApp's side ----------------------------------------------------------------------------


def call(op: str, content: RecordDict, context: Context) -> RecordDict:
    """Run ``op`` (a handler of client_app.py) for this node in its site host, starting one if none
    answers; the handler's reply content."""
    folder = node.state_dir(context.node_config)
    header = {"op": op, "identity": identity(), "run_id": context.run_id, "node_id": context.node_id,
              "node_config": dict(context.node_config)}
    for _ in range(2):  # a stale host answers once, then exits: the second try starts a fresh one
        with _connected(folder, context.node_config) as conn:
            _send(conn, header, content)
            reply, out = _receive(conn)
        if reply.get("leaving"):  # it left before reading this message: a fresh host runs it
            continue
        if reply.get("stale"):
            _wait_gone(folder)
            continue
        if "error" in reply:
            raise HostError(f"site host: {reply['error']}")
        return out
    raise HostUnavailable(f"the site host in {folder} keeps answering for another secfed build")


def stop(folder: Path) -> bool:
    """Ask the host of the node whose state folder is ``folder`` to exit; False if none answered."""
    try:
        with _address(folder) as address, socket.socket(socket.AF_UNIX) as conn:
            conn.connect(address)
            _send(conn, {"op": "stop", "identity": identity()})
            _receive(conn)
    except OSError:
        return False
    _wait_gone(folder)
    return True


def _try_connect(folder: Path) -> socket.socket | None:
    conn = socket.socket(socket.AF_UNIX)
    try:
        with _address(folder) as address:
            conn.connect(address)
        return conn
    except OSError:
        conn.close()
        return None


@contextmanager
def _connected(folder: Path, node_config: Mapping[str, object]) -> Iterator[socket.socket]:
    conn = _try_connect(folder) or _start(folder, node_config)
    try:
        yield conn
    except OSError as exc:
        raise HostError(f"lost the site host in {folder} ({exc}); see {folder / LOG_NAME}") from None
    finally:
        conn.close()


def _start(folder: Path, node_config: Mapping[str, object]) -> socket.socket:
    log = folder / LOG_NAME
    deadline, process = time.monotonic() + START_TIMEOUT, None
    while time.monotonic() < deadline:
        if process is None or process.poll() == 0:  # none yet, or it found a host leaving: start one
            with open(log, "ab") as err:
                os.chmod(log, 0o600)
                # -P, and the state folder as working folder: `-m` would put the SuperNode's working folder
                # first on the path, and a `secfed` planted there by another user ran as the node (review)
                process = subprocess.Popen(
                    [sys.executable, *(["-P"] if sys.version_info >= (3, 11) else []), "-m", __name__, str(folder),
                     "--watch", str(_supernode_pid()),
                     "--idle", str(idle_seconds(node_config))],
                    stdin=subprocess.DEVNULL, stdout=err, stderr=err, start_new_session=True, close_fds=True,
                    cwd=folder, env={**os.environ, "PYTHONSAFEPATH": "1",
                                     "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)})
        conn = _try_connect(folder)
        if conn is not None:
            return conn
        if process.poll() not in (None, 0):
            tail = log.read_text(errors="replace").strip().splitlines()[-5:]
            raise HostUnavailable(f"the site host exited with status {process.returncode}: " + " | ".join(tail))
        time.sleep(0.05)
    process.kill()
    raise HostUnavailable(f"the site host did not start within {START_TIMEOUT:.0f} s; see {log}")


def _supernode_pid() -> int:
    """The SuperNode this ClientApp serves: its parent, or as a warm fork (zygote.py) says."""
    from .zygote import SUPERNODE_PID_KEY

    try:
        return int(os.environ[SUPERNODE_PID_KEY])
    except (KeyError, ValueError):
        return os.getppid()


def _wait_gone(folder: Path, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while (folder / SOCKET_NAME).exists() and time.monotonic() < deadline:
        time.sleep(0.02)


# ---- the host ----------------------------------------------------------------------------------------


def _alive(pid: int) -> bool:
    """Whether process ``pid`` runs (pid 1 too: a SuperNode that is a container's entrypoint). A zombie
    does not: it has exited, and only its parent has yet to reap it (found by review: where nothing
    reaped the killed SuperNode, its host kept the sites' decoded images and models loaded)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # it exists, under another user
        pass
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:  # not Linux, or gone since
        return True
    return stat[stat.rfind(")") + 2:][:1] not in ("Z", "X")  # the state follows the command's closing ")"


def serve(folder: Path, watch: int, idle: float, handle: Handler) -> str:
    """Answer ClientApps on the socket in ``folder`` until idle, the SuperNode ``watch`` is gone, or
    asked to stop; returns why it stopped. ``handle(op, content, context)`` runs one message."""
    global _kept
    me = identity()
    with ExitStack() as hold:
        try:
            hold.enter_context(locking.exclusive(folder / LOCK_NAME))  # for the host's life: one host per node
        except locking.Held:
            return "another host serves this node"
        _kept = {}
        (folder / SOCKET_NAME).unlink(missing_ok=True)  # left by a host that was killed
        with _address(folder) as address, socket.socket(socket.AF_UNIX) as listener:
            node.bind_private(listener, address)
            listener.listen(4)
            listener.settimeout(0.5)
            try:
                return _answer(listener, watch, idle, handle, me)
            finally:
                (folder / SOCKET_NAME).unlink(missing_ok=True)  # no relay finds this host any more
                _turn_away(listener)


def _answer(listener: socket.socket, watch: int, idle: float, handle: Handler, me: str) -> str:
    """The host's loop: one message per connection on ``listener``; returns why it stopped."""
    last = time.monotonic()
    while True:
        if not _alive(watch):
            return "the SuperNode is gone"
        if time.monotonic() - last > idle:
            return f"idle for {idle:.0f} s"
        try:
            conn, _ = listener.accept()
        except TimeoutError:
            continue
        with conn:
            conn.settimeout(_READ_TIMEOUT)
            try:
                request, content = _receive(conn)
            except (OSError, MemoryError, HostError) as exc:
                _log(f"refused a malformed request ({exc})")
                continue
            if request.get("identity") != me:
                _send(conn, {"stale": True})
                return "a ClientApp of another secfed build asked"
            if request.get("op") == "stop":
                _send(conn, {})
                return "asked to stop"
            conn.settimeout(None)  # the ClientApp waits as long as training takes
            try:
                _send(conn, *_run(request, content, handle))
            except OSError as exc:  # the ClientApp went away: its SuperNode answers for it
                _log(f"could not answer {request['op']} ({exc})")
        last = time.monotonic()


def _turn_away(listener: socket.socket) -> None:
    """Tell the relays already queued on the socket that this host leaves without running them."""
    listener.setblocking(False)
    while True:
        try:
            conn, _ = listener.accept()
        except OSError:  # none queued
            return
        with conn:
            conn.settimeout(_READ_TIMEOUT)
            try:
                _receive(conn)
                _send(conn, {"leaving": True})
            except (OSError, MemoryError, HostError):
                pass


def _run(request: dict, content: RecordDict, handle: Handler) -> tuple[dict, RecordDict | None]:
    started = time.monotonic()
    try:
        context = Context(int(request["run_id"]), int(request["node_id"]), dict(request["node_config"]),
                          RecordDict(), {})
        out = handle(str(request["op"]), content, context)
    except Exception as exc:  # the ClientApp raises it on its side: Flower answers with an error
        forget()
        _log(f"{request.get('op')} failed: {type(exc).__name__}: {exc}")
        return {"error": f"{type(exc).__name__}: {exc}"}, None
    _log(f"{request['op']} for run {request['run_id']} in {time.monotonic() - started:.2f} s")
    return {}, out


def _log(line: str) -> None:
    print(f"{time.strftime('%Y-%m-%d %H:%M:%S')} [pid {os.getpid()}] {line}", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    import argparse

    from .client_app import handle

    parser = argparse.ArgumentParser(prog="python -m secfed.adapters.flower.site_host")
    parser.add_argument("folder", type=Path)
    parser.add_argument("--watch", type=int, required=True, help="exit when this process (the SuperNode) is gone")
    parser.add_argument("--idle", type=float, default=DEFAULT_IDLE)
    args = parser.parse_args(argv)
    _log(f"started for {args.folder} (SuperNode pid {args.watch})")
    _log(f"stopped: {serve(args.folder, args.watch, args.idle, handle)}")
    return 0


if __name__ == "__main__":  # run as -m: serve from the imported module, whose state client_app.py sees
    from secfed.adapters.flower.site_host import main as _main

    sys.exit(_main())
