"""``secfed data synth OUT``: write the synthetic pedestrian domains (Market-1501 format) to OUT."""

from __future__ import annotations

import time
from pathlib import Path

import rich_click as click
from rich import box
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn
from rich.table import Table

from secfed.cli.common import emit_json, human_console
from secfed.cli.options import FiniteFloatRange
from secfed.data.synth import (
    DEFAULT_PUBLIC_IMAGES,
    HEIGHT_RANGE,
    PUBLIC_RANGE,
    SCALE_HELP,
    SCALE_RANGE,
    SEED_RANGE,
    SYNTH_DOMAINS_RANGE,
    UNSEEN_RANGE,
    WIDTH_RANGE,
    SynthOptionError,
    check_options,
    generate,
)
from secfed.data.synth_domains import PRESETS
from secfed.data.synth_report import Row, image_counts, recorded, summary
from secfed.errors import printable

# (header, row key): the table of `data synth` and of `data inspect` on a synthetic root
_COLUMNS = (("domain", "name"), ("role", "role"), ("cams", "cameras"), ("train\nids", "train_ids"),
            ("train\nimages", "train_images"), ("test\nids", "test_ids"), ("query", "query_images"),
            ("gallery", "gallery_images"), ("distr-\nactors", "distractors"), ("junk", "junk"))


def print_domains(rows: list[Row], title: str, console: Console) -> None:
    """One row per folder of a synthetic root; fits 80 columns with every number whole."""
    # the title holds a path the user typed or read from disk: neither markup nor terminal codes (review)
    table = Table(title=escape(printable(title)), box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True)
    for header, key in _COLUMNS:
        table.add_column(header, justify="left" if key in ("name", "role") else "right", no_wrap=key == "name")
    for row in rows:
        table.add_row(*("-" if row[key] is None else f"{row[key]}" for _, key in _COLUMNS))
    console.print(table)


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("out", type=click.Path(path_type=Path))
@click.option("--domains", type=click.IntRange(*SYNTH_DOMAINS_RANGE), default=4, show_default=True,
              help=f"How many client domains, taken in order from: {', '.join(p.name for p in PRESETS)}.")
@click.option("--unseen", type=click.IntRange(*UNSEEN_RANGE), default=0, show_default=True,
              help="Also write this many unseen domains (the presets after the client domains), for "
                   "evaluation only; domains + unseen ≤ 9.")
@click.option("--public", type=click.IntRange(*PUBLIC_RANGE), default=0, show_default=True,
              help=f"Also write this many unlabelled images of new people to OUT/public, for knowledge "
                   f"distillation ({DEFAULT_PUBLIC_IMAGES}: about the largest client's train set).")
@click.option("--seed", type=click.IntRange(*SEED_RANGE), default=0, show_default=True,
              help="Run seed; the same seed writes byte-identical files.")
@click.option("--scale", type=FiniteFloatRange(*SCALE_RANGE), default=1.0, show_default=True,
              help=SCALE_HELP)
@click.option("--height", type=click.IntRange(*HEIGHT_RANGE), default=128, show_default=True,
              help="Height of the written images, in pixels.")
@click.option("--width", type=click.IntRange(*WIDTH_RANGE), default=64, show_default=True,
              help="Width of the written images, in pixels.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object (as `data inspect --json`) instead "
                                                      "of a table.")
def synth_command(out: Path, domains: int, unseen: int, public: int, seed: int, scale: float, height: int,
                  width: int, as_json: bool) -> None:
    """Generate synthetic pedestrian ReID domains into OUT (a new or empty directory).

    Each domain is a Market-1501-format dataset (bounding_box_train/, query/, bounding_box_test/)
    with its own cameras; people are disjoint across domains but drawn from one distribution.
    OUT/manifest.json records the seed, the options, every camera's parameters and every count;
    `secfed data inspect OUT` reads it back.
    """
    try:
        check_options(domains=domains, seed=seed, scale=scale, height=height, width=width, unseen=unseen,
                      public=public)
    except SynthOptionError as err:
        raise click.BadParameter(str(err).split(": ", 1)[1], param_hint=f"'--{err.option}'") from None
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise click.BadParameter(f"{out} exists and is not an empty directory", param_hint="'OUT'")

    started = time.perf_counter()
    columns = (TextColumn("{task.description:>10}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=Console(stderr=True), transient=False) as bar:
        tasks: dict[str, TaskID] = {}

        def progress(domain: str, done: int, total: int) -> None:
            if domain not in tasks:
                tasks[domain] = bar.add_task(domain, total=total)
            bar.update(tasks[domain], completed=done)

        try:
            manifest = generate(out, domains=domains, seed=seed, scale=scale, height=height, width=width,
                                unseen=unseen, public=public, progress=progress)
        except FileExistsError as err:
            raise click.BadParameter(str(err), param_hint="'OUT'") from None
        except SynthOptionError as err:  # OUT cannot be made (a read-only or missing mount)
            raise click.BadParameter(str(err).split(": ", 1)[1], param_hint=f"'{err.option}'") from None
    seconds = time.perf_counter() - started
    rows = recorded(manifest)
    if as_json:
        emit_json({**summary(manifest, rows), "root": str(out), "seconds": round(seconds, 2)})
        return
    console = human_console(json_mode=False)
    print_domains(rows, f"{out} (seed {manifest.seed}, {manifest.height}×{manifest.width})", console)
    console.print(f"wrote {image_counts(rows)}, in {seconds:.1f} s")
