"""One front door to every dataset layout: ``load_dataset(root, "market1501")``.

``FORMATS`` maps a format name to its :class:`Loader`; :func:`guess_format` maps the usual folder
names (``Market-1501-v15.09.15``, ``DukeMTMC-reID``, ``MSMT17_V1``, ...) to a format name.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from secfed.data import cuhk02, fedreidbench, market, msmt17, small_sets, unlabeled
from secfed.data.errors import DataError
from secfed.data.types import ReidDataset
from secfed.data.usable import overlap_reason


@dataclass(frozen=True)
class Loader:
    """How to read one layout. ``seeded``: the set ships no split; one is drawn per seed. ``train_only``:
    a public set with no query or gallery, for distillation (``--kd-public``), never a domain."""

    name: str
    summary: str
    read: Callable[..., ReidDataset]
    seeded: bool = False
    train_only: bool = False

    def __call__(self, root: Path, *, seed: int = 0, split_path: Path | None = None,
                 name: str | None = None) -> ReidDataset:
        if self.seeded:  # a split drawn here is apart by construction; one read from a file is checked there
            return self.read(Path(root), seed=seed, split_path=split_path, name=name or self.name)
        dataset = self.read(Path(root))
        # what the set ships is checked as a split file is (found by review: a doubled MSMT17 list line, a
        # Market train folder holding test people — accepted without a word); MSMT17 numbers its test
        # people from 0 again, so there only images are compared
        if reason := overlap_reason(dataset.train, dataset.query, dataset.gallery,
                                    identities=self.name != "msmt17"):
            raise DataError(root, reason)
        return dataset if name is None else dataclasses.replace(dataset, name=name)


FORMATS: dict[str, Loader] = {
    loader.name: loader
    for loader in (
        Loader("market1501", "Market-1501, or any folder in its format (bounding_box_train/query/bounding_box_test)",
               market.load_market1501),
        Loader("dukemtmc", "DukeMTMC-reID (Market layout, 8 cameras)", market.load_dukemtmc),
        Loader("cuhk03np-detected", "CUHK03-NP new protocol, detected boxes (ROOT/detected/...)",
               partial(market.load_cuhk03np, kind="detected")),
        Loader("cuhk03np-labeled", "CUHK03-NP new protocol, hand-labeled boxes (ROOT/labeled/...)",
               partial(market.load_cuhk03np, kind="labeled")),
        Loader("msmt17", "MSMT17 V1/V2 from its list files (15 cameras)", msmt17.load_msmt17),
        Loader("prid2011", "PRID2011 single/multi shot, seeded split", small_sets.load_prid2011, seeded=True),
        Loader("cuhk01", "CUHK01 campus/, seeded split", small_sets.load_cuhk01, seeded=True),
        Loader("viper", "VIPeR cam_a/cam_b, seeded split", small_sets.load_viper, seeded=True),
        Loader("3dpes", "3DPeS RGB/, seeded split", small_sets.load_3dpes, seeded=True),
        Loader("ilids", "QMUL i-LIDS Persons/ (FedReIDBench's 'iLIDS-VID'), seeded split", small_sets.load_ilids,
               seeded=True),
        Loader("ilidsvid", "iLIDS-VID sequences/, image protocol, seeded split", small_sets.load_ilidsvid, seeded=True),
        Loader("cuhk02", "CUHK02 P1..P5, unlabeled public set (train only)", cuhk02.load_cuhk02, train_only=True),
        Loader("fedreidbench", "any set as FedReIDBench's data_preprocess wrote it (pytorch/<subset>/<pid>/)",
               fedreidbench.load_fedreidbench),
        Loader("unlabeled", "a folder of person images used without labels, e.g. `secfed data synth --public` "
               "(train only)", unlabeled.load_unlabeled, train_only=True),
    )
}


class UnknownFormatError(ValueError):
    """A format name that is not in :data:`FORMATS`; the message lists the known ones."""

    def __init__(self, fmt: str) -> None:
        self.format = fmt
        super().__init__(f"unknown dataset format {fmt!r}; known formats: {', '.join(FORMATS)}")


def load_dataset(
    root: Path, fmt: str, *, name: str | None = None, seed: int = 0, split_path: Path | None = None
) -> ReidDataset:
    """Read the dataset at ``root`` in format ``fmt``.

    ``name`` labels the result (default: the format name; give the folder name when several
    folders share a format, e.g. synthetic domains). ``seed`` and ``split_path`` matter only for
    the seeded formats (``FORMATS[fmt].seeded``): their split is drawn from ``seed``; with
    ``split_path`` it is kept in that JSON file (read back if already there, else written, under
    ``name``), without one it is drawn in memory and nothing is written. The dataset folder itself
    is never written to. Raises :class:`~secfed.data.errors.DataError` naming the offending path.
    """
    loader = FORMATS.get(fmt)
    if loader is None:
        raise UnknownFormatError(fmt)
    return loader(Path(root), seed=seed, split_path=split_path, name=name)


# Checked in order on the folder name, lower-cased with everything but letters and digits removed.
_GUESSES: tuple[tuple[str, str], ...] = (
    (r"market(1501)?.*", "market1501"),
    (r"dukemtmc.*", "dukemtmc"),
    (r"cuhk03np.*label(l)?ed.*", "cuhk03np-labeled"),
    (r"cuhk03np.*", "cuhk03np-detected"),
    (r"msmt17.*", "msmt17"),
    (r"prid(2011)?", "prid2011"),
    (r"cuhk01", "cuhk01"),
    (r"cuhk02", "cuhk02"),
    (r"viper.*", "viper"),
    (r"3dpes|pes3d", "3dpes"),
    (r"ilidsvid", "ilidsvid"),
    (r"(qmul)?ilids(pedestrian)?", "ilids"),
    (r"fedreidbench|pytorch", "fedreidbench"),
    (r"unlabeled|unlabelled", "unlabeled"),
)


def guess_format(folder_name: str) -> str | None:
    """The format a dataset folder's usual name implies ("Market-1501-v15.09.15" → "market1501"), or None."""
    key = re.sub(r"[^a-z0-9]", "", folder_name.lower())
    return next((fmt for pattern, fmt in _GUESSES if re.fullmatch(pattern, key)), None)
