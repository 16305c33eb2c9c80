"""The small sets without official splits: seeded splits kept in splits.json, per-set protocols."""

from __future__ import annotations

import json
import os
import re
import stat
from collections import defaultdict

import pytest

from secfed.data.errors import DataError
from secfed.data.registry import load_dataset

SMALL_SETS = {
    "viper": lambda layouts, root: layouts.viper(root, ids=12),
    "cuhk01": lambda layouts, root: layouts.cuhk01(root, ids=12),
    "prid2011": lambda layouts, root: layouts.prid2011(root, frames=2),
    "3dpes": lambda layouts, root: layouts.pes3d(root, ids=12),
    "ilids": lambda layouts, root: layouts.ilids(root, ids=12),
    "ilidsvid": lambda layouts, root: layouts.ilidsvid(root, ids=12, frames=4),
}


def _split_signature(ds):
    parts = (ds.train, ds.query, ds.gallery)
    return tuple(tuple(sorted((str(s.path), s.pid, s.camid) for s in part)) for part in parts)


def _tree(root):
    """Every path under ``root`` with its size and modification time: what a load must not change."""
    return {str(p): (p.stat().st_size, p.stat().st_mtime_ns) for p in sorted(root.rglob("*"))}


def _check_protocol(ds):
    train_ids = {s.pid for s in ds.train}
    test_ids = {s.pid for s in ds.query} | {s.pid for s in ds.gallery}
    assert train_ids and ds.query and ds.gallery
    assert not train_ids & test_ids
    gallery_cams = defaultdict(set)
    for s in ds.gallery:
        gallery_cams[s.pid].add(s.camid)
    for s in ds.query:  # every query is matched in the gallery from another camera
        assert gallery_cams[s.pid] - {s.camid}
    assert not {s.path for s in ds.query} & {s.path for s in ds.gallery}


@pytest.mark.parametrize("fmt", sorted(SMALL_SETS))
def test_without_a_split_path_the_split_is_drawn_in_memory_and_nothing_written(tmp_path, layouts, fmt):
    root = SMALL_SETS[fmt](layouts, tmp_path / fmt)
    before = _tree(tmp_path)
    first = load_dataset(root, fmt, seed=0)
    _check_protocol(first)
    assert _tree(tmp_path) == before  # not a file added or touched, in the dataset folder or beside it
    assert _split_signature(load_dataset(root, fmt, seed=0)) == _split_signature(first)
    other = load_dataset(root, fmt, seed=1)
    _check_protocol(other)
    assert _split_signature(other) != _split_signature(first)


@pytest.mark.parametrize("fmt", sorted(SMALL_SETS))
def test_split_file_keeps_the_split_per_dataset_and_seed(tmp_path, layouts, fmt):
    root = SMALL_SETS[fmt](layouts, tmp_path / "data" / fmt)
    split_file = tmp_path / "run" / "splits.json"
    split_file.parent.mkdir()
    data_before = _tree(tmp_path / "data")
    first = load_dataset(root, fmt, seed=0, split_path=split_file)
    assert _tree(tmp_path / "data") == data_before

    doc = json.loads(split_file.read_text())
    assert doc["version"] == 2 and list(doc["datasets"]) == [fmt]
    entry = doc["datasets"][fmt]
    assert entry["format"] == fmt and list(entry["splits"]) == ["0"]
    assert len(entry["splits"]["0"]["train"]) == len(first.train)

    assert _split_signature(load_dataset(root, fmt, seed=0, split_path=split_file)) == _split_signature(first)
    other = load_dataset(root, fmt, seed=1, split_path=split_file)
    assert _split_signature(other) != _split_signature(first)
    assert sorted(json.loads(split_file.read_text())["datasets"][fmt]["splits"]) == ["0", "1"]
    # The file holds the same split as the in-memory draw (drawn, not remembered).
    assert _split_signature(load_dataset(root, fmt, seed=0)) == _split_signature(first)


def test_one_split_file_holds_several_datasets_by_name(tmp_path, layouts):
    a = layouts.viper(tmp_path / "a", ids=10)
    b = layouts.viper(tmp_path / "b", ids=6)
    split_file = tmp_path / "splits.json"
    ds_a = load_dataset(a, "viper", name="viper-a", split_path=split_file)
    ds_b = load_dataset(b, "viper", name="viper-b", split_path=split_file)
    assert (ds_a.name, ds_b.name) == ("viper-a", "viper-b")
    assert sorted(json.loads(split_file.read_text())["datasets"]) == ["viper-a", "viper-b"]
    assert _split_signature(load_dataset(a, "viper", name="viper-a", split_path=split_file)) == _split_signature(ds_a)
    with pytest.raises(DataError, match="'viper-a' was recorded as format 'viper', not 'cuhk01'"):
        load_dataset(layouts.cuhk01(tmp_path / "c"), "cuhk01", name="viper-a", split_path=split_file)


def test_split_survives_new_files_and_counts_them(tmp_path, layouts):
    root = layouts.viper(tmp_path / "viper", ids=10)
    split_file = tmp_path / "splits.json"
    first = load_dataset(root, "viper", seed=3, split_path=split_file)
    layouts.image(root / "VIPeR" / "cam_a" / "050_0.bmp")
    again = load_dataset(root, "viper", seed=3, split_path=split_file)
    assert _split_signature(again) == _split_signature(first)
    assert again.skipped == {"not_in_split": 1}


def test_split_file_listing_a_missing_image_is_an_error(tmp_path, layouts):
    root = layouts.viper(tmp_path / "viper")
    split_file = tmp_path / "splits.json"
    load_dataset(root, "viper", split_path=split_file)
    os.remove(root / "VIPeR" / "cam_b" / "003_90.bmp")
    with pytest.raises(DataError) as err:
        load_dataset(root, "viper", split_path=split_file)
    assert err.value.path == split_file
    assert "VIPeR/cam_b/003_90.bmp" in err.value.reason


def test_split_file_broken_or_old_is_an_error(tmp_path, layouts):
    root = layouts.cuhk01(tmp_path / "c")
    split_file = tmp_path / "splits.json"
    split_file.write_text(json.dumps({"format": "cuhk01", "version": 1, "splits": {}}))
    with pytest.raises(DataError, match="version 1; this secfed reads version 2 .*older secfed"):
        load_dataset(root, "cuhk01", split_path=split_file)
    split_file.write_text("{not json")
    with pytest.raises(DataError, match="not valid JSON"):
        load_dataset(root, "cuhk01", split_path=split_file)
    wrong_pid = {"train": [["campus/0001001.png", 7, 0]], "query": [], "gallery": []}
    doc = {"version": 2, "datasets": {"cuhk01": {"format": "cuhk01", "splits": {"0": wrong_pid}}}}
    split_file.write_text(json.dumps(doc))
    with pytest.raises(DataError, match="recorded as pid 7"):
        load_dataset(root, "cuhk01", split_path=split_file)


def test_unwritable_split_location_is_an_error_naming_it(tmp_path, layouts):
    root = layouts.viper(tmp_path / "viper")
    with pytest.raises(DataError) as err:
        load_dataset(root, "viper", split_path=tmp_path / "no-such-dir" / "s.json")
    assert err.value.path == tmp_path / "no-such-dir" / "s.json"
    assert "cannot write" in err.value.reason and "--split-file" in err.value.reason


def test_viper_and_cuhk01_protocol(tmp_path, layouts):
    viper = load_dataset(layouts.viper(tmp_path / "v", ids=9), "viper")
    assert viper.num_train_pids == 4  # n // 2
    assert {s.camid for s in viper.query} == {0} and {s.camid for s in viper.gallery} == {1}
    assert all(s.path.parent.name == ("cam_a" if s.camid == 0 else "cam_b") for s in viper.train)

    cuhk01 = load_dataset(layouts.cuhk01(tmp_path / "c", ids=6), "cuhk01")
    assert len(cuhk01.train) == 3 * 4 and len(cuhk01.query) == 3 * 2 and len(cuhk01.gallery) == 3 * 2
    for s in cuhk01.train + cuhk01.query + cuhk01.gallery:
        assert s.camid == (int(s.path.stem[4:]) - 1) // 2  # images 1-2: camera 0, 3-4: camera 1


def test_prid2011_follows_the_published_single_shot_protocol(tmp_path, layouts):
    """Real numbering: persons 1-200 in both cameras; 201.. in cam_a only and 201.. in cam_b only are
    different people who share numbers, and must never be matched."""
    root = layouts.prid2011(tmp_path / "prid2011", a_only=4, b_only=6, frames=12)
    ds = load_dataset(root, "prid2011", seed=2)
    _check_protocol(ds)
    query_ids, train_ids = {s.pid for s in ds.query}, {s.pid for s in ds.train}
    assert len(query_ids) == 100 and query_ids <= set(range(1, 201))  # test ids: half of the 200 shared
    assert {s.pid for s in ds.gallery} == query_ids | {10_201, 10_202, 10_203, 10_204, 10_205, 10_206}
    assert train_ids == set(range(1, 201)) - query_ids | {201, 202, 203, 204}  # 100 shared + cam_a-only
    assert {s.camid for s in ds.query} == {0} and {s.camid for s in ds.gallery} == {1}
    # A number above 200 names two people: cam_a's (in train) and cam_b's (a distractor), never one pid.
    for s in ds.train:
        assert int(re.search(r"person_(\d+)", str(s.path))[1]) == s.pid  # train persons keep their number
    for s in ds.gallery:
        number = int(re.search(r"person_(\d+)", s.path.name)[1])
        assert s.pid == (number if number <= 200 else 10_000 + number)
    assert all(s.camid == 0 for s in ds.train if s.pid > 200)  # cam_b frames of 201.. never join them
    assert all("single_shot" in s.path.parts for s in ds.query + ds.gallery)
    frames = defaultdict(list)
    for s in ds.train:
        assert "multi_shot" in s.path.parts
        frames[s.pid, s.camid].append(s)
    assert set(map(len, frames.values())) == {10}  # 10 of 12 frames per sequence
    assert len(frames) == 100 * 2 + 4


def test_prid2011_real_counts_match_fedreidbench(tmp_path, layouts):
    """The real set (cam_a 385 persons, cam_b 749): FedReIDBench's Table 1 row, 285 / 100 / 649."""
    ds = load_dataset(layouts.prid2011(tmp_path / "p", a_only=185, b_only=549, frames=0), "prid2011")
    assert (ds.num_train_pids, len(ds.query), len(ds.gallery)) == (285, 100, 649)


def test_prid2011_missing_shared_person_is_an_error(tmp_path, layouts):
    root = layouts.prid2011(tmp_path / "p", frames=0)
    gone = root / "prid_2011" / "single_shot" / "cam_b" / "person_0123.png"
    gone.unlink()
    with pytest.raises(DataError) as err:
        load_dataset(root, "prid2011")
    assert err.value.path == gone and "both cameras" in err.value.reason


def test_prid2011_without_multi_shot_trains_on_single_shot(tmp_path, layouts):
    root = layouts.prid2011(tmp_path / "p", frames=0)
    ds = load_dataset(root, "prid2011")
    assert all("single_shot" in s.path.parts for s in ds.train)
    assert ds.num_train_pids == 100 + 4
    assert len(ds.train) == 100 * 2 + 4


def test_3dpes_keeps_real_cameras_and_splits_them(tmp_path, layouts):
    ds = load_dataset(layouts.pes3d(tmp_path / "3dpes", ids=10), "3dpes")
    assert {s.camid for s in ds.train + ds.query + ds.gallery} <= set(range(8))
    for pid in {s.pid for s in ds.query}:
        q = {s.camid for s in ds.query if s.pid == pid}
        g = {s.camid for s in ds.gallery if s.pid == pid}
        assert len(q) == 1 and len(g) == 2 and not q & g  # 3 cameras: 1 query, 2 gallery


def test_ilids_pseudo_views(tmp_path, layouts):
    ds = load_dataset(layouts.ilids(tmp_path / "ilids", ids=6, per_id=5), "ilids")
    for pid in {s.pid for s in ds.train}:
        views = [s.camid for s in ds.train if s.pid == pid]
        assert sorted(views) == [0, 0, 1, 1, 1]  # 5 images: 2 in view 0, 3 in view 1
    assert len(ds.query) == 3 * 2 and len(ds.gallery) == 3 * 3


def test_ilidsvid_image_protocol(tmp_path, layouts):
    ds = load_dataset(layouts.ilidsvid(tmp_path / "ilidsvid", ids=4, frames=25), "ilidsvid")
    assert len(ds.train) == 2 * 2 * 10
    picked = sorted(int(s.path.stem[-5:]) for s in ds.train if s.camid == 0 and s.pid == ds.train[0].pid)
    assert picked == [0, 3, 5, 8, 11, 13, 16, 19, 21, 24]  # evenly spaced over 25 frames
    assert [int(s.path.stem[-5:]) for s in ds.query] == [12, 12]  # middle frames
    assert {s.camid for s in ds.query} == {0} and {s.camid for s in ds.gallery} == {1}


def test_small_set_unparseable_name_and_missing_folder(tmp_path, layouts):
    root = layouts.cuhk01(tmp_path / "cuhk01")
    bad = layouts.image(root / "campus" / "img_12.png")
    with pytest.raises(DataError) as err:
        load_dataset(root, "cuhk01")
    assert err.value.path == bad
    with pytest.raises(DataError) as err:
        load_dataset(tmp_path / "cuhk01" / "campus", "viper")
    assert err.value.path.name == "cam_a" and "VIPeR" in err.value.reason


def test_split_file_is_readable_by_every_user_of_the_data(tmp_path, layouts):
    root = layouts.viper(tmp_path / "viper")
    split_dir = tmp_path / "run"
    split_dir.mkdir()
    load_dataset(root, "viper", split_path=split_dir / "splits.json")
    assert stat.S_IMODE((split_dir / "splits.json").stat().st_mode) == 0o644
    assert [p.name for p in split_dir.iterdir()] == ["splits.json"]  # no temporary left behind
