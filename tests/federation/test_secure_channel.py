"""The secure channel: the server gets the same sums as the plain channel, for every named vector, and
only sums; aborted sessions are retried among the clients still online."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from secfed.config import RunConfig
from secfed.federation.channel import PlainChannel
from secfed.federation.messages import MODEL, Broadcast, Summand, Upload
from secfed.federation.secure_channel import SecureChannel
from secfed.privacy.distributed import encode, rotation_seed, skellam_params
from secfed.privacy.noise import NoiseSource

DIM = 2_000
KD_DIM = 300


def _uploads(n: int, seed: int = 0, *, kd: bool = True) -> list[Upload]:
    g = torch.Generator().manual_seed(seed)
    uploads = []
    for k in range(n):
        summed = {MODEL: Summand(torch.randn(DIM, generator=g) * 0.01, weight=(k + 1) / 10)}
        if kd:
            summed["kd"] = Summand(torch.randn(KD_DIM, generator=g), 1.0, bound=16.0)
        uploads.append(Upload(k, 5, summed, {"stats": torch.full((3,), float(k))}, model_hash=b"h" * 32))
    return uploads


def _broadcast() -> Broadcast:
    return Broadcast(round=5, weights=torch.zeros(DIM), layout_id="x")


def _channel(n: int, **secagg) -> SecureChannel:
    cfg = RunConfig()
    cfg.run.seed = 11
    for key, value in secagg.items():
        setattr(cfg.secagg, key, value)
    return SecureChannel.for_run(cfg, n)


def _aggregate(channel, uploads, dropouts):
    return channel.aggregate(_broadcast(), uploads, dropouts, broadcast_bytes=DIM * 4)


def test_secure_sums_match_plain_sums_for_every_named_vector_with_dropouts() -> None:
    uploads = _uploads(5)
    dropouts = {1: "share_keys", 3: "unmask"}  # 1 never masks its input; 3 vanishes after sending it
    channel = _channel(5)
    secure = _aggregate(channel, uploads, dropouts)
    plain = PlainChannel().aggregate(_broadcast(), uploads, {1: "upload"}, broadcast_bytes=DIM * 4)
    assert secure.contributors == (0, 2, 3, 4) == plain.contributors
    for name, bound in ((MODEL, channel.clip), ("kd", 16.0)):
        resolution = 5 * bound / channel.quantizer(bound).max_abs  # each client's rounding moves a value by < 1/scale
        assert torch.allclose(secure.sums[name], plain.sums[name], atol=resolution), name
        assert secure.weights[name] == pytest.approx(plain.weights[name], abs=resolution)
    # what clients share unsummed travels beside the sum, from the clients in it
    assert sorted(secure.shared) == [0, 2, 3, 4] and torch.equal(secure.shared[4]["stats"], torch.full((3,), 4.0))
    # masked vectors are uint32 of d + 1 values per name: the upload is the float32 update plus overhead
    assert secure.bytes_up > 4 * (DIM + KD_DIM) * 4


def test_secure_aggregate_is_reproducible_despite_fresh_keys() -> None:
    a = _aggregate(_channel(4), _uploads(4), {})
    b = _aggregate(_channel(4), _uploads(4), {})
    assert torch.equal(a.sums[MODEL], b.sums[MODEL]) and a.weights == b.weights


def test_an_aborted_session_is_retried_among_the_clients_still_online() -> None:
    uploads = _uploads(4, kd=False)
    dead = {k: "advertise_keys" for k in (0, 1, 2)}  # one client left: nothing can be aggregated
    agg = _aggregate(_channel(4), uploads, dead)
    assert agg.contributors == () and agg.weights[MODEL] == 0.0 and not agg.sums[MODEL].any()
    # 10 clients on the complete graph: if all but t − 1 vanish after sharing keys, the survivors keep
    # fewer than t neighbours to rebuild the vanished clients' keys, so the session aborts; a new
    # session among the clients still online sums their inputs.
    uploads = _uploads(10, kd=False)
    channel = _channel(10, graph="complete")
    threshold = channel.params(10).threshold
    vanish = {k: "masked_input" for k in range(10 - threshold + 1)}
    agg = _aggregate(channel, uploads, vanish)
    survivors = tuple(k for k in range(10) if k not in vanish)
    assert agg.contributors == survivors
    truth = sum(u.summed[MODEL].vector * u.summed[MODEL].weight for u in uploads if u.client_id in survivors)
    assert torch.allclose(agg.sums[MODEL], truth, atol=1e-4)


def test_a_single_client_is_never_aggregated() -> None:
    agg = _aggregate(_channel(4), _uploads(1), {})
    assert agg.contributors == () and agg.shared == {}


def test_authenticated_mode_is_the_default_and_detects_model_inconsistency() -> None:
    from secfed import protocols

    assert _channel(4).authenticated
    uploads = _uploads(4)
    uploads[2] = Upload(2, 5, uploads[2].summed, {}, model_hash=b"x" * 32)  # trained on another model
    with pytest.raises(protocols.ModelMismatch):
        _aggregate(_channel(4), uploads, {})
    # a client that vanishes at the consistency check already sent its masked input: it is in the sum
    consistent = _aggregate(_channel(4), _uploads(4), {1: "consistency_check"})
    assert consistent.contributors == (0, 1, 2, 3)


def test_ring_encoded_summands_are_summed_as_they_are() -> None:
    """Distributed DP: clients send their integer encodings (noise included); the channel sums them."""
    n, clip, z = 4, 1.0, 0.5
    params = skellam_params(dim=DIM, clip=clip, noise_multiplier=z, ring_bits=32, contributors=n)
    g = torch.Generator().manual_seed(3)
    updates = [torch.randn(DIM, generator=g) * 0.01 for _ in range(n)]
    noise = NoiseSource(0)
    uploads = [Upload(k, 5, {MODEL: Summand(torch.from_numpy(encode(u.numpy(), params, rotation_seed=rotation_seed(2, 5),
                                                                     rng=noise.generator("x", k))), 1.0, "ring")},
                      model_hash=b"h" * 32)
               for k, u in enumerate(updates)]
    agg = _aggregate(_channel(n), uploads, {})
    assert agg.sums[MODEL].dtype == torch.int64 and agg.weights[MODEL] == n
    from secfed.privacy.distributed import decode_sum

    decoded = decode_sum(agg.sums[MODEL].numpy(), params, rotation_seed=rotation_seed(2, 5))
    residual = decoded - sum(u.numpy() for u in updates).astype(np.float64)
    assert residual.std() == pytest.approx(z * clip, rel=0.1)  # z·C of noise, not zero, on the true sum


def test_values_beyond_the_range_are_counted() -> None:
    uploads = _uploads(3)
    big = uploads[1].summed[MODEL].vector.clone()
    big[:7] = 100.0  # × weight 0.2 = 20 > clip 8
    uploads[1] = Upload(1, 5, {**uploads[1].summed, MODEL: Summand(big, 0.2)}, {}, b"h" * 32)
    assert _aggregate(_channel(3), uploads, {}).clipped == 7
    assert _aggregate(_channel(3), _uploads(3), {}).clipped == 0
    # only what the released sum holds is counted (found by review: a client that dropped before
    # masking was counted, an un-noised figure of an upload no sum contains); one that vanished after
    # masking is in the sum, and counted
    assert _aggregate(_channel(3), uploads, {1: "advertise_keys"}).clipped == 0
    assert _aggregate(_channel(3), uploads, {1: "unmask"}).clipped == 7


def test_batchnorm_statistics_are_summed_in_their_own_range_and_counted_apart() -> None:
    # The default run clipped: a round moves BatchNorm running variances by up to hundreds (842 for
    # DFH), while the weights' range is 8. Statistics runs are quantised in secagg.stats_clip.
    uploads, plain_uploads = [], []
    g = torch.Generator().manual_seed(3)
    stats = ((100, 50), (400, 20))  # two runs of statistics inside the model vector
    for k in range(3):
        vector = torch.randn(DIM, generator=g) * 0.01
        vector[100:150] = 300.0 * (k + 1)  # running-variance-sized changes
        vector[400:420] = -50.0
        uploads.append(Upload(k, 5, {MODEL: Summand(vector, 0.3, statistics=stats)}, {}, model_hash=b"h" * 32))
        plain_uploads.append(Upload(k, 5, {MODEL: Summand(vector, 0.3)}, {}, model_hash=b"h" * 32))
    channel = _channel(3)
    secure = _aggregate(channel, uploads, {})
    assert secure.clipped == 0 and secure.clipped_by_vector == {MODEL: 0, f"{MODEL}/statistics": 0}
    plain = PlainChannel().aggregate(_broadcast(), uploads, {}, broadcast_bytes=DIM * 4)
    fine = 3 * channel.clip / channel.quantizer().max_abs
    coarse = 3 * channel.stats_clip / channel.quantizer(channel.stats_clip).max_abs
    in_stats = torch.zeros(DIM, dtype=torch.bool)
    in_stats[100:150] = in_stats[400:420] = True
    assert torch.allclose(secure.sums[MODEL][in_stats], plain.sums[MODEL][in_stats], atol=coarse)
    assert torch.allclose(secure.sums[MODEL][~in_stats], plain.sums[MODEL][~in_stats], atol=fine)
    # the same values without their statistics runs: clipped to the weights' range, and counted
    without = _aggregate(channel, plain_uploads, {})
    assert without.clipped == 3 * 50 + 3 * 20 and without.clipped_by_vector == {MODEL: 210}


def test_statistics_beyond_their_range_are_counted_under_their_own_name() -> None:
    vector = torch.zeros(DIM)
    vector[10:12] = 1e6  # × 0.5 beyond 4096
    uploads = [Upload(k, 5, {MODEL: Summand(vector if k == 0 else torch.zeros(DIM), 0.5, statistics=((10, 5),))},
                      {}, model_hash=b"h" * 32) for k in range(3)]
    agg = _aggregate(_channel(3), uploads, {})
    assert agg.clipped_by_vector == {MODEL: 0, f"{MODEL}/statistics": 2} and agg.clipped == 2
