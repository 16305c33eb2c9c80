"""DFH's parts on their own: Eq. 3.1 and the DFS mechanism, the privacy statement, the P×K sampler,
the batch-hard triplet, feature and domain hallucinating, and malformed DFS on either side."""

from __future__ import annotations

import copy
import math
import re

import numpy as np
import pytest
import torch

from secfed.algorithms import dfh as dfh_module
from secfed.algorithms.base import Schedule, Site
from secfed.algorithms.dfh import (DFH, MalformedDfs, draw_targets, hallucinate, hallucinated_loss,
                                  received_table)
from secfed.algorithms.losses import batch_hard_triplet
from secfed.config import ConfigError, PrivacyConfig, RunConfig
from secfed.validation import check
from secfed.data.samplers import identity_batches
from secfed.federation.messages import MODEL, Aggregate, Contribution, Summand
from secfed.privacy import adversary
from secfed.privacy.accountant import gaussian_epsilon
from secfed.privacy.dfs import DFS, IFS, domain_statistics
from secfed.privacy.noise import NoiseSource
from secfed.privacy.policy import resolve
from secfed.privacy.round import ClientPrivacy

RUN = dict(num_clients=3, clients_per_round=0, rounds=6, aggregation="weighted", secagg=True, bn_stats="shared")


def _ifs(identities: int, dim: int, seed: int = 0, scale: float = 1.0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    means = scale * torch.rand(identities, dim, generator=g)
    variances = scale * torch.rand(identities, dim, generator=g) ** 2
    return torch.stack([means, variances])


def _upload_dfs(ifs: torch.Tensor, noise: float, clip: float, *, reproducible: bool = True, round_index: int = 0,
                **privacy: object) -> tuple[dict[str, torch.Tensor], object]:
    plan = resolve(PrivacyConfig(**privacy), **RUN, dfs=(noise, clip))
    client = ClientPrivacy(plan, 0, NoiseSource(11, reproducible=reproducible))
    contribution = Contribution({MODEL: Summand(torch.zeros(3))}, shared={IFS: ifs})
    return dict(client.upload(contribution, client_id=1, round_index=round_index).shared), plan


# ---- Eq. 3.1 and the mechanism --------------------------------------------------------------------


def test_without_noise_the_upload_carries_exactly_the_four_vectors_of_eq_3_1() -> None:
    ifs = _ifs(7, 5)
    shared, plan = _upload_dfs(ifs, 0.0, 4.0)
    assert set(shared) == {DFS} and shared[DFS].shape == (4, 5) and shared[DFS].dtype == torch.float32
    m, v = ifs[0].double(), ifs[1].double()
    expected = [m.mean(0), ((m - m.mean(0)) ** 2).mean(0), v.mean(0), ((v - v.mean(0)) ** 2).mean(0)]
    for row, want in zip(shared[DFS], expected):
        torch.testing.assert_close(row.double(), want, rtol=1e-6, atol=1e-7)
    assert plan.dfs is not None and not plan.dfs.noised  # and nothing was clipped: the IFS lie far inside 4


def test_dfs_noise_is_gaussian_on_the_clipped_sums_with_the_stated_scale() -> None:
    identities, dim, z, clip = 5, 4096, 0.005, 64.0
    ifs = _ifs(identities, dim, scale=3.0)
    ifs[1] = 2.0  # variance rows of norm 128, clipped to 64: μ̃ = 1 per coordinate, far from the floor at 0
    shared, plan = _upload_dfs(ifs, z, clip)
    clipped = ifs / torch.linalg.vector_norm(ifs.double(), dim=-1, keepdim=True).clamp_min(clip).float() * clip
    clean = domain_statistics(clipped)
    assert torch.linalg.vector_norm(ifs[0], dim=-1).min() > clip  # the clip is active on both kinds of rows
    noise = (shared[DFS] - clean).double()
    # μ̂ = S₁/N and μ̃ = T₁/N: Gaussian of std 2z·Δ/N with Δ(S₁) = 2C, Δ(T₁) = √2·C
    for row, sensitivity in ((0, 2 * clip), (2, math.sqrt(2) * clip)):
        stated = 2 * z * sensitivity / identities
        assert noise[row].mean().abs() < 4 * stated / math.sqrt(dim)
        assert noise[row].std().item() == pytest.approx(stated, rel=0.06)
    assert (shared[DFS][[1, 3]] >= 0).all()  # variances pushed below 0 are floored (post-processing)
    # the four sensitivities SECURITY.md states, S₂'s and T₂'s too (review: √2·C for √2·C² passed)
    from secfed.privacy.dfs import sensitivities
    assert sensitivities(clip).tolist() == pytest.approx([2 * clip, math.sqrt(2) * clip ** 2, math.sqrt(2) * clip,
                                                          math.sqrt(2) * clip ** 2])
    # the same (round, client) under reproducible noise repeats; another round draws afresh
    again, _ = _upload_dfs(ifs, z, clip)
    later, _ = _upload_dfs(ifs, z, clip, round_index=1)
    assert torch.equal(again[DFS], shared[DFS]) and not torch.equal(later[DFS], shared[DFS])
    # secure noise is never the same twice
    first, _ = _upload_dfs(ifs, z, clip, reproducible=False)
    second, _ = _upload_dfs(ifs, z, clip, reproducible=False)
    assert not torch.equal(first[DFS], second[DFS])


def test_the_clip_bounds_each_identity_before_the_statistics_are_formed() -> None:
    ifs = _ifs(6, 32, scale=50.0)
    shared, _ = _upload_dfs(ifs, 1e-9, 2.0)
    assert torch.linalg.vector_norm(shared[DFS][0]) <= 2.0 + 1e-4  # μ̂ is a mean of clipped means
    assert torch.linalg.vector_norm(shared[DFS][2]) <= 2.0 + 1e-4


def test_a_plan_without_a_dfs_channel_refuses_to_release_ifs() -> None:
    plan = resolve(PrivacyConfig(), **RUN)
    client = ClientPrivacy(plan, 0, NoiseSource(1))
    with pytest.raises(ValueError, match="no DFS channel"):
        client.upload(Contribution({MODEL: Summand(torch.zeros(3))}, shared={IFS: _ifs(3, 4)}), client_id=0, round_index=0)


# ---- what the privacy statement says --------------------------------------------------------------


def test_statement_says_the_dfs_channel_is_outside_the_printed_epsilon() -> None:
    clear = resolve(PrivacyConfig(), **RUN, dfs=(0.0, 4.0))
    [line] = [s for s in clear.statements if s.startswith("DFH")]
    assert "no ε covers the DFS" in line and "outside the secure sum" in line and "outside any printed ε" in line

    dp = dict(clip=1.0, noise_multiplier=1.0)
    noised = resolve(PrivacyConfig(**dp), **{**RUN, "aggregation": "unweighted", "bn_stats": "local"}, dfs=(2.0, 1.5))
    assert noised.claims_epsilon and noised.dfs is not None
    assert noised.dfs.delta == noised.delta  # the same δ as the client-level ε
    eps = gaussian_epsilon(2.0, 1.0, RUN["rounds"], noised.delta)
    [line] = [s for s in noised.statements if s.startswith("DFH")]
    assert f"ε = {eps:.4g}" in line and "DFS channel alone — not the model updates, nor the released" in line
    assert "L2 ≤ 1.5" in line and noised.dfs.epsilon == pytest.approx(eps)
    # its printed line names whom it holds against: whoever sees the DFS, not "only the released models" (found
    # by review: a DFH run's models carry no ε at all)
    sentence = adversary.dfs(noised.dfs, reproducible=False).sentence()
    assert f"ε = {eps:.3g} against whoever sees the DFS" in sentence and "only the released models" not in sentence

    assert not any(s.startswith("DFH") for s in resolve(PrivacyConfig(), **RUN).statements)


def test_the_dfs_epsilon_refuses_a_delta_of_one_identity_or_more() -> None:
    """The DFS ε is identity-level, per client: δ ≥ 1/(a client's identities) admits publishing one
    identity in the clear. With clients of 3 identities, --delta 0.9 printed ε = −0.097 before; now
    it is refused naming privacy.delta — so is δ = 0.3 < 1/3, which may publish an identity with
    probability 0.9 (found by review) — δ ≤ 0.1/3 stands, and no δ given takes a default below it."""
    for delta in (0.9, 0.3):
        with pytest.raises(ConfigError, match=rf"δ = {delta} > 0.1/N = 0.0333 \(3 identities of the smallest DFH") as caught:
            resolve(PrivacyConfig(delta=delta), **RUN, dfs=(0.5, 4.0), dfs_identities=3)
        assert caught.value.key == "privacy.delta"
    assert resolve(PrivacyConfig(delta=0.03), **RUN, dfs=(0.5, 4.0), dfs_identities=3).dfs.delta == 0.03
    assert resolve(PrivacyConfig(), **RUN, dfs=(0.5, 4.0), dfs_identities=3).dfs.delta < 1 / 3
    assert resolve(PrivacyConfig(delta=0.9), **RUN, dfs=(0.0, 4.0), dfs_identities=3).dfs.delta  # no noise: no ε


def test_dfs_noise_refuses_local_batchnorm_statistics() -> None:
    cfg = RunConfig()
    cfg.method.algorithm, cfg.method.dfs_noise, cfg.model.bn_stats = "dfh", 1.0, "local"
    with pytest.raises(ConfigError) as caught:
        check(cfg)
    assert caught.value.key == "method.dfs_noise" and "public" in str(caught.value)
    cfg.model.bn_stats = "shared"
    check(cfg)


# ---- P×K batches and the batch-hard triplet ----------------------------------------------------


def test_identity_batches_hold_p_identities_with_k_images_each() -> None:
    labels = torch.tensor([0] + [1] * 2 + [2] * 5 + [3] * 8 + [4] * 8)  # identity 0 has one image
    batches = list(identity_batches(labels, 3, 4, torch.Generator().manual_seed(0), epochs=2))
    assert len(batches) == 2 * (len(labels) // 12)
    for index in batches:
        ids, counts = torch.unique(labels[index], return_counts=True)
        assert len(ids) == 3 and (counts == 4).all()
        for i in ids.tolist():
            picked = index[labels[index] == i]
            # with K or more images the K are distinct; with fewer they repeat
            assert len(set(picked.tolist())) == min(4, int((labels == i).sum()))
    again = list(identity_batches(labels, 3, 4, torch.Generator().manual_seed(0), epochs=2))
    assert all(torch.equal(a, b) for a, b in zip(batches, again))
    few = next(identity_batches(torch.tensor([0, 0, 1, 1]), 8, 2, torch.Generator().manual_seed(1)))
    assert sorted(few.tolist()) == [0, 1, 2, 3]  # fewer identities than P: all of them


def test_batch_hard_triplet_known_answer_and_degenerate_batches() -> None:
    features = torch.tensor([[0.0, 0.0], [2.0, 0.0], [1.0, 0.5], [1.0, -3.0]], requires_grad=True)
    labels = torch.tensor([0, 0, 1, 1])
    d = lambda a, b: math.dist(features[a].tolist(), features[b].tolist())  # noqa: E731
    expected = [max(0.0, d(0, 1) - min(d(0, 2), d(0, 3)) + 0.5), max(0.0, d(1, 0) - min(d(1, 2), d(1, 3)) + 0.5),
                max(0.0, d(2, 3) - min(d(2, 0), d(2, 1)) + 0.5), max(0.0, d(3, 2) - min(d(3, 0), d(3, 1)) + 0.5)]
    loss = batch_hard_triplet(features, labels, 0.5)
    assert loss.item() == pytest.approx(sum(expected) / 4, rel=1e-5)
    loss.backward()
    assert torch.isfinite(features.grad).all()
    one_identity = batch_hard_triplet(features, torch.zeros(4, dtype=torch.int64), 0.5)
    assert one_identity.item() == 0.0 and one_identity.requires_grad
    separated = batch_hard_triplet(torch.tensor([[0.0], [0.0], [9.0], [9.0]]), labels, 0.5)
    assert separated.item() == 0.0


# ---- feature and domain hallucinating -----------------------------------------------------------


def test_feature_hallucinating_moves_the_batch_to_the_target_mean_and_spread() -> None:
    features = 5 + 3 * torch.randn(64, 8, generator=torch.Generator().manual_seed(2))
    mu, sigma = torch.linspace(-1, 1, 8), torch.linspace(0.5, 2, 8)
    out = hallucinate(features, mu, sigma)
    torch.testing.assert_close(out.mean(0), mu, atol=1e-5, rtol=0)
    torch.testing.assert_close(out.std(0, unbiased=False), sigma, atol=1e-3, rtol=1e-3)
    # per-dimension affine: the order of every column is kept
    assert torch.equal(out.argsort(0), features.argsort(0))


def _dfs(mu: float, var: float, dim: int = 6) -> torch.Tensor:
    """DFS without spread: every draw from it is (mu, var) exactly."""
    return torch.stack([torch.full((dim,), mu), torch.zeros(dim), torch.full((dim,), var), torch.zeros(dim)])


def test_domain_hallucinating_mixes_every_client_with_dirichlet_weights() -> None:
    table = {0: _dfs(0.0, 1.0), 1: _dfs(1.0, 4.0), 2: _dfs(2.0, 9.0)}
    assert draw_targets({0: table[0]}, 0, 1.0, np.random.default_rng(0)) is None  # no other client yet
    targets = draw_targets(table, 0, 1.0, np.random.default_rng(0))
    assert targets is not None and len(targets.others) == 2  # FH onto clients 1 and 2, never onto itself
    for (mu, sigma), k in zip(targets.others, (1, 2)):
        assert torch.equal(mu, torch.full((6,), float(k))) and torch.equal(sigma, torch.full((6,), k + 1.0))
    mu_novel, sigma_novel = targets.novel
    # Spread-free DFS make the draws exact, so the novel domain is Σ w_k (μ_k, σ²_k) over all three clients
    # (own included): solve for w and check it lies inside the simplex, away from its corners.
    w = np.linalg.solve([[1, 1, 1], [0, 1, 2], [1, 4, 9]], [1, mu_novel[0].item(), sigma_novel[0].item() ** 2])
    assert (w > 1e-4).all() and w.sum() == pytest.approx(1)
    assert torch.allclose(mu_novel, mu_novel[0].expand(6)) and torch.allclose(sigma_novel, sigma_novel[0].expand(6))
    other = draw_targets(table, 0, 1.0, np.random.default_rng(1))
    assert not torch.equal(other.novel[0], mu_novel)


# ---- malformed DFS on the client and on the server ----------------------------------------------


@pytest.mark.parametrize("name, tensor, words", [
    ("dfs/1", torch.zeros(3, 6), "(4, 6)"),
    ("dfs/1", torch.zeros(4, 6, dtype=torch.int64), "float32"),
    ("dfs/one", torch.zeros(4, 6), "dfs/<client id>"),
    ("weights2", torch.zeros(4, 6), "dfs/<client id>"),
    ("dfs/2", _dfs(0.0, -1.0), "negative variances"),
])
def test_a_client_refuses_malformed_dfs_in_the_broadcast(name: str, tensor: torch.Tensor, words: str) -> None:
    with pytest.raises(MalformedDfs, match=re.escape(words)) as caught:
        received_table({"dfs/0": _dfs(0.0, 1.0), name: tensor}, 6)
    assert name in str(caught.value)


def test_the_server_keeps_the_latest_dfs_of_every_client_and_refuses_malformed_ones() -> None:
    method, state = DFH(RunConfig()), {}
    method.absorb(state, Aggregate(0, {}, {}, (0, 1), shared={0: {DFS: _dfs(0.0, 1.0)}, 1: {DFS: _dfs(1.0, 1.0)}}))
    method.absorb(state, Aggregate(1, {}, {}, (0,), shared={0: {DFS: _dfs(5.0, 1.0)}}))
    assert sorted(state) == ["dfs/0", "dfs/1"]
    assert state["dfs/0"][0, 0] == 5.0 and state["dfs/1"][0, 0] == 1.0  # client 1 missed round 1: kept
    assert list(method.payloads(state)) == ["dfs/0", "dfs/1"]
    with pytest.raises(MalformedDfs, match="client 2"):
        method.absorb(state, Aggregate(2, {}, {}, (2,), shared={2: {DFS: _dfs(0.0, 1.0, dim=5)}}))


# ---- the local loss (Eqs. 3.4–3.6) -----------------------------------------------------------------


def test_hallucinated_loss_is_eq_3_6s_bracket_or_one_of_its_parts() -> None:
    g = torch.Generator().manual_seed(4)
    features, labels = torch.randn(8, 6, generator=g), torch.tensor([0, 0, 1, 1, 2, 2, 3, 3])
    targets = draw_targets({0: _dfs(0.0, 1.0), 1: _dfs(1.0, 4.0), 2: _dfs(2.0, 9.0)}, 0, 1.0,
                           np.random.default_rng(3))
    novel = batch_hard_triplet(hallucinate(features, *targets.novel), labels, 0.3)
    others = [batch_hard_triplet(hallucinate(features, mu, sigma), labels, 0.3) for mu, sigma in targets.others]
    fh = sum(others) / len(others)
    assert hallucinated_loss(features, labels, targets, "domains", 0.3).item() == pytest.approx(novel.item())
    assert hallucinated_loss(features, labels, targets, "features", 0.3).item() == pytest.approx(fh.item())
    assert hallucinated_loss(features, labels, targets, "both", 0.3).item() == pytest.approx((novel + fh).item())


def test_local_training_adds_lambda_times_the_hallucinated_loss(monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = RunConfig()
    cfg.method.algorithm, cfg.method.ids_per_batch, cfg.method.dfh_lambda = "dfh", 2, 5.0
    cfg.method.dfh_hallucinate = "features"
    method = DFH(cfg)
    images = torch.randint(0, 256, (8, 3, 32, 16), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    labels = torch.tensor([0, 0, 1, 1, 2, 2, 3, 3])
    torch.manual_seed(0)
    model = method.build_model(4)
    schedule = Schedule(lr_backbone=0.01, lr_new=0.01, epochs=1, batch_size=4)
    seen: list[str] = []

    def train(constant: float, table: dict | None) -> float:
        def fake(features, labels, targets, mode, margin):  # type: ignore[no-untyped-def]
            seen.append(mode)
            return features.new_tensor(constant)

        monkeypatch.setattr(dfh_module, "hallucinated_loss", fake)
        site = Site(0, "a", images, labels, copy.deepcopy(model), 1.0)
        if table is not None:
            site.extra[dfh_module.TABLE] = table
        return method.local_train(site, schedule, seed=9).loss

    table = {0: _dfs(0.0, 1.0, 512), 1: _dfs(1.0, 4.0, 512)}
    base, shifted = train(0.0, table), train(1.0, table)
    assert shifted - base == pytest.approx(5.0, rel=1e-4)  # the same steps, the loss raised by λ·1
    assert seen and set(seen) == {"features"}
    seen.clear()
    assert train(1.0, None) == pytest.approx(base, rel=1e-5) and not seen  # no DFS: L = CE + T(F) alone


def test_unnoised_dfs_refuses_a_client_level_epsilon() -> None:
    """Issue 20 item 6: `--dfs-noise` needs shared BatchNorm statistics, client-level DP refuses them, so every DFH
    run with a client-level ε sent each client's DFS raw. No ε may sit behind that channel: refused by name."""
    run = {**RUN, "aggregation": "unweighted", "bn_stats": "local", "model_dim": 100}
    for dp in (dict(clip=1.0, noise_multiplier=1.0), dict(clip=1.0, noise_multiplier=1.0, distributed=True)):
        with pytest.raises(ConfigError) as caught:
            resolve(PrivacyConfig(**dp), **run, dfs=(0.0, 4.0))
        assert caught.value.key == "method.algorithm" and "DFS" in str(caught.value)
    beta = resolve(PrivacyConfig(clip=1.0, dp_beta=0.1), **run, dfs=(0.0, 4.0))
    assert not beta.claims_epsilon and beta.ledger() is None
    assert any("no ε is claimed" in s and "DFS" in s for s in beta.statements)
    cfg = RunConfig()
    cfg.method.algorithm, cfg.method.aggregation, cfg.model.bn_stats = "dfh", "unweighted", "local"
    cfg.privacy.clip, cfg.privacy.noise_multiplier = 1.0, 1.0
    with pytest.raises(ConfigError, match="DFS"):
        check(cfg)  # refused before any data is read
