"""Rényi-DP accounting of the sampled Gaussian mechanism, by Opacus.

One class serves both granularities secfed accounts:

* client level (DP-FedAvg): stepped once per round with the round's noise multiplier z and client
  sampling rate q (q = 1 for rounds whose amplification we do not claim);
* example level (DP-SGD inside a client): stepped once per optimiser step by Opacus' own hook.

The RDP of the sampled Gaussian mechanism (Mironov, Talwar & Zhang 2019) and its conversion to
(ε, δ) (Balle et al. 2020, Thm. 21) are Opacus' code, not ours. Adjacency is add/remove-one
(of a client, resp. an example) for q < 1; for q = 1 the bound also holds under zero-out
adjacency (one unit's clipped contribution replaced by zero), which is the one secfed uses for
fixed K-of-N client selection.

The state is plain data (lists of numbers and a string) so a checkpoint can hold it without pickle.

Opacus is imported when an accountant is made or a noise multiplier calibrated, not with this
module: importing ``opacus`` costs about a second (it loads its whole privacy engine, SciPy
included), which a run without DP — and every message of a Flower ClientApp — need not pay.
"""

from __future__ import annotations

import math
import warnings
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from opacus.accountants import RDPAccountant

STATE_VERSION = 1


def _check_step(noise_multiplier: float, sample_rate: float) -> None:
    if not (math.isfinite(noise_multiplier) and noise_multiplier >= 0):  # 0: no noise, ε = ∞ (honestly)
        raise ValueError(f"noise multiplier must be a finite number ≥ 0, got {noise_multiplier}")
    if not (0 < sample_rate <= 1):
        raise ValueError(f"sample rate must lie in (0, 1], got {sample_rate}")


def _check_delta(delta: float) -> None:
    if not (0 < delta < 1):
        raise ValueError(f"δ must lie in (0, 1), got {delta}")


class SampledGaussianAccountant:
    """A thin, checkpointable wrapper over Opacus' :class:`~opacus.accountants.RDPAccountant`."""

    def __init__(self) -> None:
        from opacus.accountants import RDPAccountant

        self._opacus = RDPAccountant()

    @property
    def opacus(self) -> RDPAccountant:
        """The Opacus accountant itself (for ``DPOptimizer.attach_step_hook``)."""
        return self._opacus

    def step(self, noise_multiplier: float, sample_rate: float) -> None:
        """Record one release of the sampled Gaussian mechanism."""
        _check_step(noise_multiplier, sample_rate)
        self._opacus.step(noise_multiplier=float(noise_multiplier), sample_rate=float(sample_rate))

    @property
    def steps(self) -> int:
        """Releases recorded so far."""
        return sum(int(count) for _, _, count in self._opacus.history)

    def epsilon(self, delta: float) -> float:
        """ε of everything recorded, at ``delta`` (0.0 before the first step)."""
        _check_delta(delta)
        with warnings.catch_warnings():
            # "optimal order is the smallest/largest alpha" is about tightness, not validity; at the
            # very large ε of weak noise it fires on every round and would drown the run's output.
            warnings.simplefilter("ignore", UserWarning)
            return float(self._opacus.get_epsilon(delta=delta))

    def state_dict(self) -> dict[str, Any]:
        """``{"version", "mechanism": "rdp", "history": [[z, q, steps], ...]}`` — JSON-serialisable."""
        return {
            "version": STATE_VERSION,
            "mechanism": self._opacus.mechanism(),
            "history": [[float(z), float(q), int(n)] for z, q, n in self._opacus.history],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from :meth:`state_dict` output; a malformed state is refused, naming what is wrong."""
        if not isinstance(state, dict):
            raise ValueError(f"accountant state must be a dict, got {type(state).__name__}")
        if state.get("version") != STATE_VERSION:
            raise ValueError(f"accountant state version {state.get('version')!r}, expected {STATE_VERSION}")
        if state.get("mechanism") != self._opacus.mechanism():
            raise ValueError(f"accountant state mechanism {state.get('mechanism')!r} is not {self._opacus.mechanism()!r}")
        history = state.get("history")
        if not isinstance(history, list):
            raise ValueError("accountant state has no 'history' list")
        entries: list[tuple[float, float, int]] = []
        for i, entry in enumerate(history):
            if not (isinstance(entry, (list, tuple)) and len(entry) == 3):
                raise ValueError(f"accountant history entry {i} is not [noise_multiplier, sample_rate, steps]")
            z, q, n = float(entry[0]), float(entry[1]), entry[2]
            if not (isinstance(n, int) and n >= 1):
                raise ValueError(f"accountant history entry {i}: steps must be a positive integer, got {n!r}")
            _check_step(z, q)
            entries.append((z, q, n))
        # Opacus compares tuples when merging repeated steps; keep its own representation.
        self._opacus.history = entries


def gaussian_epsilon(noise_multiplier: float, sample_rate: float, steps: int, delta: float) -> float:
    """ε after ``steps`` releases of the sampled Gaussian mechanism (one Opacus accountant, fresh)."""
    accountant = SampledGaussianAccountant()
    if steps > 0:
        _check_step(noise_multiplier, sample_rate)
        accountant.opacus.history = [(float(noise_multiplier), float(sample_rate), int(steps))]
    return accountant.epsilon(delta)


MAX_TARGET_EPSILON = 1e6  # guarantees nothing (e^1e6); Opacus calibrates 1e8 in 2 s but never ends at 1e300


def noise_for_target_epsilon(target_epsilon: float, delta: float, sample_rate: float, rounds: int) -> float:
    """The smallest noise multiplier (to Opacus' 0.01 ε tolerance) whose ε after ``rounds`` is ≤ target.

    Opacus' ``get_noise_multiplier`` with the RDP accountant, so calibration and reporting agree.
    """
    if not (math.isfinite(target_epsilon) and target_epsilon > 0):
        raise ValueError(f"target ε must be a positive finite number, got {target_epsilon}")
    _check_delta(delta)
    if not (0 < sample_rate <= 1):
        raise ValueError(f"sample rate must lie in (0, 1], got {sample_rate}")
    if rounds < 1:
        raise ValueError(f"rounds must be ≥ 1, got {rounds}")
    from opacus.accountants.utils import get_noise_multiplier

    if target_epsilon > MAX_TARGET_EPSILON:  # Opacus' search never ends there (found by review: 1e300 hung).
        # Checked here, not in the schema, so that runs saved with any ε it could calibrate still open (review)
        raise ValueError(f"target ε {target_epsilon:g} is above {MAX_TARGET_EPSILON:g}, where no guarantee is left")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # the order-range warning, as in epsilon()
        try:
            return float(get_noise_multiplier(target_epsilon=target_epsilon, target_delta=delta,
                                              sample_rate=sample_rate, steps=rounds, accountant="rdp"))
        except ValueError as exc:  # "The privacy budget is too low." (found by review: a traceback)
            raise ValueError(f"no noise multiplier reaches ε = {target_epsilon:g} at δ = {delta:g} over {rounds} "
                             f"steps at sampling rate {sample_rate:.3g} ({exc})") from None
