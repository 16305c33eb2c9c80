"""The secure channel: the server gets the same sums as the plain channel, and only sums."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from secfed import protocols
from secfed.config import RunConfig
from secfed.federation.channel import PlainChannel
from secfed.federation.messages import Broadcast, Upload
from secfed.federation.secure_channel import SecureChannel
from secfed.privacy.distributed import skellam_params

DIM = 2_000


def _uploads(n: int, seed: int = 0) -> list[Upload]:
    g = torch.Generator().manual_seed(seed)
    return [Upload(k, 5, torch.randn(DIM, generator=g) * 0.01, weight=(k + 1) / 10, model_hash=b"h" * 32)
            for k in range(n)]


def _broadcast() -> Broadcast:
    return Broadcast(round=5, weights=torch.zeros(DIM), layout_id="x", weight_scale=0.1)


def _channel(n: int, **secagg) -> SecureChannel:
    cfg = RunConfig(seed=11)
    cfg.secagg = dataclasses.replace(cfg.secagg, **secagg)
    return SecureChannel.for_run(cfg, DIM, n, skellam=None)


def test_secure_sum_matches_plain_sum_with_dropouts() -> None:
    uploads = _uploads(5)
    dropouts = {1: "share_keys", 3: "unmask"}  # 1 never masks its input; 3 vanishes after sending it
    secure = _channel(5).aggregate(_broadcast(), uploads, dropouts)
    plain = PlainChannel().aggregate(_broadcast(), uploads, {1: "upload"})
    assert secure.contributors == (0, 2, 3, 4) == plain.contributors
    resolution = 5 / _channel(5).scale  # each client's rounding moves a value by < 1/scale
    assert torch.allclose(secure.total, plain.total, atol=resolution)
    assert secure.weight == pytest.approx(plain.weight, abs=resolution)
    # masked vectors are uint32 of d + 1 values: the upload is within 5 % of the float32 update plus overhead
    assert secure.bytes_up > 4 * DIM * 4


def test_secure_aggregate_is_reproducible_despite_fresh_keys() -> None:
    a = _channel(4).aggregate(_broadcast(), _uploads(4), {})
    b = _channel(4).aggregate(_broadcast(), _uploads(4), {})
    assert torch.equal(a.total, b.total) and a.weight == b.weight


def test_below_threshold_aborts_the_round_cleanly() -> None:
    uploads = _uploads(4)
    dead = {k: "advertise_keys" for k in (0, 1, 2)}
    agg = _channel(4).aggregate(_broadcast(), uploads, dead)
    assert agg.contributors == () and agg.weight == 0.0 and not agg.total.any()


def test_a_single_client_is_never_aggregated() -> None:
    agg = _channel(4).aggregate(_broadcast(), _uploads(1), {})
    assert agg.contributors == () and agg.bytes_up == 0


def test_authenticated_mode_detects_model_inconsistency() -> None:
    uploads = _uploads(4)
    uploads[2] = dataclasses.replace(uploads[2], model_hash=b"x" * 32)  # trained on another model
    with pytest.raises(protocols.ModelMismatch):
        _channel(4, authenticated=True).aggregate(_broadcast(), uploads, {})
    # a client that vanishes at the consistency check already sent its masked input: it is in the sum
    consistent = _channel(4, authenticated=True).aggregate(_broadcast(), _uploads(4), {1: "consistency_check"})
    assert consistent.contributors == (0, 1, 2, 3)


def test_distributed_noise_sum_decodes_to_the_clipped_sum_plus_noise() -> None:
    n, clip, z = 4, 1.0, 0.5
    params = skellam_params(dim=DIM, clip=clip, noise_multiplier=z, ring_bits=32, contributors=n)
    cfg = RunConfig(seed=2)
    channel = SecureChannel.for_run(cfg, DIM, n, skellam=params)
    uploads = [dataclasses.replace(u, weight=1.0) for u in _uploads(n, seed=3)]
    agg = channel.aggregate(_broadcast(), uploads, {})
    truth = sum(u.update for u in uploads)
    residual = (agg.total - truth).numpy().astype(np.float64)
    assert agg.contributors == tuple(range(n))
    # the unmasked sum carries noise of std z·C (plus rounding), not zero, and is centred on the truth
    assert abs(residual.mean()) < 4 * z * clip / np.sqrt(DIM)
    assert residual.std() == pytest.approx(z * clip, rel=0.1)


def test_values_beyond_the_clip_range_are_counted() -> None:
    uploads = _uploads(3)
    big = uploads[1].update.clone()
    big[:7] = 100.0  # × weight 0.2 = 20 > clip 8
    uploads[1] = dataclasses.replace(uploads[1], update=big)
    agg = _channel(3).aggregate(_broadcast(), uploads, {})
    assert agg.clipped == 7
    assert _channel(3).aggregate(_broadcast(), _uploads(3), {}).clipped == 0
