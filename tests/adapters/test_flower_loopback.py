"""secfed's secure aggregation on Flower's Deployment Engine: a SuperLink and 3 SuperNodes as
processes on 127.0.0.1 (TLS with a CA made offline), one ``flwr run`` of loopback_app.py.

* secfed, a SuperNode killed while its app computes its input (masked-input phase), and one killed
  after it shared its keys: both rounds release the exact sum of the survivors' vectors.
* Flower's own SecAgg+ (SecAggPlusWorkflow + secaggplus_mod, flwr 1.42) with a SuperNode killed
  while keys are being shared: it halts, "Not enough shares to recover secret", releasing nothing
  — it asks the survivors for key shares of a node that never shared them. (With a stage timeout
  set, Flower's SecAgg+ does survive a node lost after sharing keys; with its default timeout=None
  it waits for the dead node for ever. secfed's answer to a node lost while sharing keys — the
  exact sum of the others — is checked in test_flower_secagg.py.)

Kills are SIGKILLs of a SuperNode's whole process group; the node restarts under a new node id.
Flower's fixed SuperNode polls are shortened (launch.make_bin ``node_poll``) to keep this lean;
every process is stopped when the test ends, passed or not.
"""

from __future__ import annotations

import json
import re
import shutil
import time
from pathlib import Path

import numpy as np
import pytest

from secfed.adapters.flower import Cohort
from secfed.adapters.flower import node as node_files
from secfed.adapters.flower.launch import Loopback, write_app

from loopback_app import NODES, vector  # noqa: I001 - shipped into the app folder as well

APP = Path(__file__).with_name("loopback_app.py")
DEADLINE = 240  # seconds for the whole Flower run; it takes ~1–2 minutes on 2 busy cores


def exact_sum(partitions) -> list[int]:
    return (sum(vector(p).astype(np.uint64) for p in partitions) % (1 << 32)).tolist()


def node_id(log: Path) -> str:
    return re.findall(r"SuperNode ID: (\d+)", log.read_text())[-1]


@pytest.mark.deployment  # ≈ 90 s of SuperNode processes: `make test-deployment` (and `make bench`) run it
def test_secfed_survives_supernodes_killed_mid_round_and_flowers_secaggplus_halts(tmp_path):
    sync = tmp_path / "sync"
    sync.mkdir()
    cohort_file = tmp_path / "cohort.toml"
    configs, sites = [], {}
    for p in range(NODES):
        folder = tmp_path / f"node-{p}"
        sites[f"site-{p}"] = node_files.public_identity(node_files.identity_key(folder))
        configs.append({node_files.STATE_DIR_KEY: str(folder), node_files.COHORT_KEY: str(cohort_file)})
    cohort_file.write_text(Cohort(sites).dumps())
    app = write_app(tmp_path / "app", name="loopback", serverapp="loopback_app:server", clientapp="loopback_app:client",
                    config={"cohort": str(cohort_file), "out": str(tmp_path / "out.json"), "sync": str(sync),
                            "phase-timeout": 10.0, "flower-kill-stage": "share_keys"},
                    files={"loopback_app.py": APP.read_text()})

    with Loopback(tmp_path / "flower", supernodes=NODES, node_configs=configs, tls=True, node_poll=0.2) as fed:
        run = fed.run(app, stream_to=tmp_path / "run.log")
        handled: set[str] = set()
        start = time.monotonic()
        try:
            while run.poll() is None:
                assert time.monotonic() - start < DEADLINE, "the Flower run did not finish in time"
                for request in sorted(sync.glob("[kt]*-r*-p*")):  # kill-… (server) and training-… (node)
                    if request.name in handled:
                        continue
                    handled.add(request.name)
                    p = int(request.name.rsplit("-p", 1)[1])
                    dead = node_id(fed.nodes[p].log)
                    fed.kill(p)
                    (sync / ("killed-" + request.name.split("-", 1)[1])).write_text(dead)
                    fed.start_node(p)
                time.sleep(0.1)
        finally:
            if run.poll() is None:
                run.kill()
    log = (tmp_path / "run.log").read_text()
    assert run.returncode == 0, log[-3000:]
    results = json.loads((tmp_path / "out.json").read_text())

    flower = results["flower"]
    assert not flower["updated"] and "Not enough shares to recover secret" in log, flower

    for name, survivors in (("during_input", [0, 1]), ("after_keys", [0, 2])):
        got = results[name]
        assert "error" not in got, got
        assert got["authenticated"] and got["n"] == NODES
        assert got["partitions"] == survivors
        assert got["total"] == exact_sum(survivors)
    shutil.rmtree(tmp_path / "flower", ignore_errors=True)  # keeps only the logs worth reading on failure


def test_a_signal_during_the_cleanup_is_held_until_every_process_is_stopped():
    """(found by review) A second SIGHUP (a closed terminal sends two) cut the cleanup short, and a mask
    held nothing: the kernel handed the signal to another of the process's threads. Now the cleanup
    finishes — a process that ignores SIGTERM is killed after the grace — and the signal is raised after."""
    import os
    import signal
    import subprocess
    import sys
    import threading
    import time

    from secfed.adapters.flower import launch

    child = subprocess.Popen([sys.executable, "-c", "import signal, sys, time; signal.signal(signal.SIGTERM, "
                              "signal.SIG_IGN); print('ready', flush=True); time.sleep(60)"],
                             stdout=subprocess.PIPE, text=True, start_new_session=True)
    assert child.stdout.readline().strip() == "ready"
    threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGHUP)).start()  # sent from another thread
    before = signal.getsignal(signal.SIGHUP)
    signal.signal(signal.SIGHUP, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            launch._Proc("stubborn", child, None).stop(grace=1.0)
        assert child.poll() is not None  # stopped before the held signal was raised
    finally:
        signal.signal(signal.SIGHUP, before)
        child.kill()
