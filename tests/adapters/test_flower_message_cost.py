"""A Flower ClientApp is a fresh process per message, so whatever secfed's ClientApp imports or loads
is paid on every round trip: the secure-aggregation phases (secfed.protocols is torch-free by design)
run without torch, torchvision or Opacus, and a train message loads no evaluation images."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
from pathlib import Path

from secfed.adapters.flower import node as node_files
from secfed.adapters.flower.sites import NodeSites, own_nodes_policy, scored_domains
from secfed.federation.builder import EvalDomain

HEAVY = ("torch", "torchvision", "opacus", "scipy", "matplotlib")

# Three nodes run secfed's own ClientApp (client_app.app) on the in-process grid; each holds a sealed
# ring vector as a train message leaves it, and SecAggWorkflow sums them through every protocol phase
# (enrolment, keys, shares, the masked input that the app's fetch step answers, unmasking).
PROBE = """
import hashlib, json, sys
from pathlib import Path
import numpy as np
sys.path.insert(0, {here!r})
from fakegrid import RUN_ID, FakeGrid
from flwr.app import ConfigRecord, Context, Message, MessageType, RecordDict
from secfed.adapters.flower import Cohort, node
from secfed.adapters.flower.client_app import STEP, _store, app
from secfed.adapters.flower.encoding import RING, Encoding
from secfed.adapters.flower.workflow import SecAggWorkflow

root, length, wire = Path({root!r}), 5, b"the round's broadcast"
nodes, keys, vectors = {{}}, {{}}, {{}}
for p in range(3):
    folder = root / f"node{{p}}"
    folder.mkdir()
    keys[p] = node.public_identity(node.identity_key(folder))
    config = {{node.STATE_DIR_KEY: str(folder), node.COHORT_KEY: str(root / "cohort.toml")}}
    vectors[p] = np.arange(length, dtype=np.uint32) * (p + 1)
    _store(Context(RUN_ID, 1000 + p, config, RecordDict(), {{}}), 1, hashlib.sha256(wire).digest(), vectors[p], personal=False)
    nodes[1000 + p] = (app, config)
cohort = Cohort({{f"site-{{p}}": k for p, k in keys.items()}})
(root / "cohort.toml").write_text(cohort.dumps())
grid = FakeGrid(nodes)
fetch = RecordDict({{STEP: ConfigRecord({{"step": "fetch", "round": 1, "broadcast": hashlib.sha256(wire).hexdigest()}})}})
messages = [Message(fetch, dst_node_id=n, message_type=MessageType.TRAIN) for n in nodes]
result = SecAggWorkflow(cohort=cohort).aggregate(grid, messages, Encoding(RING, length=length), round=1)
print(json.dumps({{"sum": result.total.tolist(), "expected": sum(vectors.values()).tolist(),
                  "errors": grid.errors, "heavy": sorted({{m.split('.')[0] for m in sys.modules}} & set({heavy!r}))}}))
"""


def test_a_secure_sum_over_secfeds_client_app_imports_no_torch(tmp_path):
    probe = PROBE.format(here=str(Path(__file__).parent), root=str(tmp_path), heavy=HEAVY)
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert seen["sum"] == seen["expected"] and not any(seen["errors"].values())  # the phases really ran
    assert seen["heavy"] == []


def test_the_client_app_module_imports_no_torch():
    probe = ("import json, sys\nimport secfed.adapters.flower.client_app\n"
             f"print(json.dumps(sorted({{m.split('.')[0] for m in sys.modules}} & set({HEAVY!r}))))\n")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []


def test_a_train_message_loads_no_query_or_gallery_and_an_evaluate_message_does(tiny_config, tmp_path):
    config = {"partition-id": 0, "num-partitions": 2, node_files.STATE_DIR_KEY: str(tmp_path),
              **own_nodes_policy(tiny_config)}
    token = secrets.token_hex(16)
    trained = NodeSites.open(tiny_config, config, token, train=True)
    assert trained.fed.domains and not any(isinstance(d, EvalDomain) for d in trained.fed.domains)
    assert all(len(trained.fed.clients[k].site.images) for k in trained.sites)  # what training reads is there
    scored = NodeSites.open(tiny_config, config, token, train=False)
    assert [d.name for d in scored.fed.domains] == [d.name for d in trained.fed.domains]
    # only the domains its own sites score are decoded (found by review: a node decoded every
    # domain's query/gallery, other sites' included)
    decoded = {d.name for d in scored.fed.domains if isinstance(d, EvalDomain) and len(d.query) and len(d.gallery)}
    assert decoded == scored_domains(scored.fed, scored.sites) == {scored.fed.clients[k].site.name for k in scored.sites}
    other = NodeSites.open(tiny_config, {**config, "partition-id": 1}, token, train=False)
    assert not decoded & {d.name for d in other.fed.domains if isinstance(d, EvalDomain)}


def test_the_clientapp_command_a_supernode_starts_skips_the_supernodes_own_cli(tmp_path):
    # flwr.supernode.cli's __init__ imports the SuperNode's CLI (FastAPI, the SQL object store) with
    # flwr-clientapp; the command make_bin writes loads the ClientApp's entry module alone, per message.
    from secfed.adapters.flower.launch import make_bin

    make_bin(tmp_path)
    probe = ("import runpy, sys\nsys.argv = ['flwr-clientapp', '--help']\n"
             f"try:\n    runpy.run_path({str(tmp_path / 'flwr-clientapp')!r}, run_name='__main__')\n"
             "except SystemExit:\n    pass\n"
             "print('LOADED', sorted(m for m in sys.modules if m.startswith('flwr.supernode.cli')))\n")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert "--runtime-api-address" in out.stdout  # Flower's own flwr_clientapp parsed the arguments
    loaded = out.stdout.strip().splitlines()[-1]
    assert loaded == "LOADED ['flwr.supernode.cli.flwr_clientapp']"


def test_supernodes_sharing_this_machines_cores_wait_passively_unless_the_user_says_otherwise(tmp_path, monkeypatch):
    # N SuperNodes each training with the run's threads oversubscribe the cores; OpenMP's spinning
    # waits made a toy train message's six steps 11.5 s instead of 1.5 s (bench/RESULTS.md). A user's
    # own policy wins.
    from secfed.adapters.flower.launch import Loopback

    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    assert Loopback(tmp_path, supernodes=2).env["OMP_WAIT_POLICY"] == "PASSIVE"
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")
    assert Loopback(tmp_path, supernodes=2).env["OMP_WAIT_POLICY"] == "ACTIVE"


def _zygote(tmp_path: Path) -> tuple[subprocess.Popen, Path]:
    import time

    path = tmp_path / "z.sock"
    process = subprocess.Popen([sys.executable, "-m", "secfed.adapters.flower.zygote", str(path)])
    deadline = time.monotonic() + 60
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    return process, path


def test_a_clientapp_message_runs_in_a_warm_fork_of_the_zygote_with_its_arguments_streams_and_status(tmp_path):
    # Under a Loopback each message's flwr-clientapp hands itself to the zygote, which imported Flower
    # and secfed's ClientApp once: the command's own process imports none of it (python -X importtime
    # lists what it imports), yet Flower's entry point ran on its arguments, wrote to its streams and
    # its exit status came back — the same as the cold command, which imports Flower itself.
    from secfed.adapters.flower.launch import make_bin
    from secfed.adapters.flower.zygote import ENV_KEY

    make_bin(tmp_path / "bin")
    command = [sys.executable, "-X", "importtime", str(tmp_path / "bin" / "flwr-clientapp")]
    zygote, path = _zygote(tmp_path)
    try:
        for env in ({ENV_KEY: str(path)}, {}, {ENV_KEY: str(tmp_path / "nobody-listens.sock")}):
            full = {**os.environ, **env}
            ok = subprocess.run([*command, "--help"], capture_output=True, text=True, env=full)
            bad = subprocess.run([*command, "--no-such-flag"], capture_output=True, text=True, env=full)
            warm = env.get(ENV_KEY) == str(path)
            assert ok.returncode == 0 and "--runtime-api-address" in ok.stdout
            assert bad.returncode == 2 and "flwr-clientapp: error:" in bad.stderr  # argparse refused: its status, its stream
            imported_flower = "| flwr" in ok.stderr
            assert imported_flower is not warm, (env, ok.stderr[-500:])
    finally:
        path.unlink(missing_ok=True)  # the zygote leaves once its socket is gone
        assert zygote.wait(timeout=15) == 0


def test_a_request_the_zygote_refuses_leaves_no_descriptor_behind(tmp_path):
    """(found by review: 3 descriptors leaked per refused request, until accept() failed with EMFILE)"""
    import socket
    import time

    zygote, path = _zygote(tmp_path)
    try:
        before = len(os.listdir(f"/proc/{zygote.pid}/fd"))
        for payload in (b"\x00\x00\x00\x05{oops", b"\x00\x00", b"\x00\x00\x00\x02[]") * 10:
            with socket.socket(socket.AF_UNIX) as conn:
                conn.connect(str(path))
                socket.send_fds(conn, [payload], [0, 1, 2])
                conn.shutdown(socket.SHUT_WR)
                conn.recv(4)  # the zygote closes it once refused
        time.sleep(0.5)
        assert len(os.listdir(f"/proc/{zygote.pid}/fd")) == before
    finally:
        path.unlink(missing_ok=True)
        assert zygote.wait(timeout=15) == 0
