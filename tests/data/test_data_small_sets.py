"""The small sets without official splits: seeded splits kept in splits.json, per-set protocols."""

from __future__ import annotations

import json
import stat
import os
from collections import defaultdict

import pytest

from secfed.data.errors import DataError
from secfed.data.registry import load_dataset

SMALL_SETS = {
    "viper": lambda layouts, root: layouts.viper(root, ids=12),
    "cuhk01": lambda layouts, root: layouts.cuhk01(root, ids=12),
    "prid2011": lambda layouts, root: layouts.prid2011(root, shared=12),
    "3dpes": lambda layouts, root: layouts.pes3d(root, ids=12),
    "ilids": lambda layouts, root: layouts.ilids(root, ids=12),
    "ilidsvid": lambda layouts, root: layouts.ilidsvid(root, ids=12, frames=4),
}


def _split_signature(ds):
    parts = (ds.train, ds.query, ds.gallery)
    return tuple(tuple(sorted((str(s.path), s.pid, s.camid) for s in part)) for part in parts)


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
def test_seeded_split_is_written_stable_and_seed_dependent(tmp_path, layouts, fmt):
    root = SMALL_SETS[fmt](layouts, tmp_path / fmt)
    first = load_dataset(root, fmt, seed=0)
    _check_protocol(first)

    doc = json.loads((root / "splits.json").read_text())
    assert doc["format"] == fmt and doc["version"] == 1 and list(doc["splits"]) == ["0"]
    assert len(doc["splits"]["0"]["train"]) == len(first.train)

    assert _split_signature(load_dataset(root, fmt, seed=0)) == _split_signature(first)
    other = load_dataset(root, fmt, seed=1)
    _check_protocol(other)
    assert _split_signature(other) != _split_signature(first)
    assert sorted(json.loads((root / "splits.json").read_text())["splits"]) == ["0", "1"]

    # The same split comes back from a fresh copy without the file (drawn, not remembered).
    (root / "splits.json").unlink()
    assert _split_signature(load_dataset(root, fmt, seed=0)) == _split_signature(first)


def test_split_survives_new_files_and_counts_them(tmp_path, layouts):
    root = layouts.viper(tmp_path / "viper", ids=10)
    first = load_dataset(root, "viper", seed=3)
    layouts.image(root / "VIPeR" / "cam_a" / "050_0.bmp")
    again = load_dataset(root, "viper", seed=3)
    assert _split_signature(again) == _split_signature(first)
    assert again.skipped == {"not_in_split": 1}


def test_split_file_listing_a_missing_image_is_an_error(tmp_path, layouts):
    root = layouts.viper(tmp_path / "viper")
    load_dataset(root, "viper")
    os.remove(root / "VIPeR" / "cam_b" / "003_90.bmp")
    with pytest.raises(DataError) as err:
        load_dataset(root, "viper")
    assert err.value.path == root / "splits.json"
    assert "VIPeR/cam_b/003_90.bmp" in err.value.reason


def test_split_file_of_another_format_or_broken_is_an_error(tmp_path, layouts):
    root = layouts.cuhk01(tmp_path / "c")
    (root / "splits.json").write_text(json.dumps({"format": "viper", "version": 1, "splits": {}}))
    with pytest.raises(DataError, match="written for format 'viper', not 'cuhk01'"):
        load_dataset(root, "cuhk01")
    (root / "splits.json").write_text("{not json")
    with pytest.raises(DataError, match="not valid JSON"):
        load_dataset(root, "cuhk01")
    wrong_pid = {"train": [["campus/0001001.png", 7, 0]], "query": [], "gallery": []}
    (root / "splits.json").write_text(json.dumps({"format": "cuhk01", "version": 1, "splits": {"0": wrong_pid}}))
    with pytest.raises(DataError, match="recorded as pid 7"):
        load_dataset(root, "cuhk01")


def test_split_file_elsewhere_and_unwritable_location(tmp_path, layouts):
    root = layouts.viper(tmp_path / "viper")
    elsewhere = tmp_path / "splits" / "viper.json"
    elsewhere.parent.mkdir()
    ds = load_dataset(root, "viper", split_path=elsewhere)
    assert elsewhere.is_file() and not (root / "splits.json").exists()
    assert json.loads(elsewhere.read_text())["splits"]["0"]["query"][0][0].startswith("VIPeR/cam_a/")
    assert len(ds.query) == 4
    with pytest.raises(DataError) as err:
        load_dataset(root, "viper", split_path=tmp_path / "no-such-dir" / "s.json")
    assert err.value.path == tmp_path / "no-such-dir" / "s.json"
    assert "cannot write" in err.value.reason


def test_viper_and_cuhk01_protocol(tmp_path, layouts):
    viper = load_dataset(layouts.viper(tmp_path / "v", ids=9), "viper")
    assert viper.num_train_pids == 4  # n // 2
    assert {s.camid for s in viper.query} == {0} and {s.camid for s in viper.gallery} == {1}
    assert all(s.path.parent.name == ("cam_a" if s.camid == 0 else "cam_b") for s in viper.train)

    cuhk01 = load_dataset(layouts.cuhk01(tmp_path / "c", ids=6), "cuhk01")
    assert len(cuhk01.train) == 3 * 4 and len(cuhk01.query) == 3 * 2 and len(cuhk01.gallery) == 3 * 2
    for s in cuhk01.train + cuhk01.query + cuhk01.gallery:
        assert s.camid == (int(s.path.stem[4:]) - 1) // 2  # images 1-2: camera 0, 3-4: camera 1


def test_prid2011_protocol(tmp_path, layouts):
    root = layouts.prid2011(tmp_path / "prid2011", shared=6, a_only=2, b_only=3, frames=12)
    ds = load_dataset(root, "prid2011")
    train_ids = {s.pid for s in ds.train}
    assert {7, 8} <= train_ids and len(train_ids) == 3 + 2  # half the shared ids + the cam-a-only ids
    assert {9, 10, 11} <= {s.pid for s in ds.gallery}  # cam-b-only ids are gallery distractors
    assert {s.pid for s in ds.query} == {s.pid for s in ds.gallery} - {9, 10, 11}
    assert all("single_shot" in s.path.parts for s in ds.query + ds.gallery)
    frames = defaultdict(list)
    for s in ds.train:
        assert "multi_shot" in s.path.parts
        frames[s.pid, s.camid].append(s)
    assert set(map(len, frames.values())) == {10}  # 10 of 12 frames per sequence
    assert len(frames) == 3 * 2 + 2  # shared train ids in both cameras, cam-a-only ids in one
    assert ds.skipped["not_in_split"] == 6 + 2 + 6 + 3 + (8 + 6) * 12 - len(ds.train) - len(ds.query) - len(ds.gallery)


def test_prid2011_without_multi_shot_trains_on_single_shot(tmp_path, layouts):
    root = layouts.prid2011(tmp_path / "p", frames=0)
    ds = load_dataset(root, "prid2011")
    assert all("single_shot" in s.path.parts for s in ds.train)
    assert ds.num_train_pids == 3 + 2


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
    load_dataset(root, "viper")
    assert stat.S_IMODE((root / "splits.json").stat().st_mode) == 0o644
    assert [p.name for p in root.iterdir() if p.name.startswith(".")] == []  # no temporary left behind
