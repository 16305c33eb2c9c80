"""The README's embedding example, executed as written, in a fresh interpreter without torch."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"
START, END = "<!-- embedding-example:start -->", "<!-- embedding-example:end -->"


def readme_example() -> str:
    """The python block between the README's embedding-example markers: one source for both."""
    text = README.read_text()
    block = text[text.index(START) + len(START) : text.index(END)]
    return block.split("```python\n", 1)[1].rsplit("```", 1)[0]


def test_readme_example_runs_with_secfed_protocols_alone():
    check = "\nimport sys\nprint(sorted(m for m in sys.modules if m.split('.')[0] == 'torch'))\n"
    out = subprocess.run([sys.executable, "-c", readme_example() + check], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
