"""Every random choice in a run flows from the run seed through :func:`derive_seed`.

Seeds are derived by hashing (run seed, purpose, indices), not by drawing from a shared RNG, so a
client's round-t randomness does not depend on how many numbers anyone drew before it. That is
what makes ``--resume`` bit-identical and lets clients be trained in any order.
"""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import torch


def derive_seed(run_seed: int, purpose: str, *indices: int) -> int:
    """A 63-bit seed for ``purpose`` at ``indices`` (e.g. ``("train", round, client)``)."""
    msg = f"secfed/{int(run_seed)}/{purpose}/" + "/".join(str(int(i)) for i in indices)
    return int.from_bytes(hashlib.sha256(msg.encode()).digest()[:8], "little") >> 1


def numpy_rng(run_seed: int, purpose: str, *indices: int) -> np.random.Generator:
    """A numpy Generator seeded by :func:`derive_seed` (for training-side randomness, never crypto)."""
    return np.random.default_rng(derive_seed(run_seed, purpose, *indices))


def torch_generator(run_seed: int, purpose: str, *indices: int) -> torch.Generator:
    """A CPU torch Generator seeded by :func:`derive_seed` (training-side randomness, never crypto)."""
    import torch  # here, not at the top: this module is imported where torch must not be required

    generator = torch.Generator()
    generator.manual_seed(derive_seed(run_seed, purpose, *indices))
    return generator
