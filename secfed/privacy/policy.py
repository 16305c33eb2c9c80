"""The front door: a run's privacy settings, checked and resolved into one :class:`PrivacyPlan`.

    plan = resolve(cfg.privacy, num_clients=N, clients_per_round=K, rounds=T, aggregation="unweighted",
                   secagg=True, bn_stats="local", model_dim=layout.size, quantiser_scale=channel.scale)
    for line in plan.statements: print(line)      # what the CLI and the run summary say, once
    ledger = plan.ledger()                        # None when no ε may be claimed

What a claimed ε means. Client-level (ε, δ): neighbouring runs differ in one client's data.

* Poisson client sampling (rate q): adjacency add/remove one client; Opacus' RDP of the sampled
  Gaussian mechanism (Mironov, Talwar & Zhang 2019), which holds for any function of the sample
  whose ℓ2 sensitivity is bounded.
* Fixed K-of-N selection: adjacency zero-out (one client's clipped update replaced by zero); no
  amplification (q = 1 in the accountant): conditioned on any selection the round is a Gaussian
  mechanism of sensitivity C.
* Distributed Skellam noise: zero-out adjacency, no amplification (see :mod:`.distributed`). The
  c = ⌊0.2·n⌋ clients secure aggregation lets collude with the server can subtract their noise shares,
  so a round counts the others only; a target ε is calibrated for the fewest honest shares a released
  sum can hold, so no dropout pattern and no collusion within that bound pushes ε past it.

Two effects of secure aggregation enter the analysis, so that the printed ε bounds what the code
does, not an idealised mechanism:

* **Rounding.** The channel's stochastic rounding can lengthen a clipped update to C + √d/s. The
  accountant is given the noise relative to that bound, and a target ε is calibrated on that same
  value — last, so the printed ε never exceeds the target.
* **Rounds that release no sum.** Secure aggregation never "aggregates" a single client: with fewer
  than two clients left the round releases noise only. Under fixed selection that rule does not
  depend on anyone's data. Under Poisson sampling it does: whether a client was sampled can decide
  whether the others' sum appears at all. The plan covers it one of two ways, whichever gives the
  smaller ε: (a) the skip event's probability p per round (cohort of N − 1 others thinned by the
  design dropout rate below two) is folded into δ — δ_accounted + T·(1 + e^ε)·p ≤ δ, a total-
  variation argument — or, when p is not negligible, (b) the sum's sensitivity is taken as 2C (adding
  one client changes Σ_S x·[|S| ≥ 2] by at most two clipped updates), i.e. the accountant's noise
  multiplier is halved. A round the protocol aborts is retried among the clients still online
  (:mod:`secfed.federation.secure_channel`), so the only skip rule is the one analysed. On Flower the
  secure sum runs among SuperNodes, each summing its sites first: "two" counts nodes, node j takes part
  with probability (1 − d)·(1 − (1 − q)^m_j), and the sensitivity is (1 + m)·C for nodes of up to m
  sites; a plan refuses a layout it was not made for (:meth:`PrivacyPlan.check_layout`).

Under DP every client counts equally: aggregation weight 1 and a fixed denominator W (K for fixed
selection, the *expected* cohort q·N under Poisson sampling) — never the realised head count.
Central noise (β, DP-FedAvg) trusts the server: it sees the noise-free sum even under secure
aggregation; only ``--dp-distributed`` hides it. Every noise is drawn from :mod:`.noise`
(AES-CTR keyed by OS entropy) unless `privacy.reproducible_noise` asks otherwise.

Problems name configuration keys (``privacy.clip``), never flags; :mod:`secfed.config` explains.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, replace
from typing import TYPE_CHECKING, Any, Literal

import torch

from secfed.config import PrivacyConfig
from secfed.errors import ConfigError, ConfigIssue, raise_issues
from secfed.privacy import adversary, distributed
from secfed.privacy.accountant import gaussian_epsilon, noise_for_target_epsilon
from secfed.privacy.dfs import DfsPlan, dfs_settings, plan_dfs
from secfed.privacy.distributed import RingTooSmall, SkellamParams, collusion_bound, fewest_honest_shares, skellam_params
from secfed.privacy.dpsgd import poisson_schedule
from secfed.privacy.ledger import PrivacyLedger

if TYPE_CHECKING:
    from secfed.algorithms.base import Method
    from secfed.config import RunConfig

Mechanism = Literal["none", "beta", "gaussian", "skellam"]
SkipRule = Literal["none", "delta", "sensitivity"]

DEFAULT_DELTA_CAP = 1e-5
MIN_SECURE_COHORT = 2  # secure aggregation never "aggregates" one client: that sum would be its update
DESIGN_DROPOUT = 0.1  # the dropout rate secure aggregation's parameters are chosen for, at least
# ⌊γ·n⌋ of a session's n clients may collude with the server: the bound secure aggregation's parameters
# are chosen for (protocols.choose_params' default, which the secure channel uses)
CORRUPT_FRACTION = 0.2

# what KD uploads beside the clipped update, which no client-level noise covers (named in refusals)
KD_UPLOAD = "KD soft labels (features on the public set)"
NOT_DP = "β noise alone is not differential privacy: nothing bounds a client's contribution, so no ε is claimed."
CENTRAL_TRUST = (
    "Central noise trusts the server: it sees the noise-free sum (secure aggregation hides single updates, "
    "not the sum); the ε protects against everyone who sees only the released models. --dp-distributed hides the sum too."
)
SKELLAM_ADJACENCY = "zero-out (one client's clipped update replaced by zero), no amplification by sampling claimed"
SECURE_NOISE = ("Privacy noise and the samples an ε relies on (Poisson cohorts and batches) are drawn from AES-CTR "
                "keyed with fresh OS entropy; nothing in the run directory (seed, checkpoints, logs) reproduces them.")
REPRODUCIBLE_NOISE = ("NOT PRIVATE: privacy noise and the samples an ε relies on are drawn from the run seed "
                      "(`privacy.reproducible_noise`); anyone who knows the seed can remove the noise and knows the "
                      "samples. Use only for experiments.")
# What add/remove adjacency leaves out when the count itself is published (found by review): data.json
# and the sampling rate show N and each n_k, so a neighbour with one unit more or less is told apart by the
# count alone; what holds for the data is replace-one adjacency, group privacy of two add/remove steps.
PUBLIC_COUNT = ("The {unit} count {n} is treated as public (data.json and the sampling rate show it): for replacing "
                "one {unit} — the same count — the guarantee is (2ε, (1 + e^ε)·δ).")
# Whom an ε covers, in people (found by review: nothing said that a person is neither a client nor a picture)
PERSON_CLIENT = ("The unit is one client: a person whose pictures lie at k clients (seen by two sites' cameras, "
                 "say) is protected over k clients together, by group privacy only — (k·ε, k·e^((k−1)·ε)·δ), "
                 "which at the ε above may be no guarantee at all.")
PERSON_EXAMPLE = ("DP-SGD's unit is one picture: a person with m pictures is protected over m examples together, by "
                  "group privacy only — (m·ε, m·e^((m−1)·ε)·δ), which may be no guarantee at all — and composed over "
                  "every client holding them.")
NOT_COVERED = ("Not covered by any ε: the training logs' per-round contributor counts, timings, byte counts, "
               "secure-aggregation clip counts (`secagg_clipped`) and evaluation scores, the local-only baselines' "
               "among them (metrics.jsonl labels them `outside_epsilon`).")

# the configuration keys the plan's refusals name
KEY = {name: f"privacy.{name}" for name in PrivacyConfig.model_fields}
KEY.update({"clients_per_round": "schedule.clients_per_round", "bn_stats": "model.bn_stats",
            "aggregation": "method.aggregation", "algorithm": "method.algorithm", "kd": "method.kd", "secagg": "secagg.enabled",
            "rounds": "schedule.rounds"})


def ref(name: str) -> str:
    """`` `privacy.clip` ``: how a message refers to another setting (rendered as a flag or a TOML key)."""
    return f"`{KEY[name]}`"


MAX_N_DELTA = 0.1  # the largest N·δ accepted (see checked_delta)


def default_delta(units: int) -> float:
    """min(10⁻⁵, 0.1/n): the largest δ :func:`checked_delta` accepts, capped at 10⁻⁵ (McMahan et al.
    2018's n^-1.1 lets n·δ exceed 0.1 from n ≈ 10⁴: Market-1501's 12,936 images, found by review)."""
    return min(DEFAULT_DELTA_CAP, MAX_N_DELTA / units)


def checked_delta(delta: float | None, units: int, field: str, unit_name: str) -> float:
    """``delta``, or :func:`default_delta` when None; δ > 0.1/N is refused, naming the setting behind ``field``.

    A mechanism that publishes each of the N units (examples, clients, identities) in the clear with
    probability δ is (0, δ)-DP, and publishes one of them with probability ≈ N·δ: δ just under 1/N
    (the old guard) let that be 0.96 for N = 4. N·δ ≤ 0.1 bounds it at 10 %; the default is far below.
    """
    if delta is None:
        return default_delta(units)
    if delta * units > MAX_N_DELTA:
        raise ConfigError(
            KEY[field],
            f"δ = {delta:g} > 0.1/N = {MAX_N_DELTA / units:.3g} ({units} {unit_name}): a (0, δ)-DP mechanism may "
            f"publish one of the {unit_name} in the clear with probability N·δ = {min(1.0, delta * units):.2g}; "
            f"use δ ≤ 0.1/N (well below 1/N), e.g. {default_delta(units):.3g}",
        )
    return delta


@dataclass(frozen=True)
class DpSgdPlan:
    """Example-level DP-SGD inside every client; each client has its own accountant and (ε, δ)."""

    max_grad_norm: float
    noise_multiplier: float | None  # fixed z, or None: derived per client from the target
    target_epsilon: float | None
    delta: float | None  # None: min(10⁻⁵, 0.1/n_k) for a client with n_k examples

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
        try:
            return noise_for_target_epsilon(self.target_epsilon, self.delta_for(num_examples), rate,
                                            steps * local_epochs * rounds)
        except ValueError as exc:  # no noise reaches it (found by review: Opacus' error as a traceback)
            raise ConfigError(KEY["dp_sgd_target_epsilon"], f"a client of {num_examples} examples: {exc}") from None


@dataclass(frozen=True)
class PrivacyPlan:
    """Everything the round loop needs to apply the run's privacy settings, and what to say about them."""

    mechanism: Mechanism  # whose noise goes on the aggregate: none, β, DP-FedAvg Gaussian, Skellam
    sampling: Literal["fixed", "poisson"]
    sample_rate: float  # each client's chance to be in a round (K/N under fixed selection)
    clients_per_round: int | None  # K under fixed selection; None under Poisson sampling
    unit_weights: bool  # every client's aggregation weight must be 1
    denominator: float | None  # W: divide the sum by this (None: Σ weights, the method's own rule)
    clip: float | None  # L2 bound of a client's whole shared update (None: no clipping)
    beta: float
    beta_mode: Literal["single", "double"]  # Eq. 15 broadcast noise ("double") applies to β only
    aggregate_noise_std: float  # std the server adds to each trainable coordinate of the new mean
    noise_multiplier: float | None  # z of the noise actually added (std z·C on the sum)
    accounting_noise_multiplier: float | None  # z the accountant is given (rounding, skip rule applied)
    claims_epsilon: bool
    delta: float | None  # the δ the printed ε holds at
    accounted_delta: float | None  # the δ handed to the accountant (δ minus the skip term under rule "delta")
    skip_rule: SkipRule
    skip_probability: float  # per round, the probability a Poisson round releases no sum (rule "delta")
    accounting_sample_rate: float | None  # q the accountant uses (1.0: no amplification claimed)
    adjacency: str | None
    skellam: SkellamParams | None
    dp_sgd: DpSgdPlan | None
    rounds: int
    reproducible_noise: bool
    statements: tuple[str, ...]
    dfs: DfsPlan | None = None  # DFH's per-client statistics channel (outside every client-level ε)
    colluders: int = 0  # distributed DP: noise shares per round the server may subtract (colluding clients)
    fewest_shares: int = 1  # distributed DP: fewest honest noise shares any released sum holds
    node_sites: tuple[int, ...] | None = None  # clients per party of the secure sum (None: one each)
    authenticated: bool = True  # secure aggregation's malicious-server mode (its quorum bounds fewest_shares)

    def ledger(self) -> PrivacyLedger | None:
        """A fresh client-level ledger, or None when no ε is claimed."""
        if not self.claims_epsilon:
            return None
        assert self.delta is not None and self.accounted_delta is not None
        if self.mechanism == "skellam":
            return PrivacyLedger("skellam", self.delta, skellam=self.skellam, colluders=self.colluders,
                                 fewest_shares=self.fewest_shares)
        return PrivacyLedger(
            "gaussian", self.delta, noise_multiplier=self.accounting_noise_multiplier,
            sample_rate=self.accounting_sample_rate, accounted_delta=self.accounted_delta,
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

    def check_layout(self, node_sites: Sequence[int]) -> None:
        """Refuse a secure-sum layout the claimed ε was not analysed for (call once the layout is known).

        ``node_sites``: clients per party of the secure sum — on Flower a SuperNode sums its sites first, so
        the sum runs among nodes, a round with fewer than two nodes releases nothing, and a colluding node
        holds all its sites' noise shares."""
        sites = tuple(int(m) for m in node_sites if m > 0)
        if not self.claims_epsilon or sites == (self.node_sites or (1,) * len(sites)):
            return
        where = f"the secure sum runs among {len(sites)} nodes holding {list(sites)} clients"
        if self.skip_rule != "none":
            raise ConfigError(KEY["sampling"], f"{where}; this ε's skip rule was analysed for "
                              f"{'one client per node' if self.node_sites is None else list(self.node_sites)} (a node "
                              f"of m sites makes the skip sensitivity (1 + m)·C) — use {ref('sampling')} fixed, or "
                              "one client per node")
        if self.mechanism == "skellam":
            colluding_nodes = collusion_bound(len(sites), CORRUPT_FRACTION)
            colluders = colluding_nodes * max(sites)  # a colluding node's sites
            fewest = fewest_honest_shares(len(sites), colluders=colluding_nodes, corrupt_fraction=CORRUPT_FRACTION,
                                          authenticated=self.authenticated, min_cohort=MIN_SECURE_COHORT)
            if colluders > self.colluders or fewest < self.fewest_shares:
                raise ConfigError(KEY["distributed"], f"{where}; colluding nodes could subtract {colluders} noise "
                                  f"shares and a released sum hold {fewest} honest ones, but the ε counts "
                                  f"{self.colluders} and {self.fewest_shares}")

    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable summary for the run directory and ``--json``."""
        out = asdict(self)
        out["statements"] = list(self.statements)
        return out


# ---- checks that need no data ----------------------------------------------------------------------


def static_issues(cfg: RunConfig, method: type[Method]) -> list[ConfigIssue]:
    """Every privacy rule that can be checked before any data is read (used by :func:`secfed.validation.check`);
    ``method``: the configured method's class, whose declarations say what it shares."""
    p = cfg.privacy
    issues = list(_combination_issues(p, secagg=cfg.secagg.enabled, clients_per_round=cfg.schedule.clients_per_round))
    blockers = _blockers(cfg.method.aggregation, cfg.model.bn_stats, p.dp_sgd, _method_extras(cfg, method))
    if client_level_dp(p) or p.distributed:
        issues += [ConfigIssue(key, f"client-level DP is on, but {why}") for key, why in blockers]
    m = cfg.method
    if p.dp_sgd:
        if m.cdw:
            issues.append(ConfigIssue("method.cdw", "cosine distance weights are computed from the client's private "
                                      "images outside DP-SGD, so example-level DP would not cover them"))
    if p.dp_beta_mode == "double" and m.cdw:
        issues.append(ConfigIssue(KEY["dp_beta_mode"], "Eq. 15's correction needs the aggregation weights, which "
                                  "cosine distance weights keep secret inside the masked sum"))
    if cfg.run.record_uploads and claims_client_level(p, blockers):
        # (found by review: under fixed sampling too, the next broadcast minus the recorded uploads' mean
        # is the round's noise; a distributed run's uploads each carry one share only)
        issues.append(ConfigIssue("run.record_uploads", "keeps every round's uploads before the client-level "
                                  "noise, named by client, in the run directory: with the next broadcast they give "
                                  "the noise away — leave it off in a run that claims a client-level ε"))
    elif p.sampling == "poisson" and cfg.run.record_uploads and p.dp_sgd:
        issues.append(ConfigIssue("run.record_uploads", "keeps every round's uploads, named by client, in the run "
                                  "directory: that is the Poisson cohorts, which the run keeps secret — leave it "
                                  "off, or sample clients fixed"))
    return issues


def _method_extras(cfg: RunConfig, method: type[Method]) -> list[str]:
    """What the method uploads besides the clipped shared update (no client-level noise covers it)."""
    extras = []
    if cfg.method.kd:
        extras.append(KD_UPLOAD)
    return extras + _dfs_extra(dfs_settings(cfg, method))


# what _blockers says of DFH's statistics when they travel unnoised
RAW_DFS = ("DFH's per-client domain feature statistics (DFS, in the clear beside the masked sum; "
           "`method.dfs_noise` needs `model.bn_stats` shared, which client-level DP refuses)")


def _dfs_extra(dfs: tuple[float, float] | None) -> list[str]:
    """DFH's DFS channel when no noise covers it: an unnoised per-client upload no client-level ε may sit behind."""
    return [RAW_DFS] if dfs is not None and dfs[0] == 0 else []


def _blockers(aggregation: str, bn_stats: str, dp_sgd: bool, extras: Sequence[str]) -> list[tuple[str, str]]:
    """What would make a client-level ε false even with clipping and noise in place."""
    out = []
    if aggregation == "weighted":
        out.append((KEY["aggregation"], "data-dependent aggregation weights (n_k or cosine distance) let one client "
                    "weigh more than its clipped update; DP uses weight 1 per client and a fixed denominator"))
    if bn_stats == "shared" and not dp_sgd:
        out.append((KEY["bn_stats"], "BatchNorm running statistics are shared without noise; use local"))
    # each unnoised upload is refused under the setting that sends it: KD's soft labels under `method.kd`
    # (an option of any method), the rest under the method
    for key, names in ((KEY["kd"], [e for e in extras if e == KD_UPLOAD]),
                       (KEY["algorithm"], [e for e in extras if e != KD_UPLOAD])):
        if names:
            out.append((key, f"{', '.join(names)} would be uploaded without noise"))
    return out


def _number_issues(cfg: PrivacyConfig) -> Iterable[ConfigIssue]:
    if cfg.dp_beta_mode == "double" and cfg.dp_beta == 0:
        yield ConfigIssue(KEY["dp_beta_mode"], f"'double' adds β noise to what clients receive, but {ref('dp_beta')} is 0")


def _combination_issues(cfg: PrivacyConfig, *, secagg: bool, clients_per_round: int) -> Iterable[ConfigIssue]:
    yield from _number_issues(cfg)
    if cfg.noise_multiplier is not None and cfg.target_epsilon is not None:
        yield ConfigIssue(KEY["target_epsilon"], f"give either {ref('noise_multiplier')} or {ref('target_epsilon')}, not both")
    if cfg.noise_multiplier is not None and cfg.clip is None:
        yield ConfigIssue(KEY["noise_multiplier"], f"a noise multiplier is relative to the clip norm: add {ref('clip')}")
    if cfg.target_epsilon is not None and cfg.clip is None:
        yield ConfigIssue(KEY["target_epsilon"], f"ε requested without clipping: nothing bounds a client's contribution; "
                          f"add {ref('clip')}")
    if cfg.target_epsilon is not None and cfg.delta is None:
        yield ConfigIssue(KEY["delta"], f"{ref('target_epsilon')} needs {ref('delta')} (an ε means nothing without its δ)")
    if cfg.dp_beta > 0 and (cfg.noise_multiplier is not None or cfg.target_epsilon is not None):
        yield ConfigIssue(KEY["dp_beta"], f"β and {ref('noise_multiplier')}/{ref('target_epsilon')} would both set the "
                          f"server's noise; with {ref('clip')}, β already is the noise multiplier z = W·β/C — give one")
    if cfg.distributed:
        if not secagg:
            yield ConfigIssue(KEY["distributed"], "distributed noise needs secure aggregation (the clients' noise shares "
                              f"only add up to privacy inside a masked sum); turn {ref('secagg')} on")
        if cfg.dp_beta > 0:
            yield ConfigIssue(KEY["dp_beta"], f"β is the server's noise; with {ref('distributed')} the clients add the "
                              "noise — give one")
        if cfg.clip is None:
            yield ConfigIssue(KEY["distributed"], f"distributed noise is calibrated to the clip norm: add {ref('clip')}")
        if cfg.noise_multiplier is None and cfg.target_epsilon is None:
            yield ConfigIssue(KEY["distributed"], f"say how much noise: {ref('noise_multiplier')} or "
                              f"{ref('target_epsilon')} with {ref('delta')}")
    if cfg.sampling == "fixed" and cfg.sample_rate is not None:
        yield ConfigIssue(KEY["sample_rate"], "a sampling rate describes Poisson sampling, but clients are selected "
                          f"K-of-N ({ref('sampling')} fixed); a Poisson ε would be false for that — use poisson")
    if cfg.sampling == "poisson" and cfg.sample_rate is None and clients_per_round == 0:
        yield ConfigIssue(KEY["sample_rate"], f"{ref('sampling')} poisson needs a rate q (or "
                          f"{ref('clients_per_round')} K as the expected cohort, q = K/N)")
    yield from _dp_sgd_issues(cfg)


def _dp_sgd_issues(cfg: PrivacyConfig) -> Iterable[ConfigIssue]:
    if not cfg.dp_sgd:
        for field in ("dp_sgd_noise_multiplier", "dp_sgd_target_epsilon", "dp_sgd_delta"):
            if getattr(cfg, field) is not None:
                yield ConfigIssue(KEY[field], f"has no effect without {ref('dp_sgd')}")
        return
    if (cfg.dp_sgd_noise_multiplier is None) == (cfg.dp_sgd_target_epsilon is None):
        yield ConfigIssue(KEY["dp_sgd"], f"give exactly one of {ref('dp_sgd_noise_multiplier')} and "
                          f"{ref('dp_sgd_target_epsilon')}")
    if cfg.dp_sgd_target_epsilon is not None and cfg.dp_sgd_delta is None:
        yield ConfigIssue(KEY["dp_sgd_delta"], f"{ref('dp_sgd_target_epsilon')} needs {ref('dp_sgd_delta')}")


# ---- the plan ------------------------------------------------------------------------------------


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
    quantiser_scale: float | None = None,
    ring_bits: int = 32,
    design_dropout: float = DESIGN_DROPOUT,
    dfs: tuple[float, float] | None = None,
    authenticated: bool = True,
    node_sites: Sequence[int] | None = None,
    dfs_identities: int | None = None,
) -> PrivacyPlan:
    """Check ``cfg`` against the run and derive the privacy plan: validate, then the plan of the one
    mechanism that noises the aggregate (Skellam, Gaussian, β or none), then DP-SGD's and DFS's, then
    what to say about them.

    ``clients_per_round``: K, 0 = every client. ``aggregation``: "weighted" when the method's
    aggregation weights depend on client data (n_k, cosine distance). ``extra_uploads``: names of
    anything else a client uploads that client-level noise does not cover (KD soft labels); such
    uploads refuse a client-level ε. ``dfs``: (noise multiplier, clip) of DFH's statistics channel,
    which has its own statement and ε (:mod:`.dfs`) and never enters the client-level one.
    ``model_dim`` (length of the shared vector) is needed for ``distributed`` and, with
    ``quantiser_scale`` (secure aggregation's ring units per 1.0), for central noise under secure
    aggregation. ``design_dropout``: the dropout rate secure aggregation is dimensioned for.
    ``authenticated``: secure aggregation's malicious-server mode (its signature quorum bounds how few
    inputs a released sum holds, see :func:`.distributed.fewest_honest_shares`). ``node_sites``: how many
    clients each party of the secure sum holds (Flower: a SuperNode's sites; None: one client each).
    ``dfs_identities``: the fewest identities a DFH client has — the DFS ε is identity-level, so its δ
    must lie below 1/that (refused naming `privacy.delta` otherwise).
    """
    if num_clients < 1:
        raise ValueError(f"num_clients must be ≥ 1, got {num_clients}")
    if rounds < 1:
        raise ValueError(f"rounds must be ≥ 1, got {rounds}")
    blockers = _blockers(aggregation, bn_stats, cfg.dp_sgd, [*extra_uploads, *_dfs_extra(dfs)])
    raise_issues(_run_issues(cfg, num_clients, clients_per_round, secagg, blockers))
    run = _facts(cfg, num_clients=num_clients, clients_per_round=clients_per_round, rounds=rounds, secagg=secagg,
                 blockers=blockers, model_dim=model_dim, quantiser_scale=quantiser_scale, ring_bits=ring_bits,
                 design_dropout=design_dropout, authenticated=authenticated, node_sites=node_sites)
    noise = _aggregate_noise(run)
    dp_sgd = _dp_sgd_plan(cfg)
    dfs_delta = run.delta if noise.claims else cfg.delta
    if dfs is not None and dfs[0] > 0 and dfs_identities is not None:  # an identity-level ε: δ < 1/identities
        dfs_delta = checked_delta(dfs_delta, dfs_identities, "delta", "identities of the smallest DFH client")
    dfs_plan = plan_dfs(dfs, rounds=rounds, delta=dfs_delta)
    statements = [*noise.statements, *_closing_statements(cfg, noise, dp_sgd, run.sampling, dfs, dfs_plan)]
    return _assemble(run, noise, dp_sgd, dfs_plan, statements)


def client_level_dp(cfg: PrivacyConfig) -> bool:
    """Whether the settings ask for a client-level ε by name (a noise multiplier or a target ε);
    ``privacy.distributed`` needs one of the two, and β asks for none."""
    return cfg.noise_multiplier is not None or cfg.target_epsilon is not None


def claims_client_level(cfg: PrivacyConfig, blockers: Sequence[tuple[str, str]]) -> bool:
    """Whether the run claims a client-level ε: asked for by name, distributed, or β noise on clipped
    updates where nothing blocks it (``blockers``: :func:`_blockers`) — the one rule for every check that
    depends on it (found by review: the uploads-recording check left β + clip out)."""
    return client_level_dp(cfg) or cfg.distributed or (cfg.dp_beta > 0 and cfg.clip is not None and not blockers)


def _run_issues(cfg: PrivacyConfig, num_clients: int, clients_per_round: int, secagg: bool,
                blockers: Sequence[tuple[str, str]]) -> list[ConfigIssue]:
    """Every refusal of ``cfg`` once the run's size is known (the data-free ones included)."""
    issues = list(_combination_issues(cfg, secagg=secagg, clients_per_round=clients_per_round))
    if not 0 <= clients_per_round <= num_clients:
        issues.append(ConfigIssue(KEY["clients_per_round"], f"must lie in [0, {num_clients}] (0 = every client), "
                                  f"got {clients_per_round}"))
    if cfg.sampling == "poisson" and cfg.sample_rate is not None and clients_per_round and \
            not math.isclose(cfg.sample_rate * num_clients, clients_per_round):
        issues.append(ConfigIssue(KEY["clients_per_round"], f"under Poisson sampling the cohort is random with mean "
                                  f"q·N = {cfg.sample_rate * num_clients:g}; it contradicts {clients_per_round} — "
                                  "give one of the two"))
    if client_level_dp(cfg):
        issues += [ConfigIssue(key, f"client-level DP is on, but {why}") for key, why in blockers]
    return issues


@dataclass(frozen=True)
class _RunFacts:
    """What every mechanism's plan reads: the validated settings and the run's shape."""

    cfg: PrivacyConfig
    num_clients: int
    rounds: int
    sampling: Literal["fixed", "poisson"]
    sample_rate: float
    fixed_k: int | None
    denominator: float  # W under DP: K, or the expected cohort q·N
    accounting_rate: float  # q the Gaussian accountant uses (1.0 under fixed selection)
    adjacency: str
    delta: float | None  # None when no ε is wanted
    blockers: tuple[tuple[str, str], ...]
    inflation: float  # secure aggregation's rounding: the clipped bound grows by this factor
    skip_p: float  # per round, P[a Poisson round releases no sum] (0 without Poisson under secure aggregation)
    design_dropout: float  # the dropout rate skip_p assumes (each sampled client vanishes with at most this)
    poisson_skips: bool
    skip_factor: int  # the sum's sensitivity in units of C under the "sensitivity" rule
    model_dim: int | None
    ring_bits: int
    authenticated: bool
    node_sites: tuple[int, ...] | None


def _facts(cfg: PrivacyConfig, *, num_clients: int, clients_per_round: int, rounds: int, secagg: bool,
           blockers: Sequence[tuple[str, str]], model_dim: int | None, quantiser_scale: float | None,
           ring_bits: int, design_dropout: float, authenticated: bool,
           node_sites: Sequence[int] | None) -> _RunFacts:
    """The run's shape as the mechanisms see it: selection, δ, rounding inflation, the Poisson skip rule."""
    sampling, sample_rate, fixed_k = _selection(cfg, num_clients, clients_per_round)
    adjacency = (
        f"add/remove one client, Poisson client sampling with rate q = {sample_rate:.4g} (amplified); "
        + PUBLIC_COUNT.format(unit="client", n="N")
        if sampling == "poisson"
        else "zero-out (one client's clipped update replaced by zero), fixed K-of-N selection, "
        "no amplification by sampling claimed (q = 1)"
    )
    wants_epsilon = claims_client_level(cfg, blockers)
    inflation = 1.0
    if secagg and quantiser_scale is not None and cfg.clip is not None and model_dim is not None:
        inflation = (cfg.clip + math.sqrt(model_dim) / quantiser_scale) / cfg.clip
    poisson_skips = secagg and sampling == "poisson"
    nodes = tuple(node_sites) if node_sites is not None else (1,) * num_clients
    return _RunFacts(
        cfg=cfg, num_clients=num_clients, rounds=rounds, sampling=sampling, sample_rate=sample_rate,
        fixed_k=fixed_k, denominator=float(fixed_k) if fixed_k is not None else sample_rate * num_clients,
        accounting_rate=sample_rate if sampling == "poisson" else 1.0, adjacency=adjacency,
        delta=checked_delta(cfg.delta, num_clients, "delta", "clients") if wants_epsilon else None,
        blockers=tuple(blockers), inflation=inflation,
        skip_p=_skip_probability(nodes, sample_rate, design_dropout) if poisson_skips else 0.0,
        design_dropout=design_dropout, poisson_skips=poisson_skips,
        skip_factor=1 + max(nodes),  # adding one client can release its update and one other node's sites
        model_dim=model_dim, ring_bits=ring_bits, authenticated=authenticated,
        node_sites=tuple(node_sites) if node_sites is not None else None,
    )


@dataclass(frozen=True)
class _NoisePlan:
    """What the mechanism that noises the aggregate decides, and what it says."""

    mechanism: Mechanism = "none"
    claims: bool = False
    statements: tuple[str, ...] = ()
    noise_multiplier: float | None = None
    accounting_z: float | None = None
    accounted_delta: float | None = None  # None: the run's δ
    skip_rule: SkipRule = "none"
    aggregate_std: float = 0.0
    accounting_rate: float | None = None  # None: the run's
    adjacency: str | None = None  # None: the run's
    skellam: SkellamParams | None = None
    colluders: int = 0
    fewest: int = 1


def _aggregate_noise(run: _RunFacts) -> _NoisePlan:
    """The one mechanism whose noise goes on the aggregate, chosen by the settings."""
    cfg = run.cfg
    if cfg.distributed:
        return _skellam_plan(run)
    if claims_client_level(cfg, run.blockers):
        return _gaussian_plan(run)
    if cfg.dp_beta > 0:
        return _beta_plan(run)
    if cfg.clip is not None:
        return _NoisePlan(statements=(f"Updates are clipped to L2 ≤ {cfg.clip:g} but not noised: clipping alone is "
                                      "not differential privacy.",))
    if cfg.dp_sgd:
        return _NoisePlan(statements=("No client-level DP: client updates are neither clipped nor noised, and no "
                                      "client-level ε is claimed.",))
    return _NoisePlan(statements=("No differential privacy: client updates are neither clipped nor noised, and no "
                                  "ε is claimed.",))


def _skellam_plan(run: _RunFacts) -> _NoisePlan:
    """Distributed DP: every client adds a Skellam share inside the masked sum (zero-out, no amplification)."""
    cfg, delta = run.cfg, run.delta
    assert delta is not None
    max_cohort = run.fixed_k if run.fixed_k is not None else run.num_clients
    colluders = collusion_bound(max_cohort, CORRUPT_FRACTION)
    fewest = fewest_honest_shares(max_cohort, colluders=colluders, corrupt_fraction=CORRUPT_FRACTION,
                                  authenticated=run.authenticated, min_cohort=MIN_SECURE_COHORT)
    skellam = _skellam(cfg, delta, run.rounds, run.fixed_k, run.sample_rate, run.num_clients, run.model_dim,
                       run.ring_bits, fewest)
    return _NoisePlan(
        mechanism="skellam", claims=True, noise_multiplier=skellam.noise_multiplier,
        accounting_z=skellam.noise_multiplier, accounting_rate=1.0, adjacency=SKELLAM_ADJACENCY, skellam=skellam,
        colluders=colluders, fewest=fewest,
        statements=tuple(_skellam_statements(cfg, skellam, delta, run.ring_bits, colluders, fewest)),
    )


def _gaussian_plan(run: _RunFacts) -> _NoisePlan:
    """Central Gaussian noise with an ε: DP-FedAvg (z or a target ε), or β on clipped unit-weight updates."""
    cfg, delta = run.cfg, run.delta
    formal = client_level_dp(cfg)
    assert cfg.clip is not None and delta is not None
    skip_p = run.skip_p if run.poisson_skips else None
    if cfg.target_epsilon is not None:
        try:
            z, accounting_z, accounted_delta, skip_rule = _calibrate(
                cfg.target_epsilon, delta, run.accounting_rate, run.rounds, run.inflation, skip_p, run.skip_factor)
        except ValueError as exc:  # no noise reaches it (found by review: Opacus' error as a traceback)
            raise ConfigError(KEY["target_epsilon"], str(exc)) from None
    else:
        z = cfg.noise_multiplier if cfg.noise_multiplier is not None else run.denominator * cfg.dp_beta / cfg.clip
        accounting_z, accounted_delta, skip_rule = _account_fixed(
            z / run.inflation, delta, run.accounting_rate, run.rounds, skip_p, run.skip_factor)
    plan = _NoisePlan(mechanism="gaussian" if formal else "beta", claims=True, noise_multiplier=z,
                      accounting_z=accounting_z, accounted_delta=accounted_delta, skip_rule=skip_rule,
                      aggregate_std=z * cfg.clip / run.denominator)
    return replace(plan, statements=tuple(_gaussian_statements(run, plan)))


def _gaussian_statements(run: _RunFacts, plan: _NoisePlan) -> list[str]:
    """What :func:`_gaussian_plan` says: the mechanism, the accountant, rounding, the skip rule, whom it trusts."""
    cfg, z = run.cfg, plan.noise_multiplier
    assert cfg.clip is not None and z is not None and run.delta is not None
    if client_level_dp(cfg):
        out = [f"Client-level DP (DP-FedAvg, McMahan et al. 2018): each client's whole shared update is clipped to "
               f"L2 ≤ C = {cfg.clip:g}; the server adds N(0, (z·C)²) with z = {z:.4g} to the unweighted "
               f"sum and divides by W = {run.denominator:g}."]
    else:
        out = [f"β = {cfg.dp_beta:g} white noise (Wu & Gong 2021, {_beta_equations(cfg)}) on the trainable shared "
               f"weights; with clipping to L2 ≤ {cfg.clip:g} and the unweighted mean over W = {run.denominator:g} "
               f"clients it is a Gaussian mechanism with noise multiplier z = W·β/C = {z:.4g}."]
        if cfg.dp_beta_mode == "double":
            out.append("The per-client broadcast noise of Eq. 15 is post-processing: it does not lower the "
                       "accounted ε.")
    out.append(f"(ε, δ = {run.delta:.3g}) by Opacus' RDP accountant, adjacency {run.adjacency}.")
    if run.inflation > 1.0:
        out.append(f"Secure aggregation's rounding can lengthen a clipped update to {cfg.clip * run.inflation:.6g}; "
                   f"the accountant is given the noise relative to that bound (z = {z / run.inflation:.6g}).")
    if plan.skip_rule == "delta":
        out.append(f"A Poisson round with fewer than {MIN_SECURE_COHORT} clients left releases no sum (probability ≤ "
                   f"{run.skip_p:.3g} per round, assuming each sampled client drops out with probability ≤ "
                   f"{run.design_dropout:g}, the rate secure aggregation is dimensioned for — more dropouts make the "
                   f"event likelier than accounted); that event is folded into δ: the accountant runs at δ = "
                   f"{plan.accounted_delta:.3g}.")
    elif plan.skip_rule == "sensitivity":
        out.append(f"A Poisson round with fewer than {MIN_SECURE_COHORT} clients left releases no sum, so one client "
                   f"can decide whether others' updates are released: the sum's sensitivity is taken as "
                   f"{run.skip_factor}C (its own update and the {run.skip_factor - 1} site(s) of one other secure-sum "
                   f"node; accountant's noise multiplier {plan.accounting_z:.4g}).")
    out.append(CENTRAL_TRUST)
    return out


def _beta_equations(cfg: PrivacyConfig) -> str:
    """Which of Wu & Gong's equations the β mode uses."""
    return "Eq. 14" if cfg.dp_beta_mode == "single" else "Eqs. 14 and 15"


def _beta_plan(run: _RunFacts) -> _NoisePlan:
    """β noise without an ε: nothing bounds a contribution, or something else blocks the claim."""
    cfg = run.cfg
    out = [f"β = {cfg.dp_beta:g} white noise (Wu & Gong 2021, {_beta_equations(cfg)}) on the trainable shared weights"
           + (" and, fresh per client, on what each client receives." if cfg.dp_beta_mode == "double" else ".")]
    if cfg.clip is None:
        out.append(NOT_DP + f" Add {ref('clip')} to bound it.")
    else:
        out.append(f"Clipped to L2 ≤ {cfg.clip:g}, but no ε is claimed: "
                   + "; ".join(why for _, why in run.blockers) + ".")
    return _NoisePlan(mechanism="beta", aggregate_std=cfg.dp_beta, statements=tuple(out))


def _dp_sgd_plan(cfg: PrivacyConfig) -> DpSgdPlan | None:
    """Example-level DP-SGD inside every client, or None."""
    if not cfg.dp_sgd:
        return None
    return DpSgdPlan(cfg.dp_sgd_clip, cfg.dp_sgd_noise_multiplier, cfg.dp_sgd_target_epsilon, cfg.dp_sgd_delta)


def _closing_statements(cfg: PrivacyConfig, noise: _NoisePlan, dp_sgd: DpSgdPlan | None,
                        sampling: Literal["fixed", "poisson"], dfs: tuple[float, float] | None,
                        dfs_plan: DfsPlan | None) -> list[str]:
    """After the aggregate's mechanism: whom its ε protects against, DP-SGD, where the noise comes from,
    what no ε covers, and DFH's statistics channel."""
    out = [adversary.statement(noise.mechanism, sampling), PERSON_CLIENT] if noise.claims else []
    if dp_sgd is not None:
        z = (f"z = {dp_sgd.noise_multiplier:g}" if dp_sgd.noise_multiplier is not None
             else f"z calibrated per client to ε = {dp_sgd.target_epsilon:g}")
        out.append(f"Example-level DP-SGD in every client (Opacus): per-example gradients clipped to "
                   f"{dp_sgd.max_grad_norm:g}, {z}, Poisson batches; each client's (ε, δ) over its own examples "
                   f"(add/remove one example) is accounted separately. {PUBLIC_COUNT.format(unit='example', n='n_k')} "
                   "BatchNorm is replaced by GroupNorm in every model. " + PERSON_EXAMPLE)
    dfs_noised = dfs is not None and dfs[0] > 0
    if noise.claims or dp_sgd is not None or noise.mechanism == "beta" or dfs_noised:
        out.append(REPRODUCIBLE_NOISE if cfg.reproducible_noise else SECURE_NOISE)
    if noise.claims or dp_sgd is not None:
        out.append(NOT_COVERED)
    if dfs_plan is not None:  # its ε too is NOT PRIVATE under reproducible noise
        out.append((adversary.NOT_PRIVATE + ": " if dfs_noised and cfg.reproducible_noise else "")
                   + dfs_plan.statement())
    return out


def _assemble(run: _RunFacts, noise: _NoisePlan, dp_sgd: DpSgdPlan | None, dfs_plan: DfsPlan | None,
              statements: Sequence[str]) -> PrivacyPlan:
    """The plan: what the mechanism decided, and the run's facts where it claims an ε."""
    cfg, claims = run.cfg, noise.claims
    accounted_delta = run.delta if noise.accounted_delta is None else noise.accounted_delta
    return PrivacyPlan(
        mechanism=noise.mechanism, sampling=run.sampling, sample_rate=run.sample_rate,
        clients_per_round=run.fixed_k, unit_weights=claims, denominator=run.denominator if claims else None,
        clip=cfg.clip, beta=cfg.dp_beta, beta_mode=cfg.dp_beta_mode, aggregate_noise_std=noise.aggregate_std,
        noise_multiplier=noise.noise_multiplier,
        accounting_noise_multiplier=noise.accounting_z if claims else None,
        claims_epsilon=claims, delta=run.delta if claims else None,
        accounted_delta=accounted_delta if claims else None, skip_rule=noise.skip_rule if claims else "none",
        skip_probability=run.skip_p,
        accounting_sample_rate=(run.accounting_rate if noise.accounting_rate is None else noise.accounting_rate)
        if claims else None,
        adjacency=(noise.adjacency or run.adjacency) if claims else None,
        skellam=noise.skellam, dp_sgd=dp_sgd, rounds=run.rounds, reproducible_noise=cfg.reproducible_noise,
        statements=tuple(statements), dfs=dfs_plan, colluders=noise.colluders, fewest_shares=noise.fewest,
        node_sites=run.node_sites, authenticated=run.authenticated,
    )


def _skip_probability(node_sites: Sequence[int], rate: float, dropout: float) -> float:
    """P[fewer than MIN_SECURE_COHORT nodes take part] once one client is removed, at worst over which node
    held it — the neighbouring dataset with one client fewer. The secure sum runs among nodes (one client
    each in-process; a Flower SuperNode sums its sites first): node j takes part when one of its m_j
    sites is sampled and the node stays online, r_j = (1 − d)·(1 − (1 − q)^m_j), independently."""
    def below_two(sizes: Counter[int]) -> float:  # P[0 or 1 nodes take part]; MIN_SECURE_COHORT is 2
        r = {m: (1 - dropout) * (1 - (1 - rate) ** m) for m, count in sizes.items() if m > 0 and count > 0}  # alike by size
        none = math.prod((1 - r[m]) ** sizes[m] for m in r)
        one = sum(sizes[m] * r[m] * (1 - r[m]) ** (sizes[m] - 1) * math.prod((1 - r[o]) ** sizes[o] for o in r if o != m)
                  for m in r)
        return none + one

    sizes = Counter(int(m) for m in node_sites)
    worst = 0.0
    for m in sorted(sizes):  # remove the client from a node of each size in turn
        fewer = sizes.copy()
        fewer[m] -= 1
        fewer[m - 1] += 1
        worst = max(worst, below_two(fewer))
    return worst


def _skip_term(rounds: int, epsilon: float, p: float) -> float:
    """δ lost to the skip event over ``rounds`` rounds: T·(1 + e^ε)·p (inf when e^ε overflows)."""
    try:
        return rounds * (1 + math.exp(epsilon)) * p
    except OverflowError:
        return math.inf


def _account_fixed(z: float, delta: float, q: float, rounds: int, skip_p: float | None,
                   factor: int = 2) -> tuple[float, float, SkipRule]:
    """(accountant z, accountant δ, skip rule) for a given noise, the one with the smaller ε; ``factor``:
    the sum's sensitivity in units of C under the "sensitivity" rule (1 + the most sites on one node)."""
    if skip_p is None:
        return z, delta, "none"
    options = [(gaussian_epsilon(z / factor, q, rounds, delta), z / factor, delta, "sensitivity")]
    half = delta / 2
    eps = gaussian_epsilon(z, q, rounds, half)
    if _skip_term(rounds, eps, skip_p) <= delta - half:
        options.append((eps, z, half, "delta"))
    _, z_acc, d_acc, rule = min(options, key=lambda o: o[0])
    return z_acc, d_acc, rule  # type: ignore[return-value]


def _calibrate(target: float, delta: float, q: float, rounds: int, inflation: float,
               skip_p: float | None, factor: int = 2) -> tuple[float, float, float, SkipRule]:
    """(noise z, accountant z, accountant δ, skip rule) meeting ``target``: calibrated on the value the
    accountant is given, last, so the printed ε ≤ target; the cheapest rule in noise wins."""
    options: list[tuple[float, float, float, SkipRule]] = []
    if skip_p is None:
        z = noise_for_target_epsilon(target, delta, q, rounds)
        options.append((z * inflation, z, delta, "none"))
    else:
        z = noise_for_target_epsilon(target, delta, q, rounds)
        options.append((factor * z * inflation, z, delta, "sensitivity"))
        half = delta / 2
        if _skip_term(rounds, target, skip_p) <= delta - half:
            z = noise_for_target_epsilon(target, half, q, rounds)
            options.append((z * inflation, z, half, "delta"))
    return min(options, key=lambda o: o[0])


def _selection(cfg: PrivacyConfig, num_clients: int, clients_per_round: int) -> tuple[Literal["fixed", "poisson"], float, int | None]:
    """(sampling, q, K): q is each client's chance per round; K is the fixed cohort (None under Poisson)."""
    if cfg.sampling == "fixed":
        k = clients_per_round or num_clients
        return "fixed", k / num_clients, k
    if cfg.sample_rate is None:
        return "poisson", clients_per_round / num_clients, None
    return "poisson", float(cfg.sample_rate), None


def _skellam_statements(cfg: PrivacyConfig, skellam: SkellamParams, delta: float, ring_bits: int, colluders: int,
                        fewest: int) -> list[str]:
    """What the plan says about distributed Skellam noise: the mechanism, the ε, the collusion bound."""
    target = ""
    if cfg.target_epsilon is not None:
        target = (f" Each share is calibrated so that even a sum of only {fewest} honest shares — the fewest a released "
                  f"sum can hold, whoever drops out or colludes — keeps ε ≤ the target {cfg.target_epsilon:g}.")
    return [
        f"Distributed DP: each client clips its whole shared update to L2 ≤ C = {cfg.clip:g} and adds its share of "
        f"Skellam noise in the integer ring Z_2^{ring_bits} before masking, so the unmasked sum carries noise std "
        f"z·C = {skellam.sum_noise_std(skellam.contributors):.4g} (z = {skellam.noise_multiplier:.4g}, "
        f"{skellam.contributors} shares) and the server never sees a noise-free sum.{target}",
        f"(ε, δ = {delta:.3g}) by the Skellam RDP bound (Agarwal, Kairouz & Liu 2021), per round without amplification "
        f"by sampling, zero-out adjacency. It holds against the server colluding with up to c = {colluders} clients "
        f"(⌊{CORRUPT_FRACTION:g}·n⌋ of the planned cohort's n, secure aggregation's bound; any of them may be in any "
        f"session the server restarts): a round counts only the noise shares of clients whose input reached the sum, "
        f"less c, and never fewer than {fewest}.",
    ]


def _skellam(
    cfg: PrivacyConfig, delta: float, rounds: int, fixed_k: int | None, sample_rate: float,
    num_clients: int, model_dim: int | None, ring_bits: int, fewest: int,
) -> SkellamParams:
    """The Skellam parameters: for a target ε, calibrated for ``fewest`` honest shares per round."""
    if model_dim is None:
        raise ValueError("distributed noise needs model_dim (the length of the shared vector) to choose the ring scaling")
    assert cfg.clip is not None
    planned = fixed_k if fixed_k is not None else max(1, round(sample_rate * num_clients))
    setup = dict(
        dim=model_dim, clip=cfg.clip, ring_bits=ring_bits, contributors=planned,
        max_contributors=fixed_k if fixed_k is not None else num_clients,
    )
    try:
        z = (
            cfg.noise_multiplier
            if cfg.noise_multiplier is not None
            else distributed.noise_for_target_epsilon(cfg.target_epsilon, delta, rounds, shares=fewest,  # type: ignore[arg-type]
                                                      **setup)
        )
        return skellam_params(noise_multiplier=z, **setup)  # type: ignore[arg-type]
    except RingTooSmall as exc:
        raise ConfigError(KEY["distributed"], str(exc)) from None


__all__ = ["DpSgdPlan", "PrivacyPlan", "checked_delta", "default_delta", "resolve", "static_issues"]
