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
