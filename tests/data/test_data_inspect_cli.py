"""``secfed data inspect``: counts as a table or one JSON object; errors name the path or flag."""

from __future__ import annotations

import json
import shutil

import pytest
from click.testing import CliRunner

from secfed.cli.data_inspect import inspect_command
from secfed.cli.data_synth import synth_command
from secfed.data.registry import load_dataset
from secfed.data.synth import SynthManifest


def _run(*args):
    return CliRunner().invoke(inspect_command, [str(a) for a in args])


def test_json_counts(tmp_path, layouts):
    root = layouts.market(tmp_path / "Market-1501-v15.09.15")
    result = _run(root, "--json")  # format guessed from the folder name
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["format"] == "market1501"
    assert summary["train"] == {"ids": 3, "images": 6, "cameras": 2}
    assert summary["query"] == {"ids": 2, "images": 2, "cameras": 1, "unmatched": 0}
    assert summary["gallery"] == {"ids": 3, "images": 4, "cameras": 3}  # 2 ids + distractor id 0
    assert summary["skipped"] == {"junk": 1, "not_image": 1}
    assert "split" not in summary
    assert "queries scored" not in _run(root).stdout


def test_queries_no_gallery_image_matches_are_counted_and_said(tmp_path, layouts):
    """(found by review: a query without a match in the gallery is left out of CMC and mAP, as the
    standard protocol has it, and nothing said so — not inspect, not data.json)"""
    root = layouts.market(tmp_path / "m")
    layouts.image(root / "query" / "0011_c1s1_000451_01.jpg")  # nobody 11 in the gallery
    layouts.image(root / "query" / "0003_c2s1_000451_01.jpg")  # 3's gallery image is from camera 2 too
    summary = json.loads(_run(root, "--format", "market1501", "--json").stdout)
    assert summary["query"]["images"] == 4 and summary["query"]["unmatched"] == 2
    assert "queries scored: 2 of 4 (2 have no gallery image of the same person from another camera" in \
        _run(root, "--format", "market1501").stdout
    from secfed.federation.builder import _describe

    assert _describe(load_dataset(root, "market1501"))["query_unmatched"] == 2


def test_table_output_draws_the_split_in_memory(tmp_path, layouts):
    root = layouts.viper(tmp_path / "data", ids=6)
    result = _run(root, "--format", "viper", "--seed", "4")
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert any(line.split()[:3] == ["│", "train", "│"] and "6" in line for line in lines)
    assert "split: seed 4, drawn in memory" in result.stdout
    assert sorted(p.name for p in tmp_path.rglob("*.json")) == []  # nothing written, in ROOT or beside it


def test_seeded_json_records_split_file(tmp_path, layouts):
    root = layouts.cuhk01(tmp_path / "cuhk01", ids=6)
    split_file = tmp_path / "elsewhere.json"
    summary = json.loads(_run(root, "--json", "--split-file", split_file).stdout)
    assert summary["split"] == {"seed": 0, "file": str(split_file)}
    assert summary["train"]["images"] == 12
    assert json.loads(split_file.read_text())["datasets"]["cuhk01"]["splits"]["0"]["seed"] == 0
    assert not (root / "splits.json").exists()
    again = json.loads(_run(root, "--json", "--split-file", split_file).stdout)  # read back
    assert again["train"] == summary["train"]
    assert json.loads(_run(root, "--json").stdout)["split"] == {"seed": 0, "file": None}


def test_bad_data_is_a_click_error_naming_the_file(tmp_path, layouts):
    root = layouts.market(tmp_path / "market1501")
    layouts.image(root / "query" / "0000_c1s1_000001_01.jpg")
    result = _run(root, "--json")
    assert result.exit_code == 1
    assert "0000_c1s1_000001_01.jpg" in result.output and "distractor" in result.output
    assert result.stdout == ""


def test_missing_root_unknown_format_and_unguessable_name(tmp_path, layouts):
    result = _run(tmp_path / "nowhere", "--format", "market1501")
    assert result.exit_code == 2 and "nowhere" in result.output
    result = _run(tmp_path, "--format", "market")
    assert result.exit_code == 2 and "--format" in result.output and "market1501" in result.output
    (tmp_path / "photos").mkdir()
    result = _run(tmp_path / "photos")
    assert result.exit_code == 2 and "pass --format" in result.output


def test_seed_flag_on_a_set_with_an_official_split_is_refused(tmp_path, layouts):
    root = layouts.market(tmp_path / "market1501")
    result = _run(root, "--seed", "3")
    assert result.exit_code == 2 and "--seed: market1501 ships its own split" in result.output
    assert _run(root, "--seed", "0", "--format", "viper").exit_code == 1  # seeded format, wrong layout


def test_verify_decodes_every_image_and_names_the_bad_ones(tmp_path, layouts):
    root = layouts.market(tmp_path / "market1501")
    summary = json.loads(_run(root, "--json", "--verify").stdout)
    assert summary["verified_images"] == 12
    bad = root / "bounding_box_train" / "0002_c1s1_000151_01.jpg"
    bad.write_bytes(bad.read_bytes()[:-40])
    result = _run(root, "--verify")
    assert result.exit_code == 1
    assert "1 of 12 images cannot be decoded" in result.output and str(bad) in result.output


# --- a root written by `secfed data synth` ---------------------------------------------------------


@pytest.fixture(scope="module")
def synth_out(tmp_path_factory):
    """What `secfed data synth OUT --json` wrote and printed: two client domains, one unseen, a public set."""
    out = tmp_path_factory.mktemp("synth") / "out"
    result = CliRunner().invoke(synth_command, [str(out), "--domains", "2", "--unseen", "1", "--public", "12",
                                                "--scale", "0.1", "--height", "32", "--width", "16", "--json"])
    assert result.exit_code == 0, result.output
    return out, json.loads(result.stdout)


def test_inspect_reads_a_synthetic_root_without_format_and_agrees_with_synth(synth_out):
    out, printed = synth_out
    result = _run(out, "--json")
    assert result.exit_code == 0, result.output
    inspected = json.loads(result.stdout)
    assert inspected["format"] == "synthetic" and inspected["root"] == str(out)
    assert inspected["domains"] == printed["domains"]  # same names, roles and counts as synth printed
    manifest = SynthManifest.load(out)
    rows = {row["name"]: row for row in inspected["domains"]}
    assert [(row["name"], row["role"]) for row in inspected["domains"]] == [
        ("campus", "client"), ("plaza", "client"), ("corridor", "unseen"), ("public", "public")]
    for domain in (*manifest.domains, *manifest.unseen):  # and as the manifest recorded them
        row = rows[domain.name]
        assert row["cameras"] == len(domain.cameras)
        for key in ("train_ids", "train_images", "test_ids", "query_images", "distractors", "junk"):
            assert row[key] == getattr(domain, key), (domain.name, key)
        assert row["gallery_images"] == domain.gallery_images - domain.junk  # what the loaders read
    assert rows["public"]["train_images"] == manifest.public.images == 12
    # Counted from the files, by the loaders training uses.
    campus = load_dataset(out / "campus", "market1501")
    assert rows["campus"]["train_images"] == len(campus.train) and rows["campus"]["query_images"] == len(campus.query)


def test_inspect_table_of_a_synthetic_root_lists_every_folder(synth_out):
    out, _ = synth_out
    result = CliRunner().invoke(inspect_command, [str(out)], terminal_width=80)
    assert result.exit_code == 0, result.output
    for name, role in (("campus", "client"), ("plaza", "client"), ("corridor", "unseen"), ("public", "public")):
        assert any(line.split()[:2] == [name, role] for line in result.stdout.splitlines()), name
    assert "…" not in result.stdout  # nothing cut at 80 columns


def test_inspect_finds_a_domain_folder_format_from_the_manifest(synth_out):
    out, printed = synth_out
    campus = json.loads(_run(out / "campus", "--json").stdout)
    assert campus["format"] == "market1501" and campus["train"]["images"] == printed["domains"][0]["train_images"]
    # one domain inspected alone counts its gallery as synth and the root's inspection do (junk apart)
    assert campus["gallery"]["images"] == printed["domains"][0]["gallery_images"]
    public = json.loads(_run(out / "public", "--json").stdout)
    assert public["format"] == "unlabeled" and public["train"]["images"] == 12


def test_inspect_refuses_a_synthetic_root_changed_since_synth(tmp_path, synth_out):
    out, _ = synth_out
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    next((copy / "plaza" / "bounding_box_train").iterdir()).unlink()
    result = _run(copy, "--json")
    assert result.exit_code == 1 and result.stdout == ""
    assert str(copy / "plaza") in result.output and "train_images" in result.output
    assert _run(copy, "--seed", "2").exit_code == 2  # no drawn split in a synthetic root


def test_synth_and_inspect_say_the_same_image_counts_each_labelled(tmp_path):
    """`data synth` counts the files it wrote, junk included; `inspect --verify` decodes what the loaders
    read. Both print one sentence with both numbers, so neither total reads as the other's."""
    out = tmp_path / "out"
    wrote = CliRunner().invoke(synth_command, [str(out), "--domains", "2", "--scale", "0.1", "--height", "32",
                                               "--width", "16"], terminal_width=200)
    assert wrote.exit_code == 0, wrote.output
    manifest = SynthManifest.load(out)
    junk = sum(d.junk for d in manifest.domains)
    on_disk = sum(1 for p in out.rglob("*.jpg"))
    assert junk > 0  # the case where the two counts differ
    sentence = f"{on_disk:,} image files: {on_disk - junk:,} read by the loaders, {junk:,} junk they skip"
    assert f"wrote {sentence}" in wrote.stdout
    inspected = CliRunner().invoke(inspect_command, [str(out), "--verify"], terminal_width=200)
    assert inspected.exit_code == 0, inspected.output
    assert f"holds {sentence}" in inspected.stdout
    assert f"verified: all {on_disk - junk:,} images read by the loaders decode" in inspected.stdout
