"""The run's client-level privacy ledger: one accountant, stepped once per round, saved with checkpoints.

Built by :meth:`secfed.privacy.policy.PrivacyPlan.ledger` with the plan's fixed parameters, so the
round loop only reports what happened (``record_round(contributors)``) and reads ``epsilon()``.
"""

from __future__ import annotations

from typing import Any, Literal

from secfed.privacy.accountant import SampledGaussianAccountant
from secfed.privacy.distributed import SkellamParams, account_round, honest_shares
from secfed.privacy.skellam import SkellamAccountant

STATE_VERSION = 1


class PrivacyLedger:
    """(ε, δ) of the rounds run so far.

    ``gaussian``: central Gaussian noise (DP-FedAvg, or β with ``--clip``) — every round costs the
    same whatever the cohort, so ``contributors`` is recorded but does not change the step.
    ``skellam``: distributed noise — a round costs according to how many noise shares reached the sum,
    less the ``colluders`` that may hand theirs to the server, never below the protocol's floor
    ``fewest_shares`` (:func:`~secfed.privacy.distributed.honest_shares`).
    """

    def __init__(
        self,
        mechanism: Literal["gaussian", "skellam"],
        delta: float,
        *,
        noise_multiplier: float | None = None,
        sample_rate: float | None = None,
        skellam: SkellamParams | None = None,
        accounted_delta: float | None = None,
        colluders: int = 0,
        fewest_shares: int = 1,
    ) -> None:
        if not 0 < delta < 1:
            raise ValueError(f"δ must lie in (0, 1), got {delta}")
        self.mechanism = mechanism
        self.delta = delta
        # δ handed to the accountant; smaller than δ when the plan folds an event into δ (see policy)
        self.accounted_delta = delta if accounted_delta is None else accounted_delta
        if not 0 < self.accounted_delta <= delta:
            raise ValueError(f"accounted δ must lie in (0, δ], got {self.accounted_delta}")
        self.rounds = 0
        self._accountant: SampledGaussianAccountant | SkellamAccountant
        if mechanism == "gaussian":
            if noise_multiplier is None or sample_rate is None:
                raise ValueError("a Gaussian ledger needs the noise multiplier and the accounting sample rate")
            self.noise_multiplier, self.sample_rate = noise_multiplier, sample_rate
            self._accountant = SampledGaussianAccountant()
        elif mechanism == "skellam":
            if skellam is None:
                raise ValueError("a Skellam ledger needs the mechanism's parameters")
            if colluders < 0 or fewest_shares < 1:
                raise ValueError(f"need colluders ≥ 0 and fewest shares ≥ 1, got {colluders}, {fewest_shares}")
            self.skellam, self.colluders, self.fewest_shares = skellam, colluders, fewest_shares
            self._accountant = SkellamAccountant()
        else:
            raise ValueError(f"unknown mechanism {mechanism!r}")

    def record_round(self, contributors: int) -> None:
        """Account one finished round; ``contributors`` = clients whose input is in its aggregate."""
        if contributors < 0:
            raise ValueError(f"contributors must be ≥ 0, got {contributors}")
        if isinstance(self._accountant, SampledGaussianAccountant):
            # The noise is the server's and does not depend on who showed up; an empty Poisson cohort
            # still released a noised (zero) sum, and the amplification analysis counts that round.
            self._accountant.step(self.noise_multiplier, self.sample_rate)
        else:
            shares = honest_shares(contributors, colluders=self.colluders, fewest=self.fewest_shares)
            account_round(self._accountant, self.skellam, shares)
        self.rounds += 1

    def record_lost_release(self) -> None:
        """Account a round that may have released its noised aggregate before an interruption lost its
        record (the resumed run redoes it with fresh noise): at the worst case, since who contributed
        is unknown — the fewest honest shares for distributed noise; the same step for Gaussian noise."""
        self.record_round(self.fewest_shares if self.mechanism == "skellam" else 0)

    def epsilon(self) -> float:
        """ε at the plan's δ after the rounds recorded so far."""
        return self._accountant.epsilon(self.accounted_delta)

    def metrics(self) -> dict[str, Any]:
        """What a metrics.jsonl line and the run summary carry."""
        out = {"epsilon": self.epsilon(), "delta": self.delta, "accounted_rounds": self.rounds, "accountant": self.mechanism}
        if self.mechanism == "skellam":
            out["colluders"] = self.colluders  # the ε holds against the server with up to this many clients
        return out

    def state_dict(self) -> dict[str, Any]:
        """Plain data: ``torch.save``-able with ``weights_only=True`` and JSON-serialisable."""
        return {
            "version": STATE_VERSION,
            "mechanism": self.mechanism,
            "delta": self.delta,
            "rounds": self.rounds,
            "accountant": self._accountant.state_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue a resumed run; refuses a state from another mechanism or δ (the run's settings changed)."""
        if not isinstance(state, dict) or state.get("version") != STATE_VERSION:
            raise ValueError(f"privacy ledger state version {state.get('version') if isinstance(state, dict) else None!r}, expected {STATE_VERSION}")
        if state.get("mechanism") != self.mechanism:
            raise ValueError(f"the checkpoint accounted {state.get('mechanism')!r} noise, this run uses {self.mechanism!r}")
        if state.get("delta") != self.delta:
            raise ValueError(f"the checkpoint accounted at δ = {state.get('delta')}, this run at δ = {self.delta}")
        rounds = state.get("rounds")
        if not (isinstance(rounds, int) and rounds >= 0):
            raise ValueError(f"privacy ledger state: rounds must be an integer ≥ 0, got {rounds!r}")
        self._accountant.load_state_dict(state["accountant"])
        self.rounds = rounds
