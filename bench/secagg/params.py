"""``--sections params``: what choosing a session's parameters costs (SECURITY.md: "choose_params computes
a row in ... at n = 100,000"), each n fresh in this process, both modes at the default rates."""

from __future__ import annotations

import time

from secfed.protocols import choose_params

SIZES = (100, 1_000, 10_000, 100_000)


def section_params(args) -> None:
    print("\n== params: choose_params(n) at δ = 0.1, γ = 0.2, milliseconds (best of 5)")
    for n in SIZES:
        cells = []
        for authenticated in (True, False):
            best = min(_timed(n, authenticated) for _ in range(5))
            params = choose_params(n, authenticated=authenticated)
            cells.append(f"{'auth' if authenticated else 'unauth'} k = {params.degree}, t = {params.threshold}: "
                         f"{1e3 * best:.1f} ms")
        print(f"   n = {n:>7,}: " + "; ".join(cells))


def _timed(n: int, authenticated: bool) -> float:
    start = time.perf_counter()
    choose_params(n, authenticated=authenticated)
    return time.perf_counter() - start
