"""``secfed compare RUN [RUN ...]``: finished runs side by side, and one comparison plot."""

from __future__ import annotations

from pathlib import Path

import rich_click as click

from secfed.cli.common import emit_json, human_console


@click.command("compare")
@click.argument("runs", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False, path_type=Path), default=Path("compare.png"),
              show_default=True, help="Where the comparison plot (PNG) is written.")
@click.option("--json", "json_output", is_flag=True, help="Print one JSON object on stdout; the rest on stderr.")
def compare_command(runs: tuple[Path, ...], plot_path: Path, json_output: bool) -> None:
    """Compare finished runs: per-domain rank-1/mAP, ε and whom it protects against, time and bytes.

    Reads each run directory's summary.json and metrics.jsonl (nothing is re-evaluated) and writes a
    plot: per-domain bars of rank-1 and mAP, and each run's mean seen-domain rank-1 per round.
    """
    from rich.markup import escape
    from rich.table import Table

    from secfed.errors import printable
    from secfed.evaluation.compare import PlotRefused, RunUnreadable, check_plot_path, load_runs, write_plot
    from secfed.evaluation.report import privacy_cell

    console = human_console(json_output)
    try:
        compared = load_runs(list(runs))
    except RunUnreadable as exc:
        raise click.BadParameter(str(exc), param_hint="RUN") from None
    try:
        check_plot_path(compared, plot_path)  # before anything is printed
    except PlotRefused as exc:
        raise click.BadParameter(str(exc), param_hint="--plot") from None

    def shown(text: object) -> str:  # names read from the runs' files: neither markup nor terminal codes
        return escape(printable(str(text)))
    domains = list(dict.fromkeys(name for r in compared for name in r.domains))
    unseen = list(dict.fromkeys(name for r in compared for name in r.unseen))
    # one column per run, one row per figure: a handful of runs stays readable in 80 columns
    table = Table(title="Runs compared (rank-1 / mAP in %)")
    table.add_column("")
    for run in compared:
        table.add_column(shown(run.label), justify="right")
    # a domain one run trains on and another holds out is two rows: each run's score in its own role
    # (found by review: one row per name showed a run's unseen score as seen, and another's seen as unseen)
    for name, held_out in [(n, False) for n in domains] + [(n, True) for n in unseen]:
        table.add_row(shown(name) + (" (unseen)" if held_out else ""),
                      *[_score((r.unseen if held_out else r.domains).get(name)) for r in compared])
    table.add_row("mean, seen domains", *[_mean_cell(r.domains) for r in compared], style="bold")
    if unseen:
        table.add_row("mean, unseen domains", *[_mean_cell(r.unseen) for r in compared], style="bold")
    table.add_row("method", *[f"{shown(r.algorithm)}, {r.rounds} rounds" for r in compared])
    table.add_row("privacy", *[shown(privacy_cell(r.privacy)) for r in compared])
    table.add_row("time", *[f"{r.wall_seconds:.0f} s" for r in compared])
    table.add_row("bytes up / down, all clients", *[f"{_mib(r.bytes_up)} / {_mib(r.bytes_down)}" for r in compared])
    console.print(table)
    try:
        written = write_plot(compared, plot_path)
    except PlotRefused as exc:
        raise click.BadParameter(str(exc), param_hint="--plot") from None
    console.print(f"comparison plot: {shown(written)}")
    if json_output:
        emit_json({"runs": [r.to_dict() for r in compared], "plot": str(written)})


def _score(scores: dict[str, float] | None) -> str:
    if not scores or "rank1" not in scores:
        return "–"
    return f"{100 * scores['rank1']:.1f} / {100 * scores.get('mAP', float('nan')):.1f}"


def _mean_cell(scores: dict[str, dict[str, float]]) -> str:
    """The mean over the domains with a score, saying how many those are when some had none (found by
    review: a run whose site did not answer averaged 3 domains beside another's 4, unmarked)."""
    rows = [v for v in scores.values() if "rank1" in v and "mAP" in v]
    if not rows:
        return "–"
    text = _score({m: sum(v[m] for v in rows) / len(rows) for m in ("rank1", "mAP")})
    return text if len(rows) == len(scores) else f"{text} ({len(rows)} of {len(scores)} domains)"


def _mib(n: int) -> str:
    return f"{n / 2**20:,.1f} MiB"
