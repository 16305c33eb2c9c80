"""Opacus (≈ 1 s to import, SciPy included) loads only when DP is used: a run without DP, and every
message of a Flower ClientApp, skip it."""

from __future__ import annotations

import json
import subprocess
import sys


def _loaded(statements: str, packages: tuple[str, ...]) -> list[str]:
    """Top-level ``packages`` a fresh interpreter holds after running ``statements``."""
    probe = (f"import json, sys\n{statements}\n"
             f"print(json.dumps(sorted({{m.split('.')[0] for m in sys.modules}} & {set(packages)!r})))\n")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_importing_privacy_and_the_training_modules_does_not_import_opacus():
    # secfed.privacy is imported by every method (algorithms.base); the runtime and the builder are what
    # a Flower node's train message loads. None of them may pull Opacus, SciPy or matplotlib in on import.
    statements = "import secfed.privacy, secfed.federation.runtime, secfed.federation.builder"
    assert _loaded(statements, ("opacus", "scipy", "matplotlib")) == []

