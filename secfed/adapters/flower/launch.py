"""A Flower Deployment Engine on this machine: one SuperLink, N SuperNodes, ``flwr run`` — each a
process of its own on 127.0.0.1, for ``secfed flower local``, the loopback tests and the bench.

Every process gets telemetry and update checks off (``FLWR_TELEMETRY_ENABLED=0``,
``FLWR_DISABLE_UPDATE_CHECK=1``) and ``FLWR_HOME`` inside the work folder. SuperLink and
SuperNodes start their own helpers (``flower-superexec``, ``flwr-clientapp``, ``flwr-serverapp``)
by name from ``PATH``; the work folder's ``bin/`` holds those commands bound to this
interpreter, so every Flower process runs the secfed that started them. Each process leads its
own process group: :meth:`Loopback.kill` and :meth:`Loopback.close` stop a SuperNode or the whole
deployment with everything it spawned, and nothing outlives the ``with`` block. The SuperNodes'
ClientApp processes are forks of one warm zygote (zygote.py; ``warm_clientapps=False`` for fresh
interpreters, as a stock SuperNode starts them).

With ``tls=True`` the SuperLink serves TLS with a certificate from a CA made offline (certs.py);
with ``node_auth=True`` as well (the default of ``secfed flower local``) it accepts only
registered SuperNodes: each node has a P-384 key, registered with ``flwr supernode register``
before it starts. (A registered node that dies can come back only once the SuperLink has
retired it, after its heartbeat expired.)
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from importlib.metadata import entry_points
from pathlib import Path

from . import certs, node, zygote

FLOWER_ENV = {"FLWR_TELEMETRY_ENABLED": "0", "FLWR_DISABLE_UPDATE_CHECK": "1"}
# Every SuperNode on this machine trains with the run's torch threads (the thread count is part of
# what makes a run bit-identical to an in-process one), so N nodes oversubscribe the cores. OpenMP's
# default wait policy then spins on every barrier while the thread it waits for is descheduled: a
# toy train message took ≈ 20 s instead of ≈ 5 s (bench/RESULTS.md, 2026-11-27). Passive waiting
# changes no result, only who holds the core; a user's own OMP_WAIT_POLICY wins.
SHARED_CORES_ENV = {"OMP_WAIT_POLICY": "PASSIVE"}
CONNECTION = "loopback"
DEFAULT_TASK_POLL = "0.1"  # SuperExec's task poll (Flower's default 1 s); see bench/RESULTS.md


class LaunchError(RuntimeError):
    """A Flower process did not start or a run failed; the message names its log file."""


def toml_value(value: object) -> str:
    """A TOML literal for a run-config value (JSON's string escapes are TOML's)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    raise TypeError(f"run config values are bool, int, float or str; got {type(value).__name__}")


def write_app(folder: Path, *, name: str, serverapp: str, clientapp: str, config: Mapping[str, object],
              files: Mapping[str, str] = {}) -> Path:
    """A Flower app folder (what ``flwr run`` bundles): pyproject.toml naming the two components,
    the run config with its defaults, and ``files`` (modules shipped with the app)."""
    folder.mkdir(parents=True, exist_ok=True)
    lines = [
        "[build-system]", 'requires = ["hatchling"]', 'build-backend = "hatchling.build"', "",
        "[project]", f'name = "{name}"', 'version = "1.0.0"', 'description = "secfed on Flower"',
        'license = "Apache-2.0"', "dependencies = []", "",
        "[tool.flwr.app]", 'publisher = "secfed"', "",
        "[tool.flwr.app.components]", f'serverapp = "{serverapp}"', f'clientapp = "{clientapp}"', "",
        "[tool.flwr.app.config]", *(f'"{k}" = {toml_value(v)}' for k, v in config.items()),
    ]
    (folder / "pyproject.toml").write_text("\n".join(lines) + "\n")
    for relative, text in files.items():
        (folder / relative).write_text(text)
    return folder


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_for_port(port: int, process: subprocess.Popen, log: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise LaunchError(f"process exited with code {process.returncode}; see {log}")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise LaunchError(f"nothing listens on 127.0.0.1:{port} after {timeout:.0f} s; see {log}")


@dataclass
class _Proc:
    name: str
    process: subprocess.Popen
    log: Path

    def signal(self, sig: int) -> None:
        """``sig`` to the process and everything it started (its process group)."""
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, sig)

    def stop(self, grace: float = 5.0) -> None:
        with _signals_held():
            _stop_all([self], grace)


def _running_from(folders: Sequence[Path]) -> list[int]:
    """This user's other processes whose command line names one of ``folders`` (a script in it, or the
    folder itself as an argument); from Linux's /proc, none elsewhere."""
    found = []
    for entry in Path("/proc").iterdir() if Path("/proc").is_dir() else []:
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            with contextlib.suppress(OSError):
                words = (entry / "cmdline").read_bytes().split(b"\0")
                if entry.stat().st_uid == os.getuid() and any(
                        w == str(f).encode() or w.startswith(str(f).encode() + b"/") for w in words for f in folders):
                    found.append(int(entry.name))
    return found


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    with contextlib.suppress(OSError):  # a zombie (exited, not yet reaped by its parent) is gone
        return (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    return True


@contextlib.contextmanager
def _signals_held() -> Iterator[None]:
    """Ctrl-C, SIGTERM and SIGHUP held while the block stops processes, and raised after it (found by
    review: a closed terminal sends two SIGHUPs, and the second, landing in the cleanup, left the
    SuperLink and the zygote running). Recorded, not masked: a mask holds only this thread, and the
    kernel hands a process signal to any other (torch's, here)."""
    caught: list[int] = []
    main = threading.current_thread() is threading.main_thread()
    previous = {sig: signal.signal(sig, lambda sig, frame: caught.append(sig))
                for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)} if main else {}
    try:
        yield
    finally:
        for sig, handler in previous.items():  # None: a handler set outside Python, which cannot be put back
            signal.signal(sig, signal.SIG_DFL if handler is None else handler)
        if any(previous[sig] is not signal.SIG_IGN for sig in caught):
            raise KeyboardInterrupt  # what was held, now that every process is stopped


def _stop_all(procs: Sequence[_Proc], grace: float = 5.0) -> None:
    """SIGTERM to every process group at once, SIGKILL to those still up after ``grace`` seconds."""
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
        for proc in procs:
            proc.signal(sig)
        deadline = time.monotonic() + wait
        for proc in procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.process.wait(max(0.0, deadline - time.monotonic()))
        if all(proc.process.poll() is not None for proc in procs):
            return


class Loopback:
    """A SuperLink and ``supernodes`` SuperNodes on 127.0.0.1 (see the module docstring).

    ``node_configs[i]``: node config of SuperNode i (``partition-id``/``num-partitions`` are added).
    ``tls``/``node_auth``: see the module docstring.
    ``env``: extra environment for every Flower process. ``node_poll``: cap Flower's fixed
    SuperNode polls (3 s idle, 0.5 s for replies) at this many seconds, and make it the first
    back-off of the SuperNodes' and ClientApps' pulls of a message still arriving (pulls.py).
    ``warm_clientapps``: the SuperNodes' ClientApp processes are forks of one warm zygote
    (zygote.py) instead of fresh interpreters; the same code runs either way.
    """

    def __init__(self, workdir: Path, *, supernodes: int, node_configs: Sequence[Mapping[str, object]] = (),
                 tls: bool = False, node_auth: bool = False, env: Mapping[str, str] | None = None,
                 start_timeout: float = 60.0, node_poll: float | None = None, warm_clientapps: bool = True) -> None:
        if node_auth and not tls:
            raise ValueError("SuperNode authentication needs TLS (Flower refuses it on an insecure channel)")
        self.workdir = Path(workdir).resolve()
        self.n, self.tls, self.node_auth = supernodes, tls, node_auth
        self.start_timeout, self.node_poll = start_timeout, node_poll
        self.node_configs = [dict(node_configs[i]) if i < len(node_configs) else {} for i in range(supernodes)]
        self.bin = self.workdir / "bin"
        self.logs = self.workdir / "logs"
        self.home = self.workdir / "flwr-home"
        self.env = {**SHARED_CORES_ENV, **os.environ, **FLOWER_ENV, "FLWR_HOME": str(self.home),
                    "FLWR_SUPEREXEC_TASK_POLL_INTERVAL": DEFAULT_TASK_POLL,
                    "PATH": f"{self.bin}{os.pathsep}{os.environ.get('PATH', '')}", **(env or {})}
        self.port = 0
        self.superlink: _Proc | None = None
        self.nodes: list[_Proc | None] = [None] * supernodes
        self.pki: certs.Pki | None = None
        self.warm_clientapps = warm_clientapps
        self.zygote: _Proc | None = None
        self._zygote_dir: Path | None = None

    # ---- lifecycle ------------------------------------------------------------------------------

    def __enter__(self) -> Loopback:
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self) -> None:
        for folder in (self.bin, self.logs, self.home):
            folder.mkdir(parents=True, exist_ok=True)
        make_bin(self.bin, node_poll=self.node_poll)
        self.port = free_port()
        if self.tls:
            self.pki = certs.make_pki(self.workdir / "pki", nodes=self.n, replace=True)  # its own folder
        self._write_connection()
        cmd = ["flower-superlink", "--disable-runtime-dependency-installation", "--host", "127.0.0.1",
               "--port", str(self.port)]
        if self.tls:
            cmd += ["--ssl-certfile", str(self.pki.server_cert), "--ssl-keyfile", str(self.pki.server_key),
                    "--ssl-ca-certfile", str(self.pki.ca_cert)]
            cmd += ["--enable-supernode-auth"] if self.node_auth else []
        else:
            cmd += ["--insecure"]
        self.superlink = self._spawn("superlink", cmd)
        if self.warm_clientapps:
            self._start_zygote()
        _wait_for_port(self.port, self.superlink.process, self.superlink.log, self.start_timeout)
        for i in range(self.n):
            if self.node_auth:
                self.flwr("supernode", "register", str(self.pki.node_public[i]), CONNECTION)
            self.start_node(i)

    def start_node(self, i: int) -> None:
        """Start (or restart) SuperNode ``i``."""
        config = {"partition-id": i, "num-partitions": self.n, **self.node_configs[i]}
        cmd = ["flower-supernode", "--superlink", f"127.0.0.1:{self.port}", "--port", str(free_port()),
               "--node-config", " ".join(f"{k}={toml_value(v)}" for k, v in config.items())]
        if self.tls:
            cmd += ["--root-certificates", str(self.pki.ca_cert)]
            cmd += ["--auth-supernode-private-key", str(self.pki.node_private[i])] if self.node_auth else []
        else:
            cmd += ["--insecure"]
        self.nodes[i] = self._spawn(f"supernode-{i}", cmd)

    def kill(self, i: int) -> None:
        """SIGKILL SuperNode ``i`` and every process it started (a machine that vanishes)."""
        proc = self.nodes[i]
        if proc is not None and proc.process.poll() is None:
            os.killpg(proc.process.pid, signal.SIGKILL)
            proc.process.wait(10)

    def close(self) -> None:
        with _signals_held():
            self._stop_everything()

    def _stop_everything(self) -> None:
        _stop_all([proc for proc in [*self.nodes, self.superlink, self.zygote] if proc is not None])
        # A ServerApp process leaves the SuperLink's process group (found by review: one outlived a SIGTERM
        # mid-run), and a node's site host its ClientApp's. Every Flower process of this deployment runs a
        # script of ``bin/``, and a site host names its node's state folder: those still up go too.
        folders = [self.bin, *(Path(str(c[node.STATE_DIR_KEY])).resolve() for c in self.node_configs
                               if node.STATE_DIR_KEY in c)]
        for sig in (signal.SIGTERM, signal.SIGKILL):
            strays = _running_from(folders)
            for pid in strays:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, sig)
            deadline = time.monotonic() + 5.0
            while strays and time.monotonic() < deadline:
                strays = [pid for pid in strays if _alive(pid)]
                time.sleep(0.05)
        if self._zygote_dir is not None:
            shutil.rmtree(self._zygote_dir, ignore_errors=True)

    def _start_zygote(self) -> None:
        # AF_UNIX paths are limited to ≈ 108 bytes: the socket lives in a short private folder
        self._zygote_dir = Path(tempfile.mkdtemp(prefix="secfed-z-"))
        path = self._zygote_dir / "clientapp.sock"
        backoff = [str(float(self.node_poll))] if self.node_poll else []  # its ClientApps' first pull back-off
        self.zygote = self._spawn("zygote", [sys.executable, "-m", "secfed.adapters.flower.zygote", str(path), *backoff])
        deadline = time.monotonic() + self.start_timeout
        while not path.exists():
            if self.zygote.process.poll() is not None or time.monotonic() > deadline:
                raise LaunchError(f"the ClientApp zygote did not start; see {self.zygote.log}")
            time.sleep(0.05)
        self.env[zygote.ENV_KEY] = str(path)

    # ---- runs ---------------------------------------------------------------------------------------

    def flwr(self, *args: str, timeout: float = 120.0) -> subprocess.CompletedProcess:
        """Run the ``flwr`` CLI against this deployment; LaunchError if it fails."""
        out = subprocess.run(["flwr", *args], env=self.env, cwd=self.workdir, capture_output=True, text=True,
                             timeout=timeout)
        if out.returncode != 0:
            raise LaunchError(f"flwr {' '.join(args)} failed ({out.returncode}):\n{out.stdout}\n{out.stderr}")
        return out

    def run(self, app: Path, *, timeout: float = 600.0, stream_to: Path | None = None) -> subprocess.Popen:
        """Submit ``app`` and stream its logs (to ``stream_to``); returns the ``flwr run`` process."""
        log = open(stream_to or self.logs / "flwr-run.log", "w")  # noqa: SIM115 - owned by the process
        return subprocess.Popen(["flwr", "run", str(app), CONNECTION, "--stream"], env=self.env, cwd=self.workdir,
                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    # ---- helpers -------------------------------------------------------------------------------------

    def _spawn(self, name: str, cmd: list[str]) -> _Proc:
        log = self.logs / f"{name}.log"
        handle = open(log, "a")  # noqa: SIM115 - the child holds it
        process = subprocess.Popen(cmd, env=self.env, cwd=self.workdir, stdout=handle, stderr=subprocess.STDOUT,
                                   stdin=subprocess.DEVNULL, start_new_session=True)
        handle.close()
        return _Proc(name, process, log)

    def _write_connection(self) -> None:
        lines = ["[superlink]", f'default = "{CONNECTION}"', "", f"[superlink.{CONNECTION}]",
                 f'address = "127.0.0.1:{self.port}"']
        if self.tls:
            lines.append(f"root-certificates = {toml_value(str(self.pki.ca_cert))}")
        else:
            lines.append("insecure = true")
        (self.home / "config.toml").write_text("\n".join(lines) + "\n")


# Flower 1.42's SuperNode sleeps a fixed 3 s whenever the SuperLink has no message for it, and
# 0.5 s between checks for its ClientApp's reply; no setting changes either. On loopback the
# tests and bench can shorten both (``node_poll``): the SuperNode then uses this clock, and first
# looks again for a message's payload still uploading after node_poll, not after 1 s (pulls.py).
_FAST_NODE = """
import time as _time
import flwr.supernode.start_client_internal as _node
from secfed.adapters.flower.pulls import quicken as _quicken

_quicken(_node, {poll})


class _Clock:
    def __getattr__(self, name):
        return getattr(_time, name)

    @staticmethod
    def sleep(seconds):
        _time.sleep(min(seconds, {poll}))


if getattr(_node, "time", None) is _time:
    _node.time = _Clock()
"""


# A ClientApp pulls its message from the SuperNode, which may still be pulling it from the SuperLink:
# under node_poll it first looks again after node_poll, not after 1 s (pulls.py; the zygote does the same).
_FAST_CLIENTAPP = """from secfed.adapters.flower.pulls import CLIENTAPP, CLIENTAPP_PULL, quicken
quicken(CLIENTAPP, {poll}, function=CLIENTAPP_PULL)
"""


# Flower starts one ClientApp process per message, and ``flwr.supernode.cli``'s __init__ imports
# the SuperNode's own CLI with it (FastAPI, the SQL object store: ≈ 0.5 s of the process's ≈ 1.2 s
# of imports), which a ClientApp never uses. Its script loads the entry module alone (the module
# imports what it needs by absolute name); if a Flower release moves the file, the plain import.
# Under a Loopback the script first asks the zygote (zygote.py) to run it in a warm fork.
_LEAN = {"flwr-clientapp"}


def load_entry(package: str, attr: str) -> Callable[[], object]:
    """``package.attr`` of a Flower console script, loading that module without running the
    ``__init__`` of ``package`` (see above)."""
    parent, _, last = package.rpartition(".")
    file = Path(importlib.import_module(parent).__file__).parent / last / f"{attr}.py"
    if not file.is_file():
        return getattr(importlib.import_module(package), attr)
    name = f"{package}.{attr}"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, file)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return getattr(sys.modules[name], attr)


def load_clientapp_entry() -> Callable[[], object]:
    """Flower's ``flwr-clientapp`` entry point, loaded lean (what the zygote and the script run)."""
    ep = next(ep for ep in entry_points(group="console_scripts") if ep.name == "flwr-clientapp")
    module, _, attr = ep.value.partition(":")
    return load_entry(module, attr)


def make_bin(folder: Path, *, node_poll: float | None = None) -> None:
    """Flower's commands as scripts run by this interpreter (so they import this secfed);
    ``node_poll`` caps the SuperNode's idle and reply polls (seconds) and is the first back-off of
    its and its ClientApps' pulls (pulls.py). ``flwr-clientapp`` runs in a
    warm fork of the zygote whose socket ``SECFED_CLIENTAPP_ZYGOTE`` names, when one answers."""
    folder.mkdir(parents=True, exist_ok=True)
    for ep in entry_points(group="console_scripts"):
        if ep.dist is None or ep.dist.name != "flwr":
            continue
        module, _, attr = ep.value.partition(":")
        patch = _FAST_NODE.format(poll=float(node_poll)) if node_poll and ep.name == "flower-supernode" else ""
        if ep.name in _LEAN:  # the cold path (no zygote answered) pulls its message as the zygote's forks do
            quick = _FAST_CLIENTAPP.format(poll=float(node_poll)) if node_poll else ""
            entry = (zygote.CLIENT.format(env=zygote.ENV_KEY) + "\nfrom secfed.adapters.flower.launch import load_entry\n"
                     f"{attr} = load_entry({module!r}, {attr!r})\n{quick}")
        else:
            entry = f"from {module} import {attr}\n"
        script = folder / ep.name
        script.write_text(f"#!{sys.executable}\nimport sys\n{patch}\n{entry}sys.exit({attr}())\n")
        script.chmod(0o755)
