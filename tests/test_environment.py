"""What a run records of the machine and the source it ran."""

from __future__ import annotations

import subprocess
from pathlib import Path

from secfed.environment import environment, source_commit


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=True).stdout.strip()


def test_an_untracked_file_marks_the_commit_dirty(tmp_path: Path) -> None:
    """A bench script not yet committed ran as part of the source: the commit it records says -dirty
    (found by review: repro_devvm.json named a clean commit its script was not in)."""
    _git(tmp_path, "init", "-q")
    (tmp_path / "module.py").write_text("x = 1\n")
    _git(tmp_path, "add", "module.py")
    _git(tmp_path, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "one")
    head = _git(tmp_path, "rev-parse", "HEAD")
    assert source_commit.__wrapped__(tmp_path) == head
    (tmp_path / "bench_new.py").write_text("y = 2\n")
    assert source_commit.__wrapped__(tmp_path) == head + "-dirty"
    assert source_commit.__wrapped__(tmp_path.parent / "no-such-folder") is None


def test_the_environment_names_the_image_decoders() -> None:
    """torchvision and Pillow decode and resize every image a run reads: their versions are recorded."""
    import PIL
    import torchvision

    env = environment()
    assert env["torchvision"] == torchvision.__version__ and env["pillow"] == PIL.__version__
