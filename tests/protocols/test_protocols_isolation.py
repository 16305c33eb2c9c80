"""secfed.protocols must import without torch and without the rest of secfed."""

from __future__ import annotations

import subprocess
import sys


def test_importing_protocols_imports_neither_torch_nor_secfed_core():
    probe = (
        "import sys, secfed.protocols\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'torchvision', 'opacus')\n"
        "             or (m.startswith('secfed.') and not m.startswith('secfed.protocols')))\n"
        "print(repr(bad))\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout
