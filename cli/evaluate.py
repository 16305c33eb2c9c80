"""``secfed evaluate RUN``: score a trained run's federated model (and its baselines) per domain."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from secfed.cli.common import cli_errors, emit_json, human_console, set_threads


@click.command("evaluate")
@click.argument("run", type=click.Path(path_type=Path))
@click.option("--threads", type=click.IntRange(min=1), help="torch CPU threads.")
@click.option("--json", "json_output", is_flag=True, help="Print one JSON object on stdout; the rest on stderr.")
def evaluate_command(run: Path, threads: int | None, json_output: bool) -> None:
    """Evaluate RUN (a run directory, or one of its checkpoints) on every evaluation domain."""
    from secfed.evaluation.report import DomainResult, results_table
    from secfed.federation.evaluate import evaluate_global, evaluate_local_training
    from secfed.federation.runtime import open_run

    console = human_console(json_output)
    set_threads(threads)
    with cli_errors():
        fed, state, checkpoint = open_run(run)
        federated = evaluate_global(fed)
        local = evaluate_local_training(fed)
    rows: list[dict[str, Any]] = []
    for domain in fed.domains:
        row: dict[str, Any] = {"name": domain.name, **federated[domain.name]}
        if local[domain.name] is not None:
            row["local_rank1"] = local[domain.name]["rank1"]
            row["local_mAP"] = local[domain.name]["mAP"]
        rows.append(row)
    console.print(results_table([
        DomainResult(domain=r["name"], **{k: v for k, v in r.items() if k != "name"}) for r in rows
    ]))
    console.print(f"checkpoint: {checkpoint} (after round {state['rounds_done']})")
    if json_output:
        emit_json({"checkpoint": str(checkpoint), "rounds": int(state["rounds_done"]),
                   "algorithm": fed.config.train.algorithm, "domains": rows})
