"""``secfed audit RUN``: attack what a run shares and give a verdict per target a CI can gate on.

Exit status: 0, or 1 under ``--fail-on`` when that verdict (or a worse one) occurs on a target the
run really exposes, 2 on usage errors (flags, a missing or unreadable run).
"""

from __future__ import annotations

import contextlib
import json
import sys
import tempfile
import time
from pathlib import Path

import rich_click as click

from secfed.cli.common import emit_json, human_console, set_threads
from secfed.cli.options import FiniteFloatRange
from secfed.config import MAX_THREADS

FAIL_ON = {"leak": ("LEAK",), "inconclusive": ("LEAK", "INCONCLUSIVE")}


class AuditUsageError(click.ClickException):
    exit_code = 2


def _check_writable(folder: Path, named: str) -> list[Path]:
    """Refuse a report folder that cannot be written before the attacks run, not after (found by review:
    `--out /proc/nope` spent the whole audit, then stopped with a traceback and lost it); the folders
    made to check it, deepest first (removed again if the audit is refused)."""
    made = [p for p in (folder, *folder.parents) if not p.exists()]
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder):
            pass
    except (OSError, ValueError) as exc:
        raise AuditUsageError(f"{named}: cannot write the report into {folder}: "
                              f"{getattr(exc, 'strerror', None) or exc}") from None
    return made


def _unmake(folders: list[Path]) -> None:
    for folder in folders:  # deepest first, each only while empty
        with contextlib.suppress(OSError):
            folder.rmdir()


@click.command("audit")
@click.argument("run", type=click.Path(path_type=Path))
@click.option("--attack", type=click.Choice(["inversion", "membership", "protocol", "all"]), default="all",
              show_default=True, help="Which attacks: inversion (updates, sum, weights, DFS), membership (DFS), "
              "protocol checks, or all.")
@click.option("--target", type=click.Choice(["update", "sum", "weights", "dfs"]),
              help="Attack one target (default: every target the attack applies to).")
@click.option("--round", "round_", type=click.IntRange(min=1),
              help="Round to attack: a recorded one (--record-uploads), or the checkpoint's next round, re-derived "
              "from the clients' real step (default: the newest recorded, else the next).")
@click.option("--client", help="Client name or id (default: the one with the fewest images).")
@click.option("--budget", type=click.Choice(["quick", "standard", "thorough"]), default="standard", show_default=True,
              help="quick ≤ 2 min (a lower bound on leakage), standard ≤ 5 min on 2 CPU cores, thorough for a GPU.")
@click.option("--time-limit", type=FiniteFloatRange(min=1.0), help="Wall-clock seconds for the whole audit "
              "(overrides the budget's).")
@click.option("--device", help="Where the attacks run: auto, cpu, cuda (default: the run's setting).")
@click.option("--data-root", type=click.Path(file_okay=False, path_type=Path),
              help="Where the run's data is now, if it moved.")
@click.option("--out", type=click.Path(file_okay=False, path_type=Path),
              help="Folder for audit.json, audit.md and images (default: audits/RUN-NAME-TIME).")
@click.option("--json", "json_output", is_flag=True, help="Print audit.json on stdout; the rest on stderr.")
@click.option("--fail-on", type=click.Choice(["leak", "inconclusive"]),
              help="Exit 1 when a target the run exposes gets this verdict (inconclusive: or LEAK).")
@click.option("--save-images", is_flag=True, help="Write image grids (victim | reconstruction | nearest match) "
              "under --out. They are as sensitive as the images.")
@click.option("--threads", type=click.IntRange(1, MAX_THREADS), default=1, show_default=True,
              help="torch CPU threads. The attacks optimise tiny batches: one thread ran a ResNet-18 step on two "
              "64×32 images 9× faster than two on a busy 2-core machine (bench/RESULTS.md).")
@click.option("--seed", type=click.IntRange(min=0), default=0, show_default=True, help="Seed of the attacks' "
              "initialisations and of the distractor draw.")
def audit_command(run: Path, attack: str, target: str | None, round_: int | None, client: str | None, budget: str,
                  time_limit: float | None, device: str | None, data_root: Path | None, out: Path | None,
                  json_output: bool, fail_on: str | None, save_images: bool, threads: int | None, seed: int) -> None:
    """Attack everything RUN shares — an update, the secure sum, the global model, DFS — and the
    protocol; print a verdict per target: LEAK, NO-LEAK-AT-THIS-STRENGTH or INCONCLUSIVE.

    Re-identification of reconstructions is measured with the run's own ReID embedding and by
    pixels, against the client's images plus distractors. An attack that did not fit its target
    never says NO-LEAK.
    """
    started = time.monotonic()
    from secfed.attacks.audit import AuditRequest, run_audit
    from secfed.attacks.evidence import AuditError
    from secfed.attacks.report import verdict_table, write_report
    from secfed.config import ConfigError
    from secfed.data.errors import DataError
    from secfed.models.reid import PretrainedWeightsUnavailable

    console = human_console(json_output)
    log = human_console(True)
    set_threads(threads)
    made = _check_writable(out or Path("audits"), "--out" if out else "the current folder's audits/")
    request = AuditRequest(run, attack, target, round_, client, budget, time_limit, device, data_root, seed)
    try:
        report = run_audit(request, progress=lambda message: log.print(f"[dim]{message}[/]"), started=started)
    except AuditError as exc:
        _unmake(made)  # a refused audit leaves no empty report folder behind
        raise AuditUsageError(str(exc)) from None
    except (ConfigError, DataError, PretrainedWeightsUnavailable) as exc:
        _unmake(made)
        raise AuditUsageError(f"{run}: {exc}") from None
    folder = out or Path("audits") / f"{report.run['name']}-{time.strftime('%Y%m%d-%H%M%S')}"
    console.print(verdict_table(report))  # before the files: a folder that fails now still shows the verdicts
    try:
        paths = write_report(report, folder, save_images=save_images)
    except OSError as exc:
        raise AuditUsageError(f"cannot write the report into {folder}: {exc.strerror or exc}") from None
    for statement in report.statements:
        console.print(f"[yellow]{statement}[/]")
    console.print(f"report: {paths['markdown']} · {paths['json']}")
    if json_output:
        emit_json(json.loads(paths["json"].read_text()))
    if fail_on is not None:
        failing = [t.target for t in report.targets if t.exposed and t.verdict is not None
                   and str(t.verdict) in FAIL_ON[fail_on]]
        if failing:
            log.print(f"[red]--fail-on {fail_on}: {', '.join(failing)}[/]")
            sys.exit(1)
