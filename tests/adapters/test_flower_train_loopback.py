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
