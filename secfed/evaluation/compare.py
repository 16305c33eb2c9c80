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
from typing import Annotated, Any, Callable

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from secfed import atomic_file
from secfed.errors import printable

MAX_SUMMARY_BYTES = 64 << 20  # a summary of thousands of domains is a few MB
MAX_METRICS_BYTES = 1 << 30  # a round's record is a few kB: 100,000s of rounds fit


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


Number = Annotated[float, Field(strict=True, allow_inf_nan=False)]  # a JSON number (not a string, not a bool)
Count = Annotated[int, Field(strict=True, ge=0, le=1 << 62)]
Text = Annotated[str, Field(strict=True)]
Fraction = Annotated[float, Field(strict=True, ge=0.0, le=1.0)]  # a score: rank-1 and mAP lie in [0, 1]
SCORES = ("rank1", "mAP", "local_rank1", "local_mAP")


class _Scores(BaseModel):
    model_config = ConfigDict(extra="allow")
    rank1: Fraction | None = None
    mAP: Fraction | None = None
    local_rank1: Fraction | None = None
    local_mAP: Fraction | None = None

    def scores(self) -> dict[str, float]:
        """The scores present: a mean over the rest would be silently over fewer domains."""
        return {k: v for k in SCORES if (v := getattr(self, k)) is not None}


class _Domain(_Scores):
    name: Text


class _Privacy(BaseModel):
    """What the privacy cell reads (report.privacy_cell); the rest is kept as it is."""
    model_config = ConfigDict(extra="allow")
    mechanism: Text = "none"
    epsilon: Number | None = None
    delta: Number | None = None
    epsilon_server: Number | None = None
    noise: Text = ""
    colluders: Count | None = None


class _Communication(BaseModel):
    model_config = ConfigDict(extra="allow")
    measured_up_bytes: Count = 0
    measured_down_bytes: Count = 0


class _Summary(BaseModel):
    """The fields of summary.json a comparison reads, typed: a damaged or hostile file is an error
    naming the field, never a traceback (found by review: a huge number, a string ε, a nested file)."""
    model_config = ConfigDict(extra="allow")
    algorithm: Text
    rounds: Count
    wall_seconds: Number
    communication: _Communication = _Communication()
    privacy: _Privacy = _Privacy()
    domains: list[_Domain]
    unseen: list[_Domain] = []

    @model_validator(mode="after")
    def _one_row_per_domain(self) -> _Summary:
        names = [d.name for d in [*self.domains, *self.unseen]]
        if twice := sorted({n for n in names if names.count(n) > 1}):  # the later row silently won (review)
            raise ValueError(f"domains scored twice: {', '.join(twice)}")
        return self


class _Record(BaseModel):
    """A metrics.jsonl line, as far as the curves read it."""
    model_config = ConfigDict(extra="allow")
    round: Count
    eval: dict[str, _Scores | None] | None = None


def load_run(path: Path) -> ComparedRun:
    """One finished run directory (its ``summary.json``; ``metrics.jsonl`` for the curves)."""
    path = Path(path)
    summary_file, metrics_file = path / "summary.json", path / "metrics.jsonl"
    if not path.is_dir():
        raise RunUnreadable(f"{path}: not a run directory")
    if not summary_file.exists():  # (found by review: a sweep's folder, and a folder that is no run at all,
        # were told to resume)
        runs = sorted(p for p in path.glob("leave-out-*") if p.is_dir())
        if runs:
            raise RunUnreadable(f"{path}: a leave-one-out sweep; compare its runs: " + ", ".join(map(str, runs)))
        if not (path / "config.json").is_file():
            raise RunUnreadable(f"{path}: not a run directory (no summary.json, no config.json)")
        raise RunUnreadable(f"{path}: no summary.json — the run has not finished (continue it with "
                            f"secfed train --resume {path})")
    for file, limit in ((summary_file, MAX_SUMMARY_BYTES), (metrics_file, MAX_METRICS_BYTES)):
        if file.exists() and not file.is_file():  # a FIFO would block the reader for ever (found by review)
            raise RunUnreadable(f"{file}: not a regular file")
        size = file.stat().st_size if file.exists() else 0  # read whole: a sparse 16 GB file was a MemoryError
        if size > limit:
            raise RunUnreadable(f"{file}: {size:,} bytes, more than a secfed run writes ({limit:,} at most are read)")
    summary = _read(_Summary, summary_file, summary_file.read_bytes, "a secfed summary")
    lines = _read(None, metrics_file, metrics_file.read_bytes, "").splitlines() if metrics_file.exists() else []
    history = [_read(_Record, f"{metrics_file} line {i}", lambda: line, "a secfed round record").model_dump()
               for i, line in enumerate(lines, 1) if line.strip()]
    return ComparedRun(
        label=path.name, path=path, algorithm=summary.algorithm, rounds=summary.rounds,
        wall_seconds=summary.wall_seconds, bytes_up=summary.communication.measured_up_bytes,
        bytes_down=summary.communication.measured_down_bytes, privacy=summary.privacy.model_dump(exclude_none=True),
        domains={d.name: d.scores() for d in summary.domains}, unseen={d.name: d.scores() for d in summary.unseen},
        history=history,
    )


def _read(model: type[BaseModel] | None, where: object, data: Callable[[], bytes], what: str) -> Any:
    """``data()`` as ``model`` (None: the bytes themselves); a file that cannot be read, or does not
    hold ``what``, is a :class:`RunUnreadable` naming it and the field."""
    try:
        raw = data()
        return raw if model is None else model.model_validate_json(raw)
    except OSError as exc:
        raise RunUnreadable(f"{where}: cannot be read ({exc.strerror})") from None
    except ValidationError as exc:
        error = exc.errors()[0]
        field = ".".join(str(x)[:80] for x in error["loc"])  # a key may be megabytes long (found by review)
        raise RunUnreadable(f"{where}: cannot be read as {what} ({field + ': ' if field else ''}{error['msg']})") from None


def labels_for(paths: list[Path]) -> list[str]:
    """Short unique labels: run directory names, with the parent folder where two names collide — and
    the whole path where that still does (p/q/run and s/q/run were both "q/run": found by review)."""
    names = [p.name for p in paths]
    short = [f"{p.parent.name}/{p.name}" if names.count(p.name) > 1 else p.name for p in paths]
    return [str(p) if short.count(label) > 1 else label for p, label in zip(paths, short)]


def load_runs(paths: list[Path]) -> list[ComparedRun]:
    """The runs at ``paths``, each once (the same run under two spellings is refused), labelled by their
    resolved folders (``.`` was labelled "": found by review)."""
    try:
        resolved = [Path(p).resolve() for p in paths]
    except (RuntimeError, OSError) as exc:  # a link loop (found by review: a traceback)
        raise RunUnreadable(f"cannot resolve a run's path ({exc})") from None
    if twice := [str(p) for p, r in zip(paths, resolved) if resolved.count(r) > 1]:
        raise RunUnreadable(f"{printable(twice[0])}: the same run given twice ({', '.join(map(printable, twice))})")
    runs = [load_run(p) for p in paths]
    return [replace(r, label=label) for r, label in zip(runs, labels_for(resolved))]


def _text(name: str) -> str:
    """A name drawn as itself: matplotlib reads $…$ as maths (found by review: "$\\foo{$" raised)."""
    return name.replace("$", r"\$")


def comparison_figure(runs: list[ComparedRun]) -> Figure:
    """Per metric (rank-1, mAP) grouped bars by domain, one colour per run, and each run's mean
    seen-domain rank-1 per evaluated round."""
    # (name, held out): a domain one run trains on and another holds out is two groups (found by review)
    domains = [(n, False) for n in dict.fromkeys(n for r in runs for n in r.domains)] + \
        [(n, True) for n in dict.fromkeys(n for r in runs for n in r.unseen)]
    figure = Figure(figsize=(max(6.0, 1.2 * len(domains) * max(1, len(runs)) ** 0.5 + 2), 9.0))
    FigureCanvasAgg(figure)
    axes = figure.subplots(3, 1)
    width = 0.8 / max(1, len(runs))
    for ax, (metric, title) in zip(axes[:2], (("rank1", "rank-1 (%)"), ("mAP", "mAP (%)"))):
        for i, run in enumerate(runs):
            values = [100 * (run.unseen if held_out else run.domains).get(d, {}).get(metric, float("nan"))
                      for d, held_out in domains]
            ax.bar([j + i * width for j in range(len(domains))], values, width, label=_text(run.label))
        ax.set_xticks([j + width * (len(runs) - 1) / 2 for j in range(len(domains))])
        ax.set_xticklabels([_text(d) + (" (unseen)" if held_out else "") for d, held_out in domains])
        ax.set_ylabel(title)
    axes[0].legend(fontsize="small")
    for run in runs:
        rounds, means = [], []
        scored = [{name: v["rank1"] for name, v in (record.get("eval") or {}).items()
                   if name in run.domains and v is not None and v.get("rank1") is not None}
                  for record in run.history]
        ever = set().union(*scored)
        for record, seen in zip(run.history, (list(s.values()) for s in scored)):
            # a round a site did not answer is a gap, not a mean over fewer domains (found by review)
            if seen and len(seen) == len(ever):
                rounds.append(record["round"])
                means.append(100 * sum(seen) / len(seen))
        axes[2].plot(rounds, means, marker="o", label=_text(run.label))
    axes[2].xaxis.set_major_locator(MaxNLocator(integer=True))
    axes[2].set_xlabel("round")
    axes[2].set_ylabel("mean seen-domain rank-1 (%)")
    figure.tight_layout()
    return figure


class PlotRefused(Exception):
    """The plot cannot go where it was asked to (the message names the path and why)."""


def check_plot_path(runs: list[ComparedRun], out_png: Path) -> None:
    """Refuse, before anything is drawn, a plot path that would replace what is not a plot: a file
    not named .png, or anything inside a compared run (found by review: `--plot RUN/summary.json`
    replaced the run's summary with a PNG)."""
    out_png = Path(out_png)
    if out_png.suffix.lower() != ".png":
        raise PlotRefused(f"{printable(out_png)}: the plot is a PNG; give a path ending in .png")
    try:
        where = out_png.resolve()
    except (OSError, RuntimeError) as exc:  # a link to itself (found by review: a RuntimeError traceback)
        raise PlotRefused(f"{printable(out_png)}: cannot be followed ({exc})") from None
    for run in runs:
        if where.is_relative_to(run.path.resolve()):
            raise PlotRefused(f"{printable(out_png)} lies inside the run {printable(run.path)}: write the plot "
                              "outside every run compared")


def write_plot(runs: list[ComparedRun], out_png: Path) -> Path:
    """The comparison figure as a PNG at ``out_png`` (:func:`check_plot_path`), written whole or not at all."""
    check_plot_path(runs, out_png)
    png = io.BytesIO()
    comparison_figure(runs).savefig(png, format="png", dpi=100)
    try:
        Path(out_png).parent.mkdir(parents=True, exist_ok=True)
        return atomic_file.write_bytes(Path(out_png), png.getvalue())
    except OSError as exc:  # a parent that is a file, a read-only or virtual file system
        raise PlotRefused(f"{printable(out_png)}: cannot write the plot ({exc.strerror or exc})") from None
