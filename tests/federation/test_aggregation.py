"""Aggregation arithmetic: the plain channel, FedPav's weighted mean, cohort selection, the LR schedule."""

from __future__ import annotations

import pytest
import torch

from secfed.algorithms.base import step_lr, weighted_mean_step
from secfed.algorithms.fedpav import FedPav
from secfed.config import PrivacyConfig
from secfed.federation.channel import PlainChannel
from secfed.federation.messages import Aggregate, Broadcast, Upload
from secfed.federation.server import Server, select_clients
from secfed.models.reid import ReIDModel
from secfed.models.sharing import shared_layout
from secfed.privacy.policy import resolve
from secfed.privacy.round import RoundPrivacy


def _broadcast(weights: torch.Tensor) -> Broadcast:
    return Broadcast(round=0, weights=weights, layout_id="x", weight_scale=0.1)


def _no_privacy(layout_mask: torch.Tensor) -> RoundPrivacy:
    plan = resolve(PrivacyConfig(), num_clients=2, clients_per_round=0, rounds=1, aggregation="weighted",
                   secagg=False, bn_stats="shared")
    return RoundPrivacy.from_plan(plan, layout_mask, run_seed=0)


def test_plain_channel_sums_weighted_updates_of_survivors() -> None:
    w = torch.zeros(3)
    uploads = [
        Upload(0, 0, torch.tensor([1.0, 2.0, 3.0]), 0.5, b""),
        Upload(1, 0, torch.tensor([-1.0, 0.0, 1.0]), 0.25, b""),
        Upload(2, 0, torch.tensor([100.0, 100.0, 100.0]), 0.25, b""),
    ]
    agg = PlainChannel().aggregate(_broadcast(w), uploads, dropouts={2: "upload"})
    assert torch.allclose(agg.total, torch.tensor([0.25, 1.0, 1.75]))
    assert agg.weight == pytest.approx(0.75)
    assert agg.contributors == (0, 1)
    assert agg.bytes_up == 2 * (3 * 4 + 8)
    assert agg.bytes_down == 3 * (3 * 4 + 64)


def test_weighted_mean_is_fedpav_nk_over_n() -> None:
    # two clients with 30 and 10 images: w' = w + (30·Δ1 + 10·Δ2) / 40
    w = torch.tensor([1.0, 1.0])
    d1, d2 = torch.tensor([0.4, 0.0]), torch.tensor([0.0, -0.8])
    agg = Aggregate(0, total=30 * d1 + 10 * d2, weight=40.0, contributors=(0, 1), bytes_up=0, bytes_down=0)
    assert torch.allclose(weighted_mean_step(w, agg), torch.tensor([1.3, 0.8]))


def test_server_keeps_weights_when_nobody_contributed() -> None:
    model = ReIDModel("resnet18", 3)
    layout = shared_layout(model, False, "shared")
    weights = layout.flatten(model.state_dict())
    server = Server(layout, weights.clone(), weighted_mean_step, FedPav.aggregation_weight, weight_scale=0.01,
                    enrolled={0: 30, 1: 70}, weighted=True, privacy=_no_privacy(layout.trainable_mask()))
    server.apply(Aggregate(0, torch.zeros_like(weights), 0.0, (), 0, 0))
    assert torch.equal(server.weights, weights)
    b = server.broadcast(4)
    assert b.round == 4 and b.layout_id == layout.fingerprint() and torch.equal(b.weights, weights)
    assert server.weight_of(0) == pytest.approx(0.3) and server.weight_of(1) == pytest.approx(0.7)


def test_fixed_selection_is_seeded_k_of_n() -> None:
    a = select_clients(10, 3, run_seed=1, clients_per_round=4)
    assert a == select_clients(10, 3, run_seed=1, clients_per_round=4)
    assert len(set(a)) == 4 and a == sorted(a) and all(0 <= k < 10 for k in a)
    rounds = [tuple(select_clients(10, t, 1, clients_per_round=4)) for t in range(20)]
    assert len(set(rounds)) > 10  # a different cohort most rounds
    assert select_clients(5, 0, 1) == [0, 1, 2, 3, 4]


def test_step_schedule_decays_across_rounds() -> None:
    assert step_lr(0.05, 0, 40, 0.1) == 0.05
    assert step_lr(0.05, 39, 40, 0.1) == 0.05
    assert step_lr(0.05, 40, 40, 0.1) == pytest.approx(0.005)
    assert step_lr(0.05, 85, 40, 0.1) == pytest.approx(0.0005)


def test_round_schedule_defaults_and_pretrained_rates() -> None:
    from secfed.config import RunConfig
    from secfed.federation.runtime import schedule_for

    cfg = RunConfig()  # 16 rounds from scratch: every layer at 0.02, one decay at round index 12
    assert (schedule_for(cfg, 0).lr_new, schedule_for(cfg, 0).lr_backbone) == (0.02, 0.02)
    assert schedule_for(cfg, 11).lr_new == 0.02
    assert schedule_for(cfg, 12).lr_new == pytest.approx(0.002)
    cfg.model.pretrained = True  # FedReIDBench's rates for an ImageNet backbone
    cfg.train.lr_step = 40
    assert (schedule_for(cfg, 0).lr_new, schedule_for(cfg, 0).lr_backbone) == (0.05, 0.005)
    assert schedule_for(cfg, 45).lr_backbone == pytest.approx(0.0005)
