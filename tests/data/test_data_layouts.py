"""Loaders of the layouts with official splits: Market-1501, DukeMTMC-reID, CUHK03-NP, MSMT17,
FedReIDBench's folders, CUHK02; and the registry in front of them."""

from __future__ import annotations


import pytest

from secfed.data.errors import DataError
from secfed.data.registry import FORMATS, UnknownFormatError, guess_format, load_dataset


def _triples(samples):
    return sorted((s.path.name, s.pid, s.camid) for s in samples)


# --- Market-1501 ---------------------------------------------------------------------------------


def test_market_reads_subsets_drops_junk_keeps_distractors(tmp_path, layouts):
    root = layouts.market(tmp_path / "market")
    ds = load_dataset(root, "market1501")

    assert _triples(ds.train) == [
        ("0002_c1s1_000151_01.jpg", 2, 0), ("0002_c6s1_000151_01.jpg", 2, 5),
        ("0007_c1s1_000151_01.jpg", 7, 0), ("0007_c6s1_000151_01.jpg", 7, 5),
        ("0009_c1s1_000151_01.jpg", 9, 0), ("0009_c6s1_000151_01.jpg", 9, 5),
    ]
    assert _triples(ds.query) == [("0003_c1s1_000451_01.jpg", 3, 0), ("0005_c1s1_000451_01.jpg", 5, 0)]
    assert sorted(s.pid for s in ds.gallery) == [0, 0, 3, 5]  # distractors kept, junk gone
    assert {s.camid for s in ds.gallery if s.pid == 0} == {0, 5}
    assert ds.skipped == {"junk": 1, "not_image": 1}
    assert ds.name == "market1501"
    assert all(s.path.is_file() for s in ds.train + ds.query + ds.gallery)


def test_market_accepts_the_official_wrapper_folder(tmp_path, layouts):
    inner = layouts.market(tmp_path / "market1501" / "Market-1501-v15.09.15")
    ds = load_dataset(tmp_path / "market1501", "market1501")
    assert len(ds.train) == 6
    for path in (inner / "bounding_box_test").iterdir():
        path.unlink()
    (inner / "bounding_box_test").rmdir()
    with pytest.raises(DataError) as err:
        load_dataset(tmp_path / "market1501", "market1501")
    assert err.value.path == inner / "bounding_box_test"  # named inside the wrapper the data is in


def test_market_distractor_outside_gallery_is_an_error(tmp_path, layouts):
    root = layouts.market(tmp_path / "m")
    bad = layouts.image(root / "query" / "0000_c2s1_000100_01.jpg")
    with pytest.raises(DataError) as err:
        load_dataset(root, "market1501")
    assert err.value.path == bad
    assert "distractor" in err.value.reason and "query" in err.value.reason


def test_market_unparseable_name_is_an_error_naming_the_file(tmp_path, layouts):
    root = layouts.market(tmp_path / "m")
    bad = layouts.image(root / "bounding_box_train" / "person2_cam1.jpg")
    with pytest.raises(DataError) as err:
        load_dataset(root, "market1501")
    assert err.value.path == bad
    assert "PID_cCAM" in str(err.value)


def test_market_missing_folder_names_it_and_the_layout(tmp_path, layouts):
    root = layouts.market(tmp_path / "m")
    for path in (root / "query").iterdir():
        path.unlink()
    (root / "query").rmdir()
    with pytest.raises(DataError) as err:
        load_dataset(root, "market1501")
    assert err.value.path == root / "query"
    assert "missing folder" in err.value.reason and "bounding_box_train" in err.value.reason


def test_broken_link_is_an_error_and_stray_entries_are_counted(tmp_path, layouts):
    root = layouts.market(tmp_path / "m")
    (root / "query" / "notes").mkdir()
    (root / "query" / ".DS_Store").write_bytes(b"x")
    assert load_dataset(root, "market1501").skipped == {"junk": 1, "not_image": 3}
    link = root / "query" / "0004_c1s1_000001_01.jpg"
    link.symlink_to(tmp_path / "elsewhere.jpg")
    with pytest.raises(DataError, match="broken symbolic link") as err:
        load_dataset(root, "market1501")
    assert err.value.path == link
    link.unlink()
    link.symlink_to(link.name)  # a link to itself (found by review: an OSError traceback)
    with pytest.raises(DataError, match="cannot be read .Too many levels of symbolic links") as err:
        load_dataset(root, "market1501")
    assert err.value.path == link


def test_missing_root_is_an_error(tmp_path):
    with pytest.raises(DataError) as err:
        load_dataset(tmp_path / "nowhere", "dukemtmc")
    assert err.value.path == tmp_path / "nowhere"


def test_market_generic_format_reads_many_cameras(tmp_path, layouts):
    root = layouts.market(tmp_path / "synthetic-domain", cameras=14)
    ds = load_dataset(root, "market1501", name="domain-3")
    assert {s.camid for s in ds.train} == {0, 13}
    assert ds.name == "domain-3"


def test_duke_checks_its_eight_cameras(tmp_path, layouts):
    ok = layouts.market(tmp_path / "duke", cameras=8)
    assert {s.camid for s in load_dataset(ok, "dukemtmc").train} == {0, 7}
    bad = layouts.market(tmp_path / "duke9", cameras=9)
    with pytest.raises(DataError, match=r"camera c9 out of range \(c1..c8\)"):
        load_dataset(bad, "dukemtmc")


# --- CUHK03-NP -----------------------------------------------------------------------------------


def test_cuhk03np_reads_labeled_and_detected_separately(tmp_path, layouts):
    root = tmp_path / "cuhk03-np"
    layouts.market(root / "labeled", cameras=2, ids=(1, 2))
    layouts.market(root / "detected", cameras=2, ids=(1, 2, 4, 6))
    labeled = load_dataset(root, "cuhk03np-labeled")
    detected = load_dataset(root, "cuhk03np-detected")
    assert len(labeled.train) == 4 and len(detected.train) == 8
    assert all("labeled" in s.path.parts for s in labeled.train)
    assert {s.camid for s in detected.train} == {0, 1}
    # FedReIDBench's flattened folder (Market layout at the top) is read as the named kind.
    assert len(load_dataset(root / "detected", "cuhk03np-detected").train) == 8


def test_cuhk03np_missing_kind_folder(tmp_path, layouts):
    layouts.market(tmp_path / "c" / "labeled", cameras=2)
    with pytest.raises(DataError) as err:
        load_dataset(tmp_path / "c", "cuhk03np-detected")
    assert err.value.path == tmp_path / "c" / "detected"


# --- MSMT17 --------------------------------------------------------------------------------------


@pytest.mark.parametrize("v2", [False, True])
def test_msmt17_lists_two_digit_cameras_and_val_in_train(tmp_path, layouts, v2):
    wrapper = "MSMT17_V2" if v2 else "MSMT17_V1"
    layouts.msmt17(tmp_path / "msmt17" / wrapper, v2=v2)
    ds = load_dataset(tmp_path / "msmt17", "msmt17")
    assert sorted((s.pid, s.camid) for s in ds.train) == [(0, 0), (0, 14), (1, 2), (1, 11)]  # train + val
    assert sorted((s.pid, s.camid) for s in ds.query) == [(0, 6), (1, 6)]
    assert sorted((s.pid, s.camid) for s in ds.gallery) == [(0, 13), (1, 13)]
    assert all(s.path.is_file() for s in ds.train)


def test_msmt17_malformed_line_names_the_list_and_line(tmp_path, layouts):
    root = layouts.msmt17(tmp_path / "MSMT17_V1")
    with (root / "list_query.txt").open("a") as handle:
        handle.write("0002/0002_000_01_x.jpg\n")  # no pid
    with pytest.raises(DataError) as err:
        load_dataset(root, "msmt17")
    assert err.value.path == root / "list_query.txt"
    assert "line 3" in err.value.reason


def test_msmt17_camera_out_of_range_and_missing_image(tmp_path, layouts):
    root = layouts.msmt17(tmp_path / "a")
    (root / "list_gallery.txt").write_text("0000/0000_000_16_0113noon_0001_1.jpg 0\n")
    with pytest.raises(DataError, match=r"camera 16 out of range \(01..15\)"):
        load_dataset(root, "msmt17")
    (root / "list_gallery.txt").write_text("0000/0000_000_03_gone.jpg 0\n")
    with pytest.raises(DataError) as err:
        load_dataset(root, "msmt17")
    assert err.value.path == root / "test" / "0000" / "0000_000_03_gone.jpg"


def test_msmt17_without_lists(tmp_path):
    (tmp_path / "msmt").mkdir()
    with pytest.raises(DataError) as err:
        load_dataset(tmp_path / "msmt", "msmt17")
    assert err.value.path.name == "list_train.txt"


# --- FedReIDBench folders, CUHK02 -----------------------------------------------------------------


def test_fedreidbench_folders_both_naming_styles(tmp_path, layouts):
    base = tmp_path / "prid" / "pytorch"
    layouts.image(base / "train_all" / "3" / "cam_0_00003_00000.png")
    layouts.image(base / "train_all" / "3" / "cam_1_00003_00001.png")
    layouts.image(base / "query" / "0" / "cam_0_00000_00000.png")  # pid 0 is a real person here
    layouts.image(base / "gallery" / "0" / "cam_1_00000_00000.png")
    layouts.image(base / "gallery" / "0002" / "0002_c4s1_000451_03.jpg")
    layouts.image(base / "gallery" / "-1" / "-1_c1s1_000401_03.jpg")
    ds = load_dataset(tmp_path / "prid", "fedreidbench")
    assert sorted((s.pid, s.camid) for s in ds.train) == [(3, 0), (3, 1)]
    assert [(s.pid, s.camid) for s in ds.query] == [(0, 0)]
    assert sorted((s.pid, s.camid) for s in ds.gallery) == [(0, 1), (2, 3)]
    assert ds.skipped == {"junk": 1}
    # without train_all, train and val are read: what train_all holds (val was dropped without a word: review)
    (base / "train_all").rename(base / "train")
    layouts.image(base / "val" / "4" / "cam_0_00004_00000.png")
    assert sorted(s.pid for s in load_dataset(tmp_path / "prid", "fedreidbench").train) == [3, 3, 4]
    layouts.image(base / "query" / "x7" / "cam_0_1.png")
    with pytest.raises(DataError) as err:
        load_dataset(tmp_path / "prid", "fedreidbench")
    assert err.value.path == base / "query" / "x7"


def test_cuhk02_is_train_only_with_ids_unique_across_pairs(tmp_path, layouts):
    ds = load_dataset(layouts.cuhk02(tmp_path / "cuhk02"), "cuhk02")
    assert ds.query == [] and ds.gallery == []
    assert len(ds.train) == 5 * 2 * 2 * 2
    assert ds.num_train_pids == 10  # ids 1, 2 restart in every pair
    assert {s.camid for s in ds.train} == set(range(10))
    pairs_of = {}
    for s in ds.train:
        pairs_of.setdefault(s.pid, set()).add(s.path.parts[-3])
    assert all(len(pairs) == 1 for pairs in pairs_of.values())


# --- registry ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("folder", "fmt"),
    [
        ("market1501", "market1501"), ("Market-1501-v15.09.15", "market1501"), ("DukeMTMC-reID", "dukemtmc"),
        ("cuhk03-np", "cuhk03np-detected"), ("cuhk03-np-labeled", "cuhk03np-labeled"), ("MSMT17_V2", "msmt17"),
        ("prid_2011", "prid2011"), ("CUHK01", "cuhk01"), ("cuhk02", "cuhk02"), ("VIPeR", "viper"),
        ("3DPeS", "3dpes"), ("i-LIDS_Pedestrian", "ilids"), ("iLIDS-VID", "ilidsvid"), ("pytorch", "fedreidbench"),
        ("prid450s", None), ("holiday-photos", None),
    ],
)
def test_guess_format(folder, fmt):
    assert guess_format(folder) == fmt


def test_every_format_name_guesses_itself():
    assert all(guess_format(name) == name for name in FORMATS)


def test_unknown_format_lists_the_known_ones(tmp_path):
    with pytest.raises(UnknownFormatError) as err:
        load_dataset(tmp_path, "market")
    assert "market1501" in str(err.value) and "msmt17" in str(err.value)


def test_loader_paths_accept_strings(tmp_path, layouts):
    root = layouts.market(tmp_path / "m")
    assert len(load_dataset(str(root), "market1501").query) == 2
