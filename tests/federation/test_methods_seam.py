"""The methods on the round seam: what each one shares, how KD and CDW ride inside the masked sum,
and what the server side of a KD + CDW round sees (sums only)."""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import pytest
import torch

from secfed import protocols
from secfed.algorithms.base import Method, flat_state
from secfed.algorithms.cdw import CosineDistanceWeight, cosine_distance_weight
from secfed.algorithms.fedpav import FedPav
from secfed.algorithms.kd import KD, soft_labels
from secfed.config import RunConfig
from secfed.federation import codec
from secfed.federation.builder import build
from secfed.federation.messages import MODEL, TrainStats
from secfed.federation.runtime import run, schedule_for, train_seed
from secfed.federation.secure_channel import ring_shape
from secfed.models.sharing import load_shared
from secfed.protocols.secagg.messages import MaskedInput


def _kd_cdw(cfg: RunConfig, synth_root: Path) -> RunConfig:
    cfg.method.kd = True
    cfg.method.kd_public = str(synth_root / "public")  # unlabelled images of other people
    cfg.method.kd_images = 24
    cfg.method.cdw = True
    cfg.secagg.enabled = True
    cfg.run.local_baseline = False
    return cfg


def test_a_kd_cdw_round_shows_the_server_only_sums(tiny_config: RunConfig, synth_root: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = _kd_cdw(tiny_config, synth_root)
    fed = build(cfg)
    broadcast = fed.server.broadcast(0)
    uploads = [c.step(codec.decode_broadcast(codec.encode_broadcast(broadcast)), schedule_for(cfg, 0),
                      train_seed(cfg, 0, c.site.id))[0] for c in fed.clients]
    cdw = [u.summed[MODEL].weight for u in uploads]
    assert len(set(cdw)) == len(cdw) and all(0 < m < 2 for m in cdw)  # m_k: client-computed, per client
    assert all(u.summed[KD].vector.numel() == 24 * cfg.model.neck_dim for u in uploads)

    seen: list[object] = []  # every message the protocol server receives
    receive = protocols.SecAggServer.receive

    def spy(self: protocols.SecAggServer, message: object) -> None:
        seen.append(message)
        receive(self, message)

    monkeypatch.setattr(protocols.SecAggServer, "receive", spy)
    aggregate = fed.channel.aggregate(broadcast, uploads, {}, broadcast_bytes=0)

    # the masked inputs are indistinguishable from uniform: no coordinate of a client's plaintext survives
    masked = [m.vector for m in seen if isinstance(m, MaskedInput)]
    assert len(masked) == len(uploads)
    rng = np.random.default_rng(0)
    for upload, vector in zip(sorted(uploads, key=lambda u: u.client_id), masked):
        plain = fed.channel.layout(ring_shape(upload)).ring_vector(upload, rng)[0]
        assert np.mean(plain == vector) < 1e-3
    # what reaches the server side: one sum and one total weight per name, never a per-client m_k or vector
    assert set(aggregate.sums) == {MODEL, KD} and aggregate.contributors == (0, 1, 2)
    assert aggregate.weights[MODEL] == pytest.approx(sum(cdw), abs=1e-5)
    assert all(abs(aggregate.weights[MODEL] - m) > 1e-3 for m in cdw)
    truth = sum(u.summed[KD].vector for u in uploads)
    assert torch.allclose(aggregate.sums[KD], truth, atol=1e-3)
    for upload in uploads:
        assert not torch.allclose(aggregate.sums[KD], upload.summed[KD].vector, atol=1e-2)


def test_cdw_weight_is_the_mean_cosine_distance_and_leaves_batchnorm_alone(tiny_config: RunConfig) -> None:
    a = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    b = torch.tensor([[1.0, 0.0], [1.0, 0.0]])
    assert cosine_distance_weight(a, b) == pytest.approx(0.5)  # (0 + 1) / 2

    class NoTraining(FedPav):  # so that only CDW's own passes could move anything
        def local_train(self, *args: object, **kwargs: object) -> TrainStats:
            return TrainStats(0.0, 0.0, 0, 0)

    fed = build(tiny_config)
    site, broadcast = fed.clients[0].site, fed.server.broadcast(0)
    contribution = CosineDistanceWeight(NoTraining(tiny_config)).client_step(
        site, broadcast, fed.layout, schedule_for(tiny_config, 0), seed=1)
    assert contribution.summed[MODEL].weight == pytest.approx(0.0, abs=1e-6)  # nothing trained: no change
    received = fed.layout.unflatten(broadcast.weights)
    for key, value in site.model.state_dict().items():
        if "running" in key:  # the reference code's training-mode passes would have moved these
            assert torch.equal(value, received[key]), key


def test_kd_teachers_run_in_eval_mode_without_touching_the_model(tiny_config: RunConfig) -> None:
    fed = build(tiny_config)
    model = fed.clients[0].site.model
    model.train()
    before = copy.deepcopy(model.state_dict())
    images = fed.clients[0].site.images[:8]
    a, b = soft_labels(model, images), soft_labels(model, images)
    assert torch.equal(a, b)  # no dropout in the targets
    assert model.training and all(torch.equal(v, before[k]) for k, v in model.state_dict().items())


def test_kd_transfers_directions_so_a_lagging_batchnorm_cannot_throw_the_server_model(
        tiny_config: RunConfig, synth_root: Path) -> None:
    # From scratch a client's BatchNorm running statistics lag its weights, and its evaluation-mode
    # features on the public set grow long (mean norm 9,638 after round 1 of FedPav+KD at the grid's
    # ×2, seed 7). Regressing those raw features, the server's fine-tuning blew its model up and the
    # run never recovered (rank-1 at chance). Soft labels are directions at unit RMS per coordinate.
    fed = build(_kd_cdw(tiny_config, synth_root))
    kd = fed.method
    model = fed.clients[0].site.model
    neck_bn = [m for m in model.neck.modules() if isinstance(m, torch.nn.BatchNorm1d)][-1]
    neck_bn.running_var.mul_(1e-6)  # statistics far behind the weights: evaluation-mode norm ≈ 2,700
    labels = soft_labels(model, kd.public)
    dim = labels.shape[1]
    assert torch.allclose(labels.norm(dim=1), torch.full((len(labels),), dim ** 0.5))
    assert labels.abs().max() <= dim ** 0.5  # the bound the masked sum quantises them in, no clipping

    weights = fed.server.broadcast(0).weights
    kd.epochs = 3  # 3 steps on the 24 public images
    distilled = kd.distill(weights, labels, round_index=0)
    assert torch.isfinite(distilled).all()
    assert distilled.norm() < 1.05 * weights.norm()  # towards the raw features: ×1.9 in these 3 steps


def test_kd_and_cdw_train_end_to_end_under_secure_aggregation(tiny_config: RunConfig, synth_root: Path,
                                                               tmp_path: Path) -> None:
    cfg = _kd_cdw(tiny_config, synth_root)
    cfg.schedule.rounds = 1
    result = run(cfg, tmp_path / "kd")
    assert result.summary["algorithm"] == "fedpav+cdw+kd" and result.summary["channel"] == "secagg"
    assert result.summary["communication"]["measured_up_bytes"] > 3 * 24 * cfg.model.neck_dim * 4


def test_fedreid_shares_only_the_embedding_and_keeps_expert_and_mapping(tiny_config: RunConfig, tmp_path: Path) -> None:
    tiny_config.method.algorithm = "fedreid"
    tiny_config.schedule.rounds = 1
    tiny_config.run.local_baseline = False
    fed = run(tiny_config, tmp_path / "fedreid").federation
    assert all(name.startswith("backbone.") for name in fed.layout.names)
    site = fed.clients[0].site
    assert "neck.0.weight" in site.model.state_dict()  # the mapping network: FC → BN → ReLU → Dropout
    assert isinstance(site.model.neck[2], torch.nn.ReLU)
    # the retrieval feature is the embedding itself (pool-5), not the mapping network's output
    with torch.no_grad():
        x = torch.randn(2, 3, 32, 16)
        site.model.eval()
        assert torch.equal(site.model.embed(x), site.model.backbone(x))


def test_fedreid_without_its_expert_trains_the_client_model_on_cross_entropy_alone(tiny_config: RunConfig) -> None:
    """(found by review: the paper's ablation, AAAI'21 Fig. 4(d), could not be run — the expert was
    always on) `--no-expert`: the client's update is exactly a plain CE step of its model."""
    tiny_config.method.algorithm = "fedreid"
    tiny_config.method.expert = False
    tiny_config.secagg.enabled = False
    tiny_config.run.local_baseline = False
    fed = build(tiny_config)
    client, broadcast = fed.clients[0], fed.server.broadcast(0)
    schedule, seed = schedule_for(tiny_config, 0), train_seed(tiny_config, 0, client.site.id)
    site = copy.deepcopy(client.site)
    upload, _ = client.step(broadcast, schedule, seed)
    assert "expert" not in client.site.extra  # no copy of the model made for an expert that never trains
    load_shared(site.model, fed.layout, broadcast.weights)
    Method.local_train(fed.method, site, schedule, seed)
    expected = flat_state(site.model, fed.layout) - broadcast.weights
    assert torch.equal(upload.summed[MODEL].vector, expected)


@pytest.mark.parametrize("method", ["fedpav", "fedavg", "fedreid", "dfh", "fedpav+kd+cdw"])
def test_no_method_writes_into_the_broadcast_and_none_clips_under_secure_aggregation(
        method: str, tiny_config: RunConfig, synth_root: Path) -> None:
    # In one process every client reads the same Broadcast tensors (the runtime does not copy them).
    # And every method's default sums fit the secure channel's ranges: a clipped value alters the
    # aggregate (before BatchNorm statistics had a range of their own, FedPav clipped in round 2 and
    # DFH in every round at this size — see the test below).
    cfg = _kd_cdw(tiny_config, synth_root) if method == "fedpav+kd+cdw" else tiny_config
    cfg.secagg.enabled = True
    if method != "fedpav+kd+cdw":
        cfg.method.algorithm = method
    if method == "dfh":
        cfg.method.ids_per_batch = 4
    fed = build(cfg)
    for t in range(2):  # round 2 carries payloads under DFH (every client's statistics)
        broadcast = fed.server.broadcast(t)
        before = (broadcast.weights.clone(), {k: v.clone() for k, v in broadcast.payloads.items()})
        uploads = [c.step(broadcast, schedule_for(cfg, t), train_seed(cfg, t, c.site.id))[0] for c in fed.clients]
        assert torch.equal(broadcast.weights, before[0])
        assert broadcast.payloads.keys() == before[1].keys()
        assert all(torch.equal(broadcast.payloads[k], v) for k, v in before[1].items())
        aggregate = fed.channel.aggregate(broadcast, uploads, {}, broadcast_bytes=0)
        assert aggregate.clipped == 0, (t, aggregate.clipped_by_vector)
        fed.server.apply(aggregate)
        assert not torch.equal(fed.server.weights, before[0])  # the server's new weights are a new tensor
        assert torch.equal(broadcast.weights, before[0])
    if method == "dfh":
        assert broadcast.payloads  # the second round did carry the statistics


def test_with_one_range_for_weights_and_statistics_dfh_clips(tiny_config: RunConfig) -> None:
    # The power of the test above: with BatchNorm statistics in the weights' range (secfed before
    # secagg.stats_clip), DFH's first round already clips its running variances.
    tiny_config.secagg.enabled = True
    tiny_config.secagg.stats_clip = tiny_config.secagg.clip
    tiny_config.method.algorithm = "dfh"
    tiny_config.method.ids_per_batch = 4
    fed = build(tiny_config)
    broadcast = fed.server.broadcast(0)
    uploads = [c.step(broadcast, schedule_for(tiny_config, 0), train_seed(tiny_config, 0, c.site.id))[0]
               for c in fed.clients]
    aggregate = fed.channel.aggregate(broadcast, uploads, {}, broadcast_bytes=0)
    assert aggregate.clipped_by_vector[f"{MODEL}/statistics"] > 0 and aggregate.clipped_by_vector[MODEL] == 0


def test_non_finite_soft_labels_stop_the_run_naming_round_and_client(tiny_config: RunConfig, synth_root: Path,
                                                                    tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    # Any float vector about to leave a client is checked, not only the model update.
    from secfed.algorithms import kd
    from secfed.federation.runtime import RunDiverged

    cfg = _kd_cdw(tiny_config, synth_root)
    cfg.secagg.enabled = False  # the plain channel no longer decodes (and so no longer checks) uploads
    real = kd.soft_labels
    monkeypatch.setattr(kd, "soft_labels", lambda model, images: real(model, images) * float("nan"))
    with pytest.raises(RunDiverged, match=r"round 1, client \w+"):
        run(cfg, tmp_path / "nan")
