"""End-of-run tables: retrieval accuracy per domain, and a run summary with the communication cost.

Both return :class:`rich.table.Table` objects; the CLI prints them, tests render them to text.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any

from rich.markup import escape
from rich.table import Table

from secfed.evaluation.communication import communication_cost, format_bytes
from secfed.evaluation.metrics import RetrievalScores
from secfed.privacy.adversary import DFS_GUARANTEE

Scores = RetrievalScores | Mapping[str, float]

BEATS_LOCAL_STYLE = "bold green"


@dataclass(frozen=True)
class DomainResult:
    """One domain's row. Rates are fractions in [0, 1]; ``None`` means not measured in this run."""

    domain: str
    rank1: float | None = None  # the federated (aggregated) model
    rank5: float | None = None
    rank10: float | None = None
    mAP: float | None = None
    local_rank1: float | None = None  # the domain's data trained alone: the baseline federation must beat
    local_mAP: float | None = None
    local_model_rank1: float | None = None  # the client's model after local training, before aggregation
    raw_pixels_rank1: float | None = None  # retrieval on raw pixels: the floor any model should clear

    def __post_init__(self) -> None:
        if not isinstance(self.domain, str) or not self.domain:
            raise ValueError(f"domain must be a non-empty string, got {self.domain!r}")
        for f in fields(self)[1:]:
            value = getattr(self, f.name)
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0.0 <= value <= 1.0:
                raise ValueError(f"{self.domain}: {f.name} must be a rate in [0, 1], got {value!r}")
            object.__setattr__(self, f.name, float(value))

    @classmethod
    def from_scores(
        cls,
        domain: str,
        federated: Scores | None = None,
        *,
        local: Scores | None = None,
        local_model: Scores | None = None,
        raw_pixels: Scores | None = None,
    ) -> DomainResult:
        """A row from whole score sets (:class:`RetrievalScores` or their ``to_dict()``)."""
        return cls(
            domain=domain,
            rank1=_pick(federated, "rank1", domain, "federated"),
            rank5=_pick(federated, "rank5", domain, "federated"),
            rank10=_pick(federated, "rank10", domain, "federated"),
            mAP=_pick(federated, "mAP", domain, "federated"),
            local_rank1=_pick(local, "rank1", domain, "local"),
            local_mAP=_pick(local, "mAP", domain, "local"),
            local_model_rank1=_pick(local_model, "rank1", domain, "local_model"),
            raw_pixels_rank1=_pick(raw_pixels, "rank1", domain, "raw_pixels"),
        )

    @classmethod
    def from_dict(cls, row: Mapping[str, Any]) -> DomainResult:
        """A row from a dict: either this class's field names (flat), or ``domain`` plus any of
        ``federated``, ``local``, ``local_model``, ``raw_pixels`` holding score dicts (nested)."""
        nested = {"federated", "local", "local_model", "raw_pixels"}
        flat = {f.name for f in fields(cls)}
        keys = set(row)
        allowed = ({"domain"} | nested) if keys & nested else flat
        if unknown := sorted(keys - allowed):
            raise ValueError(
                f"result row {row.get('domain', '?')!r}: unknown keys {unknown}; "
                f"use {sorted(flat)} or domain + {sorted(nested)}"
            )
        if "domain" not in row:
            raise ValueError(f"result row without a 'domain': {dict(row)!r}")
        if keys & nested:
            return cls.from_scores(
                row["domain"],
                row.get("federated"),
                local=row.get("local"),
                local_model=row.get("local_model"),
                raw_pixels=row.get("raw_pixels"),
            )
        return cls(**row)


# (field, header, the local-only field it is compared with)
_COLUMNS: tuple[tuple[str, str, str | None], ...] = (
    ("rank1", "Fed\nR-1", "local_rank1"),
    ("rank5", "Fed\nR-5", None),
    ("rank10", "Fed\nR-10", None),
    ("mAP", "Fed\nmAP", "local_mAP"),
    ("local_rank1", "Local\nR-1", None),
    ("local_mAP", "Local\nmAP", None),
    ("local_model_rank1", "Pre-agg\nR-1", None),
    ("raw_pixels_rank1", "Pixels\nR-1", None),
)


# What each column family means, said once under the table (only for the columns shown).
_LEGEND = {
    "rank1": "Fed: the federated model.",
    "local_rank1": "Local: the domain's data trained alone, same budget.",
    "local_model_rank1": "Pre-agg: the client's model after its last local training, before aggregation.",
    "raw_pixels_rank1": "Pixels: raw-pixel nearest neighbours.",
}


def results_table(
    domains: Sequence[DomainResult | Mapping[str, Any]], title: str = "Retrieval accuracy per domain"
) -> Table:
    """One row per domain; columns nobody measured are left out. Rates in percent, 1 decimal.

    Federated Rank-1 and mAP are marked ``*`` (and bold green on a terminal) where they beat training
    on that domain alone: the mark survives plain logs, where the colour does not.
    """
    rows = [d if isinstance(d, DomainResult) else DomainResult.from_dict(d) for d in domains]
    shown = [c for c in _COLUMNS if any(getattr(r, c[0]) is not None for r in rows)]
    table = Table(title=title)
    table.add_column("Domain", style="bold")
    for _, header, _ in shown:
        table.add_column(header, justify="right")
    table.caption = " ".join(["Rates in %."] + [_LEGEND[name] for name, _, _ in shown if name in _LEGEND])
    if any(baseline and any(_beats(r, name, baseline) for r in rows) for name, _, baseline in shown):
        table.caption += " *: federated beats local-only training."
    for row in rows:
        cells = [escape(row.domain)]  # a name like "cam[1]" is text, not rich markup
        for name, _, baseline in shown:
            value = getattr(row, name)
            text = "–" if value is None else f"{100 * value:.1f}"
            cells.append(f"[{BEATS_LOCAL_STYLE}]{text}*[/]" if baseline and _beats(row, name, baseline) else text)
        table.add_row(*cells)
    return table


# Known summary keys, in display order: key → label. Other keys follow as given.
_SUMMARY_LABELS = {
    "rounds": "Rounds",
    "wall_time_s": "Wall time",
    "shared_bytes": "Shared model size",
    "communication_bytes": "Communication per client (MM'20: rounds × 2 × model)",
    "bytes_up": "Bytes up, all clients (measured)",
    "bytes_down": "Bytes down, all clients (measured)",
    "run_dir_bytes": "Run directory on disk",
    "checkpoint_bytes": "  checkpoints",
    "uploads_bytes": "  recorded uploads",
}
_BYTE_KEYS = {"shared_bytes", "communication_bytes", "bytes_up", "bytes_down", "run_dir_bytes", "checkpoint_bytes",
              "uploads_bytes"}


def summary_table(summary: Mapping[str, Any], title: str = "Run summary") -> Table:
    """Rounds, wall time, communication cost (MM'20 §3.5) and measured traffic, then any other entries.

    ``communication_bytes`` is computed from ``rounds`` and ``shared_bytes`` when not given.
    """
    summary = dict(summary)
    if "communication_bytes" not in summary and {"rounds", "shared_bytes"} <= summary.keys():
        summary["communication_bytes"] = communication_cost(summary["rounds"], summary["shared_bytes"])
    table = Table(title=title, show_header=False)
    table.add_column(style="bold")
    table.add_column(justify="right")
    known = [k for k in _SUMMARY_LABELS if k in summary]
    for key in known + [k for k in summary if k not in _SUMMARY_LABELS]:
        table.add_row(escape(_SUMMARY_LABELS.get(key, key)), escape(_summary_cell(key, summary[key])))
    return table


def _summary_cell(key: str, value: Any) -> str:
    if key in _BYTE_KEYS:
        try:
            return format_bytes(value)
        except ValueError:
            raise ValueError(
                f"summary {key!r} must be a non-negative integer byte count, got {value!r}"
            ) from None
    if key == "wall_time_s":
        return _format_duration(value)
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def _format_duration(seconds: Any) -> str:
    number = isinstance(seconds, numbers.Real) and not isinstance(seconds, bool)
    if not number or not math.isfinite(seconds) or seconds < 0:
        raise ValueError(f"summary 'wall_time_s' must be a non-negative number of seconds, got {seconds!r}")
    if seconds < 60:
        return f"{seconds:.1f} s"
    whole = int(round(seconds))
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours} h {minutes:02d} min" if hours else f"{minutes} min {secs:02d} s"


def _beats(row: DomainResult, name: str, baseline: str) -> bool:
    value, reference = getattr(row, name), getattr(row, baseline)
    return value is not None and reference is not None and value > reference


def _pick(scores: Scores | None, key: str, domain: str, which: str) -> float | None:
    if scores is None:
        return None
    if isinstance(scores, RetrievalScores):
        return getattr(scores, key)
    if not isinstance(scores, Mapping):
        raise ValueError(
            f"{domain}: {which} scores must be RetrievalScores or a dict, got {type(scores).__name__}"
        )
    return scores.get(key)


def privacy_cell(privacy: Mapping[str, Any]) -> str:
    """A run summary's privacy in one cell: the client-level ε against the released models and against
    the server (NOT PRIVATE first under reproducible noise), or why there is none; and DFH's DFS ε
    (found by review: a DFH run with one read "no client-level DP" alone). NOT PRIVATE leads whatever ε
    the cell gives (found by review: a DFS or DP-SGD ε of a --reproducible-noise run was shown without it)."""
    guarantees = [g for g in privacy.get("epsilon_against", ()) if isinstance(g, Mapping)]
    cell = _model_cell(privacy) + "".join(
        f"; DFS: identity-level ε = {g['released_models']:.3g} (δ = {g['delta']:.2g}) vs whoever sees the DFS"
        for g in guarantees if g.get("guarantee") == DFS_GUARANTEE and is_finite_number(g.get("released_models"))
        and is_finite_number(g.get("delta")))
    reproducible = "NOT PRIVATE" in str(privacy.get("noise", "")) or any(g.get("not_private") for g in guarantees)
    return ("NOT PRIVATE: " + cell) if reproducible else cell


def is_finite_number(value: object) -> bool:
    """A real number that is finite, not a bool: what a score, an ε or a δ read from a file must be."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)


def _model_cell(privacy: Mapping[str, Any]) -> str:
    if "epsilon" in privacy:
        server = privacy.get("epsilon_server")
        return (f"(ε = {privacy['epsilon']:.3g}, δ = {privacy['delta']:.2g}) client-level, {privacy['mechanism']}, "
                f"vs released models; vs server: " + (f"ε = {server:.3g}" if server is not None else "none")
                + (f" with ≤ {privacy['colluders']} colluding clients" if "colluders" in privacy else ""))
    if privacy["mechanism"] == "beta":
        return "β noise, no formal guarantee"
    return "no client-level DP" + _dp_sgd_cell(privacy)


def _dp_sgd_cell(privacy: Mapping[str, Any]) -> str:
    """The largest example-level DP-SGD ε of any one model, and of any client over both its models (found by
    review: the cell pointed "below" to figures the comparison never showed)."""
    models = [dp for dp in (privacy.get("dp_sgd") or {}).values() if isinstance(dp, Mapping)
              and is_finite_number(dp.get("epsilon")) and is_finite_number(dp.get("delta"))]
    if not models:
        return ""
    both = [c for c in (privacy.get("dp_sgd_per_client") or {}).values() if isinstance(c, Mapping)
            and is_finite_number(c.get("epsilon"))]
    return (f"; example-level DP-SGD: ε ≤ {max(dp['epsilon'] for dp in models):.3g} "
            f"(δ = {max(dp['delta'] for dp in models):.2g}) per model"
            + (f", ≤ {max(c['epsilon'] for c in both):.3g} per client over its federated and local-only models"
               if both else ""))
