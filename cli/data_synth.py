"""``secfed data synth OUT``: write the synthetic pedestrian domains (Market-1501 format) to OUT."""

from __future__ import annotations

import time
from pathlib import Path

import click
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn
from rich.table import Table

from secfed.data.synth import SynthManifest, SynthOptionError, check_options, generate
from secfed.data.synth_domains import PRESETS


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("out", type=click.Path(path_type=Path))
@click.option("--domains", type=click.IntRange(1, len(PRESETS)), default=4, show_default=True,
              help=f"How many domains, taken in order from: {', '.join(p.name for p in PRESETS)}.")
@click.option("--seed", type=click.IntRange(min=0), default=0, show_default=True,
              help="Run seed; the same seed writes byte-identical files.")
@click.option("--scale", type=click.FloatRange(0, min_open=True), default=1.0, show_default=True,
              help="Multiplies the number of person ids of every domain.")
@click.option("--height", type=click.IntRange(32, 1024), default=128, show_default=True,
              help="Height of the written images, in pixels.")
@click.option("--width", type=click.IntRange(16, 512), default=64, show_default=True,
              help="Width of the written images, in pixels.")
def synth_command(out: Path, domains: int, seed: int, scale: float, height: int, width: int) -> None:
    """Generate synthetic pedestrian ReID domains into OUT (a new or empty directory).

    Each domain is a Market-1501-format dataset (bounding_box_train/, query/, bounding_box_test/)
    with its own cameras; people are disjoint across domains but drawn from one distribution.
    OUT/manifest.json records the seed, the options and every camera's parameters.
    """
    try:
        check_options(domains, seed, scale, height, width)
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
                                progress=progress)
        except FileExistsError as err:
            raise click.BadParameter(str(err), param_hint="'OUT'") from None
    _summary(manifest, out, time.perf_counter() - started)


def _summary(manifest: SynthManifest, out: Path, seconds: float) -> None:
    table = Table(title=f"synthetic domains in {out} (seed {manifest.seed}, {manifest.height}×{manifest.width})")
    headers = ("domain", "like", "cameras", "train ids", "train images", "test ids", "query", "gallery",
               "distractors", "junk")
    for header in headers:
        table.add_column(header, justify="left" if header in ("domain", "like") else "right")
    for d in manifest.domains:
        counts = (len(d.cameras), d.train_ids, d.train_images, d.test_ids, d.query_images, d.gallery_images,
                  d.distractors, d.junk)
        table.add_row(d.name, d.like, *(str(c) for c in counts))
    images = sum(d.train_images + d.query_images + d.gallery_images for d in manifest.domains)
    console = Console()
    console.print(table)
    console.print(f"wrote {images} images in {seconds:.1f} s")
