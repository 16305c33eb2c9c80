from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from secfed.privacy.clipping import clip_l2, l2_norm


def test_known_answer_3_4_5() -> None:
    clipped, before = clip_l2(torch.tensor([3.0, 4.0]), 1.0)
    assert before == 5.0
    assert torch.allclose(clipped, torch.tensor([0.6, 0.8]))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("scale", [1e-3, 0.999, 1.0, 1.001, 7.0, 1e6])
def test_clipped_norm_never_exceeds_bound(dtype: torch.dtype, scale: float) -> None:
    generator = torch.Generator().manual_seed(0)
    for dim in (1, 17, 100_003):
        update = torch.randn(dim, generator=generator, dtype=dtype)
        update = update * (scale * 2.5 / l2_norm(update))
        clipped, before = clip_l2(update, 2.5)
        assert math.isclose(before, l2_norm(update))
        assert l2_norm(clipped) <= 2.5
        assert clipped.dtype == dtype
        if before <= 2.5:
            assert torch.equal(clipped, update)
        else:
            assert l2_norm(clipped) == pytest.approx(2.5, rel=1e-6)
            cosine = torch.nn.functional.cosine_similarity(clipped.double(), update.double(), dim=0)
            assert float(cosine) == pytest.approx(1.0, abs=1e-9)


@settings(max_examples=200, deadline=None)
@given(
    arrays(np.float32, st.integers(1, 64), elements=st.floats(-1e6, 1e6, width=32)),
    st.floats(1e-6, 1e3),
)
def test_bound_holds_for_arbitrary_vectors(values: np.ndarray, bound: float) -> None:
    clipped, _ = clip_l2(torch.from_numpy(values), bound)
    assert l2_norm(clipped) <= bound


def test_input_is_not_modified() -> None:
    update = torch.full((10,), 3.0)
    copy = update.clone()
    clip_l2(update, 1.0)
    assert torch.equal(update, copy)


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_non_finite_update_is_refused(bad: float) -> None:
    with pytest.raises(ValueError, match="NaN or infinite"):
        clip_l2(torch.tensor([1.0, bad]), 1.0)


@pytest.mark.parametrize("bound", [0.0, -1.0, float("inf"), float("nan")])
def test_bad_bound_is_refused(bound: float) -> None:
    with pytest.raises(ValueError, match="clip norm"):
        clip_l2(torch.ones(3), bound)


def test_integer_update_is_refused() -> None:
    with pytest.raises(TypeError):
        clip_l2(torch.ones(3, dtype=torch.int64), 1.0)
