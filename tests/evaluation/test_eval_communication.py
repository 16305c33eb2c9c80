"""Communication cost (MM'20 §3.5) and byte formatting: known answers and refusals."""

from __future__ import annotations

import numpy as np
import pytest

from secfed.evaluation.communication import communication_cost, format_bytes


def test_rounds_times_two_times_model_size() -> None:
    assert communication_cost(300, 10_000) == 6_000_000
    assert communication_cost(0, 10_000) == 0
    assert communication_cost(np.int64(3), 7) == 42


@pytest.mark.parametrize(
    ("rounds", "size", "name"), [(-1, 10, "rounds"), (2.0, 10, "rounds"), (2, True, "shared_bytes")]
)
def test_refuses_non_counts(rounds, size, name: str) -> None:
    with pytest.raises(ValueError, match=f"{name} must be a non-negative integer"):
        communication_cost(rounds, size)


@pytest.mark.parametrize(
    ("num_bytes", "text"),
    [
        (0, "0 B"),
        (1023, "1023 B"),
        (1024, "1.00 KiB"),
        (1536, "1.50 KiB"),
        (2**20 - 1, "1.00 MiB"),  # rounds up to the next unit instead of "1024.00 KiB"
        (int(1.23 * 2**30), "1.23 GiB"),
        (5 * 2**50, "5.00 PiB"),
        (2**60, "1024.00 PiB"),
    ],
)
def test_format_bytes(num_bytes: int, text: str) -> None:
    assert format_bytes(num_bytes) == text
