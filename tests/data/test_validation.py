"""The validation split holds out TRAINING identities and never scores a test set or an unseen domain."""

from __future__ import annotations

from pathlib import Path

import pytest

from secfed.config import ConfigError, RunConfig
from secfed.data.types import ReidDataset, Sample
from secfed.data.validation import ValidationSplitError, validation_split
from secfed.federation.builder import RunData, _validation


def _domain(name: str, train_ids: int, cameras: int = 2) -> ReidDataset:
    train = [Sample(Path(f"{name}/t{p}_{c}_{i}.jpg"), p, c) for p in range(train_ids) for c in range(cameras)
             for i in range(2)]
    test = [Sample(Path(f"{name}/q{p}.jpg"), 1000 + p, 0) for p in range(3)]
    return ReidDataset(name, train, test, test)


def test_held_out_identities_leave_training_and_form_query_and_gallery() -> None:
    split = validation_split(_domain("a", 10), 0.3)
    held = {s.pid for s in split.query}
    assert len(held) == 3 and held.isdisjoint({s.pid for s in split.train})
    assert {s.pid for s in split.gallery} == held  # no test identity (>= 1000) is scored
    # Every query has a true match: the same identity under another camera in the gallery.
    assert all(any(g.pid == q.pid and g.camid != q.camid for g in split.gallery) for q in split.query)
    assert len(split.train) + len(split.gallery) == len(_domain("a", 10).train)


def test_single_camera_domain_cannot_be_split() -> None:
    with pytest.raises(ValidationSplitError, match="two cameras"):
        validation_split(_domain("b", 5, cameras=1), 0.2)


def test_validation_drops_unseen_domains_and_is_off_by_default() -> None:
    data = RunData([_domain("a", 10)], [_domain("unseen", 4)], [], {})
    assert _validation(RunConfig(), data) is data  # default: existing runs unchanged
    cfg = RunConfig()
    cfg.data.validation = 0.25
    tuned = _validation(cfg, data)
    assert tuned.unseen == [] and tuned.info["validation"] == 0.25
    assert all(s.pid < 1000 for s in tuned.trained[0].query)
    cfg_bad = RunConfig()
    cfg_bad.data.validation = 0.5
    with pytest.raises(ConfigError, match="data.validation"):
        _validation(cfg_bad, RunData([_domain("c", 4, cameras=1)], [], [], {}))
