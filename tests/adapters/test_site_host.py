"""A node's site host (issue 22 item 4): it keeps the sites open between messages, and whatever
happens to it — killed, stale, failing, its SuperNode gone, idle — the node still answers the way a
fresh process per message would, or says why it cannot."""

from __future__ import annotations

import json
import os
import re
import secrets
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from flwr.app import ConfigRecord, Context, RecordDict

from secfed.adapters.flower import node as node_files
from secfed.adapters.flower import site_host
from secfed.adapters.flower.client_app import STEP
from secfed.adapters.flower.sites import own_nodes_policy


@pytest.fixture
def folder(tmp_path):
    yield tmp_path
    site_host.stop(tmp_path)


def hello(cfg, folder: Path, token: str, **node_config) -> dict:
    config = {"partition-id": 0, "num-partitions": 2, node_files.STATE_DIR_KEY: str(folder),
              **own_nodes_policy(cfg), **node_config}
    content = RecordDict({STEP: ConfigRecord({"step": "hello", "config": json.dumps(cfg.to_dict()), "token": token})})
    out = site_host.call("hello", content, Context(7, 100, config, RecordDict(), {}))
    return dict(out.config_records[STEP])


def host_pids(folder: Path) -> list[int]:
    return [int(p) for p in re.findall(r"\[pid (\d+)\] started", (folder / site_host.LOG_NAME).read_text())]


def wait_gone(pid: int, timeout: float = 15.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.waitpid(pid, os.WNOHANG)  # hosts this test process started are its children: reap them
        except ChildProcessError:
            pass
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.05)
    return False


def test_a_killed_host_is_replaced_and_the_sites_open_again_from_their_folders(tiny_config, folder, tmp_path):
    token = secrets.token_hex(16)
    first = hello(tiny_config, folder, token)
    assert first["sites"] == [0, 2] and json.loads(first["census"])
    again = hello(tiny_config, folder, token)  # the same host, the sites kept open
    log = (folder / site_host.LOG_NAME).read_text()
    assert len(host_pids(folder)) == 1 and log.count("opened the sites") == 1, log
    os.kill(host_pids(folder)[0], signal.SIGKILL)  # it dies between messages, its socket left behind
    assert wait_gone(host_pids(folder)[0])
    third = hello(tiny_config, folder, token)
    assert third == again == first
    log = (folder / site_host.LOG_NAME).read_text()
    assert len(host_pids(folder)) == 2 and log.count("opened the sites") == 2, log
    # A message that fails is reported by name, the host forgets what it kept and serves the next
    with pytest.raises(site_host.HostError, match="site host: .*no-such-data"):
        hello(tiny_config, folder, token, **{"secfed-data-root": str(tmp_path / "no-such-data")})
    assert hello(tiny_config, folder, token) == first
    log = (folder / site_host.LOG_NAME).read_text()
    assert len(host_pids(folder)) == 2 and log.count("opened the sites") == 3, log


def test_a_host_of_another_secfed_build_steps_aside(tiny_config, folder, monkeypatch):
    old = start_host(folder, os.getpid(), idle=60)
    monkeypatch.setattr(site_host, "identity", lambda: "another build")
    # The old host steps aside; the fresh one runs this installation's code, which is not the
    # (pretended) build asking, so it steps aside as well and the ClientApp says so
    with pytest.raises(site_host.HostError, match="another secfed build"):
        hello(tiny_config, folder, secrets.token_hex(16))
    assert old.wait(timeout=15) == 0 and "a ClientApp of another secfed build asked" in old.stderr.read()
    # the fresh host the ClientApp started (it logs to host.log) stepped aside too; it writes why it
    # stopped after answering, so the ClientApp's error can come first (a clean clone's run lost that race)
    log, deadline = folder / site_host.LOG_NAME, time.monotonic() + 15
    while "a ClientApp of another secfed build asked" not in log.read_text() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert log.read_text().count("a ClientApp of another secfed build asked") == 1


def start_host(folder: Path, watch: int, idle: float) -> subprocess.Popen:
    process = subprocess.Popen([sys.executable, "-m", "secfed.adapters.flower.site_host", str(folder),
                                "--watch", str(watch), "--idle", str(idle)], stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not (folder / site_host.SOCKET_NAME).exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    return process


def test_a_host_leaves_with_its_supernode_and_when_idle(tmp_path):
    supernode = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    (tmp_path / "a").mkdir()
    host = start_host(tmp_path / "a", supernode.pid, idle=600)
    supernode.kill()  # not reaped until the host left: a zombie (review 85: where nothing reaped it, the host stayed)
    assert host.wait(timeout=15) == 0 and "the SuperNode is gone" in host.stderr.read()
    supernode.wait()
    assert not (tmp_path / "a" / site_host.SOCKET_NAME).exists()
    (tmp_path / "b").mkdir()
    idle = start_host(tmp_path / "b", os.getpid(), idle=0.5)
    assert idle.wait(timeout=15) == 0 and "idle for" in idle.stderr.read()


def test_one_host_per_node_and_garbage_on_its_socket_does_not_stop_it(tmp_path):
    first = start_host(tmp_path, os.getpid(), idle=60)
    assert (tmp_path / site_host.SOCKET_NAME).stat().st_mode & 0o777 == 0o600  # this user only
    second = start_host(tmp_path, os.getpid(), idle=60)  # a second host for the same node leaves at once
    assert second.wait(timeout=30) == 0 and "another host serves this node" in second.stderr.read()
    for garbage in (b"\x00" * 8, b"\x00\x00\x00\x00\x00\x00\x00\x05{oops", os.urandom(64), b"\xff" * 8):
        with socket.socket(socket.AF_UNIX) as conn:
            conn.connect(str(tmp_path / site_host.SOCKET_NAME))
            conn.sendall(garbage)
    assert site_host.stop(tmp_path)  # it still answers, and leaves when asked
    assert first.wait(timeout=15) == 0
    assert first.stderr.read().count("refused a malformed request") == 4


def test_a_bad_host_idle_setting_is_refused_by_name(tiny_config, tmp_path):
    for bad in ("soon", -1, float("nan")):
        with pytest.raises(node_files.NodeSetupError, match="secfed-host-idle"):
            hello(tiny_config, tmp_path, secrets.token_hex(16), **{site_host.IDLE_KEY: bad})
    assert not (tmp_path / site_host.SOCKET_NAME).exists()


def test_a_node_whose_host_cannot_start_answers_in_its_own_process_and_says_so(tiny_config, tmp_path, monkeypatch,
                                                                                caplog):
    from secfed.adapters.flower import client_app

    def cannot_start(folder, node_config):
        raise site_host.HostUnavailable("the site host exited with status 1: no module named secfed")

    monkeypatch.setattr(site_host, "_start", cannot_start)
    config = {"partition-id": 0, "num-partitions": 2, node_files.STATE_DIR_KEY: str(tmp_path),
              **own_nodes_policy(tiny_config)}
    content = RecordDict({STEP: ConfigRecord({"step": "hello", "config": json.dumps(tiny_config.to_dict()),
                                              "token": secrets.token_hex(16)})})
    with caplog.at_level("WARNING", logger="secfed.flower"):
        out = client_app._on_sites("hello", content, Context(7, 100, config, RecordDict(), {}))
    assert list(out.config_records[STEP]["sites"]) == [0, 2]
    assert "no module named secfed; this message opens the sites itself" in caplog.text


def _frame(manifest: bytes, *blobs: bytes) -> bytes:
    return struct.pack(">Q", len(manifest)) + manifest + b"".join(blobs)


GARBAGE = {
    "manifest-is-a-string": _frame(b'"x"'),
    "manifest-is-null": _frame(b"null"),
    "blob-index-out-of-range": _frame(json.dumps({"records": [{"name": "s", "config": {"k": ["bytes", 3]}}],
                                                  "blobs": []}).encode()),
    "array-blob-index-out-of-range": _frame(json.dumps({"records": [{"name": "a", "arrays": [
        ["k", "float32", [1], "numpy.ndarray", 9]]}], "blobs": []}).encode()),
    "this-build-without-run-id": None,  # filled in below: it needs this build's identity
    "deeply-nested-json": _frame(b"[" * 100_000 + b"]" * 100_000),
}


def test_a_malformed_frame_is_refused_by_name_and_the_host_serves_on(tmp_path):
    """(found by review: these raised AttributeError, IndexError, RecursionError or KeyError and killed the host)"""
    host = start_host(tmp_path, os.getpid(), idle=60)
    for name, garbage in GARBAGE.items():
        garbage = garbage or _frame(json.dumps({"op": "hello", "identity": site_host.identity(), "records": [],
                                                "blobs": []}).encode())
        with socket.socket(socket.AF_UNIX) as conn:
            conn.connect(str(tmp_path / site_host.SOCKET_NAME))
            conn.sendall(garbage)
            conn.settimeout(10)
            try:
                conn.recv(1)
            except OSError:
                pass
        assert host.poll() is None, name
    assert site_host.stop(tmp_path), "the host no longer answers"
    assert host.wait(timeout=15) == 0
    err = host.stderr.read()
    assert "Traceback" not in err and err.count("refused a malformed request") == len(GARBAGE) - 1, err
    assert "hello failed: KeyError" in err  # this build's request without run_id: answered as a failed message


def test_a_relay_queued_while_the_host_leaves_is_served_by_a_fresh_host(tmp_path):
    """(found by review: the queued relay got a reset and the message failed)"""
    folder = tmp_path / "node"
    folder.mkdir()
    host = start_host(folder, os.getpid(), idle=60)
    first = socket.socket(socket.AF_UNIX)
    first.connect(str(folder / site_host.SOCKET_NAME))  # the host takes this one and waits for its request
    outcome: list[object] = []

    def relay() -> None:  # an op no handler knows: a host that reads it answers with a named failure
        context = Context(7, 100, {node_files.STATE_DIR_KEY: str(folder)}, RecordDict(), {})
        try:
            outcome.append(site_host.call("no-such-op", RecordDict(), context))
        except Exception as exc:  # noqa: BLE001 - the test reports it
            outcome.append(exc)

    worker = threading.Thread(target=relay)
    worker.start()
    try:
        time.sleep(0.5)  # the relay is queued in the backlog and has sent its request
        site_host._send(first, {"op": "stop", "identity": site_host.identity()})  # the host leaves
        site_host._receive(first)
        first.close()
        assert host.wait(timeout=30) == 0
        worker.join(timeout=240)
        # before the fix: HostError "lost the site host … Connection reset by peer"; now a fresh host read it
        assert len(outcome) == 1 and "site host: KeyError: 'no-such-op'" in str(outcome[0]), outcome
        assert len(host_pids(folder)) == 1  # the fresh host the relay started (the first logged to a pipe)
    finally:
        site_host.stop(folder)


def test_a_host_serving_a_supernode_that_is_pid_1_stays(tmp_path, monkeypatch):
    """flower-supernode is PID 1 as a container's entrypoint (found by review: the host left at once)."""
    monkeypatch.setattr(site_host, "_kept", None)  # serve() makes this process a host: undone at teardown
    assert site_host.serve(tmp_path, 1, 1.5, lambda *a: RecordDict()) == "idle for 2 s"


def test_a_run_without_threads_gets_torchs_default_in_a_host_that_served_a_run_with_threads(
        tiny_config, tmp_path, monkeypatch):
    """(found by review: run A's count carried over into run B, which a fresh process would not train with)"""
    import torch

    from secfed.adapters.flower import client_app
    from secfed.adapters.flower import sites as sites_module

    monkeypatch.setattr(sites_module.NodeSites, "open", classmethod(lambda cls, *a, **k: object()))
    monkeypatch.setattr(site_host, "_kept", {})  # as in a host
    default = torch.get_num_threads()
    context = Context(7, 100, {node_files.STATE_DIR_KEY: str(tmp_path)}, RecordDict(), {})
    try:
        for threads in (default + 1, None):  # run A asks for threads, run B leaves torch's default
            tiny_config.run.threads = threads
            step = ConfigRecord({"config": json.dumps(tiny_config.to_dict()), "token": secrets.token_hex(16)})
            client_app._open(step, context, train=True)
        assert torch.get_num_threads() == default
    finally:
        torch.set_num_threads(default)


def test_a_host_imports_nothing_from_the_supernodes_working_folder(tmp_path, monkeypatch):
    """(found by review: `python -m` put the SuperNode's working folder first on the host's path, and a
    `secfed` package another user planted in a folder everyone may write to ran as the node)"""
    planted = tmp_path / "shared"
    (planted / "secfed").mkdir(parents=True)
    (planted / "secfed" / "__init__.py").write_text(f"open({str(tmp_path / 'ran')!r}, 'w').close()\n")
    (tmp_path / "state").mkdir(mode=0o700)
    monkeypatch.chdir(planted)
    try:
        site_host._start(tmp_path / "state", {site_host.IDLE_KEY: 30}).close()
    finally:
        site_host.stop(tmp_path / "state")
    assert not (tmp_path / "ran").exists()


def test_a_state_folder_is_the_nodes_own(tmp_path, monkeypatch):
    """(found by review: under umask 000 the folders made for the state folder were 0777, another user
    swapped it for one of theirs — the node sent it the broadcast, relayed its forged reply and used its
    empty privacy record; a lock file 0644 let any user hold the node's records)"""
    old = os.umask(0)
    try:
        made = node_files.state_dir({node_files.STATE_DIR_KEY: str(tmp_path / "a" / "b" / "state")})
    finally:
        os.umask(old)
    assert all((tmp_path / p).stat().st_mode & 0o777 == 0o700 for p in ("a", "a/b", "a/b/state")) and made.is_dir()
    loose = tmp_path / "loose"
    loose.mkdir(mode=0o755)
    loose.chmod(0o755)
    assert node_files.state_dir({node_files.STATE_DIR_KEY: str(loose)}).stat().st_mode & 0o777 == 0o700
    (tmp_path / "open").mkdir()
    (tmp_path / "open").chmod(0o777)
    with pytest.raises(node_files.NodeSetupError, match="is writable by other users"):
        node_files.state_dir({node_files.STATE_DIR_KEY: str(tmp_path / "open" / "state")})
    (tmp_path / "group").mkdir()
    (tmp_path / "group").chmod(0o775)  # this user's private group (umask 002): its alone (review of the fix)
    if node_files._private_group((tmp_path / "group").stat().st_gid):
        node_files.state_dir({node_files.STATE_DIR_KEY: str(tmp_path / "group" / "state")})
    # a primary group not named after the user is shared, even where the directory lists nobody in it
    # ("domain users" under SSSD: review of the fix)
    import grp
    from types import SimpleNamespace

    node_files._private_group.cache_clear()
    with monkeypatch.context() as patched:
        patched.setattr(grp, "getgrgid", lambda gid: SimpleNamespace(gr_name="domain users", gr_mem=[]))
        assert not node_files._private_group(os.getegid())
    node_files._private_group.cache_clear()
    if os.geteuid() == 0:  # a group with others in it: they could move the state folder (review of the fix)
        os.chown(tmp_path / "group", -1, 65534)
        with pytest.raises(node_files.NodeSetupError, match="is writable by other users"):
            node_files.state_dir({node_files.STATE_DIR_KEY: str(tmp_path / "group" / "state")})
    # a link is followed once and its target checked (review of the fix: a link planted under /tmp and
    # flipped after the check led the node to another user's folder)
    (tmp_path / "sticky2").mkdir()
    (tmp_path / "sticky2").chmod(0o1777)
    (tmp_path / "ours").mkdir()
    (tmp_path / "sticky2" / "state").symlink_to(tmp_path / "ours", target_is_directory=True)
    assert node_files.state_dir({node_files.STATE_DIR_KEY: str(tmp_path / "sticky2" / "state")}) == \
        (tmp_path / "ours").resolve()  # used by its target's path from then on: a later flip leads nowhere
    if os.geteuid() == 0:
        (tmp_path / "theirs").mkdir()
        os.chown(tmp_path / "theirs", 65534, 65534)
        (tmp_path / "sticky2" / "state").unlink()
        (tmp_path / "sticky2" / "state").symlink_to(tmp_path / "theirs", target_is_directory=True)
        with pytest.raises(node_files.NodeSetupError, match="owned by another user"):
            node_files.state_dir({node_files.STATE_DIR_KEY: str(tmp_path / "sticky2" / "state")})
    assert node_files.state_dir({node_files.STATE_DIR_KEY: str(tmp_path / "a" / "b" / "state")}) == made.resolve()
    # a key file another user could read or write is no key of this node (review: `secfed flower keys`
    # printed an identity another user planted)
    node_files.identity_key(made)
    (made / node_files.IDENTITY_FILE).chmod(0o644)
    with pytest.raises(node_files.NodeSetupError, match="not a file of this user's alone"):
        node_files.identity_key(made)
    (tmp_path / "sticky").mkdir()
    (tmp_path / "sticky").chmod(0o1777)  # as /tmp: others cannot move a folder of ours
    node_files.state_dir({node_files.STATE_DIR_KEY: str(tmp_path / "sticky" / "state")})
    if os.geteuid() == 0:
        os.chown(tmp_path / "sticky" / "state", 65534, 65534)
        with pytest.raises(node_files.NodeSetupError, match="owned by another user"):
            node_files.state_dir({node_files.STATE_DIR_KEY: str(tmp_path / "sticky" / "state")})


def test_a_nodes_record_lock_is_its_own_and_waits_for_a_bounded_time(tmp_path, monkeypatch):
    """(review: a lock file 0644 — any user could open it and hold the node's records, and the node
    waited on it without end)"""
    import fcntl

    from secfed.adapters.flower import sites

    lock = tmp_path / "record.lock"
    with sites._locked(lock):
        pass
    assert lock.stat().st_mode & 0o777 == 0o600
    monkeypatch.setattr(sites, "LOCK_WAIT", 0.3)
    with open(lock) as other:
        fcntl.flock(other, fcntl.LOCK_EX)
        with pytest.raises(node_files.NodeSetupError, match="stayed locked for 0 s"):
            with sites._locked(lock):
                pass


def test_flower_keys_prints_the_nodes_own_identity_and_refuses_a_planted_one(tmp_path):
    """(review: `secfed flower keys` read an identity.pem from any folder, whoever wrote it, and printed
    its line for cohort.toml)"""
    from click.testing import CliRunner

    from secfed.cli.main import cli

    state = tmp_path / "state"
    result = CliRunner().invoke(cli, ["flower", "keys", "--state-dir", str(state), "--name", "site-a"])
    key = node_files.public_identity(node_files.identity_key(state))
    assert result.exit_code == 0 and f'"site-a" = "{key.hex()}"' in result.output
    (state / node_files.IDENTITY_FILE).chmod(0o666)
    result = CliRunner().invoke(cli, ["flower", "keys", "--state-dir", str(state), "--name", "site-a"])
    assert result.exit_code == 2 and "not a file of this user's alone" in result.output and key.hex() not in result.output
