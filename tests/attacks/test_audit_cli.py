"""`secfed audit` end to end on a tiny recorded run: outputs, exit codes, refusals, and the run seam."""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from secfed.cli.main import cli
from secfed.federation import checkpoint as ckpt
from secfed.federation import recording

SLACK = 3.0  # seconds past --time-limit: an attack's judging, begun before the deadline, and the report

TARGETS = {"protocol", "update", "sum", "weights", "weights+head", "dfs"}


def _audit(*args: str) -> tuple[int, str, str]:
    """(exit code, stdout, everything printed)."""
    result = CliRunner().invoke(cli, ["audit", *args])
    return result.exit_code, result.stdout, result.output


def _files(folder: Path) -> set[str]:
    return {str(p.relative_to(folder)) for p in folder.rglob("*")}


def test_recorded_broadcasts_and_uploads_rebuild_the_round(recorded_run: Path) -> None:
    """The seam the audit stands on: the recorded broadcast of round 1 + the weighted mean of its
    uploads = the global model after round 1 (plain channel, no noise)."""
    recorded = recording.read_round(recorded_run, 1)
    broadcast, uploads = recorded.broadcast, list(recorded.uploads.values())
    assert len(uploads) == 3 and all(u.round == 0 for u in uploads)
    total = sum(u.summed["model"].weight for u in uploads)
    mean = sum(u.summed["model"].weight * u.summed["model"].vector for u in uploads) / total
    final = ckpt.load_checkpoint(ckpt.latest_checkpoint(recorded_run))["global"]
    torch.testing.assert_close(broadcast.weights + mean, final, rtol=0, atol=1e-5)


def test_recorded_uploads_weigh_well_under_a_model_per_file(recorded_run: Path) -> None:
    """--record-uploads keeps each file (the broadcast, each upload: a shared model's worth of float32
    on the wire) in well under the model's bytes, read back bit for bit (the seam test above)."""
    model_bytes = 4 * ckpt.load_checkpoint(ckpt.latest_checkpoint(recorded_run))["global"].numel()
    files = list((recorded_run / "uploads" / "round-0001").iterdir())
    assert len(files) == 4  # the broadcast and three uploads
    assert sum(p.stat().st_size for p in files) < 0.75 * len(files) * model_bytes


def test_a_quick_audit_writes_its_report_and_gates_on_the_verdict(recorded_run: Path, tmp_path: Path) -> None:
    before = _files(recorded_run)
    out = tmp_path / "report"
    code, stdout, output = _audit(str(recorded_run), "--budget", "quick", "--time-limit", "10", "--out", str(out),
                                  "--json", "--save-images", "--fail-on", "inconclusive")
    report = json.loads(stdout)
    verdicts = report["verdicts"]
    assert set(verdicts) == TARGETS and verdicts["dfs"] is None
    exposed = {t["target"]: t["exposed"] for t in report["targets"]}
    assert exposed["update"] and not exposed["weights+head"]  # plain channel; FedPav keeps its classifier
    # the run shares no DFS; nothing else is NO-LEAK at toy budgets, so --fail-on inconclusive fails the gate
    assert code == 1, output
    assert verdicts["sum"] != "LEAK"  # negative control: the sum of three clients' hundreds of steps
    # a run that shares no DFS gives its dfs target no time: the others share it (review: a third went unused)
    assert "target dfs: 0 s" in output, output
    assert report["source"] == "recorded" and report["round"] == 1 and report["lower_bound"] is True
    checkpoint = Path(report["run"]["checkpoint"])
    assert report["run"]["checkpoint_sha256"] == hashlib.sha256(checkpoint.read_bytes()).hexdigest()
    assert report["request"]["budget"] == "quick" and report["run"]["config"]["schedule"]["rounds"] == 1
    results = [r for t in report["targets"] for r in t["results"]]
    assert results
    for r in results:
        assert {"residual", "iterations", "restarts", "cpu_seconds", "assumptions", "verdict"} <= set(r)
    markdown = (out / "audit.md").read_text().splitlines()
    assert markdown[0].startswith("# secfed audit") and markdown[2].startswith("| target | verdict |")
    assert any(p.startswith("images/") and p.endswith(".png") for p in _files(out))
    assert _files(recorded_run) == before  # nothing written next to the run


def test_the_next_round_is_re_derived_from_the_clients_real_step(recorded_run: Path, tmp_path: Path) -> None:
    out = tmp_path / "next"
    code, _, output = _audit(str(recorded_run), "--round", "2", "--attack", "inversion", "--target", "update",
                          "--client", "corridor", "--time-limit", "3", "--out", str(out), "--fail-on", "leak")
    assert code == 0, output
    report = json.loads((out / "audit.json").read_text())
    assert report["source"] == "re-derived" and report["round"] == 2 and report["client"]["name"] == "corridor"
    assert [t["target"] for t in report["targets"]] == ["update"]
    assert "images" not in {p.split("/")[0] for p in _files(out)}  # no --save-images, no pictures


@pytest.mark.parametrize("args,message", [
    (["--attack", "membership", "--target", "update"], "use --target dfs"),
    (["--target", "dfs"], "shares no DFS"),
    (["--attack", "membership"], "--attack: this run"),  # (review: exit 0 with "n/a" alone; a gate passed)
    (["--round", "9"], "cannot be audited"),
    (["--round", "9", "--attack", "protocol"], "the protocol checks read every round's log; --round applies"),
    (["--round", "2", "--attack", "protocol"], "the protocol checks read every round's log"),  # the next round
    (["--client", "nobody"], "no client 'nobody'"),
    (["--client", "²"], "no client '²'"),  # a digit to str.isdigit, not to int(): was a ValueError traceback
    (["--time-limit", "nan"], "'nan' is not a finite number"),  # nan passed click's FloatRange(min=1)
])
def test_requests_the_run_cannot_answer_are_usage_errors(recorded_run: Path, tmp_path: Path, args: list[str],
                                                         message: str) -> None:
    code, _, output = _audit(str(recorded_run), "--out", str(tmp_path / "x"), *args)
    assert code == 2 and message in output, output
    assert "Traceback" not in output and not (tmp_path / "x").exists()  # no empty report folder left


def test_a_round_whose_re_derivation_diverges_is_a_usage_error(recorded_run: Path, tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """(found by review: the audit of a checkpoint kept after a divergence re-derived the next round, and
    the client step's TrainingDiverged ended in a traceback)"""
    from secfed.algorithms.base import Method, TrainingDiverged

    def diverges(*args: object, **kwargs: object) -> None:
        raise TrainingDiverged(4, float("nan"))

    monkeypatch.setattr(Method, "local_train", diverges)
    code, _, output = _audit(str(recorded_run), "--round", "2", "--attack", "inversion", "--target", "update",
                             "--out", str(tmp_path / "x"))
    assert code == 2 and "round 2 cannot be re-derived" in output and "Traceback" not in output, output


def test_a_report_folder_that_cannot_be_written_is_refused_before_the_attacks(recorded_run: Path) -> None:
    """(found by review: `--out /proc/nope` spent the whole audit, then stopped with a traceback)"""
    code, _, output = _audit(str(recorded_run), "--out", "/proc/nope", "--time-limit", "30")
    assert code == 2 and "--out: cannot write the report into /proc/nope" in output, output
    assert "Traceback" not in output and "target update" not in output  # refused before any attack ran


def test_a_missing_run_is_a_usage_error(tmp_path: Path) -> None:
    code, _, output = _audit(str(tmp_path / "nowhere"))
    assert code == 2 and "no such run directory" in output


def test_the_time_limit_holds_from_the_command_s_start_across_every_target(recorded_run: Path, tmp_path: Path) -> None:
    """--time-limit is wall-clock from the command's start, whatever the targets: opening the run,
    re-deriving or reading the round, building the gallery, every attack and the report together."""
    limit = 6.0
    started = time.monotonic()
    code, _, output = _audit(str(recorded_run), "--budget", "quick", "--time-limit", str(limit), "--out",
                             str(tmp_path / "timed"))
    took = time.monotonic() - started
    assert code == 0, output
    report = json.loads((tmp_path / "timed" / "audit.json").read_text())
    assert took <= limit + SLACK, f"{took:.1f} s for a {limit} s limit"
    assert report["seconds"]["wall"] <= limit + SLACK
    skipped = [t for t in report["targets"] if t["reason"].startswith("not attacked")]
    assert all(t["verdict"] == "INCONCLUSIVE" for t in skipped)  # not attacked is never safe


def test_the_time_limit_holds_while_the_round_s_uploads_are_read(recorded_run: Path, tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """(found by review: inflating 280 MB of recorded uploads ran 4 s past a 14-s --time-limit) Each file
    here takes the whole limit to read: none is begun after the deadline, and the target is reported
    not attacked (INCONCLUSIVE, never safe) within the limit."""
    limit, begun, read = 1.5, [], recording._read

    def slow(path: Path, max_bytes: int | None = None) -> object:
        begun.append(time.monotonic())
        time.sleep(limit)
        return read(path, max_bytes)

    monkeypatch.setattr(recording, "_read", slow)
    monkeypatch.setattr(recording, "_workers", lambda: 1)  # one file at a time: the next one waits for the first
    started = time.monotonic()
    code, _, output = _audit(str(recorded_run), "--attack", "inversion", "--target", "sum", "--budget", "quick",
                             "--time-limit", str(limit), "--out", str(tmp_path / "slow"))
    took = time.monotonic() - started
    assert code == 0, output
    assert all(t <= started + limit for t in begun), [round(t - started, 2) for t in begun]
    assert took <= limit + SLACK, f"{took:.1f} s for a {limit} s limit"
    report = json.loads((tmp_path / "slow" / "audit.json").read_text())
    assert [(t["target"], t["verdict"]) for t in report["targets"]] == [("sum", "INCONCLUSIVE")]
    assert report["targets"][0]["reason"].startswith("not attacked")


def test_a_checkpoint_kept_outside_its_run_is_audited_without_anyone_elses_recordings(recorded_run: Path,
                                                                                      tmp_path: Path) -> None:
    """(review: a checkpoint copied into another run's folder was audited against that run's recorded
    uploads — "round 2: recorded uploads" — and a folder named checkpoints/ without a config.json beside it
    was taken for a run, its parent receiving splits.json; typed from inside checkpoints/, a run's own
    checkpoint skipped its config.json check)"""
    import os

    from secfed.attacks.evidence import open_for_audit

    newest = ckpt.latest_checkpoint(recorded_run)
    stray = recorded_run / "from-elsewhere.pt"  # a loose checkpoint lying in a run that recorded its uploads
    stray.write_bytes(newest.read_bytes())
    try:
        audited = open_for_audit(stray)
        assert audited.run_dir is None and recording.recorded_rounds(audited.run_dir) == []
        result = CliRunner().invoke(cli, ["audit", str(stray), "--attack", "inversion", "--target", "update",
                                          "--round", "1", "--budget", "quick", "--out", str(tmp_path / "a")])
        assert result.exit_code == 2 and "none readable (no run directory" in result.output, result.output
    finally:
        stray.unlink()
    backup = tmp_path / "backup" / "checkpoints"
    backup.mkdir(parents=True)
    (backup / newest.name).write_bytes(newest.read_bytes())
    assert ckpt.run_dir_of(backup / newest.name) is None  # no config.json beside it: nobody's run
    here = os.getcwd()
    os.chdir(newest.parent)
    try:
        assert ckpt.run_dir_of(Path(newest.name)) == recorded_run.resolve()
    finally:
        os.chdir(here)
