"""Run directories: atomic files, one checkpoint per round, resume.

A checkpoint is a ``torch.save`` of tensors and plain data only, read back with
``torch.load(weights_only=True)`` — no pickle of arbitrary objects, so a checkpoint from elsewhere
cannot run code. Files are written to a temporary name, fsynced and renamed, so a crash leaves
either the old file or the new one, never half of one.
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import re
import threading
from pathlib import Path
from typing import Any

import torch

from secfed import atomic_file

FORMAT = "secfed-checkpoint"
VERSION = 1
CHECKPOINT_DIR = "checkpoints"
_NAME = re.compile(r"round-(\d{4,})\.pt$")


class CheckpointError(Exception):
    """A checkpoint or run directory is missing, unreadable or of another format. Names the path."""


def checkpoint_path(run_dir: Path, round_count: int) -> Path:
    return Path(run_dir) / CHECKPOINT_DIR / f"round-{round_count:04d}.pt"


def save_checkpoint(run_dir: Path, round_count: int, state: dict[str, Any], keep: int = 1) -> Path:
    """Write the state after ``round_count`` completed rounds; keep the newest ``keep`` checkpoints."""
    path = checkpoint_path(run_dir, round_count)
    path.parent.mkdir(parents=True, exist_ok=True)
    content = {"format": FORMAT, "version": VERSION, "rounds_done": round_count, **state}
    # torch.load never checks the zip records' CRC-32 (a flipped byte loads silently either way) and
    # computing it took two thirds of a 46 MB checkpoint's write (62 of 92 ms): skip it here, and
    # give the process its own setting back.
    crc = torch.serialization.get_crc32_options()
    torch.serialization.set_crc32_options(False)
    try:
        atomic_file.write_with(path, lambda fh: torch.save(content, fh))
    finally:
        torch.serialization.set_crc32_options(crc)
    for old in list_checkpoints(run_dir)[:-keep] if keep > 0 else []:
        old.unlink(missing_ok=True)
    return path


class BackgroundWriter:
    """Writes each round's checkpoint on a thread of its own while the next round trains.

    :meth:`save` takes a private copy of every tensor in the state first (the caller goes on
    changing its models), then returns; the file is written, fsynced and renamed as by
    :func:`save_checkpoint`. One write is in flight at a time: the next :meth:`save` (or
    :meth:`wait`) waits for it and re-raises its error. ``with BackgroundWriter() as w:`` waits on
    every exit, an exception or Ctrl-C included, so the last checkpoint is on disk (or, if the
    process is killed outright, the one before it, and a resume redoes one round).
    """

    def __init__(self) -> None:
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    def save(self, run_dir: Path, round_count: int, state: dict[str, Any]) -> None:
        self.wait()
        private = copy.deepcopy(state)  # tensors cloned: the models train on while this is written

        def write() -> None:
            try:
                save_checkpoint(run_dir, round_count, private)
            except BaseException as exc:  # handed to the main thread by wait()
                self._error = exc

        self._thread = threading.Thread(target=write, name=f"secfed-checkpoint-{round_count}")
        self._thread.start()

    def wait(self) -> None:
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._error is not None:
            error, self._error = self._error, None
            raise error

    def __enter__(self) -> BackgroundWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        if exc[0] is None:
            self.wait()
        else:  # already failing: finish the write, keep the original exception
            with contextlib.suppress(BaseException):
                self.wait()


def list_checkpoints(run_dir: Path) -> list[Path]:
    folder = Path(run_dir) / CHECKPOINT_DIR
    if not folder.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in folder.iterdir() if (m := _NAME.search(p.name))]
    return [p for _, p in sorted(found)]


def latest_checkpoint(run_dir: Path) -> Path:
    found = list_checkpoints(run_dir)
    if not found:
        raise CheckpointError(f"{run_dir}: no checkpoint in {Path(run_dir) / CHECKPOINT_DIR}")
    return found[-1]


def load_checkpoint(path: Path) -> dict[str, Any]:
    path = Path(path)
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise CheckpointError(f"{path}: no such checkpoint") from None
    except Exception as exc:  # truncated file, foreign pickle, wrong format: all "not a checkpoint"
        raise CheckpointError(f"{path}: not a readable secfed checkpoint ({exc})") from None
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise CheckpointError(f"{path}: not a secfed checkpoint")
    if state.get("version") != VERSION:
        raise CheckpointError(f"{path}: checkpoint version {state.get('version')}, this secfed reads {VERSION}")
    return state


def write_jsonl(path: Path, records: list[dict[str, Any]]) -> None:
    """Rewrite a JSON-lines file in one atomic step (used on resume to drop lines past the checkpoint)."""
    atomic_file.write_text(path, "".join(json.dumps(r, sort_keys=True) + "\n" for r in records))


def append_jsonl(path: Path, record: dict[str, Any]) -> None:
    with open(path, "a") as fh:
        fh.write(json.dumps(record, sort_keys=True) + "\n")
        fh.flush()
        os.fsync(fh.fileno())
