"""Copies of a model, made on one thread.

A copy is memory-bound and its tensors are small (ResNet-18's largest is 9 MB): torch's parallel
copy gains nothing there, and on a busy machine (a SuperNode's ClientApps, a shared CI box) every
tensor's OpenMP hand-off waits for a core — measured on the 2-core dev VM under load at 0.15 s per
ResNet-18 copy on 2 threads against 0.03 s on one. A copy is exact either way, so no number moves.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TypeVar

import torch

T = TypeVar("T")


@contextmanager
def one_thread() -> Iterator[None]:
    """Torch's intra-op threads set to one inside the block, restored after (also on error)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def copy_model(model: T) -> T:
    """``copy.deepcopy(model)``, its tensors copied on one thread (see the module docstring)."""
    with one_thread():
        return copy.deepcopy(model)
