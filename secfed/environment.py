"""What machine and software a number came from: written into every run's ``data.json`` and printed
beside every bench table, so a figure can be traced to the CPU, the libraries and the commit behind it.

Floating-point results of training depend on the CPU's vector units (which kernels torch picks), the
number of threads (how reductions are split) and the library versions; ``environment()`` records all
of them. Reading the CPU model needs no package (``/proc/cpuinfo`` on Linux, ``platform`` elsewhere),
so this is a few lines here rather than a dependency.
"""

from __future__ import annotations

import os
import platform
import subprocess
from functools import lru_cache
from pathlib import Path
from typing import Any

# The instruction-set extensions that change which floating-point kernels torch and numpy run.
SIMD_FLAGS = ("sse4_2", "avx", "avx2", "fma", "avx512f", "avx512_bf16", "avx512_vnni", "amx_tile", "asimd", "sve")


def cpu() -> dict[str, Any]:
    """The CPU model, the SIMD extensions among :data:`SIMD_FLAGS` it has, and the logical core count."""
    model, flags = platform.processor() or platform.machine(), set()
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace").splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and value.strip():
                model = value.strip()
            elif key.strip() in ("flags", "Features"):
                flags |= set(value.split())
    except OSError:  # not Linux: the model from platform, no flags
        pass
    return {"model": model, "simd": [f for f in SIMD_FLAGS if f in flags], "logical_cores": os.cpu_count()}


@lru_cache(maxsize=1)
def source_commit(here: Path = Path(__file__).resolve().parent) -> str | None:
    """The git commit of the secfed source tree this process runs (with ``-dirty`` for local changes,
    untracked files included), or None when it is not a git checkout (an installed wheel)."""
    try:
        commit = subprocess.run(["git", "-C", str(here), "rev-parse", "HEAD"], capture_output=True, text=True,
                                timeout=5, check=True).stdout.strip()
        # untracked files count: a bench script not yet committed ran as part of that source (found by review)
        dirty = subprocess.run(["git", "-C", str(here), "status", "--porcelain", "--untracked-files=normal"],
                               capture_output=True, text=True, timeout=5, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return commit + ("-dirty" if dirty else "") if commit else None


def environment() -> dict[str, Any]:
    """CPU, GPU, thread counts, Python/torch/numpy/torchvision/Pillow versions, torch's BLAS and the
    source commit (torchvision and Pillow decode and resize every image a run reads)."""
    import numpy
    import PIL
    import torch
    import torchvision

    import secfed

    return {
        "cpu": cpu(),
        "torch_threads": torch.get_num_threads(),
        "torch_interop_threads": torch.get_num_interop_threads(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "torch": torch.__version__,
        "torch_blas": _torch_blas(),
        "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),  # the kernels torch dispatches to
        "cuda": torch.version.cuda if torch.cuda.is_available() else None,
        # Two GPUs of one CUDA version run other kernels (an H100's and an H200's runs are two machines)
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "numpy": numpy.__version__,
        "torchvision": torchvision.__version__,
        "pillow": PIL.__version__,
        "secfed": secfed.__version__,
        "commit": source_commit(),
    }


def _torch_blas() -> str | None:
    """torch's build setting BLAS_INFO (mkl, open, ...): which BLAS its matrix products call."""
    import torch

    for setting in torch.__config__.show().replace("\n", ",").split(","):
        key, _, value = setting.strip().partition("=")
        if key.endswith("BLAS_INFO"):
            return value.strip() or None
    return None


def describe(env: dict[str, Any] | None = None) -> str:
    """One line for a bench's header or a results table: CPU, threads, versions, commit."""
    env = env or environment()
    return (f"{env['cpu']['model']} (torch kernels {env['torch_cpu_capability']}), {env['cpu']['logical_cores']} "
            f"cores, torch {env['torch']} "
            f"on {env['torch_threads']} threads{' on ' + env['gpu'] if env.get('gpu') else ''}, "
            f"numpy {env['numpy']}, Python {env['python']}, "
            f"secfed {env['commit'] or env['secfed']}")
