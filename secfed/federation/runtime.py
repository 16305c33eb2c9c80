"""The round loop. Reads top to bottom: select, broadcast, train, upload, aggregate, update, evaluate,
checkpoint, log.

``run`` owns a run directory::

    RUN/config.json        the resolved configuration (all --resume needs)
    RUN/data.json          which data the run read: datasets, sizes, clients
    RUN/metrics.jsonl      one line per round: losses, bytes up/down, seconds, evaluation when run
    RUN/checkpoints/       round-NNNN.pt after every round, written atomically (newest kept)
    RUN/summary.json       the final results (also what `--json` prints)
    RUN/history.png        rank-1 and mAP per round
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Protocol

from secfed import atomic_file
from secfed.algorithms.base import Schedule, step_lr
from secfed.config import RunConfig, from_dict
from secfed.evaluation.communication import communication_cost
from secfed.evaluation.plots import plot_history
from secfed.federation import checkpoint as ckpt
from secfed.federation.builder import Federation, build
from secfed.federation.evaluate import evaluate_final, evaluate_global
from secfed.federation.server import select_clients
from secfed.models.sharing import local_state
from secfed.seeding import derive_seed, numpy_rng


class Reporter(Protocol):
    """What a front end (the CLI's rich progress, a notebook, a test) hears from a run."""

    def data_progress(self, what: str, done: int, total: int) -> None: ...
    def run_started(self, fed: Federation, start_round: int) -> None: ...
    def round_started(self, round_number: int, cohort: list[str]) -> None: ...
    def client_done(self, round_number: int, client: str) -> None: ...
    def round_done(self, record: dict[str, Any]) -> None: ...


class SilentReporter:
    def data_progress(self, what: str, done: int, total: int) -> None: ...
    def run_started(self, fed: Federation, start_round: int) -> None: ...
    def round_started(self, round_number: int, cohort: list[str]) -> None: ...
    def client_done(self, round_number: int, client: str) -> None: ...
    def round_done(self, record: dict[str, Any]) -> None: ...


@dataclass
class RunResult:
    run_dir: Path
    summary: dict[str, Any]
    federation: Federation


def schedule_for(cfg: RunConfig, round_index: int) -> Schedule:
    t, pretrained = cfg.train, cfg.model.pretrained
    return Schedule(
        lr_backbone=step_lr(t.resolved_backbone_lr(pretrained), round_index, t.resolved_lr_step, t.lr_gamma),
        lr_new=step_lr(t.resolved_lr_new(pretrained), round_index, t.resolved_lr_step, t.lr_gamma),
        epochs=t.local_epochs,
        batch_size=t.batch_size,
        momentum=t.momentum,
        weight_decay=t.weight_decay,
    )


def dropout_schedule(cfg: RunConfig, round_index: int, cohort: list[int], phases: tuple[str, ...]) -> dict[int, str]:
    """Which clients of the cohort vanish this round, and at which protocol phase (seeded)."""
    rate = cfg.secagg.dropout_rate
    if rate <= 0:
        return {}
    rng = numpy_rng(cfg.seed, "dropout", round_index)
    draws = rng.random(len(cohort))
    phase_of = rng.integers(0, len(phases), size=len(cohort))
    return {k: phases[p] for k, u, p in zip(cohort, draws, phase_of) if u < rate}


def _eval_due(cfg: RunConfig, round_number: int) -> bool:
    every = cfg.train.eval_every
    return round_number == cfg.train.rounds or (every > 0 and round_number % every == 0)


def run(
    cfg: RunConfig,
    run_dir: Path,
    *,
    resume: bool = False,
    reporter: Reporter | None = None,
    on_round_end: Callable[[int], None] | None = None,
) -> RunResult:
    """Train a federation as configured, in ``run_dir``; with ``resume``, continue from its newest
    checkpoint and end exactly where an uninterrupted run would have."""
    reporter = reporter or SilentReporter()
    run_dir = Path(run_dir)
    fed = build(cfg, progress=reporter.data_progress)
    history, start, wall = [], 0, 0.0
    if resume:
        history, start, wall = restore(fed, ckpt.load_checkpoint(ckpt.latest_checkpoint(run_dir)))
        ckpt.write_jsonl(run_dir / "metrics.jsonl", history)
    else:
        run_dir.mkdir(parents=True, exist_ok=True)
        atomic_file.write_text(run_dir / "config.json", cfg.to_json())
        atomic_file.write_text(run_dir / "data.json", json.dumps(fed.data_info, indent=2))
        ckpt.write_jsonl(run_dir / "metrics.jsonl", [])
    reporter.run_started(fed, start)

    for t in range(start, cfg.train.rounds):
        round_number = t + 1
        t0 = time.perf_counter()
        fixed = select_clients(len(fed.clients), t, cfg.seed, cfg.train.clients_per_round)
        cohort = fed.privacy.cohort(t, len(fed.clients), fixed)
        reporter.round_started(round_number, [fed.clients[k].name for k in cohort])
        broadcast = fed.server.broadcast(t)
        schedule = schedule_for(cfg, t)

        # Local training on every selected client, then one upload each (after the privacy step).
        uploads, client_stats = [], {}
        for k in cohort:
            client = fed.clients[k]
            received = replace(broadcast, weights=fed.privacy.received(broadcast.weights, t, k))
            client.receive(received)
            stats = client.train(schedule, derive_seed(cfg.seed, "train", t, k), dp=fed.dp_sgd.get(f"fed/{k}"))
            uploads.append(client.upload(received, fed.privacy, fed.server.weight_of(k),
                                         with_hash=fed.channel.needs_model_hash))
            client_stats[client.name] = {"loss": stats.loss, "accuracy": stats.accuracy, "examples": stats.examples}
            reporter.client_done(round_number, client.name)
        # The local-training baseline: every client alone, same rule, same seeds, never aggregated.
        baseline_stats = {}
        for k, model in fed.baselines.items():
            stats = fed.clients[k].train(schedule, derive_seed(cfg.seed, "train", t, k), model, fed.dp_sgd.get(f"local/{k}"))
            baseline_stats[fed.clients[k].name] = {"loss": stats.loss, "accuracy": stats.accuracy}
        t_train = time.perf_counter()

        dropouts = dropout_schedule(cfg, t, cohort, fed.channel.phases)
        aggregate = fed.channel.aggregate(broadcast, uploads, dropouts)
        fed.server.apply(aggregate)
        privacy = fed.privacy.account(len(aggregate.contributors))
        t_agg = time.perf_counter()

        record: dict[str, Any] = {
            "round": round_number,
            "lr_backbone": schedule.lr_backbone,
            "lr_new": schedule.lr_new,
            "cohort": [fed.clients[k].name for k in cohort],
            "dropped": {fed.clients[k].name: phase for k, phase in sorted(dropouts.items())},
            "contributors": len(aggregate.contributors),
            "loss": sum(s["loss"] for s in client_stats.values()) / max(1, len(client_stats)),
            "clients": client_stats,
            "bytes_up": aggregate.bytes_up,
            "bytes_down": aggregate.bytes_down,
        }
        if aggregate.clipped:
            record["secagg_clipped"] = aggregate.clipped
        if baseline_stats:
            record["local_baseline"] = baseline_stats
        if privacy is not None:
            record["privacy"] = privacy
        if fed.dp_sgd:
            record["dp_sgd_epsilon"] = {key: state.epsilon() for key, state in sorted(fed.dp_sgd.items())}
        if _eval_due(cfg, round_number):
            record["eval"] = evaluate_global(fed)
        if round_number == cfg.train.rounds:
            record["final"] = evaluate_final(fed, aggregate.contributors)
        t_end = time.perf_counter()
        wall += t_end - t0
        record["seconds"] = {"train": t_train - t0, "aggregate": t_agg - t_train, "eval": t_end - t_agg,
                             "round": t_end - t0, "elapsed": wall}
        history.append(record)
        ckpt.save_checkpoint(run_dir, round_number, snapshot(fed, history, wall))
        ckpt.append_jsonl(run_dir / "metrics.jsonl", record)
        reporter.round_done(record)
        if on_round_end is not None:
            on_round_end(round_number)

    summary = summarize(fed, history, run_dir, wall)
    atomic_file.write_text(run_dir / "summary.json", json.dumps(summary, indent=2))
    plot_history(history, run_dir / "history.png")
    return RunResult(run_dir, summary, fed)


def snapshot(fed: Federation, history: list[dict[str, Any]], wall: float) -> dict[str, Any]:
    """Everything a resume needs, as tensors and plain data (loadable with weights_only=True)."""
    return {
        "config": fed.config.to_dict(),
        "layout_id": fed.layout.fingerprint(),
        "global": fed.server.weights,
        "clients": {str(c.id): local_state(c.model, fed.layout) for c in fed.clients},
        "baselines": {str(k): m.state_dict() for k, m in fed.baselines.items()},
        "privacy": json.dumps(fed.privacy.state_dict()),
        "dp_sgd": {key: json.dumps(state.accountant.state_dict()) for key, state in fed.dp_sgd.items()},
        "history": json.dumps(history),
        "wall_seconds": wall,
    }


def restore(fed: Federation, state: dict[str, Any]) -> tuple[list[dict[str, Any]], int, float]:
    """Load a checkpoint into a freshly built federation; returns (history, rounds done, wall seconds)."""
    if state["layout_id"] != fed.layout.fingerprint():
        raise ckpt.CheckpointError("checkpoint was written for another model layout (backbone or sharing rule)")
    fed.server.weights = state["global"]
    for client in fed.clients:
        client.model.load_state_dict(state["clients"][str(client.id)], strict=False)
    for k, model in fed.baselines.items():
        model.load_state_dict(state["baselines"][str(k)])
    fed.privacy.load_state_dict(json.loads(state["privacy"]))
    for key, dp in fed.dp_sgd.items():
        dp.accountant.load_state_dict(json.loads(state["dp_sgd"][key]))
    return json.loads(state["history"]), int(state["rounds_done"]), float(state["wall_seconds"])


def summarize(fed: Federation, history: list[dict[str, Any]], run_dir: Path, wall: float) -> dict[str, Any]:
    """The run's results: what the CLI prints and ``--json`` emits."""
    cfg = fed.config
    final = history[-1]["final"]
    images = {c["id"]: c["images"] for c in fed.data_info["clients"]}
    clients_of = {d.name: d.client_ids for d in fed.domains}
    domains = []
    for name, parts in final.items():
        row: dict[str, Any] = {"name": name, "train_images": sum(images[k] for k in clients_of[name]),
                               **parts["federated"]}
        for prefix, key in (("local_", "local"), ("local_model_", "local_model"), ("raw_pixels_", "raw_pixels")):
            if parts[key] is not None:
                row[prefix + "rank1"] = parts[key]["rank1"]
                row[prefix + "mAP"] = parts[key]["mAP"]
        domains.append(row)
    rounds = len(history)
    return {
        "run_dir": str(run_dir),
        "algorithm": cfg.train.algorithm,
        "rounds": rounds,
        "wall_seconds": wall,
        "clients": len(fed.clients),
        "channel": fed.channel.name,
        "domains": domains,
        "communication": {
            "shared_model_bytes": fed.layout.nbytes,
            "cost_bytes": communication_cost(rounds, fed.layout.nbytes),
            "measured_up_bytes": sum(r["bytes_up"] for r in history),
            "measured_down_bytes": sum(r["bytes_down"] for r in history),
        },
        "privacy": privacy_summary(fed, history),
    }


def privacy_summary(fed: Federation, history: list[dict[str, Any]]) -> dict[str, Any]:
    """What the run can honestly say about privacy: the plan's statements, and ε where one is claimed."""
    plan = fed.privacy.plan
    out: dict[str, Any] = {"mechanism": plan.mechanism, "statements": list(plan.statements),
                           "claims_epsilon": plan.claims_epsilon}
    if fed.privacy.ledger is not None:
        out.update(fed.privacy.ledger.metrics())
        out["noise_multiplier"] = plan.noise_multiplier
        out["adjacency"] = plan.adjacency
    if fed.dp_sgd:
        out["dp_sgd"] = {_dp_sgd_label(fed, key): {"epsilon": s.epsilon(), "delta": s.delta,
                                                   "noise_multiplier": s.noise_multiplier}
                         for key, s in sorted(fed.dp_sgd.items())}
    return out


def _dp_sgd_label(fed: Federation, key: str) -> str:
    role, client = key.split("/")
    return f"{fed.clients[int(client)].name} ({'federated' if role == 'fed' else 'local-only'})"


def open_run(path: Path, reporter: Reporter | None = None) -> tuple[Federation, dict[str, Any], Path]:
    """A trained federation from a run directory (its newest checkpoint) or a checkpoint file, rebuilt
    from the configuration saved inside the checkpoint, for evaluation. Returns (federation,
    checkpoint state, checkpoint path)."""
    path = Path(path)
    if not path.exists():
        raise ckpt.CheckpointError(f"{path}: no such run directory or checkpoint")
    checkpoint = ckpt.latest_checkpoint(path) if path.is_dir() else path
    state = ckpt.load_checkpoint(checkpoint)
    cfg = from_dict(state["config"], source=str(checkpoint))
    fed = build(cfg, progress=(reporter or SilentReporter()).data_progress, train_images=False)
    restore(fed, state)
    return fed, state, checkpoint
