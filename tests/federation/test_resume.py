"""Run directories: checkpoints are atomic, and a resumed run ends bit-identical to an uninterrupted one."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import pytest
import torch

from secfed import atomic_file
from secfed.config import RunConfig
from secfed.federation import checkpoint as ckpt
from secfed.environment import environment
from secfed.federation.runtime import ResumedElsewhere, resume_threads, resume_where_started, run


class Crash(Exception):
    pass


def flip_byte(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x01
    path.write_bytes(bytes(data))


def _without_timing(history: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if k != "seconds"} for r in history]


@pytest.mark.parametrize(("algorithm", "damaged"), [("fedpav", False), ("fedreid", True)])
def test_resume_ends_bit_identical(two_site_config: RunConfig, tmp_path: Path, algorithm: str, damaged: bool) -> None:
    """FedReID also keeps, per site, the latest local embedding its next expert starts from. ``damaged``:
    a byte of the newest checkpoint flips on disk; the resume continues from the one before it, says
    so naming the damaged file, and still ends where the uninterrupted run ended."""
    cfg = two_site_config
    cfg.method.algorithm = algorithm
    cfg.schedule.rounds = 3
    cfg.run.eval_every = 2  # round 2 (in the checkpoint) and round 3 (after the resume)
    cfg.run.local_baseline = algorithm == "fedpav"  # the baselines' resume needs testing once
    full = run(cfg, tmp_path / "full")

    def crash_after_two(round_number: int) -> None:
        if round_number == 2:
            raise Crash

    with pytest.raises(Crash):
        run(cfg, tmp_path / "cut", on_round_end=crash_after_two)
    # the previous checkpoint stays until the next is verified; a finished run keeps its last one only
    assert [p.name for p in ckpt.list_checkpoints(tmp_path / "cut")] == ["round-0001.pt", "round-0002.pt"]
    assert [p.name for p in ckpt.list_checkpoints(tmp_path / "full")] == ["round-0003.pt"]
    # a line for a round the checkpoint does not hold must not survive the resume
    ckpt.append_jsonl(tmp_path / "cut" / "metrics.jsonl", {"round": 3, "partial": True})
    newest = ckpt.checkpoint_path(tmp_path / "cut", 2)
    # the resume's shell has another thread count (no --threads): it trains on at the run's, as data.json
    # recorded it (found by review: it trained on at the shell's, other bytes, its files saying the first)
    started_with = torch.get_num_threads()
    torch.set_num_threads(3 - started_with)
    try:
        if damaged:
            flip_byte(newest, newest.stat().st_size // 2)
            with pytest.warns(ckpt.CheckpointWarning, match="round-0002.pt"):
                resumed = run(cfg, tmp_path / "cut", resume=True)
        else:
            resumed = run(cfg, tmp_path / "cut", resume=True)
        assert torch.get_num_threads() == started_with
    finally:
        torch.set_num_threads(started_with)
    resumes = json.loads((tmp_path / "cut" / "data.json").read_text())["resumes"]
    assert [r["round"] for r in resumes] == [2 if damaged else 3] and resumes[0]["environment"]["torch_threads"] == started_with

    assert torch.equal(full.federation.server.weights, resumed.federation.server.weights)
    for a, b in zip(full.federation.clients, resumed.federation.clients):
        for key, value in a.site.model.state_dict().items():
            assert torch.equal(value, b.site.model.state_dict()[key]), (a.site.name, key)
    for k, alone in full.federation.baselines.items():
        for key, value in alone.model.state_dict().items():
            assert torch.equal(value, resumed.federation.baselines[k].model.state_dict()[key]), key
    lines = [json.loads(line) for line in (tmp_path / "cut" / "metrics.jsonl").read_text().splitlines()]
    assert [r["round"] for r in lines] == [1, 2, 3]
    full_lines = [json.loads(line) for line in (tmp_path / "full" / "metrics.jsonl").read_text().splitlines()]
    assert _without_timing(lines) == _without_timing(full_lines)
    assert resumed.summary["domains"] == full.summary["domains"]


def test_a_resume_under_other_conditions_says_it_is_not_bit_identical(tmp_path: Path) -> None:
    """--threads given with a resume, another commit: a warning names each, and data.json records the
    resume's environment beside the first (which it keeps)."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    first = {**environment(), "torch_threads": 7, "commit": "0" * 40, "cpu": {"model": "Elsewhere CPU"}}
    (run_dir / "data.json").write_text(json.dumps({"environment": first}))
    with pytest.warns(ResumedElsewhere, match=r"round 4 .*torch_threads 7 .*commit '0{40}' .*CPU 'Elsewhere CPU'"):
        resume_where_started(run_dir, 3)
    written = json.loads((run_dir / "data.json").read_text())
    assert written["environment"] == first and written["resumes"][0]["environment"]["torch_threads"] != 7
    (run_dir / "data.json").unlink()  # (review 88: nothing was said)
    with pytest.warns(ResumedElsewhere, match="keeps no record of the environment"):
        resume_where_started(run_dir, 3)


def test_a_resume_takes_the_recorded_thread_count_within_range_only(tiny_config: RunConfig, tmp_path: Path) -> None:
    """Afresh (no round had finished) too; an edited count beyond --threads' range is not adopted
    (review 88: 10**9 asked libgomp for 216 GB)."""
    before = torch.get_num_threads()
    try:
        for recorded, expected in ((3 - before, 3 - before), (10**9, 3 - before), (0, 3 - before)):
            (tmp_path / "data.json").write_text(json.dumps({"environment": {"torch_threads": recorded}}))
            resume_threads(tiny_config, tmp_path)
            assert torch.get_num_threads() == expected
    finally:
        torch.set_num_threads(before)
    (tmp_path / "data.json").unlink()
    os.mkfifo(tmp_path / "data.json")  # (review 89: reading it hung the resume)
    reader = threading.Thread(target=resume_threads, args=(tiny_config, tmp_path), daemon=True)
    reader.start()
    reader.join(10)
    assert not reader.is_alive()


def test_a_flower_run_directory_is_never_resumed_in_process(tiny_config: RunConfig, tmp_path: Path) -> None:
    """(review 85: it resumed in-process and trained on from every site's initial classifier, silently)"""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    ckpt.save_checkpoint(run_dir, 1, {"rounds_done": 1, "config": tiny_config.to_dict(), "deployment": "flower"})
    with pytest.raises(ckpt.CheckpointError, match="Flower deployment.*cannot be resumed"):
        run(tiny_config, run_dir, resume=True)
    # before its first checkpoint too (review 88: it started afresh in-process in the Flower run's folder)
    before = tmp_path / "before"
    before.mkdir()
    (before / "config.json").write_text(tiny_config.to_json())
    (before / "data.json").write_text(json.dumps({"deployment": "flower", "environment": {}}))
    with pytest.raises(ckpt.CheckpointError, match="data.json: this run trained on a Flower deployment"):
        run(tiny_config, before, resume=True)
    # ... refused before the command says it starts afresh (review 89)
    from click.testing import CliRunner

    from secfed.cli.main import cli

    said = CliRunner().invoke(cli, ["train", "--resume", str(before)], env={"COLUMNS": "250"})
    assert said.exit_code == 1 and "Flower deployment" in said.output and "starting from round 1" not in said.output


def test_atomic_write_keeps_old_file_on_failure(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "file.bin"
    atomic_file.write_bytes(target, b"old")

    def broken_replace(src: str, dst: str) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", broken_replace)
    with pytest.raises(OSError, match="disk full"):
        atomic_file.write_bytes(target, b"new")
    assert target.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["file.bin"]  # no temporary left behind


@pytest.mark.filterwarnings("ignore:Detected pickle protocol")  # torch's note on the foreign file itself
def test_checkpoint_rejects_foreign_files(tmp_path: Path) -> None:
    bad = tmp_path / "x.pt"
    torch.save({"format": "something-else"}, bad)
    with pytest.raises(ckpt.CheckpointError, match="not a secfed checkpoint"):
        ckpt.load_checkpoint(bad)
    bad.write_bytes(b"\x80\x04garbage")
    with pytest.raises(ckpt.CheckpointError, match="x.pt"):
        ckpt.load_checkpoint(bad)
    with pytest.raises(ckpt.CheckpointError, match="no checkpoint"):
        ckpt.latest_checkpoint(tmp_path)


def test_only_newest_checkpoints_are_kept(tmp_path: Path) -> None:
    for r in range(1, 5):
        ckpt.save_checkpoint(tmp_path, r, {"x": torch.tensor([r])}, keep=2)
    assert [p.name for p in ckpt.list_checkpoints(tmp_path)] == ["round-0003.pt", "round-0004.pt"]
    assert ckpt.load_checkpoint(ckpt.latest_checkpoint(tmp_path))["rounds_done"] == 4


def test_a_checkpoint_of_other_settings_or_a_renamed_one_is_never_resumed(two_site_config: RunConfig,
                                                                          tmp_path: Path) -> None:
    """A resume continues only from a checkpoint this run wrote. Another run's checkpoint copied in
    (or a config.json edited since: the same thing to the resume) is refused naming the settings
    that differ — before, it resumed silently, continuing one run's history under another's seed.
    Settings a resume may change (--lr, --threads, …) still may. A checkpoint renamed to another
    round is damaged: its name and contents disagree."""
    cfg = two_site_config
    cfg.schedule.rounds = 1
    run(cfg, tmp_path / "a")
    newest = ckpt.latest_checkpoint(tmp_path / "a")
    before = newest.read_bytes()
    other = cfg.model_copy(deep=True)
    other.run.seed = cfg.run.seed + 1
    seed = cfg.run.seed
    with pytest.raises(ckpt.CheckpointError, match=rf"other settings \(run\.seed: {seed} there, {seed + 1} here\)"):
        run(other, tmp_path / "a", resume=True)
    assert newest.read_bytes() == before  # nothing written
    repaired = cfg.model_copy(deep=True)
    repaired.schedule.lr = 0.001
    run(repaired, tmp_path / "a", resume=True)  # a lower learning rate may accompany a resume
    renamed = newest.with_name("round-0002.pt")
    newest.rename(renamed)
    with pytest.raises(ckpt.CorruptCheckpoint, match="its name says round 2, its contents round 1"):
        ckpt.load_checkpoint(renamed)


def test_a_crafted_checkpoint_is_refused_by_name_and_a_run_reads_only_its_own_files(two_site_config: RunConfig,
                                                                                     tmp_path: Path) -> None:
    """(found by review) A digest proves only that a file is what its writer wrote, and anyone can
    write one: checkpoints whose contents do not fit the run stopped evaluate, audit and resume with a
    traceback, or loaded nothing silently (a client's state without its tensors); another run's
    checkpoint copied in was evaluated without a word; a FIFO named like a checkpoint hung the reader,
    a link led outside the run; a killed write's temporary file outlived every resume."""
    import copy
    import shutil
    import warnings

    from secfed.federation.builder import build
    from secfed.federation.runtime import read_run, restore

    cfg = two_site_config
    cfg.schedule.rounds = 1
    run(cfg, tmp_path / "a")
    _, base = ckpt.load_newest(tmp_path / "a")
    fed = build(cfg, train_images=False)

    def crafted(mutate) -> tuple[Path, dict]:
        state = copy.deepcopy({k: v for k, v in base.items() if k not in ("format", "version", "rounds_done")})
        mutate(state)
        path = ckpt.save_checkpoint(tmp_path / "crafted", 1, state, keep=1)
        return path, ckpt.load_checkpoint(path)

    for mutate, says in (
        (lambda s: s.pop("layout_id"), "KeyError: 'layout_id'"),
        (lambda s: s.__setitem__("global", s["global"][:10].clone()), "not a finite vector"),
        (lambda s: s.__setitem__("global", torch.full_like(s["global"], float("nan"))), "not a finite vector"),
        (lambda s: s.__setitem__("privacy", "{"), "JSONDecodeError"),
        (lambda s: s.__setitem__("clients", {}), "KeyError: '0'"),
        (lambda s: s.__setitem__("clients", {k: {} for k in s["clients"]}), "holds other tensors"),
        (lambda s: s.__setitem__("history", "5"), "not one record for each"),
    ):
        path, state = crafted(mutate)
        with pytest.raises(ckpt.CorruptCheckpoint, match=rf"{path}: .*{says}"):
            restore(fed, state, path)
    for mutate, says in ((lambda s: s.__setitem__("config", "x"), "holds no saved configuration"),
                         (lambda s: s["config"]["schedule"].__setitem__("rounds", "three"), "configuration is not valid")):
        path, _ = crafted(mutate)
        with pytest.raises(ckpt.CorruptCheckpoint, match=says):
            read_run(path)
    # another run's checkpoint in this run's directory: refused, naming what differs from config.json
    other = copy.deepcopy({k: v for k, v in base.items() if k not in ("format", "version", "rounds_done")})
    other["config"]["run"]["seed"] += 1
    shutil.copytree(tmp_path / "a", tmp_path / "b")
    ckpt.save_checkpoint(tmp_path / "b", 2, other, keep=5)
    with pytest.raises(ckpt.CheckpointError, match=r"round-0002.pt was written by a run with other settings .*run\.seed"):
        read_run(tmp_path / "b")
    newer = json.loads((tmp_path / "b" / "config.json").read_text())  # a config.json this secfed cannot read
    newer["run"]["a_setting_from_a_newer_secfed"] = 1                  # is named, not skipped
    (tmp_path / "b" / "config.json").write_text(json.dumps(newer))
    with pytest.raises(ckpt.CheckpointError, match=r"config.json: the run's configuration, which its checkpoints are "
                                                   r"checked against, is not valid .*a_setting_from_a_newer_secfed"):
        read_run(tmp_path / "b")
    for damaged, says in (("{not json", "Expecting property name"), ("[1, 2]", "a JSON list, not a table")):
        (tmp_path / "b" / "config.json").write_text(damaged)
        with pytest.raises(ckpt.CheckpointError, match=rf"config.json: the run's configuration.* is not valid \({says}"):
            read_run(tmp_path / "b")
    shutil.copy(tmp_path / "a" / "config.json", tmp_path / "b" / "config.json")
    # ... but a loose checkpoint file is not judged by a config.json near it, and an older spelling of a
    # setting in config.json is no difference (found by review of the check: both were refused)
    (tmp_path / "exp" / "models").mkdir(parents=True)
    shutil.copy(tmp_path / "b" / "checkpoints" / "round-0002.pt", tmp_path / "exp" / "models" / "best.pt")
    (tmp_path / "exp" / "config.json").write_text((tmp_path / "a" / "config.json").read_text())
    assert read_run(tmp_path / "exp" / "models" / "best.pt")[2].run.seed == cfg.run.seed + 1
    assert cfg.model.pretrained == "none"
    older = json.loads((tmp_path / "a" / "config.json").read_text())
    older["model"]["pretrained"] = False  # how secfed once wrote "none"
    (tmp_path / "a" / "config.json").write_text(json.dumps(older))
    assert read_run(tmp_path / "a")[0].name == "round-0001.pt"
    # a FIFO or a link named like the newest checkpoint is not read: the one before it is, with a warning
    (tmp_path / "b" / "checkpoints" / "round-0002.pt").unlink()
    os.mkfifo(tmp_path / "b" / "checkpoints" / "round-0003.pt")
    (tmp_path / "b" / "checkpoints" / "round-0004.pt").symlink_to(ckpt.latest_checkpoint(tmp_path / "a"))
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        assert read_run(tmp_path / "b")[0].name == "round-0001.pt"
    assert [str(w.message).split(":")[1].split(";")[0].strip() for w in said] == ["a link", "not a regular file"]
    # a killed write's temporary file goes at the resume
    for name in ("round-0003.pt", "round-0004.pt"):
        (tmp_path / "b" / "checkpoints" / name).unlink()
    stale = tmp_path / "b" / "checkpoints" / ".round-0002.pt.x1y2.tmp"
    stale.write_bytes(b"half a checkpoint")
    run(cfg, tmp_path / "b", resume=True)
    assert not stale.exists() and [p.name for p in ckpt.list_checkpoints(tmp_path / "b")] == ["round-0001.pt"]


def test_one_process_at_a_time_trains_in_a_run_directory(tiny_config: RunConfig, tmp_path: Path) -> None:
    """(found by review: two resumes of one run at once both trained rounds 2–4, and the ε printed
    counted 5 of the 7 noised releases; two fresh runs of one --name wrote into each other)"""
    from secfed import locking
    from secfed.config import ConfigError
    from secfed.data.errors import DataError

    run_dir = tmp_path / "busy"
    run_dir.mkdir()
    with locking.exclusive_folder(run_dir, busy=RuntimeError):  # another process is training here
        for resume in (False, True):
            with pytest.raises(ConfigError, match="in use by another secfed process") as refused:
                run(tiny_config, run_dir, resume=resume)
            assert refused.value.key == "run.out"
    # an empty folder given for a run becomes this user's alone (found by review: its trackers' files,
    # per-client losses among them, were readable by everyone in a folder made 0755 beforehand)
    given = tmp_path / "given"
    given.mkdir()
    given.chmod(0o755)
    nowhere = tiny_config.model_copy(deep=True)
    nowhere.data.root = str(tmp_path / "no-data")
    with pytest.raises((ConfigError, DataError)):  # refused while building: nothing left, the mode tightened
        run(nowhere, given)
    assert given.stat().st_mode & 0o777 == 0o700 and not any(given.iterdir())
    (run_dir / "config.json").write_text(tiny_config.to_json())  # a run started here meanwhile, and ended
    with pytest.raises(ConfigError, match="already holds a run: continue it with --resume") as refused:
        run(tiny_config, run_dir)
    assert refused.value.key == "run.name" and (run_dir / "config.json").exists()
    # the lock is the folder's own: a run killed while it held it left nothing in it (review of the fix: a
    # lock file left behind made the folder "not empty" for a fresh start and config-less for --resume)
    assert sorted(p.name for p in run_dir.iterdir()) == ["config.json"]


def test_a_refused_run_removes_only_what_it_made_and_never_a_live_neighbour(tmp_path: Path, monkeypatch) -> None:
    """(review of the fix) A run refused while building removed the topmost folder it made — a shared
    --out another run had started in meanwhile, that run's checkpoints and all; Ctrl-C while building
    left its folders; and a folder NFS cannot flock stopped every run with a traceback."""
    import errno
    import fcntl
    import stat

    from secfed import locking
    from secfed.config import ConfigError
    from secfed.federation.runtime import claimed_run_dir

    out = tmp_path / "new-out"
    with pytest.raises(RuntimeError):
        with claimed_run_dir(out / "a", fresh=True):
            with claimed_run_dir(out / "b", fresh=True):  # another run, started meanwhile in the same --out
                (out / "b" / "config.json").write_text("{}")
            raise RuntimeError("refused while building")
    assert sorted(p.name for p in out.iterdir()) == ["b"] and (out / "b" / "config.json").exists()
    with pytest.raises(KeyboardInterrupt):
        with claimed_run_dir(tmp_path / "x" / "y", fresh=True):
            raise KeyboardInterrupt
    assert not (tmp_path / "x").exists()
    kept = tmp_path / "kept"  # a folder that held something before is never touched
    kept.mkdir()
    (kept / "notes.txt").write_text("mine")
    with pytest.raises(RuntimeError):
        with claimed_run_dir(kept, fresh=True):
            raise RuntimeError("refused while building")
    assert (kept / "notes.txt").read_text() == "mine"

    real = fcntl.flock

    def no_folder_locks(fd: int, operation: int) -> None:  # NFS: flock on a folder's descriptor fails
        if stat.S_ISDIR(os.fstat(fd).st_mode):
            raise OSError(errno.EBADF, "Bad file descriptor")
        real(fd, operation)

    monkeypatch.setattr(locking.fcntl, "flock", no_folder_locks)
    with claimed_run_dir(tmp_path / "nfs", fresh=True):
        with pytest.raises(ConfigError, match="in use by another secfed process"):
            with claimed_run_dir(tmp_path / "nfs", fresh=True):
                pass
