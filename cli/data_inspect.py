"""``secfed data inspect ROOT``: what a dataset folder holds, as the loaders read it."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import click
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from secfed.cli.common import cli_errors, emit_json, human_console
from secfed.data.errors import DataError
from secfed.data.registry import FORMATS, guess_format, load_dataset
from secfed.data.types import ReidDataset, Sample

_SHOWN_FAILURES = 10


def summarize(dataset: ReidDataset, fmt: str) -> dict:
    """Counts per subset, the shape ``--json`` prints."""

    def counts(samples: list[Sample], cameras: bool = True) -> dict[str, int]:
        out = {"ids": len({s.pid for s in samples}), "images": len(samples)}
        if cameras:
            out["cameras"] = len({s.camid for s in samples})
        return out

    return {
        "format": fmt,
        "name": dataset.name,
        "train": counts(dataset.train),
        "query": counts(dataset.query),
        "gallery": counts(dataset.gallery),
        "skipped": dict(sorted(dataset.skipped.items())),
    }


def _verify(dataset: ReidDataset, console: Console) -> int:
    """Decode every image; raise naming the unreadable ones. Returns how many were checked."""
    from rich.progress import Progress

    from secfed.data.images import read_image  # torch is imported only when images are decoded

    paths = sorted({s.path for s in (*dataset.train, *dataset.query, *dataset.gallery)})

    def check(path: Path) -> str | None:
        try:
            read_image(path)
        except DataError as err:
            return str(err)
        return None

    failures = []
    with Progress(console=console, transient=True) as progress, ThreadPoolExecutor(2) as pool:
        task = progress.add_task("decoding", total=len(paths))
        for failure in pool.map(check, paths):
            progress.advance(task)
            if failure is not None:
                failures.append(failure)
    if failures:
        more = f"\n... and {len(failures) - _SHOWN_FAILURES} more" if len(failures) > _SHOWN_FAILURES else ""
        listed = "\n".join(failures[:_SHOWN_FAILURES])
        raise click.ClickException(f"{len(failures)} of {len(paths)} images cannot be decoded:\n{listed}{more}")
    return len(paths)


@click.command("inspect")
@click.argument("root", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--format", "-f", "fmt", type=click.Choice(list(FORMATS)), default=None,
              help="Dataset layout. Default: guessed from the folder name (Market-1501-v15.09.15 → market1501).")
@click.option("--seed", type=int, default=0, show_default=True,
              help="Seed of the drawn split, for the sets that ship none "
                   "(prid2011, cuhk01, viper, 3dpes, ilids, ilidsvid).")
@click.option("--split-file", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Keep the drawn split in this JSON file: read back if it holds this dataset and seed, "
                   "else written there. Default: drawn in memory, nothing written (never into ROOT).")
@click.option("--verify", is_flag=True, help="Also decode every image, to find unreadable or truncated files.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of a table.")
def inspect_command(
    root: Path, fmt: str | None, seed: int, split_file: Path | None, verify: bool, as_json: bool
) -> None:
    """Count the ids, images and cameras of the dataset at ROOT, and what was skipped."""
    if fmt is None:
        fmt = guess_format(root.resolve().name)
        if fmt is None:
            raise click.UsageError(
                f"cannot tell the format of {root} from its name; pass --format ({', '.join(FORMATS)})")
    if not FORMATS[fmt].seeded:
        ctx = click.get_current_context()
        for param, flag in (("seed", "--seed"), ("split_file", "--split-file")):
            if ctx.get_parameter_source(param) is click.core.ParameterSource.COMMANDLINE:
                seeded = ", ".join(name for name, loader in FORMATS.items() if loader.seeded)
                raise click.UsageError(f"{flag}: {fmt} ships its own split; {flag} applies to {seeded}")
    with cli_errors():
        dataset = load_dataset(root, fmt, name=root.resolve().name, seed=seed, split_path=split_file)
        checked = _verify(dataset, Console(stderr=True)) if verify else None
    summary = summarize(dataset, fmt)
    summary["root"] = str(root)
    if FORMATS[fmt].seeded:
        summary["split"] = {"seed": seed, "file": None if split_file is None else str(split_file)}
    if checked is not None:
        summary["verified_images"] = checked
    if as_json:
        emit_json(summary)
    else:
        _print_table(summary, human_console(json_mode=False))


def _print_table(summary: dict, console: Console) -> None:
    console.print(f"[bold]{escape(summary['root'])}[/bold]  [dim]{summary['format']}[/dim]")
    table = Table()
    table.add_column("subset")
    for column in ("ids", "images", "cameras"):
        table.add_column(column, justify="right")
    for subset in ("train", "query", "gallery"):
        row = summary[subset]
        table.add_row(subset, f"{row['ids']:,}", f"{row['images']:,}", f"{row['cameras']:,}")
    console.print(table)
    skipped = ", ".join(f"{reason} {count:,}" for reason, count in summary["skipped"].items()) or "nothing"
    console.print(f"skipped: {skipped}")
    if "split" in summary:
        split = summary["split"]
        kept = "drawn in memory (--split-file keeps it)" if split["file"] is None else f"kept in {escape(split['file'])}"
        console.print(f"split: seed {split['seed']}, {kept}")
    if "verified_images" in summary:
        console.print(f"verified: all {summary['verified_images']:,} images decode")
