"""Where privacy noise comes from: a cryptographically secure generator that nothing in a run
directory can reproduce.

Every Gaussian, Skellam and β draw that a privacy claim rests on comes from a
:class:`NoiseSource`. By default each generator is numpy's ``Generator`` over randomgen's
``AESCounter`` bit generator (AES-128 in counter mode, AES-NI) keyed with 128 bits of fresh OS
entropy (``secrets``): a party that knows the run seed, the checkpoints or the logs cannot
regenerate the noise and subtract it. Keys live in memory only for the draw they serve.

``reproducible=True`` (``--reproducible-noise``) keys the same generators from the run seed
instead, for experiments that must repeat bit for bit; such a run is **not private** and every
output of it says so.

Why these parts: randomgen (maintained by numpy's random-module maintainer) supplies the AES
counter bit generator, and numpy's own samplers turn it into normals and Poissons, so nothing
statistical is written here. Gaussian noise uses the sum-of-four trick of Opacus' ``secure_mode``
(Holohan & Braghin 2021, §5.1): the sum of 2n = 4 draws scaled by 1/√(2n) = 1/2 (their mean times 2,
so the variance is unchanged) resists the floating-point attacks on a single rounded Gaussian draw
(Mironov 2012; Haney et al. 2022).
"""

from __future__ import annotations

import hashlib
import secrets

import numpy as np
import randomgen
import torch


class NoiseSource:
    """A factory of noise generators: fresh OS entropy (private), or keyed by the run seed (not private)."""

    def __init__(self, run_seed: int, *, reproducible: bool = False) -> None:
        self.run_seed = int(run_seed)
        self.reproducible = reproducible

    @property
    def secure(self) -> bool:
        return not self.reproducible

    def generator(self, purpose: str, *indices: int) -> np.random.Generator:
        """A numpy Generator over AES-CTR: a fresh random key, or (reproducible) one derived from
        (run seed, purpose, indices)."""
        return self.from_key(self.key(purpose, *indices))

    def key(self, purpose: str, *indices: int) -> int:
        """A 128-bit generator key, to be kept in memory while the same noise must be drawn again."""
        if self.reproducible:
            text = f"secfed/noise/{self.run_seed}/{purpose}/" + "/".join(str(int(i)) for i in indices)
            return int.from_bytes(hashlib.sha256(text.encode()).digest()[:16], "little")
        return secrets.randbits(128)

    @staticmethod
    def from_key(key: int) -> np.random.Generator:
        return np.random.Generator(randomgen.AESCounter(key=key))


def gaussian(shape: tuple[int, ...] | torch.Size, std: float, generator: np.random.Generator,
             *, device: torch.device | str = "cpu") -> torch.Tensor:
    """N(0, std²) of ``shape`` as float32, floating-point hardened (mean of four draws × 2, i.e. the
    sum of four N(0, std²) draws halved: the same distribution, without the low-bit signature)."""
    n = int(np.prod(shape)) if len(shape) else 1
    if std == 0:
        return torch.zeros(shape, dtype=torch.float32, device=device)
    total = generator.standard_normal(n, dtype=np.float32)
    draw = np.empty(n, dtype=np.float32)
    for _ in range(3):
        total += generator.standard_normal(out=draw, dtype=np.float32)
    total *= np.float32(std / 2)
    return torch.from_numpy(total).reshape(shape).to(device)
