"""``flower-overflow`` section: where Flower's SecAgg+ defaults wrap the aggregate, from its own
quantize/dequantize."""

from __future__ import annotations

import numpy as np

from .flower import flower_available


def section_flower_overflow(args) -> None:
    print("\n== flower-overflow: Flower SecAgg+ defaults (clipping_range 8, quantization_range 2^22, "
          "modulus_range 2^32)")
    if not flower_available():
        print("  flwr not installed")
        return
    from flwr.common.secure_aggregation.quantization import dequantize, quantize

    clip, qrange, modulus = 8.0, 1 << 22, 1 << 32
    print(f"  each value is quantized into [0, {qrange:,}]; the aggregate is taken mod {modulus:,}: it wraps once "
          f"n·(quantized values) ≥ 2^32 — at n ≥ {modulus // qrange:,} for updates at +clip (worst case), "
          f"n ≥ {modulus // (qrange // 2):,} for updates centred on 0")
    d = 1000
    for n in (1000, 1023, 1024, 2000, 2047, 2048, 2100, 2200):
        updates = np.random.default_rng(n).normal(0.0, 0.05, (n, d))
        total = np.zeros(d, dtype=np.int64)
        for row in updates:
            total = (total + quantize([row], clip, qrange)[0]) % modulus
        mean = (dequantize([total], clip, qrange)[0] - (n - 1) * clip) / n  # the workflow's offset
        err = float(np.max(np.abs(mean - updates.mean(axis=0))))
        worst = (n * qrange) % modulus != n * qrange
        print(f"  n = {n:5d}: centred updates decode with max error {err:9.4f} "
              f"({'wrapped' if err > 1e-3 else 'ok'}); updates at +clip would {'wrap' if worst else 'fit'}")
    print("  (Flower warns only when num_shares > modulus_range / quantization_range; it does not refuse the "
          "cohort. secfed sizes the scale to the cohort and refuses an overflowing one, naming the largest safe "
          "cohort: Quantizer.for_cohort, protocols.largest_cohort)")
