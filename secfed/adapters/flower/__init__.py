"""secfed's secure aggregation on Flower (``pip install 'secfed[flower]'``, flwr ≥ 1.41).

* :class:`SecAggMod` — ClientApp mod: secfed's protocol client, its state sealed between messages.
* :class:`SecAggWorkflow` — the server side over a Flower Grid: one secure sum per call.
* :class:`SecAggStrategy` — any weighted-mean strategy (FedAvg, FedProx, FedAvgM, FedAdam, …)
  with its train replies securely aggregated, the strategy's code unchanged.
* :class:`Cohort` — the identity keys a deployment trusts (authenticated mode, the default).

``secfed train --flower`` (and ``secfed flower local``) run secfed's own training on SuperNodes.
Names are imported on first use: a ClientApp process that needs only the mod (a fresh process
per message) does not pay for the server side's imports.
"""

from importlib import import_module
from typing import Any

try:
    import flwr  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError("secfed.adapters.flower needs Flower: pip install 'secfed[flower]'") from exc

_WHERE = {
    "Cohort": "node", "NodeSetupError": "node",
    "Encoding": "encoding", "ReplyRefused": "encoding",
    "SecAggMod": "mod", "SessionRefused": "mod",
    "SecAggResult": "workflow", "SecAggWorkflow": "workflow", "IdentityClash": "workflow",
    "SecAggStrategy": "strategy", "is_weighted_mean": "strategy",
}
__all__ = sorted(_WHERE)


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(import_module(f"{__name__}.{_WHERE[name]}"), name)
