"""Learning curves: rank-1 and mAP per evaluated round, one line per domain, as a PNG.

Drawn with matplotlib's object API on the Agg canvas: no pyplot state, no display needed, safe
to call from a training loop on a headless machine.
"""

from __future__ import annotations

import io
import json
import math
import numbers
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from secfed import atomic_file

_PANELS = (("rank1", "Rank-1"), ("mAP", "mAP"))
FIGSIZE = (10, 4)  # inches
DPI = 120


History = str | os.PathLike[str] | Iterable[Mapping[str, Any]]


def plot_history(history: History, out_png: str | os.PathLike[str]) -> Path:
    """Plot the ``eval`` entries of round records (a ``metrics.jsonl`` path, or the records) to ``out_png``.

    A record looks like ``{"round": 3, "eval": {"domain-a": {"rank1": 0.5, "mAP": 0.3, ...}}, ...}``;
    records without ``eval`` are skipped. The PNG is written atomically (temporary file + rename),
    so a crash never leaves a half-written plot behind. Returns the path written.
    """
    figure = history_figure(history)
    out = Path(out_png)
    out.parent.mkdir(parents=True, exist_ok=True)
    png = io.BytesIO()
    figure.savefig(png, format="png", dpi=DPI)
    return atomic_file.write_bytes(out, png.getvalue())


def history_figure(history: History) -> Figure:
    """The figure :func:`plot_history` saves: panels Rank-1 and mAP (in %) against round, a line per domain."""
    if isinstance(history, (str, os.PathLike)):
        source, records = str(history), _read_jsonl(Path(history))
    else:
        source, records = "history", list(history)
    curves = _curves(records, source)

    figure = Figure(figsize=FIGSIZE, layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.subplots(1, len(_PANELS), sharex=True)
    for ax, (key, label) in zip(axes, _PANELS):
        for domain, points in curves.items():
            rounds = [r for r, _ in points[key]]
            ax.plot(rounds, [100 * v for _, v in points[key]], marker="o", markersize=3, label=domain)
        ax.set_title(label)
        ax.set_xlabel("round")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_ylabel(f"{label} (%)")
        ax.set_ylim(0, 100)
        ax.grid(True, alpha=0.3)
    axes[0].legend(fontsize="small")
    return figure


def _read_jsonl(path: Path) -> list[Mapping[str, Any]]:
    records = []
    with path.open(encoding="utf-8") as fh:
        for number, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{number}: not a JSON line ({exc.msg})") from None
    return records


def _curves(records: list[Mapping[str, Any]], source: str) -> dict[str, dict[str, list[tuple[int, float]]]]:
    """domain → metric → [(round, value)], in round order."""
    curves: dict[str, dict[str, list[tuple[int, float]]]] = {}
    for position, record in enumerate(records, start=1):
        where = f"{source} record {position}"
        if not isinstance(record, Mapping):
            raise ValueError(f"{where}: expected a JSON object, got {type(record).__name__}")
        if "eval" not in record:
            continue
        rnd = record.get("round")
        if isinstance(rnd, bool) or not isinstance(rnd, int):
            raise ValueError(f"{where}: 'round' must be an integer, got {rnd!r}")
        evaluations = record["eval"]
        if not isinstance(evaluations, Mapping):
            raise ValueError(f"{where} (round {rnd}): 'eval' must map domain → metrics")
        for domain, metrics in evaluations.items():
            points = curves.setdefault(str(domain), {key: [] for key, _ in _PANELS})
            for key, _ in _PANELS:
                value = metrics.get(key) if isinstance(metrics, Mapping) else None
                if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
                    raise ValueError(
                        f"{where} (round {rnd}): eval[{domain!r}][{key!r}] must be a number, got {value!r}"
                    )
                points[key].append((rnd, float(value)))
    if not curves:
        raise ValueError(f"{source}: no record has 'eval' metrics to plot")
    for points in curves.values():
        for series in points.values():
            series.sort(key=lambda point: point[0])
    return curves
