"""``secfed data inspect ROOT``: what a dataset folder holds, as the loaders read it.

ROOT is one dataset (its format named by ``--format`` or guessed from the folder name), or the
root that ``secfed data synth`` wrote (``manifest.json`` and one folder per domain): then every
folder is read and counted, and reported as ``data synth`` reported it.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import rich_click as click
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from secfed.cli.common import cli_errors, emit_json, human_console
from secfed.cli.data_synth import print_domains
from secfed.data.errors import DataError
from secfed.data.registry import FORMATS, guess_format, load_dataset
from secfed.data.split_file import inside
from secfed.data.synth import SEED_RANGE, SynthManifest
from secfed.data.synth_report import image_counts, measured, recorded
from secfed.data.synth_report import summary as synth_summary
from secfed.data.types import UNLABELED, ReidDataset, Sample
from secfed.data.usable import matched_queries
from secfed.errors import printable

_SHOWN_FAILURES = 10


def summarize(dataset: ReidDataset, fmt: str) -> dict:
    """Counts per subset, the shape ``--json`` prints."""

    def counts(samples: list[Sample], cameras: bool = True) -> dict[str, int]:
        # an unlabeled image (pid and camid -1) is no identity and no camera (found by review: "ids 1")
        out = {"ids": len({s.pid for s in samples} - {UNLABELED}), "images": len(samples)}
        if cameras:
            out["cameras"] = len({s.camid for s in samples} - {UNLABELED})
        return out

    return {
        "format": fmt,
        "name": dataset.name,
        "train": counts(dataset.train),
        "query": {**counts(dataset.query),
                  "unmatched": len(dataset.query) - matched_queries(dataset.query, dataset.gallery)},
        "gallery": counts(dataset.gallery),
        "skipped": dict(sorted(dataset.skipped.items())),
    }


def _verify(datasets: list[ReidDataset], console: Console) -> int:
    """Decode every image; raise naming the unreadable ones. Returns how many were checked."""
    from rich.progress import Progress

    from secfed.data.images import read_image  # torch is imported only when images are decoded

    paths = sorted({s.path for d in datasets for s in (*d.train, *d.query, *d.gallery)})

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
              help="Dataset layout. Default: guessed from the folder name (Market-1501-v15.09.15 → market1501); "
                   "a folder holding manifest.json is read as `secfed data synth` wrote it.")
@click.option("--seed", type=click.IntRange(*SEED_RANGE), default=0, show_default=True,
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
    """Count the ids, images and cameras of the dataset at ROOT, and what was skipped.

    On a root written by `secfed data synth`, count every domain (and the public set).
    """
    if fmt is None and (root / "manifest.json").is_file():
        _refuse_split_flags("a synthetic root ships its own splits")
        _inspect_synthetic(root, verify, as_json)
        return
    if fmt is None:
        fmt = _guess(root)
        if fmt is None:
            raise click.UsageError(
                f"cannot tell the format of {printable(root)} from its name; pass --format ({', '.join(FORMATS)})")
    if not FORMATS[fmt].seeded:
        _refuse_split_flags(f"{fmt} ships its own split")
    if split_file is not None and inside(split_file, root):  # (found by review: the help says never into ROOT)
        raise click.BadParameter(f"{printable(split_file)} is inside ROOT: a split file is kept outside the "
                                 "dataset folder", param_hint="--split-file")
    with cli_errors():
        dataset = load_dataset(root, fmt, name=root.resolve().name, seed=seed, split_path=split_file)
        checked = _verify([dataset], Console(stderr=True)) if verify else None
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


def _refuse_split_flags(why: str) -> None:
    ctx = click.get_current_context()
    for param, flag in (("seed", "--seed"), ("split_file", "--split-file")):
        if ctx.get_parameter_source(param) is click.core.ParameterSource.COMMANDLINE:
            seeded = ", ".join(name for name, loader in FORMATS.items() if loader.seeded)
            raise click.UsageError(f"{flag}: {why}; {flag} applies to {seeded}")


def _guess(root: Path) -> str | None:
    """The format the folder's name implies, or, for a folder of a synthetic root, the manifest's."""
    folder = root.resolve()
    if fmt := guess_format(folder.name):
        return fmt
    if not (folder.parent / "manifest.json").is_file():
        return None
    try:
        rows = recorded(SynthManifest.load(folder.parent))
    except DataError:
        return None
    return next((row["format"] for row in rows if row["name"] == folder.name), None)


def _inspect_synthetic(root: Path, verify: bool, as_json: bool) -> None:
    with cli_errors():
        manifest, rows, datasets = measured(root)
        checked = _verify(datasets, Console(stderr=True)) if verify else None
    summary = {**synth_summary(manifest, rows), "root": str(root)}
    if checked is not None:
        summary["verified_images"] = checked
    if as_json:
        emit_json(summary)
        return
    console = human_console(json_mode=False)
    print_domains(rows, f"{root} (synthetic, seed {manifest.seed}, {manifest.height}×{manifest.width})", console)
    console.print(f"holds {image_counts(rows)}")  # the sentence `data synth` printed after writing them
    if checked is not None:
        console.print(f"verified: all {checked:,} images read by the loaders decode")


def _print_table(summary: dict, console: Console) -> None:
    console.print(f"[bold]{escape(printable(summary['root']))}[/bold]  [dim]{summary['format']}[/dim]")
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
    if unmatched := summary["query"]["unmatched"]:
        console.print(f"queries scored: {summary['query']['images'] - unmatched:,} of {summary['query']['images']:,} "
                      f"({unmatched:,} have no gallery image of the same person from another camera: left out of "
                      "CMC and mAP, as in the standard protocol)")
    if "split" in summary:
        split = summary["split"]
        kept = "drawn in memory (--split-file keeps it)" if split["file"] is None else f"kept in {escape(split['file'])}"
        console.print(f"split: seed {split['seed']}, {kept}")
    if "verified_images" in summary:
        console.print(f"verified: all {summary['verified_images']:,} images read by the loaders decode")
