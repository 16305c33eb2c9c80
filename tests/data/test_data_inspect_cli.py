"""``secfed data inspect``: counts as a table or one JSON object; errors name the path or flag."""

from __future__ import annotations

import json

from click.testing import CliRunner

from secfed.cli.data_inspect import inspect_command


def _run(*args):
    return CliRunner().invoke(inspect_command, [str(a) for a in args])


def test_json_counts(tmp_path, layouts):
    root = layouts.market(tmp_path / "Market-1501-v15.09.15")
    result = _run(root, "--json")  # format guessed from the folder name
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["format"] == "market1501"
    assert summary["train"] == {"ids": 3, "images": 6, "cameras": 2}
    assert summary["query"] == {"ids": 2, "images": 2, "cameras": 1}
    assert summary["gallery"] == {"ids": 3, "images": 4, "cameras": 3}  # 2 ids + distractor id 0
    assert summary["skipped"] == {"junk": 1, "not_image": 1}
    assert "split" not in summary


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
