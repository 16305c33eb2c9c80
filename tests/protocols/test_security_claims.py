"""SECURITY.md backs its claims with `test_protocols_*.py::test_name` (protocol tests, beside this
file) or `tests/<folder>/test_*.py::test_name` references: each one must name a test that exists,
so a renamed or deleted test cannot leave a claim unbacked."""

from __future__ import annotations

import ast
import re
from pathlib import Path

HERE = Path(__file__).resolve().parent
SECURITY = HERE.parents[1] / "SECURITY.md"
# `file.py::test` or, continuing the last file named, `::test`
REFERENCE = re.compile(r"`((?:tests/[\w/]+/)?test_\w+\.py)?::(test_\w+)`")
WHOLE_FILE = re.compile(r"`(test_protocols_\w+\.py)` \(all tests\)")


def cited() -> list[tuple[str, str]]:
    refs, current = [], None
    for match in REFERENCE.finditer(SECURITY.read_text()):
        current = match.group(1) or current
        assert current is not None, f"SECURITY.md cites ::{match.group(2)} before naming a file"
        refs.append((current, match.group(2)))
    return refs


def path_of(filename: str) -> Path:
    return HERE.parents[1] / filename if filename.startswith("tests/") else HERE / filename


def defined_tests(filename: str) -> set[str]:
    tree = ast.parse(path_of(filename).read_text())
    return {node.name for node in tree.body if isinstance(node, ast.FunctionDef) and node.name.startswith("test_")}


def test_every_test_security_md_cites_exists():
    refs = cited()
    assert len(refs) > 40  # the protocol sections cite their tests throughout
    missing = [f"{f}::{t}" for f, t in refs if not path_of(f).exists() or t not in defined_tests(f)]
    assert missing == []
    for filename in WHOLE_FILE.findall(SECURITY.read_text()):
        assert defined_tests(filename), filename
