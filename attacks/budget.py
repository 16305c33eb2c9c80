"""How hard the audit tries: iterations, restarts and wall-clock per budget, and a stopwatch.

    quick      ≤ 2 min for the default run on 2 CPU cores; a LOWER BOUND on leakage, stated as such
    standard   ≤ 5 min (the default)
    thorough   for a GPU: ten times the iterations, more restarts, larger dummy batches

Every attack gets a share of the wall-clock budget and stops at its deadline (reporting the
iterations it managed), so the total stays within the budget whatever the machine's load. The
budget counts from when the command started (opening the run, reading or re-deriving the round and
embedding the gallery spend it too); a target or attack the deadline leaves no time for is not
started and is reported INCONCLUSIVE ("not attacked"), so the command ends within the limit plus
the judging of an attack begun before it. :data:`REPORT_RESERVE` of it is kept for writing the
report.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace


REPORT_RESERVE = 0.05  # share of the budget kept for judging the last attack and writing the report


@dataclass(frozen=True)
class Budget:
    name: str
    seconds: float  # wall-clock for the whole audit
    inversion_iterations: int  # gradient inversion, per restart
    restarts: int
    max_dummies: int  # the most images one gradient inversion reconstructs at once
    feature_iterations: int  # inversion of recovered features / statistics, per image set
    model_inversion_iterations: int
    model_inversion_images: int
    lower_bound: bool  # the budget is too small for a negative result to mean much

    def with_seconds(self, seconds: float) -> Budget:
        """This budget under a time limit. Less time than the budget's own leaves its attacks fewer
        iterations than it plans, so the audit is a lower bound on leakage, as a quick one is (found by
        review: ``standard --time-limit 30`` ran fewer iterations than quick and printed no warning)."""
        return replace(self, seconds=seconds, lower_bound=self.lower_bound or seconds < self.seconds)

    def to_dict(self) -> dict[str, object]:
        return {"name": self.name, "seconds": self.seconds, "inversion_iterations": self.inversion_iterations,
                "restarts": self.restarts, "max_dummies": self.max_dummies,
                "feature_iterations": self.feature_iterations,
                "model_inversion_iterations": self.model_inversion_iterations,
                "model_inversion_images": self.model_inversion_images, "lower_bound": self.lower_bound}


BUDGETS: dict[str, Budget] = {
    "quick": Budget("quick", 120.0, inversion_iterations=120, restarts=1, max_dummies=8, feature_iterations=150,
                    model_inversion_iterations=120, model_inversion_images=6, lower_bound=True),
    "standard": Budget("standard", 300.0, inversion_iterations=300, restarts=2, max_dummies=8,
                       feature_iterations=300, model_inversion_iterations=250, model_inversion_images=6,
                       lower_bound=False),
    "thorough": Budget("thorough", 3600.0, inversion_iterations=3000, restarts=4, max_dummies=64,
                       feature_iterations=2000, model_inversion_iterations=2000, model_inversion_images=16,
                       lower_bound=False),
}


class Stopwatch:
    """Wall-clock and process CPU seconds since creation, and a deadline to stop at."""

    def __init__(self, seconds: float | None = None, since: float | None = None) -> None:
        self.wall0 = time.monotonic() if since is None else since
        self.cpu0 = time.process_time()
        self.deadline = None if seconds is None else self.wall0 + max(0.0, seconds)

    @property
    def wall(self) -> float:
        return time.monotonic() - self.wall0

    @property
    def cpu(self) -> float:
        return time.process_time() - self.cpu0

    @property
    def remaining(self) -> float:
        return float("inf") if self.deadline is None else self.deadline - time.monotonic()

    @property
    def expired(self) -> bool:
        return self.remaining <= 0

    def share(self, fraction: float, reserve: float = 0.0) -> Stopwatch:
        """A stopwatch for a sub-task: ``fraction`` of what is left after keeping ``reserve`` seconds."""
        if self.deadline is None:
            return Stopwatch(None)
        return Stopwatch(max(0.0, (self.remaining - reserve) * fraction))
