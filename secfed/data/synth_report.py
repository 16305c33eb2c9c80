"""What a synthetic root holds, one row per folder: as the manifest records it, and as measured.

``secfed data synth`` prints :func:`recorded` rows after writing; ``secfed data inspect ROOT``
prints :func:`measured` rows, counted from the files by the same loaders training uses, and
refuses a folder whose counts differ from the manifest's. Both use the manifest's field names, so
the two commands report the same names and the same numbers for an untouched folder.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from secfed.data.errors import DataError
from secfed.data.market import DISTRACTOR_PID
from secfed.data.registry import load_dataset
from secfed.data.synth import SynthDomain, SynthManifest
from secfed.data.types import ReidDataset

COUNTS = ("train_ids", "train_images", "test_ids", "query_images", "gallery_images", "distractors", "junk")


Row = dict[str, Any]  # name, role, format, cameras, then COUNTS (None where a count does not apply)


def files(row: Row) -> int:
    """Image files a row stands for: what the loaders read, and the junk they skip."""
    return sum(row[key] or 0 for key in ("train_images", "query_images", "gallery_images", "junk"))


def image_counts(rows: list[Row]) -> str:
    """The one sentence ``data synth`` and ``data inspect`` both print about a root's images: the files,
    how many of them the loaders read, and the junk they skip (so neither total reads as the other)."""
    junk = sum(row["junk"] or 0 for row in rows)
    total = sum(files(row) for row in rows)
    return f"{total:,} image files: {total - junk:,} read by the loaders" + (f", {junk:,} junk they skip" if junk else "")


def _domain_row(domain: SynthDomain, role: str) -> Row:
    # "gallery" counts what the loaders read, as `secfed data inspect DOMAIN` does: the manifest counts
    # the files of bounding_box_test, junk included, and junk is skipped (and counted) by every loader
    return {"name": domain.name, "role": role, "format": "market1501", "cameras": len(domain.cameras),
            **{key: getattr(domain, key) for key in COUNTS}, "gallery_images": domain.gallery_images - domain.junk}


def recorded(manifest: SynthManifest) -> list[Row]:
    """Rows as the manifest records them: client domains, unseen domains, then the public set."""
    rows = [_domain_row(d, "client") for d in manifest.domains]
    rows += [_domain_row(d, "unseen") for d in manifest.unseen]
    if (public := manifest.public) is not None:
        rows.append({"name": public.folder, "role": "public", "format": public.format,
                     "cameras": len(public.cameras), **dict.fromkeys(COUNTS),
                     "train_ids": public.ids, "train_images": public.images})
    return rows


def _counts(dataset: ReidDataset, row: Row) -> Row:
    if row["role"] == "public":  # unlabelled: only the images can be counted
        return {**row, "train_images": len(dataset.train)}
    junk = dataset.skipped.get("junk", 0)
    return {**row, "train_ids": dataset.num_train_pids, "train_images": len(dataset.train),
            "test_ids": len({s.pid for s in dataset.query}), "query_images": len(dataset.query),
            "gallery_images": len(dataset.gallery),
            "distractors": sum(s.pid == DISTRACTOR_PID for s in dataset.gallery), "junk": junk}


def measured(root: Path) -> tuple[SynthManifest, list[Row], list[ReidDataset]]:
    """Every folder the manifest under ``root`` lists, loaded and counted; a DataError naming the
    folder if its counts are not the recorded ones. Cameras (a property of the domain, not of its
    images) and the public set's person count (its labels are not read) come from the manifest."""
    manifest = SynthManifest.load(root)
    rows, datasets = [], []
    for row in recorded(manifest):
        folder = Path(root) / row["name"]
        dataset = load_dataset(folder, row["format"], name=row["name"])
        counted = _counts(dataset, row)
        if wrong := [key for key in COUNTS if counted[key] != row[key]]:
            found = ", ".join(f"{key} {counted[key]} (manifest: {row[key]})" for key in wrong)
            raise DataError(folder, f"differs from {Path(root) / 'manifest.json'}: {found}; "
                                    "was it changed after `secfed data synth`?")
        rows.append(counted)
        datasets.append(dataset)
    return manifest, rows, datasets


def summary(manifest: SynthManifest, rows: list[Row]) -> dict[str, Any]:
    """The JSON object both commands print with ``--json``."""
    return {"format": "synthetic", "generator_version": manifest.version, "seed": manifest.seed,
            "scale": manifest.scale, "height": manifest.height, "width": manifest.width, "domains": rows}
