"""How soon a Flower process looks again for a message's payload that is still on its way.

Flower 1.42 announces a message before its payload: the sender registers the message, then
uploads its objects (the arrays, in chunks). A receiver that pulls in between finds an object
"unavailable" and backs off 1 s, then 2 s, 4 s … up to 10 s (``flwr.supercore.inflatable``'s
``pull_objects``, ``PULL_INITIAL_BACKOFF = 1``), whatever the upload still needs. A 45 MB model
takes a fraction of a second to upload on loopback, so the first back-off alone is most of a
round trip's wait, and the next one doubles it (measured in bench/RESULTS.md, issue 22 item 4).
No setting changes it, so this module re-binds the name a Flower module pulls through to the same
function with a shorter first back-off — in the processes secfed runs: its ServerApp
(``secfed-poll``) and, under a :class:`~.launch.Loopback` with ``node_poll``, the SuperNodes and
their ClientApps (which pull each message from their SuperNode while it is still pulling it). Only
the start of the schedule changes: the back-off still doubles up to Flower's cap, and Flower's
limits (tries per object, ``max_time``) give up on a payload that never comes after about as long
as before. A Flower release that renames the module or the function keeps its pulls as they are
(a log line says so).
"""

from __future__ import annotations

import functools
import importlib
import inspect
import logging
from types import ModuleType

log = logging.getLogger("secfed.flower")

#: Where each secfed-run Flower process pulls objects: the ServerApp's grid, the SuperNode's loop
#: (both through ``pull_objects``), the ClientApp's start (``pull_and_inflate_object_from_tree``).
SERVERAPP = "flwr.superlink.grid.http_grid"
SUPERNODE = "flwr.supernode.start_client_internal"
CLIENTAPP = "flwr.supernode.runtime.run_clientapp"
CLIENTAPP_PULL = "pull_and_inflate_object_from_tree"

_KNOB = "initial_backoff"


def quicken(module: str | ModuleType, backoff: float, *, function: str = "pull_objects") -> bool:
    """Make ``module``'s ``function`` (Flower's ``pull_objects``, or a caller of it that passes the
    back-off on) back off ``backoff`` s first, then doubling as Flower's. Returns whether it did;
    idempotent (a second call re-binds the original with the new figure)."""
    if not backoff > 0:
        raise ValueError(f"the pull back-off must be a positive number of seconds, not {backoff!r}")
    try:
        mod = importlib.import_module(module) if isinstance(module, str) else module
    except ImportError as exc:
        log.info("Flower's object pulls keep their back-off: %s", exc)
        return False
    current = getattr(mod, function, None)
    original = getattr(current, "func", current)  # a partial from an earlier call
    if not callable(original) or _KNOB not in inspect.signature(original).parameters:
        log.info("Flower's object pulls keep their back-off: %s has no %s(%s)", mod.__name__, function, _KNOB)
        return False
    setattr(mod, function, functools.partial(original, initial_backoff=backoff))
    return True
