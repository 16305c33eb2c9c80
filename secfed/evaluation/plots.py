"""Learning curves of a run as a PNG: per domain, rank-1 and mAP of the federated model beside the
local-only baseline, and a panel of the training loss (federated clients and local-only training).

Drawn with matplotlib's object API on the Agg canvas: no pyplot state, no display needed, safe
to call from a training loop on a headless machine.
"""

from __future__ import annotations

import io
import json
import numbers
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from secfed import atomic_file
from secfed.evaluation.report import is_finite_number

_METRICS = (("rank1", "rank-1"), ("mAP", "mAP"))
_SOURCES = (("eval", "federated", "-"), ("eval_local", "local-only", "--"))
PANEL_SIZE = (4.0, 3.2)  # inches per panel
COLUMNS = 3
DPI = 100


History = str | os.PathLike[str] | Iterable[Mapping[str, Any]]


def plot_history(history: History, out_png: str | os.PathLike[str], *, title: str | None = None) -> Path:
    """Plot round records (a ``metrics.jsonl`` path, or the records) to ``out_png``, titled ``title``.

    A record looks like ``{"round": 3, "loss": 2.1, "eval": {"domain-a": {"rank1": 0.5, "mAP": 0.3}},
    "eval_local": {...}, "local_baseline": {"domain-a": {"loss": 1.9}}}``; records without
    evaluations only feed the loss panel. The PNG is written atomically (temporary file + rename),
    so a crash never leaves a half-written plot behind. Returns the path written.
    """
    figure = history_figure(history, title=title)
    out = Path(out_png)
    out.parent.mkdir(parents=True, exist_ok=True)
    png = io.BytesIO()
    figure.savefig(png, format="png", dpi=DPI)
    return atomic_file.write_bytes(out, png.getvalue())


def figure_size(domains: int) -> tuple[float, float]:
    panels = domains + 1
    columns = min(COLUMNS, panels)
    rows = -(-panels // columns)
    return PANEL_SIZE[0] * columns, PANEL_SIZE[1] * rows + 0.5


def history_figure(history: History, *, title: str | None = None) -> Figure:
    """The figure :func:`plot_history` saves: one panel per domain (rank-1 and mAP in %, federated
    solid, local-only dashed) and a last panel with the training loss."""
    if isinstance(history, (str, os.PathLike)):
        source, records = str(history), _read_jsonl(Path(history))
    else:
        source, records = "history", list(history)
    curves = _curves(records, source)
    domains = sorted({d for by_source in curves.values() for d in by_source}, key=_first_seen(records))
    figure = Figure(figsize=figure_size(len(domains)), layout="constrained")
    FigureCanvasAgg(figure)
    panels = len(domains) + 1
    columns = min(COLUMNS, panels)
    rows = -(-panels // columns)
    axes = figure.subplots(rows, columns, squeeze=False).ravel()
    for ax, domain in zip(axes, domains):
        for key, label, style in _SOURCES:
            points = curves.get(key, {}).get(domain)
            if not points:
                continue
            for metric, name in _METRICS:
                xs = [r for r, _ in points[metric]]
                ax.plot(xs, [100 * v for _, v in points[metric]], linestyle=style, marker="o", markersize=3,
                        color="tab:blue" if metric == "rank1" else "tab:orange", label=f"{label} {name}")
        ax.set_title(domain)
        ax.set_ylabel("%")
        ax.set_ylim(0, 100)
        _style(ax)
        ax.legend(fontsize="x-small")
    _loss_panel(axes[len(domains)], records)
    for ax in axes[panels:]:
        ax.set_visible(False)
    if title:
        figure.suptitle(title, fontsize="medium")
    return figure


def _style(ax: Any) -> None:
    ax.set_xlabel("round")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.grid(True, alpha=0.3)


def _loss_panel(ax: Any, records: list[Mapping[str, Any]]) -> None:
    fed = [(r["round"], r["loss"]) for r in records if isinstance(r.get("loss"), numbers.Real)]
    local = [(r["round"], sum(v["loss"] for v in r["local_baseline"].values()) / len(r["local_baseline"]))
             for r in records if isinstance(r.get("local_baseline"), Mapping) and r["local_baseline"]]
    for points, label, style in ((fed, "federated clients", "-"), (local, "local-only", "--")):
        if points:
            ax.plot([x for x, _ in points], [y for _, y in points], linestyle=style, color="tab:green", label=label)
    ax.set_title("training loss (mean over clients)")
    if fed or local:
        ax.legend(fontsize="x-small")
    else:
        ax.text(0.5, 0.5, "not logged\n(differential privacy)", ha="center", va="center", transform=ax.transAxes)
    _style(ax)


def _first_seen(records: list[Mapping[str, Any]]) -> Any:
    order: dict[str, int] = {}
    for r in records:
        for key, _, _ in _SOURCES:
            for domain in r.get(key) or {}:
                order.setdefault(str(domain), len(order))
    return lambda d: order.get(d, len(order))


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


def _curves(records: list[Mapping[str, Any]], source: str) -> dict[str, dict[str, dict[str, list[tuple[int, float]]]]]:
    """source ("eval", "eval_local") → domain → metric → [(round, value)], in round order."""
    curves: dict[str, dict[str, dict[str, list[tuple[int, float]]]]] = {}
    for position, record in enumerate(records, start=1):
        where = f"{source} record {position}"
        if not isinstance(record, Mapping):
            raise ValueError(f"{where}: expected a JSON object, got {type(record).__name__}")
        for kind, _, _ in _SOURCES:
            if kind not in record:
                continue
            rnd = record.get("round")
            if isinstance(rnd, bool) or not isinstance(rnd, int):
                raise ValueError(f"{where}: 'round' must be an integer, got {rnd!r}")
            evaluations = record[kind]
            if not isinstance(evaluations, Mapping):
                raise ValueError(f"{where} (round {rnd}): '{kind}' must map domain → metrics")
            for domain, metrics in evaluations.items():
                if metrics is None:  # not scored this round (its scoring node did not answer): no point
                    continue
                points = curves.setdefault(kind, {}).setdefault(str(domain), {key: [] for key, _ in _METRICS})
                for key, _ in _METRICS:
                    value = metrics.get(key) if isinstance(metrics, Mapping) else None
                    if not is_finite_number(value):
                        raise ValueError(
                            f"{where} (round {rnd}): {kind}[{domain!r}][{key!r}] must be a number, got {value!r}"
                        )
                    points[key].append((rnd, float(value)))
    if "eval" not in curves:
        raise ValueError(f"{source}: no record has 'eval' metrics to plot")
    for by_domain in curves.values():
        for points in by_domain.values():
            for series in points.values():
                series.sort(key=lambda point: point[0])
    return curves
