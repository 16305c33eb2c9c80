"""secfed.models.copying: a model copy made on one thread is exact, and the thread count comes back."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from secfed.models.copying import copy_model, one_thread


class _Spy(nn.Module):
    """Records torch's intra-op thread count at the moment it is copied."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(64, 32))
        self.seen: list[int] = []

    def __deepcopy__(self, memo):
        self.seen.append(torch.get_num_threads())
        clone = _Spy.__new__(_Spy)
        nn.Module.__init__(clone)
        clone.weight = nn.Parameter(self.weight.detach().clone())
        clone.seen = []
        return clone


def test_a_model_is_copied_exactly_on_one_thread_and_the_thread_count_is_restored():
    before = torch.get_num_threads()
    spy = _Spy()
    clone = copy_model(spy)
    assert spy.seen == [1] and torch.get_num_threads() == before
    assert torch.equal(clone.weight, spy.weight) and clone.weight.data_ptr() != spy.weight.data_ptr()


def test_the_thread_count_is_restored_when_the_block_fails():
    before = torch.get_num_threads()
    with pytest.raises(RuntimeError), one_thread():
        raise RuntimeError("a copy that fails")
    assert torch.get_num_threads() == before
