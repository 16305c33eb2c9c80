"""End-to-end options of a run: FedAvg's shared classifier, local BatchNorm statistics, K-of-N
cohorts, clients vanishing under secure aggregation, and ImageNet weights that cannot be had."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from secfed.config import RunConfig
from secfed.federation.runtime import run
from secfed.models import reid
from secfed.models.sharing import load_shared


def test_fedavg_shares_one_classifier_over_the_union_of_identities(tiny_config: RunConfig, tmp_path: Path) -> None:
    tiny_config.method.algorithm = "fedavg"
    tiny_config.schedule.rounds = 1
    fed = run(tiny_config, tmp_path / "fedavg").federation
    total_ids = sum(int(c["classes"]) for c in fed.data_info["clients"])
    assert "classifier.weight" in fed.layout.names
    for client in fed.clients:
        assert client.site.model.classifier.out_features == total_ids
    # every client's labels index the union: the ranges do not overlap across clients
    ranges = [(int(c.site.labels.min()), int(c.site.labels.max())) for c in fed.clients]
    assert all(a[1] < b[0] for a, b in zip(sorted(ranges), sorted(ranges)[1:]))


def test_fedpav_keeps_each_classifier_local(tiny_config: RunConfig, tmp_path: Path) -> None:
    tiny_config.schedule.rounds = 1
    fed = run(tiny_config, tmp_path / "fedpav").federation
    sizes = {c.site.model.classifier.out_features for c in fed.clients}
    assert "classifier.weight" not in fed.layout.names and len(sizes) > 1


def test_local_batchnorm_statistics_never_leave_the_client(tiny_config: RunConfig, tmp_path: Path) -> None:
    tiny_config.schedule.rounds = 1
    tiny_config.model.bn_stats = "local"
    tiny_config.run.local_baseline = False
    fed = run(tiny_config, tmp_path / "bn").federation
    key = "backbone.layer1.0.bn1.running_mean"
    assert key not in fed.layout.names
    stats = [c.site.model.state_dict()[key] for c in fed.clients]
    assert not torch.equal(stats[0], stats[1]) and not torch.equal(stats[1], stats[2])
    # a client receiving the global weights keeps its own statistics
    before = stats[0].clone()
    load_shared(fed.clients[0].site.model, fed.layout, fed.server.weights)
    assert torch.equal(fed.clients[0].site.model.state_dict()[key], before)


def test_k_of_n_cohorts_and_dropouts_under_secure_aggregation(tiny_config: RunConfig, tmp_path: Path) -> None:
    tiny_config.schedule.rounds = 3
    tiny_config.schedule.clients_per_round = 2
    tiny_config.run.local_baseline = False
    tiny_config.secagg.enabled = True
    tiny_config.secagg.dropout_rate = 0.5
    result = run(tiny_config, tmp_path / "k-of-n")
    history = [__import__("json").loads(x) for x in (tmp_path / "k-of-n" / "metrics.jsonl").read_text().splitlines()]
    assert all(len(r["cohort"]) == 2 for r in history)
    assert len({tuple(r["cohort"]) for r in history}) > 1 or len(history) < 3
    for r in history:
        early = [c for c, phase in r["dropped"].items()
                 if phase in ("advertise_keys", "graph_seed", "share_keys", "masked_input")]
        expected = 2 - len(early)
        assert r["contributors"] == (expected if expected >= 2 else 0)  # SecAgg never "sums" one client
    assert any(r["dropped"] for r in history)
    assert result.summary["channel"] == "secagg"


def test_pretrained_weights_come_from_the_cache_only_and_are_checked(monkeypatch: pytest.MonkeyPatch,
                                                                     tmp_path) -> None:
    """--pretrained imagenet reads torchvision's cache and downloads nothing, as its help says (found by
    review: torchvision's loader fetched a missing file); a cached file must match its name's hash."""
    import hashlib
    import io
    from types import SimpleNamespace

    import torchvision

    def download(*args: object, **kwargs: object) -> None:
        raise AssertionError("secfed tried to download weights")

    monkeypatch.setattr(torch.hub, "load_state_dict_from_url", download)
    monkeypatch.setattr(torch.hub, "download_url_to_file", download)
    monkeypatch.setattr(torch.hub, "get_dir", lambda: str(tmp_path / "hub"))
    with pytest.raises(reid.PretrainedWeightsUnavailable) as err:
        reid.ReIDModel("resnet18", 3, pretrained=True)
    message = str(err.value)
    assert "not cached" in message and "resnet18-" in message and "--pretrained" in message
    buffer = io.BytesIO()
    torch.save(torchvision.models.resnet18().state_dict(), buffer)
    name = f"resnet18-{hashlib.sha256(buffer.getvalue()).hexdigest()[:8]}.pth"
    (tmp_path / "hub" / "checkpoints").mkdir(parents=True)
    (tmp_path / "hub" / "checkpoints" / name).write_bytes(buffer.getvalue())
    monkeypatch.setitem(reid._WEIGHTS, "resnet18", SimpleNamespace(url=f"https://example.org/{name}"))
    model = reid.ReIDModel("resnet18", 3, pretrained=True)  # read from the cache, its hash checked
    assert torch.equal(model.backbone.conv1.weight, torch.load(io.BytesIO(buffer.getvalue()))["conv1.weight"])
    (tmp_path / "hub" / "checkpoints" / name).write_bytes(buffer.getvalue()[:-1] + b"x")
    with pytest.raises(reid.PretrainedWeightsUnavailable, match="does not begin with"):
        reid.ReIDModel("resnet18", 3, pretrained=True)
