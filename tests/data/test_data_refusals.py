"""Data that cannot be trained on or evaluated is refused with a DataError naming the path, never
accepted as an empty subset (a domain silently missing from the results) or an empty split file."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from secfed.data.errors import DataError
from secfed.data.registry import load_dataset


def _empty(folder: Path) -> Path:
    shutil.rmtree(folder)
    folder.mkdir()
    return folder


@pytest.mark.parametrize("folder", ["bounding_box_train", "query", "bounding_box_test"])
def test_market_empty_subset_folder_is_refused(tmp_path, layouts, folder):
    root = layouts.market(tmp_path / "market1501")
    empty = _empty(root / folder)
    with pytest.raises(DataError) as err:
        load_dataset(root, "market1501")
    assert err.value.path == empty and "no images" in err.value.reason


def test_market_query_of_junk_only_is_refused(tmp_path, layouts):
    root = layouts.market(tmp_path / "m")
    query = _empty(root / "query")
    layouts.image(query / "-1_c1s1_000001_01.jpg")
    (query / "Thumbs.db").write_bytes(b"x")
    with pytest.raises(DataError) as err:
        load_dataset(root, "market1501")
    assert err.value.path == query and "no usable images" in err.value.reason and "1 junk" in err.value.reason


def test_market_without_any_matchable_query_is_refused(tmp_path, layouts):
    """Query ids that the gallery never shows from another camera: nothing to evaluate."""
    root = layouts.market(tmp_path / "m")
    for path in (root / "bounding_box_test").iterdir():
        if path.name.startswith(("0003", "0005")):
            path.rename(path.with_name(path.name.replace("_c2s1", "_c1s1")))  # same camera as the query
    with pytest.raises(DataError) as err:
        load_dataset(root, "market1501")
    assert err.value.path == root / "query" and "another camera" in err.value.reason


@pytest.mark.parametrize("camera", ["cam_a", "cam_b"])
def test_viper_empty_camera_is_refused_and_no_split_file_written(tmp_path, layouts, camera):
    root = layouts.viper(tmp_path / "viper")
    empty = _empty(root / "VIPeR" / camera)
    split_file = tmp_path / "splits.json"
    with pytest.raises(DataError) as err:
        load_dataset(root, "viper", split_path=split_file)
    assert err.value.path == empty and "no images" in err.value.reason
    assert not split_file.exists()


@pytest.mark.parametrize(
    ("fmt", "make", "folder"),
    [
        ("cuhk01", lambda L, r: L.cuhk01(r), "campus"),
        ("3dpes", lambda L, r: L.pes3d(r), "RGB"),
        ("ilids", lambda L, r: L.ilids(r), "i-LIDS_Pedestrian/Persons"),
        ("ilidsvid", lambda L, r: L.ilidsvid(r, frames=3), "i-LIDS-VID/sequences/cam2"),
        ("prid2011", lambda L, r: L.prid2011(r, frames=0), "prid_2011/single_shot/cam_a"),
        ("cuhk02", lambda L, r: L.cuhk02(r), "Dataset/P3/cam2"),
    ],
)
def test_small_set_empty_folder_is_refused(tmp_path, layouts, fmt, make, folder):
    root = make(layouts, tmp_path / fmt)
    empty = _empty(root / folder)
    with pytest.raises(DataError) as err:
        load_dataset(root, fmt, split_path=tmp_path / "splits.json")
    assert err.value.path == empty
    assert not (tmp_path / "splits.json").exists()


def test_ilidsvid_person_folders_without_frames_are_refused(tmp_path, layouts):
    root = layouts.ilidsvid(tmp_path / "ilidsvid", ids=3, frames=2)
    cam2 = root / "i-LIDS-VID" / "sequences" / "cam2"
    for person in cam2.iterdir():
        _empty(person)
    with pytest.raises(DataError) as err:
        load_dataset(root, "ilidsvid")
    assert err.value.path == cam2 and "no images" in err.value.reason


@pytest.mark.parametrize(
    ("fmt", "make"),
    [
        ("viper", lambda L, r: L.viper(r, ids=1)),
        ("cuhk01", lambda L, r: L.cuhk01(r, ids=1)),
        ("3dpes", lambda L, r: L.pes3d(r, ids=1)),
        ("ilids", lambda L, r: L.ilids(r, ids=1)),
        ("ilidsvid", lambda L, r: L.ilidsvid(r, ids=1, frames=2)),
    ],
)
def test_small_set_without_enough_identities_is_refused_without_a_split_file(tmp_path, layouts, fmt, make):
    """One identity: the protocol gives no train id or no test id; the split must not be kept."""
    root = make(layouts, tmp_path / fmt)
    split_file = tmp_path / "splits.json"
    with pytest.raises(DataError) as err:
        load_dataset(root, fmt, split_path=split_file)
    assert err.value.path == root and "identit" in err.value.reason
    assert not split_file.exists()


def test_split_file_with_an_empty_subset_is_refused(tmp_path, layouts):
    import json

    root = layouts.viper(tmp_path / "viper", ids=4)
    split_file = tmp_path / "splits.json"
    load_dataset(root, "viper", split_path=split_file)
    doc = json.loads(split_file.read_text())
    next(iter(doc["datasets"].values()))["splits"]["0"]["query"] = []
    split_file.write_text(json.dumps(doc))
    with pytest.raises(DataError) as err:
        load_dataset(root, "viper", split_path=split_file)
    assert err.value.path == split_file and "query" in err.value.reason


@pytest.mark.parametrize("listed", ["list_query.txt", "list_gallery.txt"])
def test_msmt17_empty_list_is_refused(tmp_path, layouts, listed):
    root = layouts.msmt17(tmp_path / "MSMT17_V1")
    (root / listed).write_text("")
    with pytest.raises(DataError) as err:
        load_dataset(root, "msmt17")
    assert err.value.path == root / listed and "no images" in err.value.reason


def test_msmt17_empty_train_and_val_lists_are_refused(tmp_path, layouts):
    root = layouts.msmt17(tmp_path / "MSMT17_V1")
    (root / "list_train.txt").write_text("")
    (root / "list_val.txt").write_text("")
    with pytest.raises(DataError) as err:
        load_dataset(root, "msmt17")
    assert err.value.path == root / "list_train.txt"


def test_fedreidbench_empty_query_is_refused(tmp_path, layouts):
    base = tmp_path / "viper" / "pytorch"
    layouts.image(base / "train_all" / "3" / "cam_0_00003_00000.png")
    layouts.image(base / "gallery" / "0" / "cam_1_00000_00000.png")
    (base / "query").mkdir()
    with pytest.raises(DataError) as err:
        load_dataset(tmp_path / "viper", "fedreidbench")
    assert err.value.path == base / "query" and "no images" in err.value.reason
