"""``secfed train --flower CONNECTION`` and ``secfed flower {local,keys,certs}``.

A CONNECTION file (TOML) says where the SuperLink is and whom the run trusts::

    address = "superlink.example.org:8000"
    root-certificates = "ca.pem"      # the CA of the SuperLink's TLS certificate (or: insecure = true)
    cohort = "cohort.toml"            # the SuperNodes' identity keys (authenticated secure aggregation)
    # phase-timeout = 120             # seconds a protocol phase waits for replies
    # train-timeout = 3600            # seconds a round's training (and evaluation) waits
    # public-root = "/srv/public"     # on the SuperLink's machine: where a relative --kd-public is read
    # stop-on-refusal = true          # stop when a SuperNode refuses the run, not wait start-timeout for it

``secfed train --flower`` submits secfed's ServerApp with the resolved configuration through
``flwr run`` (telemetry and update checks off) and streams its output; the ServerApp writes the
run directory on the SuperLink's machine (``--out`` names a folder there). ``secfed flower
local`` starts a SuperLink and N SuperNodes on 127.0.0.1 (TLS, registered SuperNodes, identity
keys and a cohort made for the occasion), runs ``secfed train --flower`` against them and stops
them again.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import rich_click as click

from secfed import locking
from secfed.cli.common import emit_json, human_console
from secfed.cli.options import FiniteFloatRange, config_options, option_panels
from secfed.config import RunConfig

APP_NAME = "secfed-train"
ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
# Flower's own log lines, with or without the "[MM/DD/YYYY ]HH:MM:SS:" its ServerApp process prefixes when it
# exits ("03:11:44:DEBUG:ServerApp finished running."); secfed's lines are plain
FLOWER_LOG_LINE = re.compile(r"^(?:(?:\d{2}/\d{2}/\d{4} )?\d{2}:\d{2}:\d{2}(?:[.,]\d+)?:)?(DEBUG|INFO)\s*:")


# flwr's own line naming the run it submitted; only its first, whole line counts (found by review: a line of
# the ServerApp's output — a run folder's name, a node's refusal — could name another run to stop)
STARTED = re.compile(r"Successfully started run (\d+)\s*")


def relay(lines: Any, console_out: Any, flower_log: Any, started: list[str] | None = None) -> None:
    """``flwr run --stream``'s output: Flower's colour codes stripped, its DEBUG and INFO lines to
    ``flower_log`` (dropped when None), everything else (secfed's lines, warnings, errors) shown; the
    run's id, once Flower says it started, appended to ``started``."""
    for line in lines:
        plain = ANSI.sub("", line)
        if started is not None and not started and (run := STARTED.fullmatch(plain)):
            started.append(run.group(1))
        if FLOWER_LOG_LINE.match(plain):
            if flower_log is not None:
                flower_log.write(plain)
            continue
        console_out.write(plain)


@dataclass(frozen=True)
class Connection:
    address: str
    root_certificates: Path | None
    cohort: Path | None
    phase_timeout: float = 120.0
    train_timeout: float = 3600.0
    start_timeout: float = 300.0
    public_root: str | None = None  # a folder on the SuperLink's machine (not this one's)
    stop_on_refusal: bool = False  # else a refusing node may be fixed and restarted within start-timeout

    @classmethod
    def load(cls, path: Path) -> Connection:
        from secfed.config import TomlUnreadable, read_toml

        where = "--flower"
        try:
            raw = read_toml(Path(path))
        except TomlUnreadable as exc:
            raise click.BadParameter(f"{path}: cannot read the connection file ({exc})", param_hint=where) from None
        base = Path(path).resolve().parent
        known = {"address", "root-certificates", "insecure", "cohort", "phase-timeout", "train-timeout",
                 "start-timeout", "public-root", "stop-on-refusal"}
        unknown = sorted(set(raw) - known)
        if unknown:
            raise click.BadParameter(f"{path}: unknown keys {', '.join(unknown)}; known: {', '.join(sorted(known))}",
                                     param_hint=where)
        address = raw.get("address")
        port = address.rpartition(":")[2] if isinstance(address, str) else ""
        if not isinstance(address, str) or not _HOST.fullmatch(address.rpartition(":")[0]) or not port.isdigit() \
                or not port.isascii() or not 0 < int(port) < 65536:  # the host goes into flwr's TOML: no quotes
            raise click.BadParameter(f"{path}: address must be \"host:port\" (port 1–65535), got {address!r}",
                                     param_hint=where)
        insecure = raw.get("insecure", False)
        if not isinstance(insecure, bool):
            raise click.BadParameter(f"{path}: insecure must be true or false, got {insecure!r}", param_hint=where)
        certs = raw.get("root-certificates")
        if bool(certs) == insecure:
            raise click.BadParameter(f"{path}: give root-certificates (TLS) or insecure = true, not both or neither",
                                     param_hint=where)

        def file(key: str) -> Path | None:
            value = raw.get(key)
            if value is None:
                return None
            if not isinstance(value, str) or not value or "\0" in value:
                raise click.BadParameter(f"{path}: {key} must be a file's path, got {value!r}", param_hint=where)
            found = (base / value).resolve()
            if not found.is_file():
                raise click.BadParameter(f"{path}: {key} = {value!r}: no such file", param_hint=where)
            return found

        timeouts = {}
        for key in ("phase-timeout", "train-timeout", "start-timeout"):
            if key in raw:
                value = raw[key]
                if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < 1e9:
                    raise click.BadParameter(f"{path}: {key} must be a positive number of seconds below 10⁹, "
                                             f"got {value!r}", param_hint=where)  # nan crashed the ServerApp
                timeouts[key.replace("-", "_")] = float(value)
        public = raw.get("public-root")
        if public is not None and (not isinstance(public, str) or "\0" in public or not Path(public).is_absolute()):
            raise click.BadParameter(f"{path}: public-root must be an absolute folder on the SuperLink's machine, "
                                     f"got {public!r}", param_hint=where)
        stop = raw.get("stop-on-refusal", False)
        if not isinstance(stop, bool):
            raise click.BadParameter(f"{path}: stop-on-refusal must be true or false, got {stop!r}", param_hint=where)
        return cls(address, file("root-certificates"), file("cohort"), **timeouts, public_root=public,
                   stop_on_refusal=stop)

    def write(self, path: Path) -> Path:
        lines = [f'address = "{self.address}"']
        lines.append(f'root-certificates = {json.dumps(str(self.root_certificates))}' if self.root_certificates
                     else "insecure = true")
        if self.cohort is not None:
            lines.append(f"cohort = {json.dumps(str(self.cohort))}")
        lines += [f"phase-timeout = {self.phase_timeout}", f"train-timeout = {self.train_timeout}",
                  f"start-timeout = {self.start_timeout}"]
        if self.public_root is not None:
            lines.append(f"public-root = {json.dumps(self.public_root)}")
        if self.stop_on_refusal:
            lines.append("stop-on-refusal = true")
        path.write_text("\n".join(lines) + "\n")
        return path


_HOST = re.compile(r"[A-Za-z0-9._-]+|\[[0-9A-Fa-f:.]+\]", re.ASCII)  # a name, an IPv4 or a bracketed IPv6 address


def require_flower() -> None:
    """A clean error, not a traceback, where Flower is not installed."""
    try:
        import flwr  # noqa: F401
    except ImportError:
        raise click.UsageError("--flower needs Flower on this machine: pip install 'secfed[flower]'") from None


def check_reachable(connection: Connection, timeout: float = 5.0) -> None:
    """Fail early, naming the address, when nothing listens there, and naming the certificate when TLS
    does not verify (flwr says only "unavailable" for either: found by review)."""
    host, _, port = connection.address.rpartition(":")
    host = host.strip("[]")
    try:
        sock = socket.create_connection((host, int(port)), timeout=timeout)
    except OSError as exc:
        raise click.ClickException(
            f"--flower: the SuperLink at {connection.address} (the connection file's address) cannot be reached: "
            f"{exc.strerror or exc}. Is the SuperLink running, listening there?") from None
    with sock:
        if connection.root_certificates is not None:
            _check_tls(sock, host, connection)
        elif _speaks_tls(sock, host):  # (found by review: `insecure = true` against TLS was only "unavailable")
            raise click.ClickException(f"--flower: the SuperLink at {connection.address} speaks TLS, and the "
                                       "connection file says insecure = true: give root-certificates instead")


def _speaks_tls(sock: socket.socket, host: str) -> bool:
    """Whether a TLS handshake with no certificate checked completes: a plaintext SuperLink refuses one."""
    import ssl

    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE  # only asks whether it speaks TLS
    context.set_alpn_protocols(["h2"])
    try:
        with context.wrap_socket(sock, server_hostname=host):
            return True
    except (ssl.SSLError, OSError):
        return False


def _check_tls(sock: socket.socket, host: str, connection: Connection) -> None:
    """A TLS handshake as flwr's gRPC makes it: the SuperLink's certificate checked against the
    connection file's root-certificates and the address's host."""
    import ssl

    where = f"the SuperLink at {connection.address}"
    try:
        context = ssl.create_default_context(cafile=str(connection.root_certificates))
    except (ssl.SSLError, OSError, ValueError) as exc:
        raise click.ClickException(f"--flower: root-certificates = {connection.root_certificates} holds no CA "
                                   f"certificate ({exc})") from None
    context.set_alpn_protocols(["h2"])  # gRPC's
    try:
        with context.wrap_socket(sock, server_hostname=host):
            pass
    except ssl.SSLCertVerificationError as exc:
        raise click.ClickException(f"--flower: {where} presents a certificate that root-certificates = "
                                   f"{connection.root_certificates} does not verify: {exc.verify_message}") from None
    except (ssl.SSLError, OSError) as exc:
        raise click.ClickException(f"--flower: no TLS session with {where} ({exc}): is it started with TLS, "
                                   "not --insecure?") from None


def check_flower_config(cfg: RunConfig, connection: Connection, resuming: bool) -> None:
    from secfed.adapters.flower.server_app import refusals
    from secfed.config import flag_name

    problems = [f"{flag_name(key)}: {why}" for key, why in refusals(cfg)]
    if resuming:
        problems.append("--resume: the sites' state lives on the SuperNodes; a Flower run cannot be resumed")
    if cfg.secagg.enabled and cfg.secagg.authenticated and connection.cohort is None:
        problems.append("--flower: authenticated secure aggregation needs `cohort = \"cohort.toml\"` in the "
                        "connection file (the SuperNodes' identity keys; `secfed flower keys` prints them)")
    if problems:
        raise click.UsageError("\n".join(problems))


def _stop_remote_run(console: Any, started: list[str], env: dict[str, str], cwd: Path,
                     connection: Connection) -> None:
    """Ctrl-C or SIGTERM of ``secfed train --flower``: the run on the SuperLink is stopped too (found by
    review: ending ``flwr run --stream`` ends only the log stream, and the ServerApp trained on)."""
    from secfed.adapters.flower.launch import CONNECTION

    if not started:
        console.print(f"[yellow]interrupted before Flower named the run; if the SuperLink at {connection.address} "
                      "started it, `flwr ls` shows it and `flwr stop RUN_ID` stops it[/]")
        return
    try:
        out = subprocess.run(["flwr", "stop", started[0], CONNECTION], env=env, cwd=cwd, capture_output=True,
                             text=True, timeout=60)
        stopped = out.returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        stopped = False
    console.print(f"[yellow]interrupted; run {started[0]} on the SuperLink at {connection.address} "
                  + ("was stopped[/]" if stopped else f"could not be stopped: `flwr stop {started[0]}` it there[/]"))


def train_on_flower(cfg: RunConfig, run_dir: Path, connection: Connection, *, json_output: bool = False,
                    resuming: bool = False, workdir: Path | None = None,
                    flower_log: Path | None = None, stop_remote: bool = True) -> dict[str, Any] | None:
    """Submit the run to the SuperLink and stream its output (Flower's own log lines to ``flower_log``);
    the summary when the run directory is here. An interrupt stops the run on the SuperLink too
    (``stop_remote``; `secfed flower local` stops the whole deployment instead)."""
    require_flower()
    from secfed.adapters.flower import node as node_files
    from secfed.adapters.flower.launch import CONNECTION, FLOWER_ENV, make_bin, toml_value, write_app

    check_flower_config(cfg, connection, resuming)
    try:  # read once, here, before anything reaches the SuperLink: its keys travel with the run (review)
        cohort = node_files.Cohort.load(connection.cohort) if connection.cohort else None
    except node_files.NodeSetupError as exc:
        raise click.BadParameter(f"cohort: {exc}", param_hint="--flower") from None
    check_reachable(connection)
    console = human_console(json_output)
    run_dir = run_dir.resolve()
    with tempfile.TemporaryDirectory(prefix="secfed-flower-", dir=workdir) as tmp:
        tmp_path = Path(tmp)
        make_bin(tmp_path / "bin")
        home = tmp_path / "flwr-home"
        home.mkdir()
        link = [f'[superlink]\ndefault = "{CONNECTION}"\n\n[superlink.{CONNECTION}]', f'address = "{connection.address}"',
                f"root-certificates = {toml_value(str(connection.root_certificates))}" if connection.root_certificates
                else "insecure = true"]
        (home / "config.toml").write_text("\n".join(link) + "\n")
        app = write_app(tmp_path / "app", name=APP_NAME, serverapp="secfed.adapters.flower.server_app:app",
                        clientapp="secfed.adapters.flower.client_app:app", config={
                            "secfed-config": json.dumps(cfg.to_dict()), "secfed-run-dir": str(run_dir),
                            "secfed-token": secrets.token_hex(16),
                            # the cohort's keys, not its path: the SuperLink may be another machine, whose
                            # file at that path is not the one the user checked (found by review)
                            "secfed-cohort-toml": cohort.dumps() if cohort else "",
                            "secfed-phase-timeout": connection.phase_timeout,
                            "secfed-train-timeout": connection.train_timeout,
                            "secfed-start-timeout": connection.start_timeout,
                            "secfed-public-root": connection.public_root or "",
                            "secfed-stop-on-refusal": connection.stop_on_refusal})
        env = {**os.environ, **FLOWER_ENV, "FLWR_HOME": str(home),
               "PATH": f"{tmp_path / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}"}
        console.print(f"[bold]secfed[/] → Flower SuperLink {connection.address}: run directory {run_dir}")
        process = subprocess.Popen(["flwr", "run", str(app), CONNECTION, "--stream"], env=env, cwd=tmp_path,
                                   stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)
        started: list[str] = []
        try:
            with open(flower_log, "a") if flower_log else open(os.devnull, "w") as log:  # noqa: SIM115
                relay(process.stdout, sys.stderr if json_output else sys.stdout, log, started)
            process.wait()
        except KeyboardInterrupt:
            process.terminate()
            if not stop_remote:
                raise
            if not started:  # its id may still wait in the pipe, unread
                with contextlib.suppress(subprocess.TimeoutExpired, OSError, ValueError):
                    relay(process.communicate(timeout=10)[0].splitlines(True), io.StringIO(), None, started)
            _stop_remote_run(console, started, env, tmp_path, connection)
            sys.exit(130)
    summary_file = run_dir / "summary.json"
    if process.returncode != 0 or not summary_file.is_file():
        raise click.ClickException(f"the Flower run did not finish (flwr exit code {process.returncode}); "
                                   "its output is above")
    summary = json.loads(summary_file.read_text())
    from secfed.cli.train import show_summary

    show_summary(console, summary)
    console.print(f"run directory: {run_dir}")
    if json_output:
        emit_json(summary)
    return summary


# ---- secfed flower ------------------------------------------------------------------------------------


@click.group("flower")
def flower_group() -> None:
    """Run secfed on Flower: a loopback demo, identity keys, TLS certificates.

    `secfed train --flower CONNECTION` trains with the clients on Flower SuperNodes; the README's
    "Deploy across machines" walks through a deployment.
    """


@flower_group.command("local")
@click.option("--supernodes", type=click.IntRange(min=2), default=2, show_default=True,
              help="SuperNodes to start; the run's clients are spread over them (k mod N).")
@click.option("--insecure", is_flag=True, help="No TLS and no SuperNode authentication (default: both).")
@click.option("--node-poll", type=FiniteFloatRange(min=0.01, max=3.0), default=None, metavar="SECONDS",
              help="Cap the SuperNodes' fixed polls (Flower's: 3 s idle, 0.5 s for replies): faster rounds on "
                   "loopback for a little idle CPU.")
@click.option("--keep", is_flag=True, help="Keep RUN_DIR/../NAME.flower (the SuperNodes' state and the logs) "
                                        "after a successful run; a failed run always keeps it.")
@click.option("--config", type=click.Path(dir_okay=False, path_type=Path), help="TOML file; flags override it.")
@click.option("--json", "json_output", is_flag=True, help="Print one JSON object on stdout; the rest on stderr.")
@config_options
@option_panels(["--supernodes", "--insecure", "--node-poll", "--keep", "--config", "--json", "--help"])
def local_command(supernodes: int, insecure: bool, node_poll: float | None, keep: bool, **params: Any) -> None:
    """Train on a SuperLink and SUPERNODES SuperNodes started on 127.0.0.1 for this run.

    Every Flower process is stopped afterwards. Each SuperNode keeps its sites' state, identity
    and sealing key in RUN_DIR/../NAME.flower/node-I, and Flower's logs go to
    RUN_DIR/../NAME.flower/deployment/logs; that folder is removed after a successful run unless
    --keep is given.
    """
    require_flower()
    from secfed.cli.train import resolve_config

    cfg, run_dir, resuming = resolve_config({**params, "resume": None})
    try:
        work = run_dir.parent.resolve() / f"{run_dir.name}.flower"
        work.mkdir(parents=True, exist_ok=True)
        work.chmod(0o700)  # the SuperNodes' state folders lie under it: this user's alone (node.state_dir checks)
    except (OSError, RuntimeError) as exc:  # a name too long, --out a file (found by review: a traceback)
        raise click.BadParameter(f"cannot make the deployment's folder beside {run_dir} ({exc})",
                                 param_hint="--out/--name") from None
    with _in_use(work, run_dir):
        _local(work, run_dir, cfg, supernodes, insecure, node_poll, params["json_output"])
    if not keep:  # reached only when the run finished: a failed run leaves its logs for the user
        shutil.rmtree(work, ignore_errors=True)


def _in_use(work: Path, run_dir: Path) -> contextlib.AbstractContextManager[None]:
    """``work`` held by this command (found by review: a second `secfed flower local` of the same run
    shared its folders, then stopped the first one's processes and deleted its nodes' state)."""
    return locking.exclusive(work / ".in-use", busy=lambda: click.UsageError(
        f"{work} is in use by another `secfed flower local` of the run {run_dir}; choose another --name"))


def _local(work: Path, run_dir: Path, cfg: RunConfig, supernodes: int, insecure: bool, node_poll: float | None,
           json_output: bool) -> None:
    """The deployment of `secfed flower local` in ``work``, the run on it, and every process stopped."""
    from secfed.adapters.flower import Cohort
    from secfed.adapters.flower import node as node_files
    from secfed.adapters.flower.launch import Loopback
    from secfed.adapters.flower.sites import own_nodes_policy

    cohort_file, sites, configs = work / "cohort.toml", {}, []
    for i in range(supernodes):
        folder = work / f"node-{i}"
        sites[f"node-{i}"] = node_files.public_identity(node_files.identity_key(folder))
        configs.append({node_files.STATE_DIR_KEY: str(folder), node_files.COHORT_KEY: str(cohort_file),
                        **own_nodes_policy(cfg)})
    cohort_file.write_text(Cohort(sites).dumps())
    try:
        with Loopback(work / "deployment", supernodes=supernodes, node_configs=configs, tls=not insecure,
                      node_auth=not insecure, node_poll=node_poll) as fed:
            ca = fed.pki.ca_cert if fed.pki else None
            # its nodes are this command's: a refusal (their policy, their data) will not change, so it stops the run
            connection = Connection(f"127.0.0.1:{fed.port}", ca, cohort_file, phase_timeout=300.0,
                                    stop_on_refusal=True)
            connection.write(work / "connection.toml")
            train_on_flower(cfg, run_dir, connection, json_output=json_output, workdir=work,
                            flower_log=fed.logs / "flwr-run.log", stop_remote=False)
    except KeyboardInterrupt:  # Ctrl-C, SIGTERM, SIGHUP: the with block has stopped every Flower process
        human_console(json_output).print(f"[yellow]interrupted; the SuperLink and SuperNodes are stopped, "
                                         f"their logs kept in {work / 'deployment' / 'logs'}[/]")
        sys.exit(130)


@flower_group.command("keys")
@click.option("--state-dir", type=click.Path(file_okay=False, path_type=Path), required=True,
              help="The SuperNode's state folder (its node config secfed-state-dir).")
@click.option("--name", required=True, help="The site's name in the cohort file.")
def keys_command(state_dir: Path, name: str) -> None:
    """Create the node's Ed25519 identity (if it has none) and print its cohort-file line."""
    require_flower()
    from secfed.adapters.flower import node as node_files

    for given, flag in ((str(state_dir), "--state-dir"), (name, "--name")):  # (found by review: "" was the
        if not given.strip() or given == ".":  # current folder, made 0700, and a site named "")
            raise click.BadParameter("must not be empty", param_hint=flag)
    try:
        folder = node_files.state_dir({node_files.STATE_DIR_KEY: str(state_dir)})
        key = node_files.identity_key(folder)
    except node_files.NodeSetupError as exc:
        raise click.BadParameter(str(exc), param_hint="--state-dir") from None
    try:
        line = f'{node_files.toml_key(name)} = "{node_files.public_identity(key).hex()}"'  # TOML, whatever the name
    except node_files.NodeSetupError as exc:
        raise click.BadParameter(str(exc), param_hint="--name") from None
    click.echo(line)


@flower_group.command("certs")
@click.argument("folder", type=click.Path(file_okay=False, path_type=Path))
@click.option("--host", "hosts", multiple=True, default=("127.0.0.1", "localhost"), show_default=True,
              help="Host name or IP address the SuperLink is reached at (repeat for several).")
@click.option("--nodes", type=click.IntRange(min=0), default=0, show_default=True,
              help="SuperNode authentication key pairs to make.")
def certs_command(folder: Path, hosts: tuple[str, ...], nodes: int) -> None:
    """Make a CA, the SuperLink's TLS certificate and SuperNode keys offline, in FOLDER."""
    require_flower()
    from secfed.adapters.flower.certs import make_pki

    try:
        pki = make_pki(folder, hosts=hosts, nodes=nodes)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--host") from None
    except OSError as exc:  # files already there (kept), a folder that cannot be made
        why = str(exc) if isinstance(exc, FileExistsError) else f"{folder}: cannot write there ({exc.strerror or exc})"
        raise click.BadParameter(why, param_hint="FOLDER") from None
    click.echo(f"CA certificate      {pki.ca_cert}  (give it to every SuperNode and to `secfed train --flower`)")
    click.echo(f"SuperLink TLS       {pki.server_cert}, {pki.server_key}")
    for private, public in zip(pki.node_private, pki.node_public):
        click.echo(f"SuperNode key pair  {private} (stays on the node), {public} (flwr supernode register)")
