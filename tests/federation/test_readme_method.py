"""The README's 30-line custom method runs as written: registered, configured, trained under secure
aggregation, and its proximal term really pulls the shared weights towards the global ones."""

from __future__ import annotations

import re
from pathlib import Path

import torch

from secfed.algorithms import METHODS
from secfed.config import RunConfig
from secfed.federation.builder import build
from secfed.federation.runtime import run

README = Path(__file__).resolve().parents[2] / "README.md"


def _block() -> str:
    text = README.read_text()
    block = text[text.index("<!-- custom-method:start -->"):text.index("<!-- custom-method:end -->")]
    return re.search(r"```python\n(.*?)```", block, re.S).group(1)


def test_the_readme_method_registers_and_trains_under_secure_aggregation(two_site_config: RunConfig, tmp_path: Path) -> None:
    cfg = two_site_config
    code = _block()
    assert len(code.splitlines()) <= 40
    namespace: dict = {}
    try:
        exec(compile(code, "README.md", "exec"), namespace)
        assert METHODS["fedprox"] is namespace["FedProx"]
        cfg.method.algorithm = "fedprox"
        cfg.schedule.rounds = 1
        cfg.secagg.enabled = True
        cfg.run.local_baseline = False
        start = build(cfg).server.weights  # the same initial model both runs start from
        namespace["FedProx"].mu = 10.0
        stiff = run(cfg, tmp_path / "prox").federation
        namespace["FedProx"].mu = 0.0
        loose = run(cfg, tmp_path / "plain").federation
    finally:
        METHODS.pop("fedprox", None)
    assert stiff.method.name == "fedprox" and stiff.channel.name == "secagg"
    # the proximal term keeps the trained weights (not BatchNorm's statistics) near the global model
    mask = stiff.layout.trainable_mask()
    moved = [float(torch.linalg.norm((fed.server.weights - start)[mask])) for fed in (stiff, loose)]
    assert 0 < moved[0] < 0.9 * moved[1]


def test_the_readme_method_trains_under_dp_sgd(two_site_config: RunConfig, tmp_path: Path) -> None:
    """The README's FedProx with --dp-sgd alone: every client's steps are clipped, noised and accounted
    (before the framework owned DP-SGD it trained without any and reported ε = 0), on a model without
    BatchNorm."""
    cfg = two_site_config
    namespace: dict = {}
    try:
        exec(compile(_block(), "README.md", "exec"), namespace)
        cfg.method.algorithm = "fedprox"
        cfg.schedule.rounds = 1
        cfg.run.local_baseline = False
        cfg.privacy.dp_sgd = True
        cfg.privacy.dp_sgd_noise_multiplier = 1.0
        cfg.schedule.batch_size = 64  # fewer steps: each draws secure noise for all 11 M weights
        result = run(cfg, tmp_path / "dp")
    finally:
        METHODS.pop("fedprox", None)
    fed = result.federation
    assert fed.method.name == "fedprox"
    for client in fed.clients:
        assert client.dp_sgd.accountant.steps > 0 and client.dp_sgd.epsilon() > 0
    per_client = result.summary["privacy"]["dp_sgd"]
    assert len(per_client) == 2 and all(v["epsilon"] > 0 for v in per_client.values())
    assert not any(isinstance(m, torch.nn.BatchNorm2d) for m in fed.clients[0].site.model.modules())
