"""History plot: what is drawn (per domain federated vs local-only, the loss, the run's title), a valid
PNG written atomically, and errors that name the record."""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib.image
import pytest
from matplotlib.figure import Figure

from secfed.evaluation.plots import DPI, figure_size, history_figure, plot_history

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"

HISTORY = [
    {"round": 1, "loss": 3.2, "local_baseline": {"a": {"loss": 3.0}, "b": {"loss": 2.0}}},
    {"round": 2, "eval": {"a": {"rank1": 0.25, "mAP": 0.125, "rank5": 0.5}, "b": {"rank1": 0.5, "mAP": 0.25}},
     "eval_local": {"a": {"rank1": 0.5, "mAP": 0.25}}},
    {"round": 3, "loss": 2.1},
    {"round": 4, "eval": {"a": {"rank1": 0.75, "mAP": 0.5}}},
]


def write_jsonl(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


def test_a_panel_per_domain_with_federated_and_local_curves_and_a_loss_panel() -> None:
    figure = history_figure(HISTORY, title="run-x: fedpav")
    assert isinstance(figure, Figure)
    a, b, loss = [ax for ax in figure.axes if ax.get_visible()]
    assert (a.get_title(), b.get_title()) == ("a", "b") and "loss" in loss.get_title()
    assert figure.get_suptitle() == "run-x: fedpav"
    lines = {line.get_label(): line for line in a.get_lines()}
    assert list(lines["federated rank-1"].get_xdata()) == [2, 4]
    assert list(lines["federated rank-1"].get_ydata()) == [25.0, 75.0]
    assert list(lines["federated mAP"].get_ydata()) == [12.5, 50.0]
    assert list(lines["local-only rank-1"].get_ydata()) == [50.0]  # dashed beside it
    assert lines["local-only rank-1"].get_linestyle() == "--"
    assert [line.get_label() for line in b.get_lines()] == ["federated rank-1", "federated mAP"]
    losses = {line.get_label(): list(line.get_ydata()) for line in loss.get_lines()}
    assert losses == {"federated clients": [3.2, 2.1], "local-only": [2.5]}


def test_loss_panel_says_when_losses_are_not_logged() -> None:
    figure = history_figure([{"round": 1, "eval": {"a": {"rank1": 0.1, "mAP": 0.1}}}])
    loss = [ax for ax in figure.axes if ax.get_visible()][-1]
    assert not loss.get_lines() and "not logged" in loss.texts[0].get_text()


def test_png_from_jsonl_is_valid_and_replaces_atomically(tmp_path: Path) -> None:
    metrics = write_jsonl(tmp_path / "metrics.jsonl", HISTORY)
    out = tmp_path / "run" / "history.png"

    assert plot_history(metrics, out) == out
    data = out.read_bytes()
    assert data.startswith(PNG_SIGNATURE)
    pixels = matplotlib.image.imread(out)
    width, height = figure_size(2)
    assert pixels.shape[:2] == (round(height * DPI), round(width * DPI))
    assert pixels.std() > 0  # something was drawn

    plot_history(HISTORY[:2], out)  # overwrite in place with a different history
    assert out.read_bytes() != data
    assert sorted(p.name for p in out.parent.iterdir()) == ["history.png"]  # no temporary left


def test_failed_write_keeps_the_old_plot(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = plot_history(HISTORY, tmp_path / "history.png")
    before = out.read_bytes()

    def broken_savefig(self, *args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(Figure, "savefig", broken_savefig)
    with pytest.raises(OSError, match="disk full"):
        plot_history(HISTORY[:2], out)
    assert out.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["history.png"]


@pytest.mark.parametrize(
    ("records", "message"),
    [
        ([{"round": 1, "loss": 1.0}], "no record has 'eval' metrics"),
        ([{"eval": {"a": {"rank1": 0.1, "mAP": 0.1}}}], "history record 1: 'round' must be an integer"),
        ([{"round": 5, "eval": {"a": {"rank1": 0.1}}}], r"round 5\): eval\['a'\]\['mAP'\] must be a number"),
        ([{"round": 5, "eval": [0.1]}], "'eval' must map domain"),
        (["not a record"], "expected a JSON object"),
    ],
)
def test_bad_records_are_named(records: list, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        history_figure(records)


def test_bad_jsonl_line_names_file_and_line(tmp_path: Path) -> None:
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text(json.dumps(HISTORY[1]) + "\n\n{truncated\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"metrics.jsonl:3: not a JSON line"):
        plot_history(metrics, tmp_path / "out.png")
    assert not (tmp_path / "out.png").exists()


def test_a_domain_not_scored_in_a_round_is_a_gap_not_an_error() -> None:
    """(found by review: a Flower node that did not answer the evaluation left its domain's entry None,
    and drawing history.png at the end of the run raised)"""
    figure = history_figure([*HISTORY, {"round": 5, "eval": {"a": None, "b": {"rank1": 1.0, "mAP": 1.0}}}])
    a, b, _ = [ax for ax in figure.axes if ax.get_visible()]
    assert list({line.get_label(): line for line in a.get_lines()}["federated rank-1"].get_xdata()) == [2, 4]
    assert list({line.get_label(): line for line in b.get_lines()}["federated rank-1"].get_xdata()) == [2, 5]
