"""Aggregation arithmetic: the plain channel over named summands, FedPav's weighted mean, the server
side, cohort selection, the LR schedule."""

from __future__ import annotations

import pytest
import torch

from secfed.algorithms.base import step_lr
from secfed.algorithms.fedpav import FedPav
from secfed.config import PrivacyConfig, RunConfig
from secfed.federation import codec
from secfed.federation.channel import PlainChannel
from secfed.federation.messages import MODEL, Aggregate, Broadcast, Summand, Upload
from secfed.federation.server import ServerSide, select_clients, weighted_mean
from secfed.privacy.noise import NoiseSource
from secfed.privacy.policy import resolve
from secfed.privacy.round import ServerPrivacy


def _broadcast(weights: torch.Tensor) -> Broadcast:
    return Broadcast(round=0, weights=weights, layout_id="x")


def _no_privacy(layout_mask: torch.Tensor) -> ServerPrivacy:
    plan = resolve(PrivacyConfig(), num_clients=2, clients_per_round=0, rounds=1, aggregation="weighted",
                   secagg=False, bn_stats="shared")
    return ServerPrivacy.from_plan(plan, layout_mask, 0, NoiseSource(0))


def test_plain_channel_sums_every_named_vector_with_its_weight_and_passes_shared_payloads() -> None:
    w = torch.zeros(3)
    uploads = [
        Upload(0, 0, {MODEL: Summand(torch.tensor([1.0, 2.0, 3.0]), 0.5), "kd": Summand(torch.ones(2))},
               {"dfs": torch.tensor([7.0])}),
        Upload(1, 0, {MODEL: Summand(torch.tensor([-1.0, 0.0, 1.0]), 0.25), "kd": Summand(torch.ones(2) * 3)}),
        Upload(2, 0, {MODEL: Summand(torch.tensor([100.0, 100.0, 100.0]), 0.25), "kd": Summand(torch.zeros(2))}),
    ]
    agg = PlainChannel().aggregate(_broadcast(w), uploads, dropouts={2: "upload"}, broadcast_bytes=100)
    assert torch.allclose(agg.sums[MODEL], torch.tensor([0.25, 1.0, 1.75]))
    assert agg.weights[MODEL] == pytest.approx(0.75)
    assert torch.equal(agg.sums["kd"], torch.tensor([4.0, 4.0])) and agg.weights["kd"] == 2.0
    assert agg.contributors == (0, 1)
    assert torch.equal(agg.shared[0]["dfs"], torch.tensor([7.0])) and agg.shared[1] == {}
    assert agg.bytes_down == 300 and agg.bytes_up == sum(len(codec.encode_upload(u)) for u in uploads[:2])


def test_clients_must_sum_the_same_vectors() -> None:
    uploads = [Upload(0, 0, {MODEL: Summand(torch.zeros(3))}), Upload(1, 0, {MODEL: Summand(torch.zeros(4))})]
    with pytest.raises(ValueError, match="same named vectors"):
        PlainChannel().aggregate(_broadcast(torch.zeros(3)), uploads, {}, broadcast_bytes=0)


def test_weighted_mean_is_fedpav_nk_over_n() -> None:
    # two clients with 30 and 10 images: w' = w + (30·Δ1 + 10·Δ2) / 40
    w = torch.tensor([1.0, 1.0])
    d1, d2 = torch.tensor([0.4, 0.0]), torch.tensor([0.0, -0.8])
    agg = Aggregate(0, {MODEL: 30 * d1 + 10 * d2}, {MODEL: 40.0}, (0, 1))
    assert torch.allclose(weighted_mean(w, agg, None), torch.tensor([1.3, 0.8]))
    assert torch.allclose(weighted_mean(w, agg, denominator=4.0), w + (30 * d1 + 10 * d2) / 4)  # DP's fixed W


def test_server_keeps_weights_when_nobody_contributed() -> None:
    method = FedPav(RunConfig())
    model = method.build_model(3)
    layout = method.layout(model)
    weights = layout.flatten(model.state_dict())
    server = ServerSide(method, layout, weights.clone(), _no_privacy(layout.trainable_mask()), enrolled={0: 30, 1: 70},
                        weight_scale=0.01)
    server.apply(Aggregate(0, {MODEL: torch.zeros_like(weights)}, {MODEL: 0.0}, ()))
    assert torch.equal(server.weights, weights)
    b = server.broadcast(4)
    assert b.round == 4 and b.layout_id == layout.fingerprint() and torch.equal(b.weights, weights)
    assert server.public_weight(0) == pytest.approx(0.3) and server.public_weight(1) == pytest.approx(0.7)


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
    from secfed.federation.runtime import schedule_for

    cfg = RunConfig()  # 16 rounds from scratch: every layer at 0.02, one decay at round index 12
    assert (schedule_for(cfg, 0).lr_new, schedule_for(cfg, 0).lr_backbone) == (0.02, 0.02)
    assert schedule_for(cfg, 11).lr_new == 0.02
    assert schedule_for(cfg, 12).lr_new == pytest.approx(0.002)
    cfg.model.pretrained = True  # FedReIDBench's rates for an ImageNet backbone
    cfg.schedule.lr_step = 40
    assert (schedule_for(cfg, 0).lr_new, schedule_for(cfg, 0).lr_backbone) == (0.05, 0.005)
    assert schedule_for(cfg, 45).lr_backbone == pytest.approx(0.0005)
    cfg.method.algorithm = "fedreid"  # Wu & Gong: 0.1 for the mapping network, 0.01 for the embedding
    assert (schedule_for(cfg, 0).lr_new, schedule_for(cfg, 0).lr_backbone) == (0.1, 0.01)
