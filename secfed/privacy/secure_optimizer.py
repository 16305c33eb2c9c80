"""Opacus' DPOptimizer with secfed's noise: imported by :func:`secfed.privacy.dpsgd.make_private` only.

It subclasses Opacus at class definition, so importing it imports Opacus (about a second, SciPy
included); keeping it out of :mod:`secfed.privacy.dpsgd` lets ``import secfed.privacy`` — every run,
every Flower ClientApp message — skip Opacus unless DP-SGD actually trains.
"""

from __future__ import annotations

import numpy as np
from opacus.optimizers import DPOptimizer

from secfed.privacy.noise import gaussian


class SecureNoiseDPOptimizer(DPOptimizer):
    """Opacus' DPOptimizer whose Gaussian noise comes from a :class:`~secfed.privacy.noise.NoiseSource`
    generator (AES-CTR keyed by OS entropy, floating-point hardened) instead of torch's generator —
    Opacus' own ``secure_mode`` needs torchcsprng, which is no longer maintained.

    A ``p.grad`` present when the step starts is the gradient of train_loop's data-independent
    ``penalty`` (per-example gradients live in ``p.grad_sample``; the loop refuses any other): it is
    added to the clipped, noised gradient — post-processing of the private release, so it costs no
    privacy — where Opacus would overwrite it.
    """

    def __init__(self, *args, noise_generator: np.random.Generator, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.noise_generator = noise_generator

    def add_noise(self) -> None:
        std = self.noise_multiplier * self.max_grad_norm
        # Opacus marks a noised sum with its private helpers; the same guard through our own attribute
        # (a sum noised twice means zero_grad was skipped between two steps).
        for p in self.params:
            if getattr(p.summed_grad, "_secfed_noised", False):
                raise ValueError("gradients were not cleared since the last DP-SGD step: call zero_grad() every step")
            penalty = p.grad
            noise = gaussian(tuple(p.summed_grad.shape), std, self.noise_generator, device=p.summed_grad.device)
            p.grad = (p.summed_grad + noise.to(p.summed_grad.dtype)).view_as(p)
            if penalty is not None:  # scale_grad divides p.grad by the expected batch size next
                p.grad.add_(penalty, alpha=self.expected_batch_size * self.accumulated_iterations)
            p.summed_grad._secfed_noised = True
