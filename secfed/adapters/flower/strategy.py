"""Any weighted-mean Flower strategy, its sums taken by secfed's secure aggregation.

    strategy = SecAggStrategy(FedAvg(), SecAggWorkflow(cohort=Cohort.load("cohort.toml")))
    result = strategy.start(grid=grid, initial_arrays=arrays, num_rounds=3)

The wrapped strategy runs unchanged: :meth:`SecAggStrategy.start` hands it a grid whose
``send_and_receive`` runs secure aggregation for train messages (evaluation and other messages
pass through). The strategy's train messages are what the nodes' apps train on in the
masked-input phase; their replies are encoded as [w'·x, w', w'·m] (encoding.py) and masked, so
the strategy receives ONE reply: the weighted mean of the survivors' arrays and listed metrics,
weighted by their total weight. Its own averaging of that one reply returns it unchanged; what it
does next (FedAvgM's momentum, FedAdam's server optimiser, FedProx's proximal term on clients)
is its own. A round that aborts returns no reply: the strategy keeps its arrays.

Each round but the last advertises the next round's keys with its unmask (workflow.py,
pipelining), assuming the next round trains the same nodes on arrays of the same layout (what
FedAvg with a fixed cohort does); a round whose nodes or layout differ advertises afresh.

Strategies that are not a weighted mean of the replies (median, trimmed mean, Krum, Bulyan,
q-FedAvg, the XGBoost ones, server-side DP clipping) need each reply and are refused.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Iterable, Sequence
from typing import Any

from flwr.app import Message, MessageType, RecordDict
from flwr.serverapp import Grid
from flwr.serverapp.strategy import FedAvg, FedAvgM, Strategy
from flwr.serverapp.strategy.fedopt import FedOpt

from secfed.protocols import ProtocolError

from .encoding import Encoding
from .workflow import NextRound, SecAggResult, SecAggWorkflow

log = logging.getLogger("secfed.flower")


def is_weighted_mean(strategy: Strategy) -> bool:
    """Whether ``strategy`` aggregates train replies as a weighted mean (then maybe a server step)."""
    if isinstance(strategy, (FedAvgM, FedOpt)):
        return True
    return isinstance(strategy, FedAvg) and type(strategy).aggregate_train is FedAvg.aggregate_train


class SecAggStrategy:
    """``strategy`` with its train replies securely aggregated (see the module docstring).

    ``clip`` and ``max_weight``: each coordinate of w'·x, w' = weight / max_weight, is clipped to
    [−clip, clip] before quantisation (as Flower's SecAgg+ ``clipping_range`` and ``max_weight``);
    a client whose weight exceeds ``max_weight`` refuses to take part. ``metrics``: metric names
    averaged securely with the arrays; every other metric of a reply stays on its node.
    """

    def __init__(self, strategy: Strategy, workflow: SecAggWorkflow, *, clip: float = 8.0,
                 max_weight: float = 1000.0, metrics: Sequence[str] = ()) -> None:
        if not is_weighted_mean(strategy):
            raise TypeError(f"{type(strategy).__name__} does not aggregate by a weighted mean; secure aggregation "
                            "gives it only the sum of the replies (FedAvg, FedProx, FedAvgM, FedAdagrad, FedAdam, "
                            "FedYogi and FedAvg subclasses that keep its aggregate_train are supported)")
        self.strategy, self.workflow = strategy, workflow
        self.clip, self.max_weight, self.metrics = clip, max_weight, tuple(metrics)
        self.results: list[SecAggResult] = []  # one per completed round
        self.rounds = 0  # the run's rounds (start's num_rounds): the last one has no next to advertise

    def __getattr__(self, name: str) -> Any:
        return getattr(self.strategy, name)

    def start(self, grid: Grid, *args: Any, **kwargs: Any) -> Any:
        """The wrapped strategy's ``start``, over a grid that aggregates train replies securely."""
        bound = inspect.signature(self.strategy.start).bind(grid, *args, **kwargs)
        bound.apply_defaults()
        self.rounds = int(bound.arguments["num_rounds"])
        return self.strategy.start(_SecAggGrid(grid, self), *args, **kwargs)

    def train_round(self, grid: Grid, messages: list[Message]) -> list[Message]:
        """Secure aggregation of one round's train messages → one reply (or none, if it aborted)."""
        arrays = [m.content.array_records.get(self.strategy.arrayrecord_key) for m in messages]
        if not messages or arrays[0] is None:
            return []
        encoding = Encoding.weighted_mean(arrays[0], clip=self.clip, max_weight=self.max_weight,
                                          weight_key=self.strategy.weighted_by_key, metrics=self.metrics)
        server_round = int(messages[0].content.config_records[self.strategy.configrecord_key].get("server-round", 0))
        try:
            nodes = tuple(sorted(m.metadata.dst_node_id for m in messages))
            follow = NextRound(nodes, encoding, server_round + 1) if server_round < self.rounds else None
            result = self.workflow.aggregate(grid, messages, encoding, round=server_round, next_round=follow)
        except ProtocolError as exc:
            log.warning("round %s: secure aggregation aborted, no update released: %s: %s",
                        server_round, type(exc).__name__, exc)
            return []
        self.results.append(result)
        decoded = encoding.decode(result.total, result.config.n_clients)
        if decoded is None:
            return []
        mean, metrics = decoded
        content = RecordDict({self.strategy.arrayrecord_key: mean, "metrics": metrics})
        # One reply stands for the whole cohort; its metadata is that of the first survivor's message.
        first = next(m for m in messages if m.metadata.dst_node_id == result.survivors[0])
        return [Message(content, reply_to=first)]


class _SecAggGrid(Grid):
    """A Grid that runs secure aggregation for train messages and passes everything else through."""

    def __init__(self, grid: Grid, owner: SecAggStrategy) -> None:
        self._grid, self._owner = grid, owner

    def send_and_receive(self, messages: Iterable[Message], *, timeout: float | None = None) -> Iterable[Message]:
        messages = list(messages)
        if messages and all(m.metadata.message_type == MessageType.TRAIN for m in messages):
            return self._owner.train_round(self._grid, messages)
        return self._grid.send_and_receive(messages, timeout=timeout)

    # Everything else is the wrapped grid's.
    @property
    def run(self) -> Any:
        return self._grid.run

    def set_run(self, run: Any) -> None:
        self._grid.set_run(run)

    def create_message(self, content: RecordDict, message_type: str, dst_node_id: int, group_id: str,
                       ttl: float | None = None) -> Message:
        return self._grid.create_message(content, message_type, dst_node_id, group_id, ttl)

    def get_node_ids(self) -> Iterable[int]:
        return self._grid.get_node_ids()

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        return self._grid.push_messages(messages)

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        return self._grid.pull_messages(message_ids)

