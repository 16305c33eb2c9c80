"""`secfed flower local` (hence `secfed train --flower`) on the Deployment Engine: a SuperLink and
two SuperNodes as processes on 127.0.0.1 (TLS, registered SuperNodes), every ClientApp message a
fresh process. It trains the synthetic default for 2 rounds with authenticated secure aggregation
and writes the run directory an in-process run writes; each site's private state stays in its
SuperNode's folder.

Kept small (16×8 pixels, a tenth of the synthetic default, one evaluation) and with Flower's fixed
SuperNode polls capped (``--node-poll``): the time goes to Flower's per-message process starts.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from secfed.cli.main import cli
from secfed.federation import checkpoint as ckpt

SMALL = ["--synth-scale", "0.1", "--height", "16", "--width", "8", "--neck-dim", "32", "--rounds", "2",
         "--batch-size", "8", "--no-local-baseline", "--eval-every", "0", "--seed", "1"]


def files(folder: Path) -> set[str]:
    return {str(p.relative_to(folder)) for p in folder.rglob("*")}


@pytest.mark.deployment
def test_train_on_flower_loopback_writes_the_in_process_run_directory(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))  # SuperNodes inherit it: one data cache
    out = tmp_path / "runs"
    runner = CliRunner()
    # In-process first: it also generates the synthetic default into the cache the nodes read.
    local = runner.invoke(cli, ["train", *SMALL, "--out", str(out), "--name", "in-process"])
    assert local.exit_code == 0, local.output
    flower = runner.invoke(cli, ["flower", "local", "--supernodes", "2", "--node-poll", "0.2", "--keep", *SMALL,
                                 "--out", str(out), "--name", "flower"])
    assert flower.exit_code == 0, flower.output
    assert "\x1b[" not in flower.output and "DEBUG" not in flower.output  # Flower's own lines go to its log
    assert (out / "flower.flower" / "deployment" / "logs" / "flwr-run.log").is_file()
    ours, theirs = out / "flower", out / "in-process"
    assert files(ours) == files(theirs)
    assert {"config.json", "data.json", "metrics.jsonl", "summary.json", "history.png"} <= files(ours)
    a = [json.loads(x) for x in (ours / "metrics.jsonl").read_text().splitlines()]
    b = [json.loads(x) for x in (theirs / "metrics.jsonl").read_text().splitlines()]
    assert [r["round"] for r in a] == [1, 2]
    assert [set(r) for r in a] == [set(r) for r in b]
    assert [r["contributors"] for r in a] == [r["contributors"] for r in b] == [4, 4]  # one site per domain
    assert all(r["bytes_up"] > 0 for r in a)
    s_ours, s_theirs = (json.loads((d / "summary.json").read_text()) for d in (ours, theirs))
    assert set(s_ours) == set(s_theirs)
    assert s_ours["channel"] == s_theirs["channel"] == "secagg"
    assert [d["name"] for d in s_ours["domains"]] == [d["name"] for d in s_theirs["domains"]]
    state = ckpt.load_checkpoint(ours / "checkpoints" / "round-0002.pt")
    assert state["deployment"] == "flower"
    # Each site's private state is on its SuperNode (site k on node k mod 2), nowhere in the run directory.
    names = [c["name"] for c in json.loads((ours / "data.json").read_text())["clients"]]
    work = out / "flower.flower"
    for k, name in enumerate(names):
        assert len(list(work.glob(f"node-{k % 2}/runs/*/site-{k:04d}-{name}/state.pt"))) == 1
        assert not list(work.glob(f"node-{1 - k % 2}/runs/*/site-{k:04d}-*"))
    assert not list(work.glob("node-*/pending/*"))  # each masked input was used once, then deleted
    assert "secure aggregation: unmask" in flower.output


def _processes_in(folder: Path) -> list[str]:
    """Live processes whose command line or working folder lies in ``folder``."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            cwd = str((proc / "cwd").resolve())
        except OSError:
            continue
        if str(folder) in cmdline or cwd.startswith(str(folder)):
            found.append(f"{proc.name}: {cmdline[:200]}")
    return found


@pytest.mark.deployment
def test_flower_local_stops_every_flower_process_on_sigterm_and_on_a_nodes_refusal(tmp_path, synth_root):
    """`kill` of `secfed flower local` stops the SuperLink, the SuperNodes and what they started (before,
    Python's default SIGTERM left them all running), and a refusal by one of its own nodes stops the run at
    once instead of waiting the start timeout (300 s) for a node that will not change its mind."""
    import os
    import signal
    import subprocess
    import sys
    import time

    out = (tmp_path / "runs").resolve()
    base = [sys.executable, "-c", "from secfed.cli.main import main; main()", "flower", "local", "--supernodes", "2",
            "--node-poll", "0.2", *[a for a in SMALL if a not in ("--synth-scale", "0.1")], "--out", str(out)]
    process = subprocess.Popen([*base, "--name", "killed", "--data-root", str(synth_root), "--rounds", "50"],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    logs = out / "killed.flower" / "deployment" / "logs"
    deadline = time.monotonic() + 120
    while not (logs / "supernode-1.log").is_file() and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    time.sleep(3)  # the SuperNodes have started their own processes
    assert process.poll() is None, process.communicate()[0]  # still running: nothing was stopped yet
    assert _processes_in(out / "killed.flower")
    process.send_signal(signal.SIGTERM)
    time.sleep(0.05)
    process.send_signal(signal.SIGTERM)  # a second one during the cleanup (review: it left the SuperLink up)
    output = process.communicate(timeout=60)[0]
    assert process.returncode == 130 and "Traceback" not in output, output
    assert _processes_in(out / "killed.flower") == []
    # nodes that refuse the run (here: their data root holds no dataset; the server never reads it) stop it
    empty = tmp_path / "empty"
    empty.mkdir()
    started = time.monotonic()
    refused = subprocess.run([*base, "--name", "refused", "--data-root", str(empty)], capture_output=True, text=True,
                             timeout=240, env={**os.environ, "COLUMNS": "250"})
    assert refused.returncode != 0 and "refused" in refused.stdout + refused.stderr, refused.stdout + refused.stderr
    assert time.monotonic() - started < 120
    assert _processes_in(out / "refused.flower") == []
