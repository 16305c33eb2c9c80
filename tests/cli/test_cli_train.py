"""`secfed train` and `secfed evaluate` end to end on a tiny synthetic federation."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from secfed.cli.main import cli

TINY = ["--height", "32", "--width", "16", "--rounds", "2", "--batch-size", "8", "--no-secagg", "--threads", "2"]


@pytest.fixture(scope="module")
def trained(synth_root: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, Path]:
    out = tmp_path_factory.mktemp("cli-runs")
    result = CliRunner().invoke(
        cli, ["train", "--data-root", str(synth_root), *TINY, "--out", str(out), "--name", "r", "--json"]
    )
    assert result.exit_code == 0, result.output + str(result.exception)
    return json.loads(result.stdout), out / "r"


def test_train_json_is_one_object_with_the_promised_keys(trained: tuple[dict, Path]) -> None:
    summary, run_dir = trained
    assert summary["run_dir"] == str(run_dir)
    assert summary["algorithm"] == "fedpav" and summary["rounds"] == 2 and summary["wall_seconds"] > 0
    names = [d["name"] for d in summary["domains"]]
    assert len(names) == 3 and len(set(names)) == 3
    for d in summary["domains"]:
        for key in ("rank1", "rank5", "rank10", "mAP", "local_rank1", "raw_pixels_rank1"):
            assert 0.0 <= d[key] <= 1.0, key
        assert d["rank1"] <= d["rank5"] <= d["rank10"]
    comm = summary["communication"]
    assert comm["cost_bytes"] == 2 * 2 * comm["shared_model_bytes"]


def test_run_directory_holds_config_metrics_checkpoint_plot(trained: tuple[dict, Path]) -> None:
    _, run_dir = trained
    config = json.loads((run_dir / "config.json").read_text())
    assert config["train"]["rounds"] == 2 and config["data"]["height"] == 32
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["round"] for r in lines] == [1, 2]
    assert all(r["bytes_up"] > 0 and r["bytes_down"] > 0 and r["loss"] > 0 for r in lines)
    assert "eval" in lines[-1] and "final" in lines[-1]
    assert (run_dir / "checkpoints" / "round-0002.pt").is_file()
    assert (run_dir / "history.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert json.loads((run_dir / "summary.json").read_text())["rounds"] == 2


def test_evaluate_reproduces_the_final_federated_scores(trained: tuple[dict, Path]) -> None:
    summary, run_dir = trained
    result = CliRunner().invoke(cli, ["evaluate", str(run_dir), "--json", "--threads", "2"])
    assert result.exit_code == 0, result.output
    evaluated = json.loads(result.stdout)
    assert evaluated["rounds"] == 2
    by_name = {d["name"]: d for d in evaluated["domains"]}
    for d in summary["domains"]:
        assert by_name[d["name"]]["rank1"] == pytest.approx(d["rank1"])
        assert by_name[d["name"]]["mAP"] == pytest.approx(d["mAP"])
        assert by_name[d["name"]]["local_rank1"] == pytest.approx(d["local_rank1"])


@pytest.mark.parametrize("args, flag", [
    (["--clients-per-round", "9"], "--clients-per-round"),
    (["--scenario", "by-camera"], "--datasets"),
    (["--scenario", "by-identity", "--datasets", "campus"], "--num-clients"),
    (["--rounds", "0"], "--rounds"),
    (["--dropout-rate", "1.5"], "--dropout-rate"),
    (["--bn-stats", "local", "--scenario", "by-camera", "--datasets", "campus"], "--bn-stats"),
    (["--datasets", "nope"], "--datasets"),
    (["--device", "nope"], "--device"),
    (["--secagg-clip", "0.5"], "--secagg-clip"),
    (["--authenticated", "--no-secagg"], "--authenticated"),
    (["--clip", "1", "--noise-multiplier", "1"], "--aggregation"),
    (["--clip", "1", "--noise-multiplier", "1", "--aggregation", "unweighted"], "--bn-stats"),
    (["--target-epsilon", "3"], "--target-epsilon"),
    (["--sample-rate", "0.5"], "--sample-rate"),
    (["--dp-distributed", "--clip", "1", "--noise-multiplier", "1", "--aggregation", "unweighted",
      "--bn-stats", "local", "--no-secagg"], "--dp-distributed"),
])
def test_invalid_settings_name_the_flag(synth_root: Path, tmp_path: Path, args: list[str], flag: str) -> None:
    result = CliRunner().invoke(cli, ["train", "--data-root", str(synth_root), *TINY, "--out", str(tmp_path), *args])
    assert result.exit_code == 2, result.output
    assert flag in result.output


def test_resume_refuses_flags_that_change_the_run(trained: tuple[dict, Path]) -> None:
    _, run_dir = trained
    result = CliRunner().invoke(cli, ["train", "--resume", str(run_dir), "--rounds", "5"])
    assert result.exit_code == 2 and "--rounds" in result.output


def test_missing_data_root_and_config_file_are_named(tmp_path: Path) -> None:
    result = CliRunner().invoke(cli, ["train", "--data-root", str(tmp_path / "absent"), "--out", str(tmp_path)])
    assert result.exit_code == 2 and "absent" in result.output
    bad = tmp_path / "bad.toml"
    bad.write_text("[train]\nroundz = 3\n")
    result = CliRunner().invoke(cli, ["train", "--config", str(bad), "--out", str(tmp_path)])
    assert result.exit_code == 2 and "train.roundz" in result.output


def test_config_file_is_overridden_by_flags(synth_root: Path, tmp_path: Path) -> None:
    from click import Context

    from secfed.cli.train import resolve_config, train_command

    toml = tmp_path / "run.toml"
    toml.write_text(f'seed = 5\n[data]\nroot = "{synth_root}"\n[train]\nrounds = 7\nbatch_size = 16\n')
    ctx = train_command.make_context("train", ["--config", str(toml), "--rounds", "3", "--out", str(tmp_path)])
    with ctx:
        cfg, run_dir, resuming = resolve_config(ctx, ctx.params)
    assert (cfg.train.rounds, cfg.train.batch_size, cfg.seed, cfg.data.root) == (3, 16, 5, str(synth_root))
    assert not resuming and run_dir.parent == tmp_path
    assert isinstance(ctx, Context)


def test_resume_of_a_finished_run_reads_its_saved_config_and_reports_the_same(trained: tuple[dict, Path]) -> None:
    summary, run_dir = trained
    result = CliRunner().invoke(cli, ["train", "--resume", str(run_dir), "--json", "--threads", "2"])
    assert result.exit_code == 0, result.output
    again = json.loads(result.stdout)
    assert again["rounds"] == 2 and again["domains"] == summary["domains"]
