"""listing.Resolver gives exactly Path.resolve()'s answer, symbolic links anywhere included (the
run's data fingerprint and a node's image-cache keys are computed with it)."""

from __future__ import annotations

from pathlib import Path

from secfed.data.listing import Resolver


def test_the_resolver_agrees_with_path_resolve_through_links_dots_and_missing_files(tmp_path, monkeypatch):
    real, elsewhere = tmp_path / "real", tmp_path / "elsewhere"
    real.mkdir()
    elsewhere.mkdir()
    (real / "a.jpg").write_bytes(b"a")
    (elsewhere / "b.jpg").write_bytes(b"b")
    (tmp_path / "link").symlink_to(real)  # a linked folder
    (real / "b.jpg").symlink_to(elsewhere / "b.jpg")  # a linked file: resolved to where it points
    (real / "gone.jpg").symlink_to(tmp_path / "nowhere.jpg")  # a dangling link
    (real / "chain.jpg").symlink_to(tmp_path / "link" / "b.jpg")  # a link through a linked folder
    monkeypatch.chdir(tmp_path)
    cases = [tmp_path / "link" / name for name in ("a.jpg", "b.jpg", "gone.jpg", "chain.jpg", "missing.jpg")]
    cases += [Path("link/a.jpg"), Path("link/b.jpg"), tmp_path / "link" / ".." / "elsewhere" / "b.jpg",
              tmp_path / "link" / "..", Path("."), Path("a.jpg"), tmp_path / "no-folder" / "x.jpg"]
    resolve = Resolver()
    for path in cases + cases:  # the second pass is answered from the resolved folders
        assert resolve(path) == path.resolve(), path
