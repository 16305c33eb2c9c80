"""Keep freed memory for reuse instead of handing it back to the kernel after every round.

A round allocates and frees the same few vectors of the shared model's size (46 MB for ResNet-18)
again and again: updates, ring vectors, masks, sums. glibc serves every allocation above its mmap
threshold (at most 32 MiB) with a fresh ``mmap`` and unmaps it on free, so each round pays the
page faults of every such vector anew — measured on the 2-core dev VM at 15–20 ms per 46 MB, and
far more when numpy asks for transparent huge pages in a fragmented process (the kernel then tries
to compact memory on every fault). :func:`reuse_freed_memory` raises glibc's mmap and trim
thresholds (``mallopt``, the knobs behind ``MALLOC_MMAP_THRESHOLD_`` / ``MALLOC_TRIM_THRESHOLD_``)
so freed blocks stay in the heap and the next round reuses them without a fault. The cost: the
process keeps its peak heap until it exits, which a training process does anyway.

Written by hand because no maintained Python package sets allocator options of the running
process; the alternative (jemalloc or tcmalloc through ``LD_PRELOAD``) must be arranged before
Python starts. The ``secfed`` command calls it at start; a program that embeds secfed may too.
Torch-free, like the rest of the top-level package.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os

_M_TRIM_THRESHOLD = -1  # glibc malloc.h
_M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 1 << 30  # allocations below 1 GiB come from the heap and are reused
TRIM_THRESHOLD = 1 << 31  # free memory at the heap's top is kept up to 2 GiB


def reuse_freed_memory() -> bool:
    """Set glibc's thresholds so freed large blocks are reused; True if they were set.

    Does nothing (False) off glibc, or when the user set either threshold in the environment:
    their choice stands."""
    if any(k in os.environ for k in ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_")):
        return False
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError, TypeError):  # not glibc (musl, macOS, Windows)
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD))
