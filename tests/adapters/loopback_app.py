"""The Flower app of the loopback test (shipped into the app folder; runs in Flower's processes).

Node p's input is a fixed pseudo-random ring vector (``vector(p)``): sums are checked exactly.
The ServerApp runs, in one Flower run, three rounds and writes what it saw to ``out``:

    flower        Flower's own SecAgg+ (SecAggPlusWorkflow + secaggplus_mod), node 1 killed after
                  sharing keys, before its masked vector is collected
    during_input  secfed, node 2 killed while its app computes its input (masked-input phase)
    after_keys    secfed, node 1 killed after it shared its keys, before the masked input is asked

It talks to the test through files in ``sync``: a node announces ``training-rR-pP`` while it
computes its input, the server asks ``kill-rR-pP`` and waits for ``killed-rR-pP`` (which holds the
dead node's id); the test kills (SIGKILL, the SuperNode's whole process group) and restarts the
SuperNode, which comes back under a new node id.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, RecordDict
from flwr.clientapp import ClientApp
from flwr.common import Code, FitRes, Status, ndarrays_to_parameters, parameters_to_ndarrays
from flwr.common.secure_aggregation.secaggplus_constants import RECORD_KEY_CONFIGS
from flwr.compat.common import recorddict_compat as compat
from flwr.client.mod import secaggplus_mod
from flwr.serverapp import Grid, ServerApp

from secfed.adapters.flower import Cohort, SecAggMod, SecAggWorkflow
from secfed.adapters.flower.encoding import RING, RING_RECORD, Encoding

DIMENSION = 64
NODES = 3


def vector(p: int) -> np.ndarray:
    return np.random.default_rng(1000 + p).integers(0, 1 << 32, DIMENSION, dtype=np.uint64).astype(np.uint32)


def flower_secaggplus(msg: Message, context: Context, call_next):
    """Flower's mod, applied only to Flower's own secure-aggregation messages."""
    if RECORD_KEY_CONFIGS in msg.content.config_records:
        return secaggplus_mod(msg, context, call_next)
    return call_next(msg, context)


client = ClientApp(mods=[SecAggMod(), flower_secaggplus])


@client.train()
def train(msg: Message, context: Context) -> Message:
    p = int(context.node_config["partition-id"])
    content = msg.content
    if "fitins.parameters" in content.array_records:  # Flower's SecAgg+ round (its legacy FitIns)
        fitres = FitRes(Status(Code.OK, ""), ndarrays_to_parameters([np.full(DIMENSION, 0.1 * (p + 1), np.float32)]),
                        10 * (p + 1), {})
        return Message(compat.fitres_to_recorddict(fitres, keep_input=True), reply_to=msg)
    task = content.config_records["task"]
    if [int(task["round"]), p] == [int(v) for v in task["die"]]:
        (Path(str(context.run_config["sync"])) / f"training-r{task['round']}-p{p}").touch()
        time.sleep(120)  # the test kills this node now
    reply = RecordDict({"partition": ConfigRecord({"p": p}), RING_RECORD: ArrayRecord({"vector": Array(vector(p))})})
    return Message(reply, reply_to=msg)


server = ServerApp()


class Nodes:
    """The live SuperNodes, told apart from the ids of killed ones (which the SuperLink still lists
    until their heartbeat expires): a restarted node shows up under a new id."""

    def __init__(self, grid: Grid, sync: Path) -> None:
        self.grid, self.sync = grid, sync
        self.seen: set[int] = set()
        self.live: list[int] = self._new(NODES)

    def _new(self, count: int) -> list[int]:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            fresh = [n for n in self.grid.get_node_ids() if n not in self.seen]
            if len(fresh) >= count:
                self.seen.update(fresh)
                return fresh
            time.sleep(0.1)
        raise TimeoutError(f"{count} new SuperNode(s) did not connect")

    def kill(self, round_: int, partition: int) -> int:
        """Ask the test to kill SuperNode ``partition``; its node id, once it is gone."""
        (self.sync / f"kill-r{round_}-p{partition}").touch()
        done = self.sync / f"killed-r{round_}-p{partition}"
        deadline = time.monotonic() + 60
        while not done.exists() or not done.read_text():
            if time.monotonic() > deadline:
                raise TimeoutError(f"node {partition} was not killed")
            time.sleep(0.1)
        return int(done.read_text())

    def replace(self, dead: int) -> None:
        """After the test restarted a killed node: its new id replaces ``dead``."""
        if dead in self.live:
            self.live = [n for n in self.live if n != dead] + self._new(1)


def secfed_round(grid: Grid, flow: SecAggWorkflow, nodes: Nodes, round_: int, *, die: int | None = None,
                 kill_after_keys: int | None = None) -> dict:
    """One secure sum of the live nodes' vectors; partition ``die`` is killed while it computes its
    input, ``kill_after_keys`` once it has shared its keys."""
    phases: list[tuple[str, float]] = []

    def on_phase(phase: str, _nodes) -> None:
        phases.append((phase, time.monotonic() - t0))
        if phase == "masked_input" and kill_after_keys is not None:
            nodes.kill(round_, kill_after_keys)

    flow.on_phase = on_phase
    task = {"round": round_, "die": [round_, -1 if die is None else die]}
    messages = [Message(RecordDict({"task": ConfigRecord(task)}), dst_node_id=n, message_type="train")
                for n in nodes.live]
    t0 = time.monotonic()
    try:
        result = flow.aggregate(grid, messages, Encoding(RING, length=DIMENSION), round=round_)
    except Exception as exc:  # noqa: BLE001 - the test reports it
        return {"error": f"{type(exc).__name__}: {exc}"}
    seconds = time.monotonic() - t0
    partitions = sorted(int(result.clear[n].config_records["partition"]["p"]) for n in result.survivors)
    for dead in result.dropped:
        nodes.replace(dead)
    return {"partitions": partitions, "total": result.total.tolist(), "seconds": seconds, "phases": phases,
            "authenticated": result.config.authenticated, "n": result.config.n_clients}


def flower_round(grid: Grid, context: Context, nodes: Nodes, round_: int, kill_after_keys: int) -> dict:
    """Flower's own SecAgg+ (legacy strategy, DefaultWorkflow), a node killed after sharing keys."""
    from flwr.server import LegacyContext, ServerConfig
    from flwr.server.strategy import FedAvg as LegacyFedAvg
    from flwr.server.workflow import DefaultWorkflow, SecAggPlusWorkflow
    from flwr.server.workflow.constant import MAIN_PARAMS_RECORD

    stage = str(context.run_config.get("flower-kill-stage", "collect_masked_vectors"))

    class KillAfterKeys(SecAggPlusWorkflow):
        dead = -1

        def collect_masked_vectors_stage(self, grid, context, state):  # noqa: ANN001
            if stage == "collect_masked_vectors":
                self.dead = nodes.kill(round_, kill_after_keys)
            return super().collect_masked_vectors_stage(grid, context, state)

        def share_keys_stage(self, grid, context, state):  # noqa: ANN001
            if stage == "share_keys":
                self.dead = nodes.kill(round_, kill_after_keys)
            return super().share_keys_stage(grid, context, state)

    strategy = LegacyFedAvg(fraction_evaluate=0.0, min_fit_clients=NODES, min_available_clients=NODES,
                            initial_parameters=ndarrays_to_parameters([np.zeros(DIMENSION, np.float32)]))
    legacy = LegacyContext(context=context, config=ServerConfig(num_rounds=1), strategy=strategy)
    fit = KillAfterKeys(num_shares=NODES, reconstruction_threshold=2, timeout=float(context.run_config["phase-timeout"]))
    t0 = time.monotonic()
    error = None
    try:
        DefaultWorkflow(fit_workflow=fit)(grid, legacy)
    except Exception as exc:  # noqa: BLE001 - reported as what happened
        error = f"{type(exc).__name__}: {exc}"
    seconds = time.monotonic() - t0
    params = compat.arrayrecord_to_parameters(legacy.state.array_records[MAIN_PARAMS_RECORD], keep_input=True)
    final = parameters_to_ndarrays(params)[0]
    nodes.replace(fit.dead)
    return {"updated": bool(np.any(final != 0)), "final": final.tolist(), "error": error, "seconds": seconds}


@server.main()
def main(grid: Grid, context: Context) -> None:
    cfg = context.run_config
    nodes = Nodes(grid, Path(str(cfg["sync"])))
    results = {"flower": flower_round(grid, context, nodes, 1, kill_after_keys=1)}
    flow = SecAggWorkflow(cohort=Cohort.load(str(cfg["cohort"])), phase_timeout=float(cfg["phase-timeout"]),
                          poll_interval=0.1)
    if cfg.get("flower-only"):
        Path(str(cfg["out"])).write_text(json.dumps(results))
        return
    results["during_input"] = secfed_round(grid, flow, nodes, 2, die=2)
    results["after_keys"] = secfed_round(grid, flow, nodes, 3, kill_after_keys=1)
    Path(str(cfg["out"])).write_text(json.dumps(results))
