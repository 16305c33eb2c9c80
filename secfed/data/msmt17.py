"""MSMT17 (Wei et al., CVPR 2018), read from its list files; train is ``list_train`` and ``list_val``
together (the official 32,621-image training set; torchreid adds val only with ``combineall``).

Layout (``MSMT17_V1``; ``MSMT17_V2`` names its image folders ``mask_train_v2``/``mask_test_v2``)::

    ROOT/list_train.txt  list_val.txt  list_query.txt  list_gallery.txt
    ROOT/train/0000/0000_000_01_0303morning_0015_0.jpg     (ROOT/test/... for query and gallery)

Each list line is ``<path relative to the image folder> <pid>``; the third ``_`` field of the file
name is the two-digit camera, 01..15 (made 0-based). The train set is ``list_train`` + ``list_val``:
32,621 images of 1,041 ids, the figure of FedReIDBench's Table 1. Pids are the lists' own labels
(train and test both start at 0; 0 is a real person here, not a distractor).
"""

from __future__ import annotations

from pathlib import Path

from secfed.data.errors import DataError
from secfed.data.listing import require_dir, require_some
from secfed.data.types import ReidDataset, Sample
from secfed.data.usable import unusable_reason

NUM_CAMERAS = 15
_WRAPPERS = ("MSMT17_V1", "MSMT17_V2")
_IMAGE_DIRS = {"train": ("train", "mask_train_v2"), "test": ("test", "mask_test_v2")}
LAYOUT = "ROOT/list_{train,val,query,gallery}.txt + ROOT/train/ + ROOT/test/ (V2: mask_train_v2/, mask_test_v2/)"


def _find_base(root: Path) -> Path:
    require_dir(root, LAYOUT)
    for base in (root, *(root / w for w in _WRAPPERS)):
        if (base / "list_train.txt").is_file():
            return base
    raise DataError(root / "list_train.txt",
                    f"missing list file (also looked inside MSMT17_V1/, MSMT17_V2/); expected layout: {LAYOUT}")


def _image_dir(base: Path, part: str) -> Path:
    for name in _IMAGE_DIRS[part]:
        if (base / name).is_dir():
            return base / name
    names = " or ".join(f"{n}/" for n in _IMAGE_DIRS[part])
    raise DataError(base / _IMAGE_DIRS[part][0], f"missing folder ({names}); expected layout: {LAYOUT}")


def read_list(list_path: Path, image_dir: Path) -> list[Sample]:
    """Samples named by one MSMT17 list file; a malformed line or a missing image names the line."""
    if not list_path.is_file():
        raise DataError(list_path, f"missing list file; expected layout: {LAYOUT}")
    samples = []
    try:
        text = list_path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise DataError(list_path, f"cannot read the list file ({exc})") from None
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        fields = line.split()
        where = f"line {number} ({line.strip()!r})"
        if len(fields) != 2 or not (fields[1].isascii() and fields[1].isdigit()):  # "²" is a digit to isdigit
            raise DataError(list_path, f"{where}: expected '<relative path> <pid>'")
        name_fields = Path(fields[0]).name.split("_")
        if len(name_fields) < 3 or not (name_fields[2].isascii() and name_fields[2].isdigit()):
            raise DataError(list_path, f"{where}: no camera number in the third '_' field of the file name")
        cam = int(name_fields[2])
        if not 1 <= cam <= NUM_CAMERAS:
            raise DataError(list_path, f"{where}: camera {cam:02d} out of range (01..{NUM_CAMERAS})")
        if Path(fields[0]).is_absolute() or ".." in Path(fields[0]).parts:  # (found by review: read outside ROOT)
            raise DataError(list_path, f"{where}: the path must lie inside {image_dir.name}/, without '..'")
        path = image_dir / fields[0]
        if not path.is_file():
            raise DataError(path, f"listed in {list_path.name} {where} but missing")
        samples.append(Sample(path, int(fields[1]), cam - 1))
    return samples


def load_msmt17(root: Path) -> ReidDataset:
    """MSMT17 V1 or V2 under ``root`` (or ``root/MSMT17_V1``, ``root/MSMT17_V2``)."""
    base = _find_base(root)
    train_dir, test_dir = _image_dir(base, "train"), _image_dir(base, "test")
    listed = "images listed in this file"
    # each list on its own: an empty list_val.txt is a broken copy too (found by review: train lost its images)
    train = [s for name in ("list_train.txt", "list_val.txt")
             for s in require_some(read_list(base / name, train_dir), base / name, listed)]
    query = require_some(read_list(base / "list_query.txt", test_dir), base / "list_query.txt", listed)
    gallery = require_some(read_list(base / "list_gallery.txt", test_dir), base / "list_gallery.txt", listed)
    if reason := unusable_reason(train, query, gallery):
        raise DataError(base / "list_query.txt", reason)
    return ReidDataset("msmt17", train, query, gallery, {})
