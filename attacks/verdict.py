"""Verdicts, and the one rule that turns an attack's outcome into one.

    LEAK                       the attack re-identified people (or linked an identity to the client)
                               significantly more often than chance, or reconstructed a victim's own
                               picture (image-level match: :data:`secfed.attacks.judge.IMAGE_SSIM`) —
                               whatever its residual
    NO-LEAK-AT-THIS-STRENGTH   the attack fitted what it attacked — its own residual is below its fit
                               threshold AND, for gradient inversion, what it reconstructed reproduces
                               the update's batch statistics (a fit is judged on the pictures, not on
                               the gradient alone) — modelled the whole target, ran a test with the
                               power to find a leak, and found nothing
    INCONCLUSIVE               anything else, with the reason: the attack did not fit, its pictures do
                               not explain the update, it models only part of the target (a probe
                               that finds nothing proves nothing), or no test had power (no other
                               picture of a victim to find; a gallery too small for p < ALPHA)

An attack that did not fit its target, or whose tests could not have found a leak, never says
"safe". A target's verdict is LEAK if any of its attacks says LEAK, NO-LEAK-AT-THIS-STRENGTH if one
says so and none leaks, INCONCLUSIVE otherwise.

"Significantly" is a one-sided test at level :data:`ALPHA`: for reconstructions, how high the first
picture of a victim's identity ranks among the gallery, against a random ranking (per image, then
combined: :mod:`secfed.attacks.judge`); for membership, a rank test of member against non-member
scores. The image-level match is a threshold test, calibrated on negatives
(``tests/attacks/test_judge.py::test_image_match_threshold_is_never_crossed_by_negatives``).
"""

from __future__ import annotations

from dataclasses import KW_ONLY, dataclass, field
from enum import Enum
from typing import Any

import torch

ALPHA = 0.01  # level of every "better than chance" test behind a LEAK


class Verdict(str, Enum):
    LEAK = "LEAK"
    NO_LEAK = "NO-LEAK-AT-THIS-STRENGTH"
    INCONCLUSIVE = "INCONCLUSIVE"

    def __str__(self) -> str:
        return self.value


SEVERITY = {Verdict.LEAK: 2, Verdict.INCONCLUSIVE: 1, Verdict.NO_LEAK: 0}


@dataclass(frozen=True)
class LeakTest:
    """Whether an attack's output identifies people better than chance."""

    measurable: bool  # False: no test was possible (e.g. no other image of the victims to find)
    hits: int = 0
    trials: int = 0
    chance: float = 0.0
    p_value: float = 1.0
    statistic: str = ""  # what was counted, in words
    threshold: bool = False  # a threshold test: any hit is a leak (no p-value; calibrated on negatives)

    @property
    def significant(self) -> bool:
        if self.threshold:
            return self.measurable and self.hits > 0
        return self.measurable and self.p_value < ALPHA

    def to_dict(self) -> dict[str, Any]:
        return {"measurable": self.measurable, "hits": self.hits, "trials": self.trials, "chance": self.chance,
                "p_value": None if self.threshold else self.p_value, "significant": self.significant,
                "statistic": self.statistic, "rule": "threshold" if self.threshold else f"p < {ALPHA}"}


def no_test(reason: str) -> LeakTest:
    return LeakTest(False, statistic=reason)


@dataclass
class AttackResult:
    """One attack against one target: its verdict and everything a reader needs to weigh it."""

    attack: str  # e.g. "probe:neck-bn", "inversion:gradient", "membership:dfs"
    target: str  # update | sum | weights | dfs | protocol
    verdict: Verdict
    reason: str
    residual: float | None  # the attack's own fit residual (see residual_kind); None: not applicable
    residual_kind: str
    fit_threshold: float | None
    complete: bool  # whether the attack models the whole target (only then may it say NO-LEAK)
    # the rest by name only (found by review: iterations and restarts given in order landed in the
    # reconstruction residual's fields, and audit.json said "fitted": false of fitted attacks)
    _: KW_ONLY
    # what the reconstructions themselves reproduce (gradient inversion: the update's batch statistics)
    reconstruction_residual: float | None = None
    reconstruction_threshold: float | None = None
    iterations: int = 0
    restarts: int = 0
    cpu_seconds: float = 0.0
    wall_seconds: float = 0.0
    assumptions: dict[str, Any] = field(default_factory=dict)
    metrics: dict[str, Any] = field(default_factory=dict)
    tests: dict[str, LeakTest] = field(default_factory=dict)
    per_image: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    # reconstructions and what they are compared with, for --save-images only (never serialised)
    images: dict[str, torch.Tensor] = field(default_factory=dict, repr=False)

    @property
    def fitted(self) -> bool:
        if self.residual is None or self.fit_threshold is None or self.residual > self.fit_threshold:
            return False
        if self.reconstruction_threshold is None:
            return True
        return self.reconstruction_residual is not None and self.reconstruction_residual <= self.reconstruction_threshold

    def to_dict(self) -> dict[str, Any]:
        return {
            "attack": self.attack, "target": self.target, "verdict": str(self.verdict), "reason": self.reason,
            "residual": self.residual, "residual_kind": self.residual_kind, "fit_threshold": self.fit_threshold,
            "reconstruction_residual": self.reconstruction_residual,
            "reconstruction_threshold": self.reconstruction_threshold,
            "fitted": self.fitted, "complete": self.complete, "iterations": self.iterations,
            "restarts": self.restarts, "cpu_seconds": round(self.cpu_seconds, 3),
            "wall_seconds": round(self.wall_seconds, 3), "assumptions": self.assumptions, "metrics": self.metrics,
            "tests": {k: t.to_dict() for k, t in self.tests.items()}, "per_image": self.per_image,
            "notes": self.notes,
        }


def decide(tests: dict[str, LeakTest], residual: float | None, fit_threshold: float | None,
           complete: bool, reconstruction: tuple[float | None, float] | None = None,
           exact: bool = False) -> tuple[Verdict, str]:
    """The verdict of one attack from its leak tests and its own fit. ``reconstruction``: (residual,
    threshold) of what the attack reconstructed, for attacks whose own residual can be driven down
    without reconstructing anything (gradient inversion); a residual of None: nothing to check it on.
    ``exact``: the attack reads what it tests from the target, with nothing to fit."""
    for name, test in tests.items():
        if test.significant and test.threshold:
            return Verdict.LEAK, f"{name}: {test.hits}/{test.trials} reconstruction(s) match a victim's own picture " \
                f"({test.statistic})"
        if test.significant and name.startswith("reid"):
            # p comes from the rank of each reconstruction's first true match, not from the rank-1
            # count: say so, or "1/6 at rank 1, chance 0.17" reads as evidence of nothing
            return Verdict.LEAK, (f"{name}: p = {test.p_value:.2g} < {ALPHA}: pictures of the victims rank "
                                  f"higher than chance ({test.hits}/{test.trials} at rank 1, chance "
                                  f"{test.chance:.2g})")
        if test.significant:  # membership, linkage: their own statistic, not a re-identification
            return Verdict.LEAK, f"{name}: p = {test.p_value:.2g} < {ALPHA} ({test.statistic})"
    fitted = exact or (residual is not None and fit_threshold is not None and residual <= fit_threshold)
    if not fitted:
        shown = "n/a" if residual is None else f"{residual:.3g}"
        limit = "" if fit_threshold is None else f" > fit threshold {fit_threshold:.3g}"
        return Verdict.INCONCLUSIVE, f"the attack did not fit its target (residual {shown}{limit}); it proves nothing"
    if reconstruction is not None:
        value, limit = reconstruction
        if value is None:
            return Verdict.INCONCLUSIVE, (f"the update fitted (residual {residual:.3g}) but nothing checks what was "
                                          "reconstructed (no batch statistics in the update): a gradient fit alone "
                                          "proves nothing")
        if not value <= limit:  # NaN included: an unchecked reconstruction proves nothing
            return Verdict.INCONCLUSIVE, (f"the update fitted (residual {residual:.3g}) but the reconstructions do not "
                                          f"reproduce its batch statistics ({value:.3g} > {limit:.3g}): they are not "
                                          "the pictures behind it, so finding no one proves nothing")
    # An image-level match can only say LEAK; a clean bill needs a re-identification test with power
    # (said first: "part of the target" would hide that nothing could have been found — review 82).
    if not any(t.measurable and not t.threshold for t in tests.values()):
        why = "; ".join(f"{name}: {t.statistic}" for name, t in tests.items() if not t.threshold) or "no test ran"
        return Verdict.INCONCLUSIVE, f"the attack fitted, but no test had the power to find a leak ({why})"
    if not complete:
        return Verdict.INCONCLUSIVE, "the attack fitted only part of the target and found nothing there"
    how = "nothing to fit" if exact else f"the attack fitted (residual {residual:.3g} ≤ {fit_threshold:.3g})"
    return Verdict.NO_LEAK, f"{how} and re-identified no one above chance"


def target_verdict(results: list[AttackResult]) -> tuple[Verdict, str]:
    """LEAK if any attack leaks; NO-LEAK if one fitted completely and none leaked; else INCONCLUSIVE."""
    if not results:
        return Verdict.INCONCLUSIVE, "no attack ran"
    for r in results:
        if r.verdict is Verdict.LEAK:
            return Verdict.LEAK, f"{r.attack}: {r.reason}"
    for r in results:
        if r.verdict is Verdict.NO_LEAK:
            return Verdict.NO_LEAK, f"{r.attack}: {r.reason}"
    fits = [(r.residual / r.fit_threshold, r) for r in results if r.residual is not None and r.fit_threshold]
    if not fits:
        return Verdict.INCONCLUSIVE, "no attack produced a fit to judge"
    _, closest = min(fits, key=lambda pair: pair[0])
    return Verdict.INCONCLUSIVE, f"no attack both fitted and covered the whole target; closest: {closest.attack}, " \
        f"residual {closest.residual:.3g} (fit ≤ {closest.fit_threshold:.3g})"
