"""`secfed train --leave-one-out`: every training domain held out in turn (FedDG protocol), each
training an ordinary run directory, interruptible and resumable as a whole."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from secfed.cli.main import cli
from secfed.federation import leave_one_out as loo

TINY = ["--height", "32", "--width", "16", "--rounds", "1", "--batch-size", "8", "--threads", "2",
        "--no-secagg", "--no-local-baseline", "--eval-every", "0"]


def _invoke(args: list[str]):  # type: ignore[no-untyped-def]
    return CliRunner().invoke(cli, ["train", *args], env={"COLUMNS": "250"})


def test_each_domain_is_held_out_once_and_an_interrupted_sweep_resumes_where_it_stopped(
        synth_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real_run = loo.run
    held_out: list[list[str]] = []

    def interrupting(cfg, run_dir, **kwargs):  # type: ignore[no-untyped-def]
        held_out.append(list(cfg.data.leave_out))
        if len(held_out) == 2 and not kwargs.get("resume"):
            raise KeyboardInterrupt  # Ctrl-C during the second training
        return real_run(cfg, run_dir, **kwargs)

    monkeypatch.setattr(loo, "run", interrupting)
    args = ["--data-root", str(synth_root), *TINY, "--rounds", "1", "--no-local-baseline", "--out", str(tmp_path),
            "--name", "sweep", "--leave-one-out"]  # one round each: the sweep's order is what is tested
    cut = _invoke(args)
    assert cut.exit_code == 130, cut.output
    assert f"secfed train --resume {tmp_path / 'sweep'}" in cut.output

    resumed = _invoke(["--resume", str(tmp_path / "sweep"), "--json"])
    assert resumed.exit_code == 0, resumed.output
    result = json.loads(resumed.stdout)
    names = [t["name"] for t in result["targets"]]
    assert sorted(names) == sorted(p.name for p in synth_root.iterdir() if p.is_dir() and p.name != "public")
    # the first training finished before the interruption and is not repeated
    assert held_out == [[names[0]], [names[1]], [names[1]], [names[2]]]
    for target in result["targets"]:
        summary = json.loads((tmp_path / "sweep" / target["run"] / "summary.json").read_text())
        assert [d["name"] for d in summary["unseen"]] == [target["name"]]
        assert target["name"] not in [d["name"] for d in summary["domains"]]
        assert target["mAP"] == summary["unseen"][0]["mAP"]
    assert result["mean"]["mAP"] == pytest.approx(sum(t["mAP"] for t in result["targets"]) / 3)
    assert json.loads((tmp_path / "sweep" / "leave-one-out.json").read_text()) == result


def test_leave_one_out_refuses_a_held_out_list_and_too_few_domains(synth_root: Path, tmp_path: Path) -> None:
    names = sorted(p.name for p in synth_root.iterdir() if p.is_dir() and p.name != "public")
    both = _invoke(["--data-root", str(synth_root), *TINY, "--out", str(tmp_path), "--leave-one-out",
                    "--leave-out", names[0]])
    assert both.exit_code == 2 and "--leave-out" in both.output and "Traceback" not in both.output
    two = _invoke(["--data-root", str(synth_root), *TINY, "--out", str(tmp_path), "--leave-one-out",
                   "--datasets", ",".join(names[:2])])
    assert two.exit_code == 2 and "--datasets" in two.output and "at least three" in two.output
    # validation mode scores no held-out domain (review: the first target trained, then a traceback)
    tuning = _invoke(["--data-root", str(synth_root), *TINY, "--out", str(tmp_path), "--leave-one-out",
                      "--validation", "0.3"])
    assert tuning.exit_code == 2 and "--validation" in tuning.output and "Traceback" not in tuning.output
    # a domain with one training image: refused before the first target trains (review: the first ran to
    # its end, then the second stopped on it)
    import shutil

    thin = tmp_path / "thin"
    shutil.copytree(synth_root, thin, ignore=shutil.ignore_patterns("public"))
    for image in sorted((thin / names[0] / "bounding_box_train").iterdir())[1:]:
        image.unlink()
    one = _invoke(["--data-root", str(thin), *TINY, "--out", str(tmp_path / "runs"), "--name", "s", "--leave-one-out"])
    assert one.exit_code == 2 and f"clients {names[0]} (1) hold fewer than 2 training images" in one.output
    assert not (tmp_path / "runs" / "s").exists()


def test_a_clients_epsilon_over_the_sweep_adds_up_over_the_runs_its_data_trained() -> None:
    """Each run of a sweep states its own ε, but a client's data trains every run except the one that
    holds its domain out: nothing stated what that costs it. Basic composition, per domain, and the
    worst domain's total (a client of `a` trained runs b and c: 2 + 3)."""
    privacy = {"a": {"epsilon": 1.0, "delta": 1e-5}, "b": {"epsilon": 2.0, "delta": 1e-5},
               "c": {"epsilon": 3.0, "delta": 1e-5}}
    targets = [{"name": n, "privacy": p} for n, p in privacy.items()]
    composed = loo.composed_privacy(targets)
    assert composed["per_domain"] == {"a": {"runs": 2, "epsilon": 5.0, "delta": 2e-5},
                                      "b": {"runs": 2, "epsilon": 4.0, "delta": 2e-5},
                                      "c": {"runs": 2, "epsilon": 3.0, "delta": 2e-5}}
    assert composed["epsilon"] == 5.0 and composed["delta"] == 2e-5 and "basic" in composed["composition"]
    unclaimed = [{"name": n, "privacy": {"mechanism": "none", "claims_epsilon": False}} for n in privacy]
    assert loo.composed_privacy(unclaimed) is None
    result = loo.SweepResult(Path("."), [{"name": "a"}], {"rank1": 0.1, "mAP": 0.1}, composed)
    assert result.to_dict()["privacy"]["epsilon"] == 5.0
    from secfed.privacy import adversary

    # DFH's identity-level DFS ε composes the same way, and a DFS-only sweep states it (found by review: none)
    dfs_only = [{"name": n, "privacy": {"epsilon_against": [{"guarantee": adversary.DFS_GUARANTEE, "released_models": e,
                                                             "delta": 1e-5}]}} for n, e in (("a", 1.0), ("b", 2.0))]
    composed = loo.composed_privacy(dfs_only)
    assert "epsilon" not in composed and composed["dfs"]["per_domain"]["a"] == {"runs": 1, "epsilon": 2.0, "delta": 1e-5}
    assert composed["dfs"]["epsilon"] == 2.0
    # each client's DP-SGD ε over every model its examples trained, the local-only baselines' included
    # (found by review: a DP-SGD sweep stated none)
    dp_sgd = [{"name": held_out, "privacy": {"dp_sgd": {f"{n}{suffix}": {"epsilon": e, "delta": 1e-5}
                                                        for n, e in trained for suffix in (" (federated)", " (local-only)")}}}
              for held_out, trained in (("a", [("b", 2.0)]), ("b", [("a", 1.0)]), ("c", [("a", 1.5), ("b", 2.0)]))]
    composed = loo.composed_privacy(dp_sgd)["dp_sgd"]
    assert composed["per_client"] == {"b": {"models": 4, "epsilon": 8.0, "delta": 4e-5},
                                      "a": {"models": 4, "epsilon": 5.0, "delta": 4e-5}}
    assert (composed["epsilon"], composed["delta"]) == (8.0, 4e-5)


def test_a_finished_targets_summary_is_read_typed_or_refused_by_name(tmp_path) -> None:
    """(found by review) Resuming a sweep trusted each finished target's summary.json: a damaged one and
    one without the held-out domain raised tracebacks."""
    import json

    import pytest

    from secfed.federation import checkpoint as ckpt
    from secfed.federation.leave_one_out import _finished

    target = tmp_path / "leave-out-campus"
    target.mkdir()
    summary = {"algorithm": "fedpav", "rounds": 1, "wall_seconds": 1.0, "domains": [{"name": "plaza", "rank1": 0.5}],
               "unseen": [{"name": "campus", "rank1": 0.25, "mAP": 0.125}]}
    (target / "summary.json").write_text(json.dumps(summary))
    assert _finished(target / "summary.json", "campus")["unseen"][0]["mAP"] == 0.125
    for damaged, why in (("{not json", "cannot be read"), (json.dumps({**summary, "unseen": []}), "scores no held-out")):
        (target / "summary.json").write_text(damaged)
        with pytest.raises(ckpt.CheckpointError, match=why):
            _finished(target / "summary.json", "campus")


def test_a_rate_given_to_a_sweeps_resume_reaches_the_targets_not_begun(tiny_config, monkeypatch,
                                                                       tmp_path: Path) -> None:
    """(found by review) A target of a sweep that had not begun when `--resume --lr X` was given built
    from the sweep's file, at the rate first given: the sweep's configuration now keeps X."""
    run_dir = tmp_path / "sweep"
    monkeypatch.setattr(loo, "_targets", lambda cfg, *a, **k: [{"name": n, "rank1": 0.1, "mAP": 0.1, "run": n,
                                                                 "privacy": None} for n in ("a", "b", "c")])
    loo.leave_one_out(tiny_config, run_dir)
    resumed = tiny_config.model_copy(deep=True)
    resumed.schedule.lr = 0.007
    loo.leave_one_out(resumed, run_dir, resume=True, rates_given=("schedule.lr",))
    assert json.loads((run_dir / loo.SWEEP_FILE).read_text())["config"]["schedule"]["lr"] == 0.007
    loo.leave_one_out(tiny_config, run_dir, resume=True)  # a plain resume leaves the sweep's file as it is
    assert json.loads((run_dir / loo.SWEEP_FILE).read_text())["config"]["schedule"]["lr"] == 0.007
