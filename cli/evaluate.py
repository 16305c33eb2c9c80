"""``secfed evaluate RUN``: score a trained run's federated model (and its baselines) per domain."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import rich_click as click

from secfed.cli.common import cli_errors, emit_json, human_console, set_threads
from secfed.config import MAX_THREADS


@click.command("evaluate")
@click.argument("run", type=click.Path(path_type=Path))
@click.option("--data-root", type=click.Path(file_okay=False, path_type=Path),
              help="Where the run's data is now, if it moved (checked against the run's content fingerprint).")
@click.option("--threads", type=click.IntRange(1, MAX_THREADS), help="torch CPU threads.")
@click.option("--json", "json_output", is_flag=True, help="Print one JSON object on stdout; the rest on stderr.")
def evaluate_command(run: Path, data_root: Path | None, threads: int | None, json_output: bool) -> None:
    """Evaluate RUN (a run directory, or one of its checkpoints) on every evaluation domain.

    The JSON has the keys of `secfed train --json` for the same things (domains, unseen, rounds,
    algorithm)."""
    from secfed.cli.progress import RichReporter
    from secfed.cli.train import print_domains
    from secfed.federation import checkpoint as ckpt
    from secfed.federation.evaluate import evaluate_final
    from secfed.evaluation.report import privacy_cell
    from secfed.federation.runtime import domain_row, open_run, privacy_summary

    console = human_console(json_output)
    set_threads(threads)
    with cli_errors(), RichReporter(human_console(True)) as reporter:  # bars on stderr: data, then each domain scored
        fed, state, checkpoint = open_run(run, reporter, data_root=data_root)
        final = evaluate_final(fed, ())
    images = {c["id"]: c["images"] for c in fed.data_info["clients"]}
    seen: list[dict[str, Any]] = []
    unseen: list[dict[str, Any]] = []
    for domain in fed.domains:
        row = domain_row(domain.name, final[domain.name])
        if domain.unseen:
            unseen.append(row)
        else:
            row["train_images"] = sum(images[k] for k in domain.client_ids)
            seen.append(row)
    run_dir = ckpt.run_dir_of(checkpoint)
    summary = {"run_dir": str(run_dir) if run_dir else None, "checkpoint": str(checkpoint),
               "rounds": int(state["rounds_done"]),
               "algorithm": fed.method.describe(), "domains": seen, "unseen": unseen,
               "privacy": privacy_summary(fed, int(state["rounds_done"]))}
    print_domains(console, seen, unseen)
    console.print(f"checkpoint: {checkpoint} (after round {state['rounds_done']})")
    # the run's ε, or why there is none, as compare's row says it (found by review: only --json carried
    # it, so a terminal reader of a --reproducible-noise run never saw NOT PRIVATE here)
    console.print(f"privacy: {privacy_cell(summary['privacy'])}", soft_wrap=True)
    if json_output:
        emit_json(summary)
