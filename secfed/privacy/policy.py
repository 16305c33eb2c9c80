"""The front door: a run's privacy settings, checked and resolved into one :class:`PrivacyPlan`.

    plan = resolve(cfg.privacy, num_clients=N, clients_per_round=K, rounds=T, aggregation="unweighted",
                   secagg=True, bn_stats="local", model_dim=layout.size, ring_bits=b)
    for line in plan.statements: print(line)      # what the CLI and the run summary say
    plan.check_noise_mask(layout.trainable_mask())
    ledger = plan.ledger()                        # None when no ε may be claimed

One round with it (names from :mod:`secfed.privacy`):

    cohort   poisson_subset(N, plan.sample_rate, rng) if plan.sampling == "poisson", else K of N
    send     BetaNoise(plan.aggregate_noise_std, plan.beta_mode, mask, seed).broadcast(θ, t, i)
    client   Δ ← clip_l2(Δ, plan.clip)[0] when plan.clip; weight 1 when plan.unit_weights;
             under plan.skellam: to_ring(encode(Δ, plan.skellam, rotation_seed=rotation_seed(seed, t), rng), b)
    server   Σ (decode_sum(...) under plan.skellam) / plan.denominator (or Σ weights when None),
             then BetaNoise.aggregate (std plan.aggregate_noise_std); ledger.record_round(len(contributors))

Every inconsistent combination is refused with :class:`~secfed.config.ConfigError` naming the flag
to change; :data:`FLAGS` maps config fields to the flags the CLI exposes.

What a claimed ε means. Client-level (ε, δ): neighbouring runs differ in one client's data.

* Poisson client sampling (rate q): adjacency add/remove one client; Opacus' RDP of the sampled
  Gaussian mechanism (amplified by q).
* Fixed K-of-N selection: adjacency zero-out (one client's clipped update replaced by zero); no
  amplification (q = 1 in the accountant). Conditioned on any selection the round is a Gaussian
  mechanism of sensitivity C, so the unamplified bound holds whatever the selection — a valid,
  conservative figure. A Poisson ε is never reported for fixed-size selection.
* Distributed Skellam noise: zero-out adjacency, no amplification (see :mod:`.distributed`).

Under DP every client counts equally: the caller gives each client aggregation weight 1 and divides
the sum by the fixed :attr:`PrivacyPlan.denominator` W (K for fixed selection, the *expected* cohort
q·N under Poisson sampling) — never by the realised head count or Σ weights, which depend on who
showed up. Central noise (β, DP-FedAvg) trusts the server: it sees the noise-free sum even under
secure aggregation; only ``--dp-distributed`` hides it.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any, Literal

import torch

from secfed.config import ConfigError, PrivacyConfig
from secfed.privacy import distributed
from secfed.privacy.accountant import noise_for_target_epsilon
from secfed.privacy.distributed import RingTooSmall, SkellamParams, skellam_params
from secfed.privacy.dpsgd import poisson_schedule
from secfed.privacy.ledger import PrivacyLedger

Mechanism = Literal["none", "beta", "gaussian", "skellam"]

FLAGS: dict[str, str] = {
    "dp_beta": "--dp-beta",
    "dp_beta_mode": "--dp-beta-mode",
    "clip": "--clip",
    "noise_multiplier": "--noise-multiplier",
    "target_epsilon": "--target-epsilon",
    "delta": "--delta",
    "sampling": "--sampling",
    "sample_rate": "--sample-rate",
    "distributed": "--dp-distributed",
    "dp_sgd": "--dp-sgd",
    "dp_sgd_noise_multiplier": "--dp-sgd-noise-multiplier",
    "dp_sgd_clip": "--dp-sgd-clip",
    "dp_sgd_target_epsilon": "--dp-sgd-target-epsilon",
    "dp_sgd_delta": "--dp-sgd-delta",
    "clients_per_round": "--clients-per-round",
    "bn_stats": "--bn-stats",
    "aggregation": "--aggregation",
    "algorithm": "--algorithm",
    "secagg": "--secagg",
}

DEFAULT_DELTA_CAP = 1e-5

NOT_DP = "β noise alone is not differential privacy: nothing bounds a client's contribution, so no ε is claimed."
CENTRAL_TRUST = (
    "Central noise trusts the server: it sees the noise-free sum (secure aggregation hides single updates, "
    "not the sum); the ε protects against everyone who sees only the released models. --dp-distributed hides the sum too."
)
SKELLAM_ADJACENCY = "zero-out (one client's clipped update replaced by zero), no amplification by sampling claimed"
SEEDED_NOISE = (
    "DP noise is drawn from generators seeded by the run seed (reproducible runs): the guarantee holds only "
    "against parties who do not know the run seed."
)


def default_delta(units: int) -> float:
    """min(10⁻⁵, n^-1.1): below 1/n, as δ must be (McMahan et al. 2018 use n^-1.1)."""
    return min(DEFAULT_DELTA_CAP, units**-1.1)


def checked_delta(delta: float | None, units: int, field: str, unit_name: str) -> float:
    """``delta``, or :func:`default_delta` when None; δ ≥ 1/N is refused, naming the flag behind ``field``.

    δ ≥ 1/N admits a mechanism that publishes one of the N units (examples or clients) in the clear.
    """
    if delta is None:
        return default_delta(units)
    if delta >= 1 / units:
        raise ConfigError(
            FLAGS[field],
            f"δ = {delta:g} ≥ 1/N = {1 / units:.3g} ({units} {unit_name}) allows a mechanism that publishes one of "
            f"the {unit_name} in the clear; use δ < 1/N, e.g. {default_delta(units):.3g}",
        )
    return delta


def _positive(value: float | None, field: str) -> None:
    if value is not None and not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
        raise ConfigError(FLAGS[field], f"must be a positive finite number, got {value!r}")


@dataclass(frozen=True)
class DpSgdPlan:
    """Example-level DP-SGD inside every client; each client has its own accountant and (ε, δ)."""

    max_grad_norm: float
    noise_multiplier: float | None  # fixed z, or None: derived per client from the target
    target_epsilon: float | None
    delta: float | None  # None: min(10⁻⁵, n_k^-1.1) for a client with n_k examples

    def delta_for(self, num_examples: int) -> float:
        """The δ a client with ``num_examples`` training examples accounts at (refuses δ ≥ 1/n_k)."""
        if num_examples < 1:
            raise ValueError(f"a client needs ≥ 1 example, got {num_examples}")
        return checked_delta(self.delta, num_examples, "dp_sgd_delta", "examples")

    def noise_multiplier_for(self, *, num_examples: int, batch_size: int, local_epochs: int, rounds: int) -> float:
        """z for one client: the fixed one, or calibrated so that taking part in all ``rounds`` rounds
        (Poisson batches of expected size ``batch_size``, ``local_epochs`` epochs each) stays within
        the target ε — conservative for a client that is not selected every round."""
        if self.noise_multiplier is not None:
            return self.noise_multiplier
        assert self.target_epsilon is not None
        rate, steps = poisson_schedule(num_examples, batch_size)
        return noise_for_target_epsilon(self.target_epsilon, self.delta_for(num_examples), rate, steps * local_epochs * rounds)


@dataclass(frozen=True)
class PrivacyPlan:
    """Everything the round loop needs to apply the run's privacy settings, and what to say about them."""

    mechanism: Mechanism  # whose noise goes on the aggregate: none, β (seed), DP-FedAvg Gaussian, Skellam
    sampling: Literal["fixed", "poisson"]
    sample_rate: float  # each client's chance to be in a round (K/N under fixed selection)
    clients_per_round: int | None  # K under fixed selection; None under Poisson sampling
    unit_weights: bool  # every client's aggregation weight must be 1
    denominator: float | None  # W: divide the sum by this (None: Σ weights, the method's own rule)
    clip: float | None  # L2 bound of a client's whole shared update (None: no clipping)
    beta: float
    beta_mode: Literal["single", "double"]  # Eq. 15 broadcast noise ("double") applies to β only
    aggregate_noise_std: float  # std the server adds to each trainable coordinate of the new mean
    noise_multiplier: float | None  # client-level z (None when nothing bounds a contribution)
    claims_epsilon: bool
    delta: float | None
    accounting_sample_rate: float | None  # q the accountant uses (1.0: no amplification claimed)
    adjacency: str | None
    skellam: SkellamParams | None
    dp_sgd: DpSgdPlan | None
    rounds: int
    statements: tuple[str, ...]

    def ledger(self) -> PrivacyLedger | None:
        """A fresh client-level ledger, or None when no ε is claimed."""
        if not self.claims_epsilon:
            return None
        assert self.delta is not None
        if self.mechanism == "skellam":
            return PrivacyLedger("skellam", self.delta, skellam=self.skellam)
        return PrivacyLedger(
            "gaussian", self.delta, noise_multiplier=self.noise_multiplier, sample_rate=self.accounting_sample_rate
        )

    def check_noise_mask(self, trainable_mask: torch.Tensor) -> None:
        """Refuse a shared layout with coordinates the claimed ε does not cover (call once per run).

        Central noise goes on trainable coordinates only; an ε is honest only if that is all of them.
        """
        if self.claims_epsilon and self.mechanism != "skellam" and not bool(trainable_mask.all()):
            left = int((~trainable_mask).sum())
            raise ValueError(
                f"{left} shared coordinates (BatchNorm statistics?) would be released without noise; "
                "the claimed ε would be false — share only trainable weights under DP"
            )

    def for_quantised_channel(self, *, scale: float, dim: int) -> PrivacyPlan:
        """The plan to use when central noise is added to a sum that went through secure aggregation's
        float quantiser (``scale`` ring units per 1.0, stochastic rounding, ``dim`` coordinates).

        Rounding moves each coordinate by < 1/scale, so a client's contribution to the dequantised sum
        is bounded by C + √d/scale, not C. The noise added stays z·C; the accountant is told the smaller
        effective multiplier z·C / (C + √d/scale). Plans without central-noise claims come back unchanged.
        """
        if not (self.claims_epsilon and self.mechanism in ("beta", "gaussian")):
            return self
        if not (math.isfinite(scale) and scale > 0) or dim < 1:
            raise ValueError(f"need a positive quantisation scale and dimension, got {scale} and {dim}")
        assert self.clip is not None and self.noise_multiplier is not None
        bound = self.clip + math.sqrt(dim) / scale
        effective = self.noise_multiplier * self.clip / bound
        note = (
            f"Secure aggregation's rounding can lengthen a clipped update to {bound:.6g}; "
            f"ε is accounted with the effective noise multiplier {effective:.6g}."
        )
        return dataclasses.replace(self, noise_multiplier=effective, statements=self.statements + (note,))

    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable summary for the run directory and ``--json``."""
        out = asdict(self)
        out["statements"] = list(self.statements)
        return out


def resolve(
    cfg: PrivacyConfig,
    *,
    num_clients: int,
    clients_per_round: int,
    rounds: int,
    aggregation: Literal["weighted", "unweighted"],
    secagg: bool,
    bn_stats: Literal["shared", "local"],
    extra_uploads: Sequence[str] = (),
    model_dim: int | None = None,
    ring_bits: int = 32,
) -> PrivacyPlan:
    """Check ``cfg`` against the run and derive the privacy plan.

    ``clients_per_round``: K, 0 = every client. ``aggregation``: "weighted" when the method's
    aggregation weights depend on client data (n_k, cosine distance). ``extra_uploads``: names of
    anything else a client uploads (KD soft labels, feature statistics) — no noise covers them.
    ``model_dim`` (length of the shared vector) and ``ring_bits`` are needed for ``--dp-distributed``.
    """
    _check_values(cfg, num_clients=num_clients, clients_per_round=clients_per_round, rounds=rounds)
    _check_combinations(cfg, secagg=secagg)
    dp_sgd = _dp_sgd_plan(cfg)
    sampling, sample_rate, fixed_k = _selection(cfg, num_clients, clients_per_round)
    denominator_if_dp = float(fixed_k) if fixed_k is not None else sample_rate * num_clients
    accounting_rate = sample_rate if sampling == "poisson" else 1.0
    adjacency = (
        f"add/remove one client, Poisson client sampling with rate q = {sample_rate:.4g} (amplified)"
        if sampling == "poisson"
        else "zero-out (one client's clipped update replaced by zero), fixed K-of-N selection, "
        "no amplification by sampling claimed (q = 1)"
    )

    # What would make an ε false even with clipping and noise in place.
    blockers: list[tuple[str, str]] = []
    if aggregation == "weighted":
        blockers.append((FLAGS["aggregation"], "data-dependent aggregation weights (n_k or cosine distance) let one "
                         "client weigh more than its clipped update; DP uses weight 1 per client and a fixed denominator"))
    if bn_stats == "shared" and not cfg.dp_sgd:
        blockers.append((FLAGS["bn_stats"], "BatchNorm running statistics are shared without noise; use --bn-stats local"))
    if extra_uploads:
        blockers.append((FLAGS["algorithm"], f"{', '.join(extra_uploads)} would be uploaded without noise"))

    formal = cfg.noise_multiplier is not None or cfg.target_epsilon is not None
    if formal and blockers:
        flag, why = blockers[0]
        raise ConfigError(flag, f"client-level DP is on, but {why}")
    wants_epsilon = formal or (cfg.dp_beta > 0 and cfg.clip is not None)
    delta = checked_delta(cfg.delta, num_clients, "delta", "clients") if wants_epsilon else None

    statements: list[str] = []
    skellam: SkellamParams | None = None
    noise_multiplier: float | None = None
    claims = False
    aggregate_std = 0.0
    mechanism: Mechanism = "none"

    if cfg.distributed:
        mechanism, claims = "skellam", True
        accounting_rate, adjacency = 1.0, SKELLAM_ADJACENCY
        skellam = _skellam(cfg, delta, rounds, fixed_k, sample_rate, num_clients, model_dim, ring_bits)
        noise_multiplier = skellam.noise_multiplier
        statements.append(
            f"Distributed DP: each client clips its whole shared update to L2 ≤ C = {cfg.clip:g} and adds its share of "
            f"Skellam noise in the integer ring Z_2^{ring_bits} before masking, so the unmasked sum carries noise std "
            f"z·C = {skellam.sum_noise_std(skellam.contributors):.4g} (z = {noise_multiplier:.4g}, {skellam.contributors} "
            f"shares) and the server never sees a noise-free sum."
        )
        statements.append(
            f"(ε, δ = {delta:.3g}) by the Skellam RDP bound (Agarwal, Kairouz & Liu 2021), per round without amplification "
            "by sampling, zero-out adjacency, counting only the noise shares of clients whose input reached the sum."
        )
    elif formal:
        mechanism, claims = "gaussian", True
        assert cfg.clip is not None and delta is not None
        noise_multiplier = (
            cfg.noise_multiplier
            if cfg.noise_multiplier is not None
            else noise_for_target_epsilon(cfg.target_epsilon, delta, accounting_rate, rounds)  # type: ignore[arg-type]
        )
        aggregate_std = noise_multiplier * cfg.clip / denominator_if_dp
        statements.append(
            f"Client-level DP (DP-FedAvg, McMahan et al. 2018): each client's whole shared update is clipped to "
            f"L2 ≤ C = {cfg.clip:g}; the server adds N(0, (z·C)²) with z = {noise_multiplier:.4g} to the unweighted sum "
            f"and divides by W = {denominator_if_dp:g}."
        )
        statements.append(f"(ε, δ = {delta:.3g}) by Opacus' RDP accountant, adjacency {adjacency}.")
        statements.append(CENTRAL_TRUST)
    elif cfg.dp_beta > 0:
        mechanism = "beta"
        aggregate_std = cfg.dp_beta
        eqs = "Eq. 14" if cfg.dp_beta_mode == "single" else "Eqs. 14 and 15"
        statements.append(
            f"β = {cfg.dp_beta:g} white noise (Wu & Gong 2021, {eqs}) on the trainable shared weights"
            + (" and, fresh per client, on what each client receives." if cfg.dp_beta_mode == "double" else ".")
        )
        if cfg.clip is None:
            statements.append(NOT_DP + f" Add {FLAGS['clip']} C to bound it.")
        elif blockers:
            statements.append(
                f"Clipped to L2 ≤ {cfg.clip:g}, but no ε is claimed: " + "; ".join(why for _, why in blockers) + "."
            )
        else:
            claims = True
            noise_multiplier = denominator_if_dp * cfg.dp_beta / cfg.clip
            statements.append(
                f"With {FLAGS['clip']} {cfg.clip:g} and the unweighted mean over W = {denominator_if_dp:g} clients, β is a "
                f"Gaussian mechanism with noise multiplier z = W·β/C = {noise_multiplier:.4g}; (ε, δ = {delta:.3g}) by "
                f"Opacus' RDP accountant, adjacency {adjacency}."
            )
            if cfg.dp_beta_mode == "double":
                statements.append("The per-client broadcast noise of Eq. 15 is post-processing: it does not lower the accounted ε.")
            statements.append(CENTRAL_TRUST)
    elif cfg.clip is not None:
        statements.append(f"Updates are clipped to L2 ≤ {cfg.clip:g} but not noised: clipping alone is not differential privacy.")
    elif cfg.dp_sgd:
        statements.append("No client-level DP: client updates are neither clipped nor noised, and no client-level ε is claimed.")
    else:
        statements.append("No differential privacy: client updates are neither clipped nor noised, and no ε is claimed.")

    if dp_sgd is not None:
        noise = (
            f"z = {dp_sgd.noise_multiplier:g}"
            if dp_sgd.noise_multiplier is not None
            else f"z calibrated per client to ε = {dp_sgd.target_epsilon:g}"
        )
        statements.append(
            f"Example-level DP-SGD in every client (Opacus): per-example gradients clipped to {dp_sgd.max_grad_norm:g}, "
            f"{noise}, Poisson batches; each client's (ε, δ) over its own examples (add/remove one example) is accounted "
            "separately. BatchNorm is replaced by GroupNorm in every model."
        )
    if claims or dp_sgd is not None:
        statements.append(SEEDED_NOISE)

    unit_weights = claims
    return PrivacyPlan(
        mechanism=mechanism,
        sampling=sampling,
        sample_rate=sample_rate,
        clients_per_round=fixed_k,
        unit_weights=unit_weights,
        denominator=denominator_if_dp if unit_weights else None,
        clip=cfg.clip,
        beta=cfg.dp_beta,
        beta_mode=cfg.dp_beta_mode,
        aggregate_noise_std=aggregate_std,
        noise_multiplier=noise_multiplier,
        claims_epsilon=claims,
        delta=delta if claims else None,
        accounting_sample_rate=accounting_rate if claims else None,
        adjacency=adjacency if claims else None,
        skellam=skellam,
        dp_sgd=dp_sgd,
        rounds=rounds,
        statements=tuple(statements),
    )


def _check_values(cfg: PrivacyConfig, *, num_clients: int, clients_per_round: int, rounds: int) -> None:
    if num_clients < 1:
        raise ValueError(f"num_clients must be ≥ 1, got {num_clients}")
    if rounds < 1:
        raise ValueError(f"rounds must be ≥ 1, got {rounds}")
    if not 0 <= clients_per_round <= num_clients:
        raise ConfigError(FLAGS["clients_per_round"], f"must lie in [0, {num_clients}] (0 = every client), got {clients_per_round}")
    if not (isinstance(cfg.dp_beta, (int, float)) and math.isfinite(cfg.dp_beta) and cfg.dp_beta >= 0):
        raise ConfigError(FLAGS["dp_beta"], f"must be a finite number ≥ 0, got {cfg.dp_beta!r}")
    if cfg.dp_beta_mode not in ("single", "double"):
        raise ConfigError(FLAGS["dp_beta_mode"], f"must be 'single' or 'double', got {cfg.dp_beta_mode!r}")
    for field in ("clip", "noise_multiplier", "target_epsilon"):
        _positive(getattr(cfg, field), field)
    if cfg.delta is not None and not (isinstance(cfg.delta, (int, float)) and 0 < cfg.delta < 1):
        raise ConfigError(FLAGS["delta"], f"must lie in (0, 1), got {cfg.delta!r}")
    if cfg.sampling not in ("fixed", "poisson"):
        raise ConfigError(FLAGS["sampling"], f"must be 'fixed' or 'poisson', got {cfg.sampling!r}")
    if cfg.sample_rate is not None and not (isinstance(cfg.sample_rate, (int, float)) and 0 < cfg.sample_rate <= 1):
        raise ConfigError(FLAGS["sample_rate"], f"must lie in (0, 1], got {cfg.sample_rate!r}")


def _check_combinations(cfg: PrivacyConfig, *, secagg: bool) -> None:
    if cfg.dp_beta_mode == "double" and cfg.dp_beta == 0:
        raise ConfigError(FLAGS["dp_beta_mode"], f"'double' adds β noise to what clients receive, but {FLAGS['dp_beta']} is 0")
    if cfg.noise_multiplier is not None and cfg.target_epsilon is not None:
        raise ConfigError(FLAGS["target_epsilon"], f"give either {FLAGS['noise_multiplier']} or {FLAGS['target_epsilon']}, not both")
    if cfg.noise_multiplier is not None and cfg.clip is None:
        raise ConfigError(FLAGS["noise_multiplier"], f"a noise multiplier is relative to the clip norm: add {FLAGS['clip']} C")
    if cfg.target_epsilon is not None and cfg.clip is None:
        raise ConfigError(FLAGS["target_epsilon"], f"ε requested without clipping: nothing bounds a client's contribution; add {FLAGS['clip']} C")
    if cfg.target_epsilon is not None and cfg.delta is None:
        raise ConfigError(FLAGS["delta"], f"{FLAGS['target_epsilon']} needs {FLAGS['delta']} (an ε means nothing without its δ)")
    if cfg.dp_beta > 0 and (cfg.noise_multiplier is not None or cfg.target_epsilon is not None):
        raise ConfigError(
            FLAGS["dp_beta"],
            f"β and {FLAGS['noise_multiplier']}/{FLAGS['target_epsilon']} would both set the server's noise; with "
            f"{FLAGS['clip']} C, β already is the noise multiplier z = W·β/C — give one",
        )
    if cfg.distributed:
        if not secagg:
            raise ConfigError(FLAGS["distributed"], "distributed noise needs secure aggregation (the clients' noise shares only add up to privacy inside a masked sum); turn secure aggregation on")
        if cfg.dp_beta > 0:
            raise ConfigError(FLAGS["dp_beta"], f"β is the server's noise; with {FLAGS['distributed']} the clients add the noise — give one")
        if cfg.clip is None:
            raise ConfigError(FLAGS["distributed"], f"distributed noise is calibrated to the clip norm: add {FLAGS['clip']} C")
        if cfg.noise_multiplier is None and cfg.target_epsilon is None:
            raise ConfigError(FLAGS["distributed"], f"say how much noise: {FLAGS['noise_multiplier']} z or {FLAGS['target_epsilon']} ε with {FLAGS['delta']} δ")
    if cfg.sampling == "fixed" and cfg.sample_rate is not None:
        raise ConfigError(
            FLAGS["sample_rate"],
            f"a sampling rate describes Poisson sampling, but clients are selected K-of-N ({FLAGS['sampling']} fixed); "
            f"a Poisson ε would be false for that — use {FLAGS['sampling']} poisson",
        )


def _selection(cfg: PrivacyConfig, num_clients: int, clients_per_round: int) -> tuple[Literal["fixed", "poisson"], float, int | None]:
    """(sampling, q, K): q is each client's chance per round; K is the fixed cohort (None under Poisson)."""
    if cfg.sampling == "fixed":
        k = clients_per_round or num_clients
        return "fixed", k / num_clients, k
    if cfg.sample_rate is None:
        if clients_per_round == 0:
            raise ConfigError(FLAGS["sample_rate"], f"{FLAGS['sampling']} poisson needs a rate q (or {FLAGS['clients_per_round']} K as the expected cohort, q = K/N)")
        return "poisson", clients_per_round / num_clients, None
    if clients_per_round and not math.isclose(cfg.sample_rate * num_clients, clients_per_round):
        raise ConfigError(
            FLAGS["clients_per_round"],
            f"under Poisson sampling the cohort is random with mean q·N = {cfg.sample_rate * num_clients:g}; "
            f"it contradicts {FLAGS['clients_per_round']} {clients_per_round} — give one of the two",
        )
    return "poisson", float(cfg.sample_rate), None


def _skellam(
    cfg: PrivacyConfig, delta: float | None, rounds: int, fixed_k: int | None, sample_rate: float,
    num_clients: int, model_dim: int | None, ring_bits: int,
) -> SkellamParams:
    if model_dim is None:
        raise ValueError("--dp-distributed needs model_dim (the length of the shared vector) to choose the ring scaling")
    assert cfg.clip is not None and delta is not None
    planned = fixed_k if fixed_k is not None else max(1, round(sample_rate * num_clients))
    setup = dict(
        dim=model_dim, clip=cfg.clip, ring_bits=ring_bits, contributors=planned,
        max_contributors=fixed_k if fixed_k is not None else num_clients,
    )
    try:
        z = (
            cfg.noise_multiplier
            if cfg.noise_multiplier is not None
            else distributed.noise_for_target_epsilon(cfg.target_epsilon, delta, rounds, **setup)  # type: ignore[arg-type]
        )
        return skellam_params(noise_multiplier=z, **setup)  # type: ignore[arg-type]
    except RingTooSmall as exc:
        raise ConfigError(FLAGS["distributed"], str(exc)) from None


def _dp_sgd_plan(cfg: PrivacyConfig) -> DpSgdPlan | None:
    dp_sgd_delta = cfg.dp_sgd_delta
    if not cfg.dp_sgd:
        for field in ("dp_sgd_noise_multiplier", "dp_sgd_target_epsilon"):
            if getattr(cfg, field) is not None:
                raise ConfigError(FLAGS[field], f"has no effect without {FLAGS['dp_sgd']}")
        if dp_sgd_delta is not None:
            raise ConfigError(FLAGS["dp_sgd_delta"], f"has no effect without {FLAGS['dp_sgd']}")
        return None
    for field in ("dp_sgd_clip", "dp_sgd_noise_multiplier", "dp_sgd_target_epsilon"):
        _positive(getattr(cfg, field), field)
    if (cfg.dp_sgd_noise_multiplier is None) == (cfg.dp_sgd_target_epsilon is None):
        raise ConfigError(FLAGS["dp_sgd"], f"give exactly one of {FLAGS['dp_sgd_noise_multiplier']} and {FLAGS['dp_sgd_target_epsilon']}")
    if dp_sgd_delta is not None and not (isinstance(dp_sgd_delta, (int, float)) and 0 < dp_sgd_delta < 1):
        raise ConfigError(FLAGS["dp_sgd_delta"], f"must lie in (0, 1), got {dp_sgd_delta!r}")
    if cfg.dp_sgd_target_epsilon is not None and dp_sgd_delta is None:
        raise ConfigError(FLAGS["dp_sgd_delta"], f"{FLAGS['dp_sgd_target_epsilon']} needs {FLAGS['dp_sgd_delta']}")
    return DpSgdPlan(
        max_grad_norm=cfg.dp_sgd_clip,
        noise_multiplier=cfg.dp_sgd_noise_multiplier,
        target_epsilon=cfg.dp_sgd_target_epsilon,
        delta=dp_sgd_delta,
    )
