"""README.md's Flower embedding example, run as written: its client_app.py and server_app.py on
three nodes of the in-process grid (every message crosses Flower's serialisation, every node keeps
only its context), with the cohort file and node config the README describes."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import numpy as np
import pytest
from fakegrid import FakeGrid
from flwr.app import Context, RecordDict

from secfed.adapters.flower import Cohort
from secfed.adapters.flower import node as node_files

README = Path(__file__).resolve().parents[2] / "README.md"
MARK = re.compile(r"<!-- flower-example:(\S+) -->\n```python\n(.*?)```\n", re.S)


def examples() -> dict[str, str]:
    """file name → the python block after its ``flower-example`` marker."""
    found = dict(MARK.findall(README.read_text()))
    assert set(found) == {"client_app.py", "server_app.py"}, sorted(found)
    return found


def load(path: Path):
    spec = importlib.util.spec_from_file_location(f"readme_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_readme_flower_example_runs_as_written(tmp_path, monkeypatch, capsys):
    for name, source in examples().items():
        (tmp_path / name).write_text(source)
    client, server = load(tmp_path / "client_app.py"), load(tmp_path / "server_app.py")
    monkeypatch.chdir(tmp_path)  # Cohort.load("cohort.toml"), as the README's server app reads it
    nodes, sites = {}, {}
    for p in range(3):
        folder = tmp_path / f"site-{p}"
        sites[f"site-{p}"] = node_files.public_identity(node_files.identity_key(folder))
        nodes[100 + p] = (client.app, {"partition-id": p, node_files.STATE_DIR_KEY: str(folder),
                                       node_files.COHORT_KEY: str(tmp_path / "cohort.toml")})
    (tmp_path / "cohort.toml").write_text(Cohort(sites).dumps())
    grid = FakeGrid(nodes)
    server.main(grid, Context(1, 0, {}, RecordDict(), {"num-server-rounds": 2}))
    printed = capsys.readouterr().out
    line = next(x for x in printed.splitlines() if x.startswith("global w:"))
    w = np.array([float(v) for v in line.split("[", 1)[1].rstrip("]").split()])
    # Each round adds the weighted mean of 0.1·(p + 1) over weights 100·(p + 1): 1.4 / 6.
    np.testing.assert_allclose(w, np.full(4, 2 * 1.4 / 6), atol=1e-5)
    assert not any(grid.errors.values()), grid.errors


@pytest.mark.parametrize("name", ["client_app.py", "server_app.py"])
def test_the_readme_example_names_only_public_secfed_names(name):
    imported = re.findall(r"from secfed\.adapters\.flower import (.+)", examples()[name])
    from secfed.adapters import flower

    for names in imported:
        for n in names.split(","):
            assert n.strip() in flower.__all__
