"""The Flower app of bench_flower.py (shipped into the app folder; runs in Flower's processes).

Every node p answers a train message with the same float32 vector of ``dimension`` values and
weight 10·(p + 1). The ServerApp runs, over the same SuperNodes in one Flower run:

    plain      one train message per node and its reply (no secure aggregation), each carrying
               ``dimension`` random float32 values: Flower's cost of a model's round trip (a
               ClientApp process per message, polls, the transfers), by Grid.send_and_receive
    plain-polled   the same, sent and collected as secfed's ServerApp does (its 0.2-s poll)
    secfed     SecAggStrategy(FedAvg) over SecAggWorkflow (authenticated): secfed's protocol
    secfed-unauthenticated   the same, honest-but-curious-server mode (no signatures, no
               consistency check): the mode that matches what Flower's SecAgg+ protects against
    flower     Flower's SecAgg+ (SecAggPlusWorkflow + secaggplus_mod, legacy FedAvg)

``rounds`` of each, interleaved, and writes seconds per round (and secfed's per-phase times) to
``out`` as JSON. Each secfed arm keeps one workflow for all its rounds, as ``secfed train
--flower`` does: the nodes enrol once (timed apart, ``enrol``), not in every round. A secfed
round is the second round of a two-round run: every round after the first had its keys advertised
with the previous round's unmask (pipelining), so it starts at share_keys — the steady state of a
run. The first round's extra message (advertise_keys) is the run's, like enrolment.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.client.mod import secaggplus_mod
from flwr.common import Code, FitRes, Status, ndarrays_to_parameters
from flwr.common.secure_aggregation.secaggplus_constants import RECORD_KEY_CONFIGS
from flwr.compat.common import recorddict_compat as compat
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg

from secfed.adapters.flower import Cohort, SecAggMod, SecAggStrategy, SecAggWorkflow, pulls
from secfed.adapters.flower.workflow import exchange


def flower_secaggplus(msg: Message, context: Context, call_next):
    """Flower's mod, applied only to Flower's own secure-aggregation messages."""
    if RECORD_KEY_CONFIGS in msg.content.config_records:
        return secaggplus_mod(msg, context, call_next)
    return call_next(msg, context)


client = ClientApp(mods=[SecAggMod(), flower_secaggplus])


@client.train()
def train(msg: Message, context: Context) -> Message:
    p = int(context.node_config["partition-id"])
    d = int(context.run_config["dimension"])
    if "plain" in msg.content.config_records:  # a model-like reply: values that differ in every chunk
        update = np.random.default_rng().standard_normal(d, dtype=np.float32)
        return Message(RecordDict({"arrays": ArrayRecord({"w": Array(update)})}), reply_to=msg)
    update = np.full(d, 0.01 * (p + 1), np.float32)
    if "fitins.parameters" in msg.content.array_records:  # Flower's SecAgg+ round (its legacy FitIns)
        fitres = FitRes(Status(Code.OK, ""), ndarrays_to_parameters([update]), 10 * (p + 1), {})
        return Message(compat.fitres_to_recorddict(fitres, keep_input=True), reply_to=msg)
    reply = RecordDict({"arrays": ArrayRecord({"w": Array(update)}),
                        "metrics": MetricRecord({"num-examples": 10.0 * (p + 1)})})
    return Message(reply, reply_to=msg)


server = ServerApp()


def _nodes(grid: Grid, count: int) -> list[int]:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        ids = list(grid.get_node_ids())
        if len(ids) >= count:
            return ids
        time.sleep(0.1)
    raise TimeoutError(f"{count} SuperNodes did not connect")


def plain_round(grid: Grid, nodes: list[int], d: int, poll: float | None = None) -> float:
    """One train message per node and its reply, both carrying d random float32 values (Flower's
    object store keeps identical chunks once: a vector of zeros would travel as one chunk). Sent by
    Flower's ``Grid.send_and_receive`` (which polls every 3 s), or with ``poll`` by secfed's
    ``exchange``, which polls as secfed's ServerApp does (the plain-polled arm)."""
    model = np.random.default_rng().standard_normal(d, dtype=np.float32)
    t0 = time.monotonic()
    content = RecordDict({"arrays": ArrayRecord({"w": Array(model)}), "plain": ConfigRecord({"round": 1})})
    if poll is None:
        messages = [Message(content, dst_node_id=n, message_type="train") for n in nodes]
        replies = list(grid.send_and_receive(messages, timeout=120))
    else:
        replies = list(exchange(grid, {n: content for n in nodes}, timeout=120, poll=poll).values())
    assert len(replies) == len(nodes) and not any(r.has_error() for r in replies)
    return time.monotonic() - t0


def secfed_round(grid: Grid, flow: SecAggWorkflow, n: int, d: int, phases: list) -> float:
    """Seconds of the second round of a two-round run (see the module docstring), and its phases."""
    marks: list[tuple[str, float]] = []
    flow.on_phase = lambda phase, _nodes: marks.append((phase, time.monotonic()))
    strategy = SecAggStrategy(FedAvg(fraction_evaluate=0.0, min_available_nodes=n, min_train_nodes=n), flow)
    first_done: list[float] = []
    train_round = strategy.train_round

    def timed_round(grid: Grid, messages: list[Message]) -> list[Message]:
        out = train_round(grid, messages)
        first_done.append(time.monotonic())
        return out

    strategy.train_round = timed_round  # type: ignore[method-assign]
    result = strategy.start(grid=grid, initial_arrays=ArrayRecord({"w": Array(np.zeros(d, np.float32))}),
                            num_rounds=2)
    t_end = time.monotonic()
    seconds = t_end - first_done[0]
    w = result.arrays["w"].numpy()
    expected = sum(10.0 * (p + 1) * 0.01 * (p + 1) for p in range(n)) / sum(10.0 * (p + 1) for p in range(n))
    assert np.allclose(w, expected, atol=1e-4), (w[:3], expected)
    second = [(name, t) for name, t in marks if t > first_done[0]]
    assert [name for name, _ in second][0] == "share_keys", marks  # pipelined: no advertise_keys of its own
    ends = [t for _, t in second[1:]] + [t_end]
    phases.append({name: round(end - start, 3) for (name, start), end in zip(second, ends)})
    return seconds


def flower_round(grid: Grid, context: Context, n: int, d: int) -> float:
    from flwr.server import LegacyContext, ServerConfig
    from flwr.server.strategy import FedAvg as LegacyFedAvg
    from flwr.server.workflow import DefaultWorkflow, SecAggPlusWorkflow

    strategy = LegacyFedAvg(fraction_evaluate=0.0, min_fit_clients=n, min_available_clients=n,
                            initial_parameters=ndarrays_to_parameters([np.zeros(d, np.float32)]))
    legacy = LegacyContext(context=context, config=ServerConfig(num_rounds=1), strategy=strategy)
    fit = SecAggPlusWorkflow(num_shares=n, reconstruction_threshold=max(2, n // 2 + 1), timeout=120)
    t0 = time.monotonic()
    DefaultWorkflow(fit_workflow=fit)(grid, legacy)
    return time.monotonic() - t0


@server.main()
def main(grid: Grid, context: Context) -> None:
    cfg = context.run_config
    n, d, rounds = int(cfg["nodes"]), int(cfg["dimension"]), int(cfg["rounds"])
    poll = float(cfg["poll"])
    if float(cfg["pull_backoff"]) > 0:  # as secfed's ServerApp does (secfed/adapters/flower/pulls.py)
        pulls.quicken(pulls.SERVERAPP, float(cfg["pull_backoff"]))
    nodes = _nodes(grid, n)
    flow = SecAggWorkflow(cohort=Cohort.load(str(cfg["cohort"])), poll_interval=poll, phase_timeout=120)
    open_flow = SecAggWorkflow(authenticated=False, poll_interval=poll, phase_timeout=120)
    t0 = time.monotonic()
    flow.enrol(grid, nodes)
    out: dict = {"enrol": time.monotonic() - t0, "plain": [], "plain-polled": [], "secfed": [], "secfed-unauthenticated": [],
                 "flower": [], "secfed_phases": [], "secfed-unauthenticated_phases": []}
    arms = str(cfg["arms"]).split(",")
    for _ in range(rounds):
        if "plain" in arms:
            out["plain"].append(plain_round(grid, nodes, d))
        if "plain-polled" in arms:
            out["plain-polled"].append(plain_round(grid, nodes, d, poll=0.2))
        if "secfed" in arms:
            out["secfed"].append(secfed_round(grid, flow, n, d, out["secfed_phases"]))
        if "secfed-unauthenticated" in arms:
            out["secfed-unauthenticated"].append(secfed_round(grid, open_flow, n, d,
                                                              out["secfed-unauthenticated_phases"]))
        if "flower" in arms:
            out["flower"].append(flower_round(grid, context, n, d))
    Path(str(cfg["out"])).write_text(json.dumps(out))
