"""Randomised Hadamard rotation: x ↦ H·D·x, with D a diagonal of random signs, H the normalised
Walsh–Hadamard matrix (H = Hᵀ = H⁻¹, entries ±1/√d).

Used by the distributed discrete mechanism to spread a vector's energy evenly over coordinates, so
that each coordinate of the (scaled, integer) sum is small with high probability and fits the ring
Z_{2^b}. The signs need not be secret — the rotation protects utility (no wrap-around), not privacy —
so they come from a public per-round seed that every client and the server derive alike.
"""

from __future__ import annotations

import math

import numpy as np


def padded_size(dim: int) -> int:
    """The smallest power of two ≥ ``dim`` (the Hadamard transform's length)."""
    if dim < 1:
        raise ValueError(f"dimension must be ≥ 1, got {dim}")
    return 1 << (dim - 1).bit_length()


def fwht(x: np.ndarray) -> np.ndarray:
    """Normalised fast Walsh–Hadamard transform H·x of a float64 vector of power-of-two length.

    O(d log d); H is orthonormal and its own inverse, so ``fwht(fwht(x)) == x`` up to rounding.
    """
    n = x.shape[0]
    if x.ndim != 1 or n & (n - 1):
        raise ValueError(f"fwht needs a 1-D vector of power-of-two length, got shape {x.shape}")
    y = np.array(x, dtype=np.float64, copy=True)
    half = 1
    while half < n:
        pairs = y.reshape(-1, 2, half)
        top = pairs[:, 0, :].copy()
        pairs[:, 0, :] += pairs[:, 1, :]
        np.subtract(top, pairs[:, 1, :], out=pairs[:, 1, :])
        half *= 2
    y *= 1.0 / math.sqrt(n)
    return y


def random_signs(size: int, seed: int) -> np.ndarray:
    """The diagonal of D: ``size`` independent ±1.0 from a public seed."""
    bits = np.random.default_rng(seed).integers(0, 2, size=size, dtype=np.int8)
    return (2.0 * bits - 1.0).astype(np.float64)


def rotate(x: np.ndarray, seed: int) -> np.ndarray:
    """H·D·[x, 0…]: ``x`` zero-padded to a power of two, then rotated."""
    n = padded_size(x.shape[0])
    padded = np.zeros(n, dtype=np.float64)
    padded[: x.shape[0]] = x
    return fwht(padded * random_signs(n, seed))


def unrotate(y: np.ndarray, seed: int, dim: int) -> np.ndarray:
    """(H·D)⁻¹·y = D·H·y, truncated to the first ``dim`` coordinates (the padding is dropped)."""
    return (fwht(y) * random_signs(y.shape[0], seed))[:dim]
