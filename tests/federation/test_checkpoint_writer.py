"""The background checkpoint writer: what it writes is the state at save(), errors reach the
caller, and leaving its block (normally or by an exception) leaves the checkpoint on disk."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import torch

from secfed.federation import checkpoint as ckpt


def test_the_checkpoint_holds_the_state_at_save_not_what_the_run_did_next(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    trained_on = threading.Event()
    write = ckpt.save_checkpoint

    def late_write(*args: object) -> object:  # the write starts only after the next round changed the models
        assert trained_on.wait(10)
        return write(*args)

    monkeypatch.setattr(ckpt, "save_checkpoint", late_write)
    weights = torch.zeros(1000)
    nested = {"site": {"w": torch.ones(3)}, "history": "[]"}
    with ckpt.BackgroundWriter() as writer:
        writer.save(tmp_path, 1, {"global": weights, "clients": nested})
        weights.add_(5)  # the next round trains on in place
        nested["site"]["w"].mul_(7)
        trained_on.set()
    state = ckpt.load_checkpoint(ckpt.latest_checkpoint(tmp_path))
    assert torch.equal(state["global"], torch.zeros(1000))
    assert torch.equal(state["clients"]["site"]["w"], torch.ones(3)) and state["rounds_done"] == 1


def test_a_failed_write_is_raised_by_the_next_save(tmp_path: Path) -> None:
    blocked = tmp_path / "file-not-folder"
    blocked.write_text("x")  # checkpoints/ cannot be created under a file
    writer = ckpt.BackgroundWriter()
    writer.save(blocked, 1, {"global": torch.zeros(3)})
    with pytest.raises(OSError):
        writer.save(tmp_path, 2, {"global": torch.zeros(3)})
    writer.wait()


def test_an_exception_in_the_block_still_finishes_the_write_and_keeps_its_own_error(tmp_path: Path) -> None:
    with pytest.raises(KeyboardInterrupt):
        with ckpt.BackgroundWriter() as writer:
            writer.save(tmp_path, 3, {"global": torch.arange(10.0)})
            raise KeyboardInterrupt
    assert ckpt.load_checkpoint(ckpt.latest_checkpoint(tmp_path))["rounds_done"] == 3


def test_a_checkpoint_round_trips_and_leaves_torchs_crc_setting_as_it_was(tmp_path: Path) -> None:
    before = torch.serialization.get_crc32_options()
    try:
        torch.serialization.set_crc32_options(True)
        ckpt.save_checkpoint(tmp_path, 2, {"global": torch.arange(5.0)})
        assert torch.serialization.get_crc32_options() is True
    finally:
        torch.serialization.set_crc32_options(before)
    assert torch.equal(ckpt.load_checkpoint(ckpt.checkpoint_path(tmp_path, 2))["global"], torch.arange(5.0))


def _flip(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x01
    path.write_bytes(bytes(data))


def test_a_flipped_byte_in_a_tensor_or_in_the_plain_data_is_caught_on_load(tmp_path: Path) -> None:
    """The attack: one bit of a weight, and one character of the saved history, changed on disk. Both
    still unpickle into a well-formed state; both must be refused, naming the file."""
    weights = torch.arange(4096, dtype=torch.float32) + 0.5
    path = ckpt.save_checkpoint(tmp_path, 1, {"global": weights, "history": '[{"loss": 1.25}]'})
    raw = path.read_bytes()
    for offset in (raw.index(weights.numpy().tobytes()) + 1000, raw.index(b'"loss": 1.25') + 10):
        damaged = tmp_path / f"damaged-{offset}.pt"
        damaged.write_bytes(raw)
        _flip(damaged, offset)
        with pytest.raises(ckpt.CorruptCheckpoint, match=damaged.name):
            ckpt.load_checkpoint(damaged)
    assert torch.equal(ckpt.load_checkpoint(path)["global"], weights)


def test_equal_tensors_are_stored_once_and_come_back_as_separate_tensors(tmp_path: Path) -> None:
    """Sites holding copies of the same weights (FedReID's expert and its model, a classifier a round
    left unchanged) cost one copy on disk; loading gives every place its own tensor."""
    big = torch.randn(100_000)
    one = ckpt.save_checkpoint(tmp_path / "one", 1, {"a": big})
    sites = {f"site-{k}": {"w": big.clone(), "own": torch.full((3,), float(k))} for k in range(4)}
    many = ckpt.save_checkpoint(tmp_path / "many", 1, {"a": big, "sites": sites, "view": big[:10]})
    assert many.stat().st_size < one.stat().st_size + 4096  # not 5 copies of 400 kB (and not the view's storage)
    state = ckpt.load_checkpoint(many)
    loaded = [state["a"]] + [state["sites"][f"site-{k}"]["w"] for k in range(4)]
    assert all(torch.equal(t, big) for t in loaded) and torch.equal(state["view"], big[:10])
    assert len({t.untyped_storage().data_ptr() for t in loaded}) == 5  # no hidden aliasing
    assert [state["sites"][f"site-{k}"]["own"][0].item() for k in range(4)] == [0.0, 1.0, 2.0, 3.0]


def test_the_previous_checkpoint_stays_until_the_new_one_reads_back_intact(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ckpt.save_checkpoint(tmp_path, 1, {"global": torch.zeros(1000)})
    ckpt.save_checkpoint(tmp_path, 2, {"global": torch.ones(1000)})
    write = ckpt.atomic_file.write_with

    def write_then_rot(path: Path, writer: object, **kw: object) -> Path:  # the disk damages what it got
        write(path, writer, **kw)
        _flip(Path(path), Path(path).stat().st_size // 2)
        return Path(path)

    monkeypatch.setattr(ckpt.atomic_file, "write_with", write_then_rot)
    with pytest.raises(ckpt.CheckpointError, match="round-0003.pt"):
        ckpt.save_checkpoint(tmp_path, 3, {"global": torch.full((1000,), 2.0)})
    assert [p.name for p in ckpt.list_checkpoints(tmp_path)] == ["round-0001.pt", "round-0002.pt", "round-0003.pt"]
    with pytest.warns(ckpt.CheckpointWarning, match="round-0003.pt"):
        path, state = ckpt.load_newest(tmp_path)
    assert path.name == "round-0002.pt" and torch.equal(state["global"], torch.ones(1000))


def test_when_no_checkpoint_is_intact_the_error_names_every_file(tmp_path: Path) -> None:
    for r in (1, 2):
        path = ckpt.save_checkpoint(tmp_path, r, {"global": torch.full((1000,), float(r))})
        _flip(path, path.stat().st_size // 2)
    with pytest.raises(ckpt.CheckpointError, match="round-0002.pt.*round-0001.pt"):
        ckpt.load_newest(tmp_path)


def test_a_crafted_newest_checkpoint_is_passed_over_for_the_one_before(tmp_path: Path) -> None:
    """(found by review) A sparse tensor or a skeleton 200,000 lists deep raised from the digest — a
    traceback in resume, evaluate and audit, with the intact previous checkpoint never tried."""
    import sys

    ckpt.save_checkpoint(tmp_path, 1, {"global": torch.zeros(10)})
    second = ckpt.save_checkpoint(tmp_path, 2, {"global": torch.ones(10)}, keep=3)
    raw = torch.load(second, weights_only=True)
    deep: list = []
    for _ in range(5_000):  # beyond the interpreter's recursion limit, which the reader keeps
        deep = [deep]
    for crafted in ({**raw, "tensors": [*raw["tensors"], torch.sparse_coo_tensor([[0, 1]], [1.0, 2.0], (3,))]},
                    {**raw, "state": {**raw["state"], "deep": deep}}):
        done = threading.Event()

        def save(content: dict = crafted) -> None:
            torch.save(content, second)
            done.set()

        limit = sys.getrecursionlimit()
        threading.stack_size(128 * 1024 * 1024)  # the forger's pickling of the deep list recurses
        sys.setrecursionlimit(50_000)
        try:
            writer = threading.Thread(target=save)
            writer.start()
            writer.join()
        finally:
            threading.stack_size(0)
            sys.setrecursionlimit(limit)
        assert done.is_set()
        with pytest.warns(ckpt.CheckpointWarning, match="round-0002.pt: damaged checkpoint"):
            path, state = ckpt.load_newest(tmp_path)
        assert path.name == "round-0001.pt" and torch.equal(state["global"], torch.zeros(10))


def test_a_stray_later_checkpoint_never_costs_the_run_its_own(tmp_path: Path) -> None:
    """(found by review) A round-9999.pt copied into the folder made the finished run prune its verified
    last checkpoint: only that stray file was left, and nothing loaded."""
    ckpt.save_checkpoint(tmp_path, 1, {"global": torch.zeros(10)})
    stray = tmp_path / ckpt.CHECKPOINT_DIR / "round-9999.pt"
    stray.write_bytes(ckpt.checkpoint_path(tmp_path, 1).read_bytes())
    ckpt.save_checkpoint(tmp_path, 2, {"global": torch.ones(10)})
    ckpt.prune_checkpoints(tmp_path, keep=1, newest=2)  # the end of a finished run
    assert [p.name for p in ckpt.list_checkpoints(tmp_path)] == ["round-0002.pt", "round-9999.pt"]
    with pytest.warns(ckpt.CheckpointWarning, match="round-9999.pt: its name says round 9999"):
        path, _ = ckpt.load_newest(tmp_path)
    assert path.name == "round-0002.pt"


def test_a_write_that_fails_names_the_file_and_keeps_the_one_before(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """(found by review) A full disk surfaced as torch's "unexpected pos …" traceback."""
    ckpt.save_checkpoint(tmp_path, 1, {"global": torch.zeros(10)})

    def full(*args: object, **kwargs: object) -> None:
        raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 45457536 vs 45457424")

    monkeypatch.setattr(ckpt.torch, "save", full)
    with pytest.raises(ckpt.CheckpointError, match=r"round-0002.pt: cannot be written \(.*unexpected pos.* MiB free"):
        ckpt.save_checkpoint(tmp_path, 2, {"global": torch.ones(10)})
    assert [p.name for p in (tmp_path / ckpt.CHECKPOINT_DIR).iterdir()] == ["round-0001.pt"]
    (tmp_path / "metrics.jsonl").mkdir()  # a folder where a run file goes
    with pytest.raises(ckpt.CheckpointError, match="metrics.jsonl: cannot be written"):
        ckpt.append_jsonl(tmp_path / "metrics.jsonl", {"round": 1})


def test_a_linked_checkpoint_folder_is_refused(tmp_path: Path) -> None:
    """(found by review) A resume wrote and pruned checkpoints in the folder the link named."""
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / ckpt.CHECKPOINT_DIR).symlink_to(tmp_path / "elsewhere")
    with pytest.raises(ckpt.CheckpointError, match="checkpoints: a link"):
        ckpt.list_checkpoints(tmp_path / "run")


def test_the_privacy_notes_are_read_whole_or_refused_by_line(tmp_path: Path) -> None:
    """(found by review) privacy-releases.jsonl as a FIFO hung the resume, as a folder or with bytes that
    are not UTF-8 raised, and a damaged middle line was skipped — a release left out of the ε. Only a
    torn last line (its round never began training) is passed over."""
    import os

    from secfed.federation.runtime import _notes

    log = tmp_path / "privacy-releases.jsonl"
    log.write_text('{"release": 0, "round": 1}\n{"release": 1, "round": 2}\n{"relea')
    assert [n["round"] for n in _notes(log)] == [1, 2]
    log.write_bytes(b'{"release": 0, "round": 1}\n{"release": \xff1, "round": 2}\n{"release": 2, "round": 3}\n')
    with pytest.raises(ckpt.CheckpointError, match="privacy-releases.jsonl, line 2: damaged"):
        _notes(log)
    log.unlink()
    os.mkfifo(log)
    with pytest.raises(ckpt.CheckpointError, match="not a regular file"):
        _notes(log)
    log.unlink()
    log.mkdir()
    with pytest.raises(ckpt.CheckpointError, match="not a regular file"):
        _notes(log)


def test_a_line_appended_after_a_crash_never_runs_into_the_torn_one(tmp_path: Path) -> None:
    """(found by review) A resumed run appended its note straight after a torn one; the next resume
    refused the merged line. A torn tail is dropped; a whole line without its newline is kept."""
    from secfed.federation.runtime import _notes

    log = tmp_path / "privacy-releases.jsonl"
    log.write_text('{"release": 0, "round": 1}\n{"release": 1, "rou')
    ckpt.append_jsonl(log, {"release": 1, "round": 2})
    log.write_text(log.read_text() + '{"release": 2, "round": 3}')  # whole, its newline never written
    ckpt.append_jsonl(log, {"release": 3, "round": 4})
    assert [n["round"] for n in _notes(log)] == [1, 2, 3, 4]


def test_dfs_released_again_after_a_kill_are_counted_in_the_dfs_epsilon() -> None:
    """(found by review) A round redone after a kill released DFH's statistics twice, and the DFS ε still
    counted the planned rounds only."""
    from dataclasses import dataclass
    from types import SimpleNamespace

    from secfed.federation.runtime import _charge_lost_dfs_releases
    from secfed.privacy.dfs import plan_dfs

    @dataclass(frozen=True)
    class Plan:
        dfs: object
        statements: tuple

    dfs = plan_dfs((1.0, 4.0), rounds=4, delta=1e-5)
    fed = SimpleNamespace(plan=Plan(dfs, ("before", dfs.statement())), config=SimpleNamespace(
        schedule=SimpleNamespace(rounds=4)))
    notes = [{"release": i, "round": r} for i, r in enumerate((1, 2, 3))]  # round 3 begun, checkpoint after 2
    with pytest.warns(ckpt.CheckpointWarning, match="counts 5 releases"):
        _charge_lost_dfs_releases(fed, notes, rounds_done=2)
    assert fed.plan.dfs.rounds == 5 and fed.plan.dfs.epsilon > dfs.epsilon
    assert fed.plan.statements == ("before", fed.plan.dfs.statement())
    fed.plan = Plan(dfs, ())
    _charge_lost_dfs_releases(fed, notes[:2], rounds_done=2)  # nothing lost: the plan stands
    assert fed.plan.dfs is dfs
    # a run whose notes begin late (made before DFS-only runs wrote them): rounds before the checkpoint count
    # once each, every note after it once more (review of the fix: a second kill went uncharged)
    fed.plan = Plan(dfs, ())
    late = [{"release": 3, "round": 4}, {"release": 4, "round": 5}, {"release": 5, "round": 6}]
    fed.config.schedule.rounds = 6
    with pytest.warns(ckpt.CheckpointWarning, match="counts 7 releases"):
        _charge_lost_dfs_releases(fed, late, rounds_done=5)


def test_an_empty_file_is_named_as_one(tmp_path: Path) -> None:
    """(review: `secfed evaluate` of an empty file said "not a readable secfed checkpoint ()")"""
    empty = tmp_path / "round-0001.pt"
    empty.write_bytes(b"")
    with pytest.raises(ckpt.CheckpointError, match=r"not a readable secfed checkpoint \(empty file"):
        ckpt.load_checkpoint(empty)


def test_a_sweep_folder_names_its_runs_instead_of_a_missing_checkpoint(tmp_path: Path) -> None:
    """(found by review: `secfed audit` of a leave-one-out sweep's folder said it had no checkpoint)"""
    for name in ("leave-out-campus", "leave-out-plaza"):
        (tmp_path / name).mkdir()
    with pytest.raises(ckpt.CheckpointError, match="a leave-one-out sweep; give one of its runs: .*leave-out-campus"):
        ckpt.load_newest(tmp_path)
