"""History plot: what is drawn, a valid PNG written atomically, and errors that name the record."""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib.image
import pytest
from matplotlib.figure import Figure

from secfed.evaluation.plots import DPI, FIGSIZE, history_figure, plot_history

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"

HISTORY = [
    {"round": 1, "loss": 3.2},
    {"round": 2, "eval": {"a": {"rank1": 0.25, "mAP": 0.125, "rank5": 0.5}, "b": {"rank1": 0.5, "mAP": 0.25}}},
    {"round": 3, "loss": 2.1},
    {"round": 4, "eval": {"a": {"rank1": 0.75, "mAP": 0.5}}},
]


def write_jsonl(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


def test_panels_have_a_line_per_domain_in_percent() -> None:
    figure = history_figure(HISTORY)
    assert isinstance(figure, Figure)
    rank1, m_ap = figure.axes
    assert (rank1.get_title(), m_ap.get_title()) == ("Rank-1", "mAP")
    lines = {line.get_label(): line for line in rank1.get_lines()}
    assert list(lines["a"].get_xdata()) == [2, 4] and list(lines["a"].get_ydata()) == [25.0, 75.0]
    assert list(lines["b"].get_xdata()) == [2] and list(lines["b"].get_ydata()) == [50.0]
    assert [list(line.get_ydata()) for line in m_ap.get_lines()] == [[12.5, 50.0], [25.0]]


def test_png_from_jsonl_is_valid_and_replaces_atomically(tmp_path: Path) -> None:
    metrics = write_jsonl(tmp_path / "metrics.jsonl", HISTORY)
    out = tmp_path / "run" / "history.png"

    assert plot_history(metrics, out) == out
    data = out.read_bytes()
    assert data.startswith(PNG_SIGNATURE)
    pixels = matplotlib.image.imread(out)
    assert pixels.shape[:2] == (FIGSIZE[1] * DPI, FIGSIZE[0] * DPI)
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
