"""secfed's secure aggregation on Flower (``pip install 'secfed[flower]'``, flwr ≥ 1.41).

* :class:`SecAggMod` — ClientApp mod: secfed's protocol client, its state sealed between messages.
* :class:`SecAggWorkflow` — the server side over a Flower Grid: one secure sum per call.
* :class:`SecAggStrategy` — any weighted-mean strategy (FedAvg, FedProx, FedAvgM, FedAdam, …)
  with its train replies securely aggregated, the strategy's code unchanged.
* :class:`Cohort` — the identity keys a deployment trusts (authenticated mode, the default).

``secfed train --flower`` (and ``secfed flower local``) run secfed's own training on SuperNodes.
"""

try:
    import flwr  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError("secfed.adapters.flower needs Flower: pip install 'secfed[flower]'") from exc

from .encoding import Encoding, ReplyRefused
from .mod import SecAggMod, SessionRefused
from .node import Cohort, NodeSetupError
from .strategy import SecAggStrategy, is_weighted_mean
from .workflow import SecAggResult, SecAggWorkflow

__all__ = [
    "Cohort",
    "Encoding",
    "NodeSetupError",
    "ReplyRefused",
    "SecAggMod",
    "SecAggResult",
    "SecAggStrategy",
    "SecAggWorkflow",
    "SessionRefused",
    "is_weighted_mean",
]
