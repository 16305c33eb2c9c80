"""Several finished runs side by side: per-domain scores, privacy, time and bytes, and one plot.

``secfed compare RUN [RUN ...]`` reads only what each run directory already holds (``summary.json``,
``metrics.jsonl``, ``config.json``); nothing is re-evaluated, so comparing is instant and needs no
data. A run directory that is missing, unfinished or unreadable is an error naming it.
"""

from __future__ import annotations

import io
import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from secfed import atomic_file


class RunUnreadable(ValueError):
    """A path given to ``secfed compare`` is not a finished run directory."""


@dataclass(frozen=True)
class ComparedRun:
    """What the comparison shows of one run."""

    label: str
    path: Path
    algorithm: str
    rounds: int
    wall_seconds: float
    bytes_up: int
    bytes_down: int
    privacy: dict[str, Any]
    domains: dict[str, dict[str, float]]  # name -> rank1, mAP (and local_rank1 ... where present)
    unseen: dict[str, dict[str, float]]
    history: list[dict[str, Any]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"label": self.label, "run_dir": str(self.path), "algorithm": self.algorithm, "rounds": self.rounds,
                "wall_seconds": self.wall_seconds, "bytes_up": self.bytes_up, "bytes_down": self.bytes_down,
                "privacy": self.privacy, "domains": self.domains, "unseen": self.unseen}


def load_run(path: Path) -> ComparedRun:
    """One finished run directory (its ``summary.json``; ``metrics.jsonl`` for the curves)."""
    path = Path(path)
    summary_file = path / "summary.json"
    if not path.is_dir():
        raise RunUnreadable(f"{path}: not a run directory")
    if not summary_file.exists():
        raise RunUnreadable(f"{path}: no summary.json — the run has not finished (continue it with "
                            f"secfed train --resume {path})")
    try:
        summary = json.loads(summary_file.read_text())
        history = _history([json.loads(line) for line in (path / "metrics.jsonl").read_text().splitlines()
                            if line.strip()] if (path / "metrics.jsonl").exists() else [])
        comm = summary.get("communication", {})
        return ComparedRun(
            label=path.name, path=path, algorithm=str(summary["algorithm"]), rounds=int(summary["rounds"]),
            wall_seconds=float(summary["wall_seconds"]),
            bytes_up=int(comm.get("measured_up_bytes", 0)), bytes_down=int(comm.get("measured_down_bytes", 0)),
            privacy=dict(summary.get("privacy", {})),
            domains={d["name"]: _scores(d) for d in summary["domains"]},
            unseen={d["name"]: _scores(d) for d in summary.get("unseen", [])},
            history=history,
        )
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise RunUnreadable(f"{summary_file}: cannot be read as a secfed summary ({type(exc).__name__}: {exc})") from None


def _scores(domain: dict[str, Any]) -> dict[str, float]:
    """A domain row's scores; a score that is neither a number nor absent (None) is refused, never
    dropped — a mean over the rest would be silently over fewer domains (found by review)."""
    out = {}
    for k in ("rank1", "mAP", "local_rank1", "local_mAP"):
        value = domain.get(k)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"domain {domain.get('name')!r}: {k} is {value!r}, not a number")
        out[k] = float(value)
    return out


def _history(records: list[Any]) -> list[dict[str, Any]]:
    """metrics.jsonl's records, each an object whose evaluation (if any) maps domains to score objects."""
    for i, record in enumerate(records, 1):
        evaluated = record.get("eval") if isinstance(record, dict) else None
        if not isinstance(record, dict) or not isinstance(evaluated, (dict, type(None))) or not all(
                v is None or (isinstance(v, dict) and isinstance(v.get("rank1"), (int, float, type(None))))
                for v in (evaluated or {}).values()):
            raise ValueError(f"metrics.jsonl line {i} is not a secfed round record")
    return records


def labels_for(paths: list[Path]) -> list[str]:
    """Short unique labels: run directory names, with the parent folder where two names collide."""
    names = [p.name for p in paths]
    return [f"{p.parent.name}/{p.name}" if names.count(p.name) > 1 else p.name for p in paths]


def load_runs(paths: list[Path]) -> list[ComparedRun]:
    runs = [load_run(p) for p in paths]
    return [replace(r, label=label) for r, label in zip(runs, labels_for(paths))]


def comparison_figure(runs: list[ComparedRun]) -> Figure:
    """Per metric (rank-1, mAP) grouped bars by domain, one colour per run, and each run's mean
    seen-domain rank-1 per evaluated round."""
    domains = list(dict.fromkeys(name for r in runs for name in [*r.domains, *r.unseen]))
    figure = Figure(figsize=(max(6.0, 1.2 * len(domains) * max(1, len(runs)) ** 0.5 + 2), 9.0))
    FigureCanvasAgg(figure)
    axes = figure.subplots(3, 1)
    width = 0.8 / max(1, len(runs))
    for ax, (metric, title) in zip(axes[:2], (("rank1", "rank-1 (%)"), ("mAP", "mAP (%)"))):
        for i, run in enumerate(runs):
            scores = {**run.domains, **run.unseen}
            values = [100 * scores.get(d, {}).get(metric, float("nan")) for d in domains]
            ax.bar([j + i * width for j in range(len(domains))], values, width, label=run.label)
        ax.set_xticks([j + width * (len(runs) - 1) / 2 for j in range(len(domains))])
        ax.set_xticklabels([d + (" (unseen)" if any(d in r.unseen for r in runs) else "") for d in domains])
        ax.set_ylabel(title)
    axes[0].legend(fontsize="small")
    for run in runs:
        rounds, means = [], []
        for record in run.history:
            seen = [v["rank1"] for name, v in (record.get("eval") or {}).items()
                    if name in run.domains and v is not None and v.get("rank1") is not None]
            if seen:
                rounds.append(record["round"])
                means.append(100 * sum(seen) / len(seen))
        axes[2].plot(rounds, means, marker="o", label=run.label)
    axes[2].xaxis.set_major_locator(MaxNLocator(integer=True))
    axes[2].set_xlabel("round")
    axes[2].set_ylabel("mean seen-domain rank-1 (%)")
    figure.tight_layout()
    return figure


def write_plot(runs: list[ComparedRun], out_png: Path) -> Path:
    png = io.BytesIO()
    comparison_figure(runs).savefig(png, format="png", dpi=100)
    Path(out_png).parent.mkdir(parents=True, exist_ok=True)
    return atomic_file.write_bytes(Path(out_png), png.getvalue())
