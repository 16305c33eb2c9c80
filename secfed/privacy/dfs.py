"""DFH's shared channel: domain-level feature statistics (DFS) formed from a client's identity-level
ones (IFS), and the optional Gaussian mechanism on them (Yang et al., "Federated and Generalized
Person Re-identification through Domain and Feature Hallucinating", §3.2, Eq. 3.1).

    IFS   per identity j of client i: μ_j, σ²_j ∈ R^d, the mean and variance of its pool-5 features
          under the broadcast model. They never leave the client: the method hands them to the
          privacy step (``Contribution.shared["ifs"]``, shape (2, N_i, d)) and :func:`release`
          turns them into the only thing that leaves (``Upload.shared["dfs"]``).
    DFS   four d-vectors, rows of a (4, d) tensor, in this order (Eq. 3.1, 1/N_i normalisation):
              μ̂  = mean_j μ_j        σ̂² = mean_j (μ_j − μ̂)²
              μ̃  = mean_j σ²_j       σ̃² = mean_j (σ²_j − μ̃)²

Eq. 3.1 is computed here, in the privacy step, so that the function that clips and noises is the
one that forms what leaves the client.

The mechanism (`method.dfs_noise` z > 0). Each identity's μ_j and σ²_j are first clipped to L2 ≤ C
(`method.dfs_clip`). The DFS are post-processing of four sums over identities,

    S₁ = Σ μ_j,  S₂ = Σ μ_j⊙μ_j,  T₁ = Σ σ²_j,  T₂ = Σ σ²_j⊙σ²_j      (μ̂ = S₁/N, σ̂² = S₂/N − μ̂², …)

and replacing one identity's images by another's (N_i unchanged) moves them by at most
Δ(S₁) = 2C, Δ(S₂) = √2·C², Δ(T₁) = √2·C, Δ(T₂) = √2·C² in L2 (S₂, T₁, T₂ sum non-negative vectors of
norm ≤ C² resp. C, and ‖a − b‖² ≤ ‖a‖² + ‖b‖² for non-negative a, b). Each sum divided by its Δ
moves by ≤ 1, the four together by ≤ 2; adding N(0, (2z)²) to each coordinate of the divided sums —
N(0, (2z·Δ)²) to each sum — is the Gaussian mechanism with noise multiplier z. Variances (and μ̃, a
mean of variances) that noise pushed below zero are set to zero (post-processing). A client's DFS
are released once per round it takes part in; the plan states ε for a client in every one of the T
rounds, by the same RDP accountant and δ as the client-level ε (Opacus, no amplification by sampling).

What that ε means, exactly: identity-level DP within one client (adjacency: one identity's images
in one client replaced by another identity's), with the number of identities N_i NOT protected and
the feature extractor — the broadcast model, with its BatchNorm statistics — treated as public. It
bounds what the DFS add to what the model channel reveals; it is a separate figure, never inside the
printed client-level ε. Without noise nothing is clipped and no ε covers the DFS.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from secfed.privacy.accountant import gaussian_epsilon
from secfed.privacy.noise import NoiseSource, gaussian

if TYPE_CHECKING:
    from secfed.algorithms.base import Method
    from secfed.config import RunConfig

IFS = "ifs"  # Contribution.shared: (2, N, d) per-identity means and variances — never uploaded
DFS = "dfs"  # Upload.shared: (4, d) rows μ̂, σ̂², μ̃, σ̃²
ROWS = ("mu_hat", "sigma_hat_sq", "mu_tilde", "sigma_tilde_sq")
DEFAULT_DELTA = 1e-5  # δ of the DFS ε when the run claims no client-level (ε, δ) and gives no `privacy.delta`


@dataclass(frozen=True)
class DfsPlan:
    """The DFS channel of a run: noise multiplier z (0: none), clip C, and the ε it earns over T rounds."""

    noise_multiplier: float
    clip: float
    delta: float
    rounds: int

    @property
    def noised(self) -> bool:
        return self.noise_multiplier > 0

    @property
    def epsilon(self) -> float | None:
        """Identity-level ε after ``rounds`` releases (None: no noise, no ε)."""
        if not self.noised:
            return None
        return gaussian_epsilon(self.noise_multiplier, 1.0, self.rounds, self.delta)

    def statement(self) -> str:
        """What the privacy statement says about the channel."""
        shared = ("DFH: every round each client uploads its domain-level feature statistics (DFS: four "
                  "d-vectors of Eq. 3.1 — mean and spread over its identities of their pool-5 feature means and "
                  "variances under the broadcast model) in the clear, outside the secure sum: secure aggregation "
                  "never covers them; the server keeps every client's latest DFS and broadcasts them to all. "
                  "Per-identity statistics never leave the client.")
        if not self.noised:
            return (shared + " No noise (`method.dfs_noise` 0): no ε covers the DFS. They describe the client's "
                    "domain (camera style, lighting, how spread its identities are), not one identity, but nothing "
                    "bounds what they reveal; the DFS channel is outside any printed ε.")
        return (shared + f" Each identity's statistics are clipped to L2 ≤ {self.clip:g} and the sums behind the "
                f"DFS get Gaussian noise with z = {self.noise_multiplier:g}: identity-level (ε = {self.epsilon:.4g}, "
                f"δ = {self.delta:.3g}) per client after {self.rounds} rounds (adjacency: one identity's images in one "
                "client replaced by another's; the client's number of identities is not protected; the broadcast "
                "model is treated as public; a person whose pictures lie at k clients is protected over k of them "
                "together — group privacy only). This ε covers the DFS channel alone — not the model updates, nor the "
                "released models; a client-level ε, where one is printed, is separate from it.")


def dfs_settings(cfg: RunConfig, method: Method | type[Method]) -> tuple[float, float] | None:
    """(noise multiplier, clip) of the run's DFS channel, or None when ``method`` (the run's, as the
    registry has it) declares no DFS among what it shares in the clear."""
    if DFS not in method.shared_in_clear:
        return None
    return cfg.method.dfs_noise, cfg.method.dfs_clip


def plan_dfs(settings: tuple[float, float] | None, *, rounds: int, delta: float | None) -> DfsPlan | None:
    """The DFS channel's plan; ``delta`` is the client-level δ when the run claims one."""
    if settings is None:
        return None
    noise, clip = settings
    if not (math.isfinite(noise) and noise >= 0 and math.isfinite(clip) and clip > 0):
        raise ValueError(f"DFS noise must be ≥ 0 and the clip > 0, got z = {noise}, C = {clip}")
    return DfsPlan(float(noise), float(clip), delta if delta is not None else DEFAULT_DELTA, rounds)


# ---- Eq. 3.1 and the mechanism -----------------------------------------------------------------------


def clip_rows(rows: torch.Tensor, bound: float) -> torch.Tensor:
    """Every row scaled down to L2 norm ≤ ``bound`` (norms measured in float64, a hair of slack kept)."""
    norms = torch.linalg.vector_norm(rows.double(), dim=-1, keepdim=True)
    scale = torch.clamp(bound * (1 - 2.0**-20) / norms.clamp_min(1e-300), max=1.0)
    return (rows.double() * scale).to(rows.dtype)


def sums(means: torch.Tensor, variances: torch.Tensor) -> torch.Tensor:
    """(4, d) float64: S₁, S₂, T₁, T₂ over the identities (rows of ``means`` and ``variances``)."""
    m, v = means.double(), variances.double()
    return torch.stack([m.sum(0), (m * m).sum(0), v.sum(0), (v * v).sum(0)])


def from_sums(totals: torch.Tensor, count: int) -> torch.Tensor:
    """(4, d) float32 DFS from the four sums of ``count`` identities; μ̃ and the variances floored at 0."""
    mu_hat, mu_tilde = totals[0] / count, (totals[2] / count).clamp_min(0)
    sigma_hat_sq = (totals[1] / count - mu_hat * mu_hat).clamp_min(0)
    sigma_tilde_sq = (totals[3] / count - mu_tilde * mu_tilde).clamp_min(0)
    return torch.stack([mu_hat, sigma_hat_sq, mu_tilde, sigma_tilde_sq]).float()


def domain_statistics(ifs: torch.Tensor) -> torch.Tensor:
    """Eq. 3.1: the (4, d) DFS of (2, N, d) IFS, computed directly (the mechanism's reference)."""
    m, v = ifs[0].double(), ifs[1].double()
    return torch.stack([m.mean(0), m.var(0, unbiased=False), v.mean(0), v.var(0, unbiased=False)]).float()


def sensitivities(clip: float) -> torch.Tensor:
    """L2 sensitivity of S₁, S₂, T₁, T₂ to replacing one identity, each row clipped to ``clip``."""
    return torch.tensor([2 * clip, math.sqrt(2) * clip**2, math.sqrt(2) * clip, math.sqrt(2) * clip**2],
                        dtype=torch.float64)


def check_ifs(ifs: torch.Tensor) -> int:
    """The number of identities of a (2, N, d) IFS tensor; anything else is refused."""
    if ifs.dim() != 3 or ifs.shape[0] != 2 or ifs.shape[1] < 1 or not ifs.is_floating_point():
        raise ValueError(f"IFS must be a float (2, N, d) tensor of per-identity means and variances, "
                         f"got {ifs.dtype} {tuple(ifs.shape)}")
    if not torch.isfinite(ifs).all():
        raise ValueError("IFS hold NaN or infinite values")
    return int(ifs.shape[1])


def release(ifs: torch.Tensor, plan: DfsPlan, *, noise: NoiseSource | None = None, round_index: int = 0,
            client_id: int = 0) -> torch.Tensor:
    """The (4, d) DFS a client uploads: Eq. 3.1 as it is, or — when the plan adds noise — of the
    clipped IFS through the noised sums. Noise comes from ``noise`` (the client's NoiseSource)."""
    count = check_ifs(ifs)
    if not plan.noised:
        return domain_statistics(ifs)
    if noise is None:
        raise ValueError("noised DFS need the client's NoiseSource")
    totals = sums(clip_rows(ifs[0], plan.clip), clip_rows(ifs[1], plan.clip))
    stds = 2 * plan.noise_multiplier * sensitivities(plan.clip)
    rng = noise.generator("dfs", round_index, client_id)
    noisy = torch.stack([totals[r] + gaussian((totals.shape[1],), float(stds[r]), rng).double()
                         for r in range(len(ROWS))])
    return from_sums(noisy, count)


def release_shared(shared: Mapping[str, torch.Tensor], plan: DfsPlan | None, noise: NoiseSource, *,
                   round_index: int, client_id: int) -> dict[str, torch.Tensor]:
    """A contribution's shared payloads as they leave the client: IFS replaced by the DFS."""
    out = dict(shared)
    if IFS not in out:
        return out
    if plan is None:
        raise ValueError("a client produced IFS, but the privacy plan has no DFS channel to release them through")
    out[DFS] = release(out.pop(IFS), plan, noise=noise, round_index=round_index, client_id=client_id)
    return out


__all__ = ["DFS", "IFS", "DfsPlan", "dfs_settings", "domain_statistics", "plan_dfs", "release", "release_shared"]
