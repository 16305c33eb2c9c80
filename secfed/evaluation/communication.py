"""Communication cost as FedReIDBench counts it (Zhuang et al., MM 2020, §3.5).

"The number of communication rounds times twice the model size (uploading and downloading)":
every round a client downloads the shared model and uploads its update of the same size.
"""

from __future__ import annotations

import numbers


_UNITS = ("KiB", "MiB", "GiB", "TiB", "PiB")


def communication_cost(rounds: int, shared_bytes: int) -> int:
    """Bytes moved per client over ``rounds`` rounds: rounds × 2 × size of the shared model."""
    _check_count(rounds, "rounds")
    _check_count(shared_bytes, "shared_bytes")
    return int(rounds) * 2 * int(shared_bytes)


def format_bytes(num_bytes: int) -> str:
    """Binary units with two decimals: ``512 B``, ``1.50 KiB``, ``1.23 GiB``."""
    _check_count(num_bytes, "num_bytes")
    if num_bytes < 1024:
        return f"{num_bytes} B"
    value, unit = num_bytes / 1024, 0
    while round(value, 2) >= 1024 and unit < len(_UNITS) - 1:  # 1048575 B is 1.00 MiB, not 1024.00 KiB
        value, unit = value / 1024, unit + 1
    return f"{value:.2f} {_UNITS[unit]}"


def _check_count(value: numbers.Integral, name: str) -> None:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 0:
        raise ValueError(f"{name} must be a non-negative integer, got {value!r}")
