"""Progress through every wait of a run (issue 25 item 2): the library's steps reach the listener of
their own context only, each wait of a round is a step naming what it does, the CLI draws them as
transient bars with an ETA, and listening changes nothing the run computes."""

from __future__ import annotations

import io
import json
import threading
from pathlib import Path

import pytest
import torch
from rich.console import Console

from secfed import progress
from secfed.algorithms.kd import KD_ACTIVITY
from secfed.cli.progress import RichReporter
from secfed.config import RunConfig
from secfed.federation import checkpoint as ckpt
from secfed.federation.evaluate import SCORING
from secfed.federation.runtime import BASELINES, run

Step = tuple[str, int, int, str]


def test_steps_reach_the_listener_of_their_context_only() -> None:
    heard: list[Step] = []
    progress.step("before", 0, 1)  # nobody listens: nothing happens
    with progress.listening(lambda *s: heard.append(s)):
        assert list(progress.tracked("counting", ["a", "b"], str.upper)) == ["a", "b"]
        other = threading.Thread(target=progress.step, args=("another thread", 0, 1))
        other.start()
        other.join()
    progress.step("after", 0, 1)
    assert heard == [("counting", 0, 2, "A"), ("counting", 1, 2, "B"), ("counting", 2, 2, "")]


def test_a_checkpoint_wait_is_a_step_naming_its_round(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    release = threading.Event()
    write = ckpt.save_checkpoint

    def slow_write(*args: object) -> object:  # a slow disk: the write outlasts the next round
        assert release.wait(10)
        return write(*args)

    monkeypatch.setattr(ckpt, "save_checkpoint", slow_write)
    heard: list[Step] = []
    writer = ckpt.BackgroundWriter()
    writer.save(tmp_path, 4, {"global": torch.zeros(3)})
    threading.Timer(0.2, release.set).start()
    with progress.listening(lambda *s: heard.append(s)):
        writer.wait()
    assert heard == [(ckpt.CHECKPOINT_WAIT, 0, 1, "round 4"), (ckpt.CHECKPOINT_WAIT, 1, 1, "")]


def test_the_cli_draws_a_wait_as_a_transient_bar_with_its_eta() -> None:
    screen = io.StringIO()
    with RichReporter(Console(file=screen, force_terminal=True, width=200)) as reporter:
        progress.step(SCORING, 1, 4, "cam[1]: federated model")  # a name that looks like markup stays text
        (task,) = [t for t in reporter.progress.tasks if t.description.endswith(SCORING)]
        assert task.description == SCORING and (task.completed, task.total) == (1, 4)
        reporter.progress.refresh()
        drawn = screen.getvalue()
        assert "cam[1]: federated model" in drawn and "ETA" in drawn
        progress.step(SCORING, 4, 4)
        assert not any(t.description.endswith(SCORING) for t in reporter.progress.tasks)
    progress.step(SCORING, 0, 4)  # the reporter closed: it no longer listens


def test_a_plain_log_gets_no_bars_and_no_markup() -> None:
    log = io.StringIO()
    with RichReporter(Console(file=log, force_terminal=False, width=200)):
        progress.step(KD_ACTIVITY, 0, 10, "epoch 1/1")
        progress.step(KD_ACTIVITY, 10, 10)
    assert "[bold" not in log.getvalue() and KD_ACTIVITY not in log.getvalue()


def _kd_run(cfg: RunConfig, synth_root: Path, name: str) -> RunConfig:
    cfg.run.name = name
    cfg.schedule.rounds = 1
    cfg.method.kd = True
    cfg.method.kd_public = str(synth_root / "public")  # unlabelled images of other people
    cfg.method.kd_images = 20  # fewer than a batch: one batch an epoch, so a step per epoch
    cfg.method.kd_epochs = 3
    return cfg


def test_every_wait_of_a_round_is_a_step_and_listening_changes_nothing(two_site_config: RunConfig,
                                                                       synth_root: Path) -> None:
    cfg = two_site_config  # the steps name every site: two are enough to check that
    heard: list[Step] = []
    with progress.listening(lambda *s: heard.append(s)):
        heard_run = run(_kd_run(cfg, synth_root, "heard"), Path(cfg.run.out) / "heard")
    quiet = run(_kd_run(cfg, synth_root, "quiet"), Path(cfg.run.out) / "quiet")

    by_activity: dict[str, list[Step]] = {}
    for s in heard:
        by_activity.setdefault(s[0], []).append(s)
    domains = [d.name for d in heard_run.federation.domains]
    scoring = by_activity[SCORING]  # one step per job, each naming its domain, then the end
    assert scoring[-1][1] == scoring[-1][2] == len(scoring) - 1
    assert all(any(s[3].startswith(f"{d}: ") for s in scoring) for d in domains)
    assert [s[3] for s in by_activity[BASELINES][:-1]] == [b.name for b in heard_run.federation.baselines.values()]
    kd = by_activity[KD_ACTIVITY]
    assert [s[1:] for s in kd] == [(0, 3, "epoch 1/3"), (1, 3, "epoch 2/3"), (2, 3, "epoch 3/3"), (3, 3, "")]
    # what the run computes and writes is the same whether anyone listened
    for key in ("domains", "communication", "privacy"):
        assert heard_run.summary[key] == quiet.summary[key], key
    assert torch.equal(heard_run.federation.server.weights, quiet.federation.server.weights)
    records = [json.loads((Path(cfg.run.out) / n / "metrics.jsonl").read_text()) for n in ("heard", "quiet")]
    for record in records:
        record.pop("seconds")
    assert records[0] == records[1]


@pytest.mark.parametrize("claims_epsilon", [False, True])
def test_under_an_epsilon_the_bars_name_no_client_and_count_no_cohort(claims_epsilon: bool) -> None:
    """(found by review: under a claimed ε the terminal bar showed each round's secret Poisson cohort,
    its size and each member's name — kept in scrollback, `script` logs and CI consoles)"""
    from types import SimpleNamespace

    cfg = SimpleNamespace(schedule=SimpleNamespace(rounds=2), data=SimpleNamespace(scenario="by-dataset", height=16,
                          width=8), model=SimpleNamespace(backbone="resnet18"))
    fed = SimpleNamespace(config=cfg, domains=[], method=SimpleNamespace(describe=lambda: "FedPav"), clients=[1, 2, 3],
                          layout=SimpleNamespace(size=10), channel=SimpleNamespace(name="plain"),
                          plan=SimpleNamespace(claims_epsilon=claims_epsilon, dp_sgd=None, dfs=None))
    screen = io.StringIO()
    with RichReporter(Console(file=screen, force_terminal=True, width=200)) as reporter:
        reporter.run_started(fed, 0)
        reporter.round_started(1, ["campus", "plaza"])
        reporter.client_done(1, "campus")
        progress.step(SCORING, 1, 4, "plaza: federated model")
        reporter.progress.refresh()
        (bar,) = [t for t in reporter.progress.tasks if t.description == "clients"]
        drawn = screen.getvalue()
    named = "campus" in drawn or "plaza" in drawn
    assert named != claims_epsilon and (bar.total == 1) == claims_epsilon
