"""Data that cannot be trained on or evaluated is refused with a DataError naming the path, never
accepted as an empty subset (a domain silently missing from the results) or an empty split file."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
import torch

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
    (cam2 / "person999").mkdir()  # one empty person folder is counted (it was dropped without a word: review)
    assert load_dataset(root, "ilidsvid").skipped["empty_folder"] == 1
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


@pytest.mark.parametrize("listed", ["list_query.txt", "list_gallery.txt", "list_val.txt"])  # val: found by review
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


# ---- hostile names, files and split files (found by review: each raised a traceback, hung, or was read wrong) ----


def test_a_label_beyond_any_dataset_or_a_name_that_is_not_utf8_is_refused_by_file(tmp_path, layouts):
    """Before: a camera of 10^22 in a file name overflowed the label tensor in train and evaluate, and a
    file name that is not UTF-8 stopped the data fingerprint — after `data inspect --verify` passed."""
    root = layouts.market(tmp_path / "m")
    huge = layouts.image(root / "query" / "0003_c99999999999999999999999s1_000001_01.jpg")
    with pytest.raises(DataError, match=r"camera 99999999999999999999998 lies outside \[-1, 2\^31\)") as err:
        load_dataset(root, "market1501")
    assert err.value.path == huge
    huge.unlink()
    odd = root / "query" / os.fsdecode(b"0003_c1s1_\xff\x1b[31m.jpg")
    shutil.copy(next((root / "query").iterdir()), odd)
    with pytest.raises(DataError, match="the file name is not valid UTF-8") as err:
        load_dataset(root, "market1501")
    assert "\\xff\\x1b[31m" in str(err.value) and "\x1b" not in str(err.value)  # shown escaped, not obeyed


def test_digits_of_other_scripts_are_not_ids(tmp_path, layouts):
    """Before: `\\d` read '٠٠٠٣_c١' (Arabic-Indic digits) as pid 3, camera 1; and '²' passed MSMT17's
    isdigit() and then stopped int() with a traceback."""
    root = layouts.market(tmp_path / "m")
    layouts.image(root / "query" / "٠٠٠٣_c١s1_000001_01.jpg")
    with pytest.raises(DataError, match="file name does not start with PID_cCAM"):
        load_dataset(root, "market1501")
    msmt = layouts.msmt17(tmp_path / "msmt")
    lines = (msmt / "list_train.txt").read_text().splitlines()
    (msmt / "list_train.txt").write_text("\n".join([lines[0].rsplit(" ", 1)[0] + " ²", *lines[1:]]) + "\n")
    with pytest.raises(DataError, match="expected '<relative path> <pid>'"):
        load_dataset(msmt, "msmt17")
    (msmt / "list_train.txt").write_bytes(b"\xff junk 3\n")
    with pytest.raises(DataError, match="cannot read the list file"):
        load_dataset(msmt, "msmt17")


def test_images_are_bounded_before_they_are_read_and_sixteen_bits_are_scaled(tmp_path):
    """Before: a 40 GB sparse file raised MemoryError, a PNG header of 30000×30000 (875 KB on disk)
    took 3.35 GB to decode, and a 16-bit PNG kept its low byte only (0x1234 became 0x34)."""
    import struct
    import zlib

    import numpy as np
    from PIL import Image

    from secfed.data.images import MAX_IMAGE_BYTES, read_image

    big = tmp_path / "0001_c1s1_000001_01.jpg"
    with open(big, "wb") as f:
        f.truncate(MAX_IMAGE_BYTES + 1)
    with pytest.raises(DataError, match="larger than any image a ReID set holds"):
        read_image(big)

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", 30000, 30000, 8, 2, 0, 0, 0)  # 30000×30000 RGB, 8 bits
    bomb = tmp_path / "bomb.png"
    bomb.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(b"\0" * 1000))
                     + chunk(b"IEND", b""))
    with pytest.raises(DataError, match="more pixels than any image a ReID set holds"):
        read_image(bomb)
    # review of the fix: a header Pillow cannot read went to libjpeg unchecked (a 635-byte JPEG decoded to
    # 20000×20000), and an animated GIF multiplied the bound by its frames (940 bytes → 1.9 GB); the size is
    # then read from the JPEG or PNG header itself (refusing every header Pillow cannot read refused
    # pictures libjpeg and libpng decode: review of that fix)
    small = tmp_path / "small.jpg"
    Image.new("RGB", (4, 8), (180, 40, 20)).save(small)
    data = small.read_bytes()
    sof = data.index(b"\xff\xc0")
    huge = data[:sof + 5] + struct.pack(">HH", 20000, 20000) + data[sof + 9:]
    marked = tmp_path / "marked.jpg"
    for content, outcome in ((data, (3, 8, 4)), (huge, "20000×20000 pixels: more than any image")):
        marked.write_bytes(content[:2] + b"\xff\x01" + content[2:])  # TEM: libjpeg skips it, Pillow refuses
        if isinstance(outcome, str):
            with pytest.raises(DataError, match=outcome):
                read_image(marked)
        else:
            assert tuple(read_image(marked).shape) == outcome
    # ... and a walk over the markers was led past the real frame header by a stuffed FF 00 that libjpeg
    # skips, to a small decoy after EOI (review of that fix): every frame header counts
    sof_len = struct.unpack(">H", data[sof + 2:sof + 4])[0]
    region = huge[2:sof] + b"\xff\x01" + huge[sof:] + b"\x00" * 8
    decoy = data[:2] + b"\xff\x00" + struct.pack(">H", len(region) + 2) + region + data[sof:sof + 2 + sof_len] + b"\xff\xd9"
    (tmp_path / "decoy.jpg").write_bytes(decoy)
    with pytest.raises(DataError, match="20000×20000 pixels: more than any image"):
        read_image(tmp_path / "decoy.jpg")
    # ... and Pillow, its JPEG reader refusing, tried its others: its PCD reader (b"PCD_" at offset 2048,
    # here in a comment) reported 768×512 for that JPEG (review of that fix): only the decoder's format
    comment = b"\x00" * (2048 - 8) + b"PCD_" + b"\x00" * 1600
    pcd = b"\xff\xd8\xff\x01" + b"\xff\xfe" + struct.pack(">H", len(comment) + 2) + comment + huge[2:]
    (tmp_path / "pcd.jpg").write_bytes(pcd)
    with pytest.raises(DataError, match="20000×20000 pixels: more than any image"):
        read_image(tmp_path / "pcd.jpg")
    (tmp_path / "junk.jpg").write_bytes(b"not an image at all, of any format")
    with pytest.raises(DataError, match="not a JPEG, PNG, GIF or WebP"):
        read_image(tmp_path / "junk.jpg")
    camera = tmp_path / "camera.jpg"  # a JPEG with its preview: MPO of two frames to Pillow, one picture
    Image.new("RGB", (4, 8), (1, 2, 3)).save(camera, format="MPO", save_all=True,
                                              append_images=[Image.new("RGB", (2, 4), (9, 8, 7))])
    assert tuple(read_image(camera).shape) == (3, 8, 4)
    frames = tmp_path / "frames.jpg"
    Image.new("RGB", (4, 8), (1, 2, 3)).save(frames, format="GIF", save_all=True,
                                              append_images=[Image.new("RGB", (4, 8), (9, 8, 7))])
    with pytest.raises(DataError, match="2 frames: an image of a ReID set is one picture"):
        read_image(frames)
    deep = tmp_path / "grey16.png"
    Image.fromarray(np.full((8, 4), 0x1234, np.uint16)).save(deep)
    assert read_image(deep).dtype == torch.uint8 and read_image(deep)[:, 0, 0].tolist() == [0x12] * 3


def test_a_split_file_that_is_not_a_file_or_json_or_whose_parts_overlap_is_refused(tmp_path, layouts):
    """Before: a FIFO hung the reader, JSON nested 200,000 deep or a 5,000-digit number raised a
    traceback, and a hand-edited split listing a test image twice scored rank-1 100 % without a word."""
    import json

    root = layouts.viper(tmp_path / "viper", ids=8)
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    with pytest.raises(DataError, match="not a regular file"):
        load_dataset(root, "viper", split_path=fifo)
    for text in ('{"version": 2, "datasets": ' + "[" * 200_000 + "]" * 200_000 + "}",
                 '{"version": 2, "datasets": {"v": ' + "9" * 5000 + "}}"):
        (tmp_path / "bad.json").write_text(text)
        with pytest.raises(DataError, match="split file is not valid JSON"):
            load_dataset(root, "viper", split_path=tmp_path / "bad.json")
    split_file = tmp_path / "splits.json"
    load_dataset(root, "viper", split_path=split_file)
    good = json.loads(split_file.read_text())
    for edit, reason in ((lambda s: s["gallery"].append(s["query"][0]), "twice"),
                         (lambda s: s["train"].append(s["query"][0]), "twice"),
                         (lambda s: s["query"].append(s["train"].pop()), "in the training part and in the test part")):
        doc = json.loads(json.dumps(good))
        edit(next(iter(doc["datasets"].values()))["splits"]["0"])
        split_file.write_text(json.dumps(doc))
        with pytest.raises(DataError, match=reason):
            load_dataset(root, "viper", split_path=split_file)


def test_a_synthetic_root_names_only_folders_inside_it_and_its_output_is_no_link(tmp_path):
    """Before: a manifest naming domain '../escaped' was read from outside the data root and trained
    on; one nested 100,000 deep raised RecursionError; OUT a link raised NotADirectoryError after
    every image had been made."""
    import json

    from secfed.data.synth import SynthManifest, generate

    root = tmp_path / "synth"
    generate(root, domains=1, seed=0, scale=0.05, height=32, width=16)
    manifest = json.loads((root / "manifest.json").read_text())
    manifest["domains"][0]["name"] = "../escaped"
    (root / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(DataError, match="'../escaped' is not a folder name"):
        SynthManifest.load(root)
    manifest["domains"][0]["name"] = 5  # a number passed str(name), then `root / 5` raised TypeError
    (root / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(DataError, match="5 is not a folder name"):
        SynthManifest.load(root)
    (root / "manifest.json").write_text('{"version": ' + "[" * 100_000 + "]" * 100_000 + "}")
    with pytest.raises(DataError, match="malformed manifest .RecursionError"):
        SynthManifest.load(root)
    manifest["domains"][0]["name"] = "campus"  # (review: an unknown public format was a traceback in inspect)
    manifest["public"] = {"folder": "public", "format": "nope", "cameras": [], "pids": [0, 0], "ids": 0, "images": 0}
    (root / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(DataError, match="format 'nope' is not one secfed reads"):
        SynthManifest.load(root)
    (tmp_path / "empty").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "empty", target_is_directory=True)
    with pytest.raises(FileExistsError, match="is a symbolic link"):
        generate(tmp_path / "link", domains=1, seed=0, scale=0.05, height=32, width=16)


def test_a_public_set_lists_regular_files_named_in_utf8(tmp_path, layouts):
    """(review of the fixes: the public set of distillation skipped every check — a FIFO named *.jpg
    hung `train --kd`, a name that is not UTF-8 stopped its fingerprint with a traceback)"""
    from secfed.config import ConfigError
    from secfed.federation.builder import _list_images, public_fingerprint

    public = tmp_path / "public"
    for i in range(3):
        layouts.image(public / f"{i:04d}.jpg")
    os.mkfifo(public / "zz_fifo.jpg")
    (public / "dir.jpg").mkdir()
    images = _list_images(public)
    assert [p.name for p in images] == ["0000.jpg", "0001.jpg", "0002.jpg"] and len(public_fingerprint(images)) == 64
    shutil.copy(images[0], public / os.fsdecode(b"\xff.jpg"))
    with pytest.raises(ConfigError, match=r"\\xff.jpg: the file name is not valid UTF-8"):
        _list_images(public)


def test_a_dataset_folder_linked_from_another_disk_fingerprints_as_listed(tmp_path, layouts):
    """(review: the fingerprint named a linked folder by its target's absolute path, so two nodes holding
    the same data were told they read different data; runs recorded before keep their spelling)"""
    from secfed.federation.builder import fingerprint

    plain, linked = tmp_path / "plain", tmp_path / "linked"
    layouts.market(plain / "m")
    layouts.market(tmp_path / "elsewhere" / "m")
    linked.mkdir()
    (linked / "m").symlink_to(tmp_path / "elsewhere" / "m", target_is_directory=True)
    (ours, ours_resolved), (theirs, theirs_resolved) = (
        fingerprint([load_dataset(root / "m", "market1501", name="m")], root) for root in (plain, linked))
    assert ours == theirs == ours_resolved != theirs_resolved


def test_names_are_shown_escaped_where_they_could_forge_a_line_or_pass_for_another():
    """(reviews: a folder name cleared the screen and forged a line in a configuration error; invisible
    characters let two names look alike; then no-break spaces and Persian's joiner were escaped too)"""
    from secfed.config import ConfigError
    from secfed.errors import printable

    assert printable("a\nb\x1b[2J") == "a\\nb\\x1b[2J" and printable(os.fsdecode(b"x\xff")) == "x\\xff"
    assert printable("داده\u200cها") == "داده\u200cها" and printable("ali\u200cce") == "ali\\u200cce"
    assert printable("Market\xa01501 café") == "Market\xa01501 café" and printable("a\u202eb") == "a\\u202eb"
    assert printable("a\u034fb\U000E0041\ufeff") == "a\\u034fb\\U000e0041\\ufeff"
    for kept in ("क्\u200dष", "ന്\u200d", "مَ\u200cها"):  # after a sign, not a letter (review of the fix)
        assert printable(kept) == kept
    assert printable("да\u200cнные") == "да\\u200cнные" and printable("a\u2800b") == "a\\u2800b"
    rendered = ConfigError("data.scenario\x1b", "got Market-1501\x1b[2J\nfake line").render()
    assert "\n" not in rendered and "\x1b" not in rendered and "\\x1b[2J\\nfake line" in rendered


def test_fedreidbench_person_folders_are_ascii_digits_and_cameras_count_from_one(tmp_path, layouts):
    """(review: person folders "+3" and "٤" were read by int() as people 3 and 4 and merged with them;
    a c0 camera read as −1, the unlabelled marker; a person folder linked to itself was an ELOOP traceback)"""
    for odd, why in (("+3", "not a person id"), ("\u0664", "not a person id"), ("1_0", "not a person id")):
        base = tmp_path / f"set{len(why)}{odd.encode().hex()}" / "pytorch"
        layouts.image(base / "train_all" / "3" / "cam_0_00003_00000.png")
        layouts.image(base / "train_all" / odd / "cam_0_00003_00001.png")
        layouts.image(base / "query" / "0" / "cam_0_00000_00000.png")
        layouts.image(base / "gallery" / "0" / "cam_1_00000_00000.png")
        with pytest.raises(DataError) as err:
            load_dataset(base.parent, "fedreidbench")
        assert err.value.path.name == odd and why in err.value.reason
    base = tmp_path / "c0" / "pytorch"
    layouts.image(base / "train_all" / "3" / "0003_c0s1_000151_01.jpg")
    layouts.image(base / "query" / "0" / "0000_c1s1_000151_01.jpg")
    layouts.image(base / "gallery" / "0" / "0000_c2s1_000151_01.jpg")
    with pytest.raises(DataError, match="numbered from 1"):
        load_dataset(base.parent, "fedreidbench")
    (base / "train_all" / "3" / "0003_c0s1_000151_01.jpg").rename(base / "train_all" / "3" / "0003_c1s1_000151_01.jpg")
    (base / "train_all" / "0003").mkdir()  # (review of the fix: "2" and "0002" merged into one person)
    layouts.image(base / "train_all" / "0003" / "0003_c1s1_000152_01.jpg")
    with pytest.raises(DataError, match="person 3 again"):
        load_dataset(base.parent, "fedreidbench")
    shutil.rmtree(base / "train_all" / "0003")
    (base / "train_all" / "7").symlink_to("7")
    with pytest.raises(DataError) as err:
        load_dataset(base.parent, "fedreidbench")
    assert err.value.path.name == "7" and "cannot be read" in err.value.reason


def test_what_a_set_ships_is_checked_like_a_split_file(tmp_path, layouts):
    """(found by review) A Market train folder holding a test person, a doubled MSMT17 list line and a
    list line reading outside ROOT were accepted without a word; a split file is refused for each."""
    market = layouts.market(tmp_path / "market", ids=(2, 3))  # 3 is also a test identity
    with pytest.raises(DataError, match=r"identities \[3\] are in the training part and in the test part"):
        load_dataset(market, "market1501")
    msmt = layouts.msmt17(tmp_path / "MSMT17_V1")
    gallery = (msmt / "list_gallery.txt").read_text()
    (msmt / "list_gallery.txt").write_text(gallery + gallery)
    with pytest.raises(DataError, match="is listed twice"):
        load_dataset(msmt, "msmt17")
    (msmt / "list_gallery.txt").write_text(gallery + f"../train/{gallery.split()[0]} 0\n")
    with pytest.raises(DataError, match=r"line \d+ .*must lie inside test/, without '\.\.'"):
        load_dataset(msmt, "msmt17")


def test_a_split_file_is_never_written_into_a_dataset_folder(tmp_path, layouts):
    """(found by review) --split-file inside VIPeR/cam_a was written there, then listed as a picture;
    `data inspect --split-file` wrote into ROOT. (Review of the fix: a run's own RUN/splits.json under an
    --out inside the data root was refused too, naming a flag nobody gave: it stands.)"""
    from click.testing import CliRunner

    from secfed.cli.main import cli
    from secfed.config import ConfigError, from_dict
    from secfed.federation.builder import resolve_data

    root = layouts.viper(tmp_path / "data" / "viper")
    inside = root / "VIPeR" / "cam_a" / "000_split.bmp"
    cfg = from_dict({"data": {"root": str(tmp_path / "data"), "split_file": str(inside)}})
    with pytest.raises(ConfigError, match="is inside the dataset folder") as err:
        resolve_data(cfg, split_path=inside)
    assert err.value.key == "data.split_file"
    result = CliRunner().invoke(cli, ["data", "inspect", str(root), "--split-file", str(root / "splits.json")])
    assert result.exit_code == 2 and "--split-file" in result.output and "inside ROOT" in result.output
    assert not inside.exists() and not (root / "splits.json").exists()
    cfg.data.split_file = None  # a run's own file, wherever its --out puts it
    (root / "runs" / "x").mkdir(parents=True)
    assert resolve_data(cfg, split_path=root / "runs" / "x" / "splits.json").trained[0].name == "viper"


def test_a_bmp_is_bounded_by_its_header_before_it_is_decoded(tmp_path):
    """(found by review) Pillow only warns below twice its bound: a 218-byte RLE8 BMP of 9500×9500
    (its rows skipped by delta codes) decoded to 1.6 GB."""
    import struct

    from secfed.data.images import read_image

    palette, data = b"\0\0\0\0\xff\xff\xff\0", b"\x00\x02\x00\xff" * 38 + b"\x00\x01"  # 255 rows a jump
    info = struct.pack("<IiiHHIIiiII", 40, 9500, 9500, 1, 8, 1, len(data), 2835, 2835, 2, 0)
    offset = 14 + len(info) + len(palette)
    bomb = tmp_path / "0001_c1s1_000001_01.bmp"
    bomb.write_bytes(b"BM" + struct.pack("<IHHI", offset + len(data), 0, 0, offset) + info + palette + data)
    with pytest.raises(DataError, match="9500×9500 pixels: more than any image"):
        read_image(bomb)


def test_a_folder_that_cannot_be_listed_is_named(tmp_path, layouts, monkeypatch):
    """(found by review) An unreadable query/ stopped `data inspect` and `train` with a PermissionError
    traceback (tests run as root, whom chmod does not stop: the listing's refusal stands in)."""
    from secfed.data import listing

    root = layouts.market(tmp_path / "market")
    scandir = os.scandir

    def refuse(folder):
        if Path(folder).name == "query":
            raise PermissionError(13, "Permission denied", str(folder))
        return scandir(folder)

    monkeypatch.setattr(listing.os, "scandir", refuse)
    with pytest.raises(DataError, match="cannot be listed .Permission denied.") as err:
        load_dataset(root, "market1501")
    assert err.value.path == root / "query"


def test_a_public_set_is_read_alike_by_inspect_and_distillation_and_is_no_domain(tmp_path, layouts):
    """(found by review) `data inspect --format unlabeled` read the top folder (4 images) while
    distillation read every sub-folder (8); a cuhk02 or unlabeled folder under --data-root was trained
    as a domain, then the first evaluation stopped with a traceback."""
    from cli.data_inspect import summarize
    from secfed.config import ConfigError
    from secfed.federation.builder import _entries_under, _list_images

    public = tmp_path / "root" / "unlabeled"
    for rel in ("a.jpg", "b.jpg", "sub/c.jpg", ".hidden/d.jpg"):
        layouts.image(public / rel)
    listed = load_dataset(public, "unlabeled")
    assert [s.path for s in listed.train] == _list_images(public) and len(listed.train) == 4
    assert summarize(listed, "unlabeled")["train"] == {"ids": 0, "images": 4, "cameras": 0}
    layouts.market(tmp_path / "root" / "market1501")
    cuhk02 = layouts.cuhk02(tmp_path / "root" / "cuhk02")
    assert "not_in_layout" not in load_dataset(cuhk02, "cuhk02").skipped
    base = next(cuhk02.rglob("P1")).parent
    for extra in ("P6", "P1/cam3"):  # dropped without a count before (found by review)
        layouts.image(base / extra / "001_1.png")
    (base / "loop").symlink_to(base / "loop")  # a stray link loop stops nothing (review of the fix)
    assert load_dataset(cuhk02, "cuhk02").skipped["not_in_layout"] == 3
    assert _entries_under(tmp_path / "root", [], "data.datasets") == [("market1501", "market1501")]
    for named in ("cuhk02", "unlabeled"):
        with pytest.raises(ConfigError, match=f"public set with no query or gallery.*--kd-public .*{named}"):
            _entries_under(tmp_path / "root", [named], "data.datasets")
