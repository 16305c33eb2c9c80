"""A method's rules are its own declarations, read through the registry: a method registered under
any name gets the learning rates its paper fixes, its DFS channel planned and stated, and its
refusals checked, with no line naming it outside its class."""

from __future__ import annotations

import pytest

from secfed.algorithms import METHODS
from secfed.algorithms.dfh import DFH
from secfed.algorithms.fedreid import FedReID
from secfed.config import RunConfig
from secfed.errors import ConfigError
from secfed.federation.runtime import schedule_for
from secfed.privacy.dfs import dfs_settings
from secfed.validation import check


def _registered(monkeypatch: pytest.MonkeyPatch, base: type, **declarations: object) -> RunConfig:
    """A subclass of ``base`` with ``declarations``, registered under a new name; a config choosing it."""
    monkeypatch.setitem(METHODS, "renamed", type("Renamed", (base,), {"name": "renamed", **declarations}))
    cfg = RunConfig()
    cfg.method.algorithm = "renamed"
    return cfg


def test_a_methods_declared_learning_rates_are_the_schedules_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    """FedReID's rates follow its class under another name; a given `schedule.lr` still wins."""
    cfg = _registered(monkeypatch, FedReID)
    assert (schedule_for(cfg, 0).lr_new, schedule_for(cfg, 0).lr_backbone) == FedReID.learning_rates
    cfg.schedule.lr = 0.07
    assert schedule_for(cfg, 0).lr_new == 0.07 and schedule_for(cfg, 0).lr_backbone == FedReID.learning_rates[1]
    plain = _registered(monkeypatch, FedReID, learning_rates=None)
    assert (schedule_for(plain, 0).lr_new, schedule_for(plain, 0).lr_backbone) == (0.02, 0.02)  # from scratch


def test_what_a_method_shares_in_the_clear_decides_its_dfs_channel(monkeypatch: pytest.MonkeyPatch) -> None:
    """DFH's DFS channel is planned for any method declaring DFS, and for no other (DFH renamed to no DFS)."""
    cfg = _registered(monkeypatch, DFH)
    cfg.method.dfs_noise = 1.5
    assert dfs_settings(cfg, METHODS["renamed"]) == (1.5, cfg.method.dfs_clip)
    silent = _registered(monkeypatch, DFH, shared_in_clear=())
    assert dfs_settings(silent, METHODS["renamed"]) is None


def test_dfh_refusals_hold_under_another_name(monkeypatch: pytest.MonkeyPatch) -> None:
    """DFH's own refusal (noised DFS need shared BatchNorm statistics) comes with its class."""
    cfg = _registered(monkeypatch, DFH)
    cfg.method.dfs_noise, cfg.model.bn_stats = 1.0, "local"
    with pytest.raises(ConfigError, match="treats the feature extractor as public"):
        check(cfg)
