"""bench/check_claims.py: a second machine's runs tested against the published distribution, on
constructed runs (the training is bench-only)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"


@pytest.fixture(scope="module")
def check():  # noqa: ANN201 - a module loaded from bench/
    sys.path.insert(0, str(BENCH))
    for name in ("claims", "check_claims"):
        if name not in sys.modules:
            spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
            module = importlib.util.module_from_spec(spec)
            sys.modules[name] = module  # dataclasses look their module up by name
            spec.loader.exec_module(module)
    return sys.modules["check_claims"]


def run(arm: str, seed: int, rank1: float, unseen_map: float, scale: float = 1.0) -> dict:
    return {"arm": arm, "seed": seed, "rounds": 16, "lr_scale": scale, "seconds": 60.0,
            "domains": [{"name": "a", "rank1": rank1, "train_images": 10, "local_rank1": rank1 - 0.01}],
            "unseen": [{"name": "u", "mAP": unseen_map, "rank1": unseen_map}]}


PUBLISHED = [run("fedpav", s, 0.30 + 0.01 * (s % 3), 0.40 + 0.01 * (s % 4)) for s in range(10)] + \
    [run("fedpav+cdw", s, 0.32 + 0.01 * (s % 3), 0.41) for s in range(10)] + \
    [run("fedpav", 99, 0.9, 0.9, scale=2.0)]  # a grid run: never part of the published distribution


def test_the_prediction_interval_widens_with_fewer_runs_and_a_wider_spread(check) -> None:
    values = [1.0, 2.0, 3.0, 2.0, 2.5]
    mean, lo1, hi1 = check.prediction(values, 1, 0.05)
    _, lo10, hi10 = check.prediction(values, 10, 0.05)
    assert mean == pytest.approx(2.1) and lo1 < lo10 < mean < hi10 < hi1
    # t(0.975, 4) · s · sqrt(1/5 + 1/1), s = 0.742
    assert hi1 - mean == pytest.approx(2.776 * 0.7416 * (1.2 ** 0.5), rel=1e-3)
    _, lo_strict, hi_strict = check.prediction(values, 1, 0.005)
    assert lo_strict < lo1 and hi_strict > hi1


def test_runs_from_the_published_distribution_are_within_and_a_shifted_machine_is_not(check) -> None:
    factors = check.published_factors(PUBLISHED, ["fedpav", "fedpav+cdw"])
    assert factors == {"fedpav": 1.0, "fedpav+cdw": 1.0}  # from scratch: the table at the defaults
    published = check.at_factors(PUBLISHED, factors, 16)
    assert len(published) == 20  # the ×2 grid run is left out
    same = [run("fedpav", s, 0.31, 0.415) for s in range(3)] + [run("fedpav+cdw", s, 0.33, 0.41) for s in range(3)]
    compared = check.comparisons(published, same, ["fedpav", "fedpav+cdw"])
    names = [c[0] for c in compared]
    assert names[:2] == ["fedpav: seen rank-1", "fedpav: unseen mAP"]
    assert "MM'20 Fig. 6: d (rank-1 points)" in names and "MM'20 Table 3: d (rank-1 points)" in names
    assert not any("Fig. 7" in n for n in names)  # fedpav+kd did not run here
    text, outside = check.report(compared, published, same, "cmd")
    assert outside == 0 and f"**{len(compared)} of {len(compared)} published numbers reproduced**" in text
    # a machine whose FedPav lands 5 rank-1 points low fails its rows, named
    shifted = [run("fedpav", s, 0.26, 0.415) for s in range(3)] + same[3:]
    text, outside = check.report(check.comparisons(published, shifted, ["fedpav", "fedpav+cdw"]), published,
                                 shifted, "cmd")
    assert outside >= 2  # FedPav's seen rank-1 and CDW's paired gain over it
    assert "| fedpav: seen rank-1 | 10, 30.90 (0.88) |" in text and "**OUTSIDE**" in text


def test_a_pretrained_start_is_compared_with_its_own_runs(check) -> None:
    published = [{**r, "arm": r["arm"] + "@synthetic"} for r in PUBLISHED if r["lr_scale"] == 1.0] + PUBLISHED[:10]
    mine = [run("fedpav@synthetic", 0, 0.31, 0.41)]
    compared = check.comparisons(check.at_factors(published, {"fedpav@synthetic": 1.0}, 16), mine, ["fedpav@synthetic"])
    assert [c[0] for c in compared] == ["fedpav@synthetic: seen rank-1", "fedpav@synthetic: unseen mAP",
                                        "MM'20 Fig. 6 from synthetic: d (rank-1 points)"]
    assert all(len(theirs) == 10 for _, theirs, _ in compared)  # the from-scratch runs are not mixed in


def test_a_started_arm_is_checked_at_the_factor_its_published_claims_are_decided_from(check) -> None:
    def grid(arm: str, scale: float, v: float) -> dict:
        return {**run(arm, check.claims.GRID_SEED, v, v, scale), "validation": True, "domains": [{"mAP": v}]}

    arms = ["fedpav@synthetic", "fedreid@synthetic"]
    tuning = [grid("fedreid@synthetic", f, v) for f, v in ((0.5, 0.8), (1.0, 0.7), (2.0, 0.6))]
    tuning += [grid("fedpav@synthetic", f, v) for f, v in ((0.5, 0.6), (1.0, 0.7), (2.0, 0.6))]
    at_one = [run(a, s, 0.40, 0.50) for s in range(10) for a in arms]
    halved = [run("fedreid@synthetic", s, 0.38 + 0.001 * s, 0.52, 0.5) for s in range(10)]
    published = tuning + at_one + halved
    factors = check.published_factors(published, arms)
    assert factors == {"fedpav@synthetic": 1.0, "fedreid@synthetic": 0.5}  # what the grid chose, ten seeds in
    assert check.published_factors(published, arms, at_defaults=True) == dict.fromkeys(arms, 1.0)
    assert check.published_factors(tuning + at_one + halved[:9], arms)["fedreid@synthetic"] == 1.0  # nine: factor 1
    chosen = check.at_factors(published, factors, 16)
    assert sorted({(r["arm"], r["lr_scale"]) for r in chosen}) == [("fedpav@synthetic", 1.0), ("fedreid@synthetic", 0.5)]
    assert len(chosen) == 20  # neither the grid's runs nor fedreid's factor-1 seeds
    mine = [run("fedpav@synthetic", 0, 0.40, 0.50), run("fedreid@synthetic", 0, 0.385, 0.60, 0.5)]
    compared = check.comparisons(chosen, mine, arms)
    names = [c[0] for c in compared]
    assert "fedreid@synthetic ×0.5: seen rank-1" in names and "fedpav@synthetic: unseen mAP" in names
    fig4 = next(c for c in compared if c[0].startswith("AAAI'21 vs FedPav"))
    assert fig4[1] == pytest.approx([2.0] * 10) and fig4[2] == pytest.approx([10.0])  # the ×0.5 runs, paired


def test_the_command_compares_what_it_finds_and_refuses_what_it_cannot(check, tmp_path: Path, capsys) -> None:
    published = tmp_path / "published" / "runs.jsonl"
    published.parent.mkdir()
    old_kd = [run("fedpav+kd", s, 0.2, 0.3) for s in range(10)]  # no KD revision: before 655c22e
    published.write_text("".join(json.dumps(r) + "\n" for r in [*PUBLISHED, *old_kd]))
    out = tmp_path / "check"
    out.mkdir()
    (out / "runs.jsonl").write_text("".join(json.dumps(run("fedpav", s, 0.31, 0.415)) + "\n" for s in range(4)))
    args = ["fedpav", "--seeds", "3", "--published", str(published), "--out", str(out), "--report"]
    assert check.main(args) == 0
    written = (out / "check.md").read_text()
    assert "| fedpav: seen rank-1 | 10, 30.90 (0.88) |" in written and "| 3, 31.00 |" in written  # seeds 0–2 only
    assert "; `?`." in written  # no record of the command that made the runs: not the re-print's own
    assert "the ranges are ±" in written and "a shift smaller than that passes unseen" in written  # its power (review)
    (out / "command.txt").write_text("python bench/check_claims.py fedpav --seeds 3 --threads 2\n")
    assert check.main(args) == 0
    assert "; `python bench/check_claims.py fedpav --seeds 3 --threads 2`." in (out / "check.md").read_text()
    # a folder of two machines' runs is not one machine's check (found by review: another machine's runs
    # were reported as this machine's)
    amd = {"cpu": {"model": "AMD EPYC", "logical_cores": 2}, "torch": "2.13.0", "torch_threads": 2}
    with (out / "runs.jsonl").open("a") as f:
        f.write(json.dumps({**run("fedpav", 0, 0.31, 0.415), "environment": amd}) + "\n")
    with pytest.raises(SystemExit) as stopped:
        check.main(args)
    assert stopped.value.code == 2 and "holds runs of 2 machines" in capsys.readouterr().err
    published_args = ["--published", str(published)]
    for bad, named in ((["nope", *published_args, "--out", str(out)], "nope"),
                       (["fedpav+kd", *published_args, "--out", str(out)], "fedpav+kd: --published"),  # old KD only
                       (["fedpav", *published_args, "--out", str(published.parent)], "--out"),
                       (["fedpav", "--published", str(tmp_path / "missing"), "--out", str(out)], "--published")):
        with pytest.raises(SystemExit) as stopped:
            check.main([*bad, "--report"])
        assert stopped.value.code == 2 and named in capsys.readouterr().err


def test_the_check_says_whether_this_machine_started_from_the_published_bytes(check) -> None:
    def started(arm: str, data: str, backbone: str | None) -> dict:
        return {**run(arm, 0, 0.3, 0.4), "inputs": {"data_fingerprint": data, "backbone_sha256": backbone}}

    published = [started("fedpav", "d1", None), started("fedpav@synthetic", "d1", "b1"),
                 started("fedreid@synthetic", "d1", "b1"), run("fedreid", 0, 0.3, 0.4),
                 started("fedpav+cdw", "d1", None)]
    mine = [started("fedpav", "d1", None), started("fedpav@synthetic", "d1", "b2"),
            started("fedreid@synthetic", "d2", "b1"), started("fedreid", "d1", None), run("fedpav+cdw", 0, 0.3, 0.4)]
    said = check.same_inputs(published, mine, ["fedpav", "fedpav@synthetic", "fedreid@synthetic", "fedreid",
                                               "fedpav+cdw"])
    assert "fedpav: the same data and initial backbone bytes" in said
    assert "fedpav@synthetic: **other initial backbone bytes**" in said
    assert "fedreid@synthetic: **other data bytes**" in said
    assert "fedreid: cannot tell (the published runs predate" in said
    assert "fedpav+cdw: cannot tell (this machine's runs predate" in said
