"""Whom each printed ε protects against: the server, and those who see only the released models.

The two views differ in what they observe:

    released models   everyone who sees only what the run publishes (the global models, whoever
                      uses the model): not who took part in a round. Poisson amplification holds
                      against them, as long as the cohorts and batches stay secret — secfed draws
                      them from the CSPRNG noise source (:mod:`.noise`). Not the other sites under
                      secure aggregation: a site drawn in a round learns that round's cohort from
                      the session (its members' identity keys), as the server does, and sees no
                      more than the server — against them the server's figure is what holds.
    the server        sees who uploads in every round, so amplification by client sampling never
                      holds against it. With central noise (DP-FedAvg, β) it also sees the
                      noise-free sum: no ε protects against it ("central DP trusts the server").
                      With distributed Skellam noise it sees only the noised sum, and that ε
                      claims no amplification by sampling, so it holds against the server as is.

Example-level DP-SGD and DFH's identity-level DFS ε rest on nothing the server observes (the batches
are drawn inside the client from its CSPRNG; the DFS ε claims no amplification), so they hold against
the server as well. Under `privacy.reproducible_noise` every ε is labelled NOT PRIVATE: whoever
knows the run seed regenerates the noise and the samples.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from secfed.privacy.dfs import DfsPlan
    from secfed.privacy.policy import PrivacyPlan

NOT_PRIVATE = "NOT PRIVATE (reproducible noise)"
RELEASED_MODELS = "those who see only the released models"
CENTRAL_TRUSTS_SERVER = "none: central DP trusts the server (it sees the noise-free sum and who uploads)"
SKELLAM_SERVER = ("the server sees who uploads and only the noised sum; no amplification by client sampling is "
                  "claimed, so the ε holds against it")
DP_SGD_SERVER = ("the server sees at most this client's update; the batches are drawn inside the client from its "
                 "CSPRNG, so the ε holds against it")
DP_SGD_LOCAL_ONLY = ("the server never sees this model: it trains alone, for comparison, and stays in the run "
                     "directory")
LOCAL_ONLY_AUDIENCE = "whoever sees this model (the run directory's checkpoints)"
FEDERATED, LOCAL_ONLY = " (federated)", " (local-only)"  # how a summary names a client's two DP-SGD models
DFS_GUARANTEE = "identity-level DFS (DFH), per client"
DFS_SERVER = "the server sees every client's noised DFS; no amplification by sampling is claimed, so the ε holds against it"
DFS_AUDIENCE = "whoever sees the DFS (every client, through the broadcast)"
DFS_ONLY = "the DFS channel alone: not the model updates, nor the released models"


@dataclass(frozen=True)
class Guarantee:
    """One mechanism's (ε, δ), against each of the two adversaries."""

    guarantee: str  # what is protected, by which mechanism
    delta: float
    released_models: float  # ε against those who see only the released models
    server: float | None  # ε against the server; None: no ε holds against it
    server_note: str  # why the server's ε is what it is
    released_note: str  # what the released-models ε assumes
    not_private: bool  # reproducible noise: the figures hold against nobody who knows the run seed
    # who the first figure holds against; a DFS ε is not one "those who see only the released models" get
    # (found by review: the models of a DFH run carry no ε at all)
    audience: str = RELEASED_MODELS

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def sentence(self) -> str:
        """The printed line: both figures, labelled, and NOT PRIVATE first where it applies."""
        server = self.server_note if self.server is None else f"ε = {self.server:.3g} ({self.server_note})"
        return (f"{NOT_PRIVATE + ': ' if self.not_private else ''}{self.guarantee}: ε = {self.released_models:.3g} "
                f"against {self.audience} ({self.released_note}); against the server: {server}; "
                f"δ = {self.delta:.2g}")


def client_level(plan: PrivacyPlan, epsilon: float) -> Guarantee:
    """The client-level ε of a plan that claims one, as both adversaries see it."""
    assert plan.claims_epsilon and plan.delta is not None
    if plan.mechanism == "skellam":
        server, note = epsilon, SKELLAM_SERVER
        name = "client-level distributed DP (Skellam)"
    else:
        server, note = None, CENTRAL_TRUSTS_SERVER
        name = f"client-level central DP ({'DP-FedAvg' if plan.mechanism == 'gaussian' else 'β noise, clipped'})"
    amplified = plan.accounting_sample_rate is not None and plan.accounting_sample_rate < 1
    released = (f"amplified by Poisson client sampling, q = {plan.accounting_sample_rate:.3g}; holds while the "
                "cohorts stay secret: not against the other sites under secure aggregation, where a site drawn in a "
                "round learns its cohort from the session (against them the server's figure holds), and an "
                "in-process run directory holds every site's state, from which they can be read: keep it with the "
                "sites' data" if amplified else "no amplification by client sampling")
    return Guarantee(name, plan.delta, epsilon, server, note, released, plan.reproducible_noise)


def dp_sgd(who: str, epsilon: float, delta: float, *, reproducible: bool, local: bool = False) -> Guarantee:
    """One model's example-level DP-SGD ε (amplified by its client's secret Poisson batches). A ``local``
    (local-only baseline's) model never reaches the server (found by review: its line said the server
    sees its update)."""
    return Guarantee(f"example-level DP-SGD, {who}", delta, epsilon, epsilon,
                     DP_SGD_LOCAL_ONLY if local else DP_SGD_SERVER,
                     "amplified by Poisson batch sampling inside the client; holds while the batches stay secret",
                     reproducible, audience=LOCAL_ONLY_AUDIENCE if local else RELEASED_MODELS)


def dp_sgd_per_client(models: Iterable[tuple[str, Mapping[str, float]]]) -> dict[str, dict[str, float]]:
    """Each client's DP-SGD ε over every model its examples trained — its federated model and its
    local-only baseline, in one run or over a sweep's runs — by basic composition: ε and δ add (found by
    review: each model's ε was stated, never what the client's examples bear over both)."""
    out: dict[str, dict[str, float]] = {}
    for who, dp in models:
        client = out.setdefault(who.removesuffix(FEDERATED).removesuffix(LOCAL_ONLY),
                                {"models": 0, "epsilon": 0.0, "delta": 0.0})
        client["models"] += 1
        client["epsilon"] += dp["epsilon"]
        client["delta"] += dp["delta"]
    return out


def dfs(plan: DfsPlan | None, *, reproducible: bool) -> Guarantee | None:
    """DFH's identity-level DFS ε per client (None: no DFS, or unnoised DFS — no ε)."""
    if plan is None or plan.epsilon is None:
        return None
    return Guarantee(DFS_GUARANTEE, plan.delta, plan.epsilon, plan.epsilon, DFS_SERVER, DFS_ONLY, reproducible,
                     audience=DFS_AUDIENCE)


def statement(mechanism: str, sampling: str) -> str:
    """The plan's sentence on whom a claimed client-level ε holds against."""
    if mechanism == "skellam":
        return "Against the server the Skellam ε holds as printed (" + SKELLAM_SERVER + ")."
    secret = ("Poisson client sampling amplifies the ε only against those who see only the released models: the "
              "cohorts are drawn from the CSPRNG noise source, never from the run seed; the server sees who uploads, "
              "so against it no amplification holds, and neither against the other sites under secure aggregation "
              "(a site drawn in a round learns its cohort from the session; the server's figure holds against "
              "them). " if sampling == "poisson" else "")
    return secret + "Against the server no ε holds: " + CENTRAL_TRUSTS_SERVER.removeprefix("none: ") + "."


__all__ = ["Guarantee", "client_level", "dfs", "dp_sgd", "dp_sgd_per_client", "statement"]
