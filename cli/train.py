"""``secfed train``: a federated run from the embedded synthetic default, a TOML file, or flags."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Collection
from pathlib import Path
from typing import Any

import rich_click as click

from secfed.cli.common import cli_errors, emit_json, human_console, set_threads
from secfed.locking import FOLDER_LOCK
from secfed.cli.options import config_options, given_overrides, option_panels, render
from secfed.config import RESUME_COMPATIBLE, ConfigError, RunConfig, from_dict, load_toml, with_overrides

# The library is imported inside the functions that run a command: `secfed train --help` then
# starts without torch, torchvision and the federation (≈ 4 s on the dev VM).

COMMAND_OPTIONS = ["--config", "--resume", "--leave-one-out", "--flower", "--json", "--help"]
# the type goes after the help, not in a column of its own: more room in 80 columns
click.rich_click.OPTIONS_TABLE_COLUMN_TYPES = ["required", "opt_short", "opt_long", "help"]
click.rich_click.OPTIONS_TABLE_HELP_SECTIONS = ["help", "deprecated", "envvar", "default", "required", "metavar"]


def _toml_keys(path: Path) -> set[str]:
    from secfed.config import TomlUnreadable, read_toml

    try:
        raw = read_toml(path)
    except TomlUnreadable:  # the loader reports it properly
        return set()
    return {f"{section}.{key}" for section, table in raw.items() if isinstance(table, dict) for key in table}


def resolve_config(params: dict[str, Any], *, public_root: bool = False) -> tuple[RunConfig, Path, bool]:
    """(config, run directory, resuming?) from --config, the flags and --resume; every problem at once.
    ``public_root``: the run's server reads `method.kd_public` inside a public root of its own (a
    Flower connection file's `public-root`), so the name stays as given."""
    from secfed.validation import check

    overrides = given_overrides(params)
    typed = set(overrides)
    toml: Path | None = params.get("config")
    try:
        if params.get("resume") is not None:
            if toml is not None:  # (found by review: ignored without a word)
                raise click.UsageError("--config cannot be combined with --resume: a resumed run keeps the "
                                       "configuration saved in its run directory")
            return _resume_config(Path(params["resume"]), overrides)
        try:
            cfg = load_toml(toml) if toml is not None else RunConfig()
        except ConfigError as exc:  # the file's own values: named as its keys, not as flags given beside it
            raise click.UsageError(render(exc, from_file=_toml_keys(toml), toml=str(toml))) from None  # (review)
        cfg = with_overrides(cfg, overrides)
        if cfg.data.root is not None:  # absolute in config.json, so the run directory can move
            cfg.data.root = _absolute(cfg.data.root, "data.root")
        if cfg.method.kd_public is not None and not public_root:  # the server distils on it, and each
            # Flower node reads the same path inside its own public root (a relative one would name
            # whatever folder the ServerApp's process runs in: found by review)
            cfg.method.kd_public = _absolute(cfg.method.kd_public, "method.kd_public")
        check(cfg)
    except ConfigError as exc:
        raise click.UsageError(render(exc, typed=typed, from_file=_toml_keys(toml) if toml else set(),
                                      toml=str(toml) if toml else None)) from None
    name = cfg.run.name or f"{cfg.method.algorithm}-{cfg.data.scenario}-{time.strftime('%Y%m%d-%H%M%S')}"
    try:
        run_dir = Path(cfg.run.out).expanduser() / name  # "~/runs" from a TOML file too (found by review: ./~/runs)
    except RuntimeError as exc:  # ~user of nobody (review of that fix: a traceback)
        raise click.BadParameter(f"{cfg.run.out}: {exc}", param_hint="--out") from None
    try:
        started = run_dir.exists() and any(p.name != FOLDER_LOCK for p in run_dir.iterdir())  # a lock alone: empty
    except OSError as exc:  # a name too long for the file system (found by review: a traceback)
        raise click.BadParameter(f"{run_dir}: cannot be a run directory ({exc.strerror or exc})",
                                 param_hint="--name") from None
    if started:  # a deployment's run cannot be resumed (review 85: --flower was pointed at --resume)
        then = "" if params.get("flower") is not None else f" or continue it with --resume {run_dir}"
        raise click.BadParameter(f"{run_dir} already exists and is not empty; choose another --name{then}",
                                 param_hint="--name")
    return cfg, run_dir, False


def _absolute(path: str, key: str) -> str:
    try:
        return str(Path(path).expanduser().resolve())
    except (RuntimeError, OSError) as exc:  # a link loop (found by review), a home folder that is not there
        raise ConfigError(key, f"cannot resolve {path!r}: {exc}") from None


def _resume_config(run_dir: Path, overrides: dict[str, Any]) -> tuple[RunConfig, Path, bool]:
    from secfed.federation.leave_one_out import SWEEP_FILE, is_sweep

    refused = sorted(k for k in overrides if k not in RESUME_COMPATIBLE)
    if refused:
        from secfed.config import flag_name

        flags = ", ".join(flag_name(k) for k in refused)
        raise click.UsageError(f"{flags} cannot be combined with --resume: a resumed run keeps the configuration "
                               f"saved in its run directory (only {', '.join(sorted(flag_name(k) for k in RESUME_COMPATIBLE))} "
                               "may change)")
    sweep = is_sweep(run_dir)
    config_file = run_dir / (SWEEP_FILE if sweep else "config.json")
    if not sweep and not config_file.is_file():
        _restore_config(run_dir, config_file)
    if not config_file.is_file():
        raise click.BadParameter(
            f"{run_dir} has no config.json: it is not a secfed run directory, or it was interrupted before its "
            f"configuration was written; start it again without --resume (delete {run_dir} first)",
            param_hint="--resume")
    try:
        raw = json.loads(config_file.read_text())
        raw = raw["config"] if sweep else raw
    except (OSError, KeyError, TypeError, ValueError, RecursionError) as exc:  # ValueError: bad JSON, not UTF-8
        raise click.BadParameter(f"{config_file} cannot be read ({exc})", param_hint="--resume") from None
    if not isinstance(raw, dict):
        raise click.BadParameter(f"{config_file} is not a secfed configuration (a JSON object of sections); it "
                                 f"holds a {type(raw).__name__}", param_hint="--resume")
    saved = {f"{section}.{key}" for section, table in raw.items() if isinstance(table, dict) for key in table}
    try:  # the file first: its own bad value is blamed on it, even where a flag overrides that key
        base = from_dict(raw)
    except ConfigError as exc:
        raise click.UsageError(render(exc, typed=set(), from_file=saved, toml=str(config_file))) from None
    try:
        cfg = with_overrides(base, overrides)
    except ConfigError as exc:
        raise click.UsageError(render(exc, typed=set(overrides), from_file=saved - set(overrides),
                                      toml=str(config_file))) from None
    return cfg, run_dir, True


def _restore_config(run_dir: Path, config_file: Path) -> None:
    """A run directory that lost its config.json but kept checkpoints: each checkpoint holds the run's
    configuration, so config.json is written back from the newest intact one (nothing finished is
    lost; before, the advice was to delete the directory)."""
    from secfed import atomic_file
    from secfed.federation import checkpoint as ckpt
    from secfed.federation.runtime import saved_config

    if not ckpt.list_checkpoints(run_dir):
        return
    try:
        path, state = ckpt.load_newest(run_dir)
        restored = saved_config(state, path).to_json()
    except ckpt.CheckpointError as exc:
        raise click.BadParameter(f"{run_dir} has no config.json and its checkpoints cannot restore it ({exc})",
                                 param_hint="--resume") from None
    atomic_file.write_text(config_file, restored)
    human_console(True).print(f"[yellow]{config_file} was missing: restored from {path}[/yellow]")


@click.command("train")
@click.option("--config", type=click.Path(dir_okay=False, path_type=Path), help="TOML file; flags override it.")
@click.option("--resume", type=click.Path(file_okay=False, path_type=Path),
              help="Continue the run in this directory (starts it afresh if no round had finished).")
@click.option("--leave-one-out", is_flag=True,
              help="Train once per training domain, holding each out in turn and scoring it as an unseen target "
                   "(FedDG protocol); one run directory per target under the run's.")
@click.option("--flower", type=click.Path(dir_okay=False, path_type=Path), metavar="CONNECTION",
              help="Run the clients on Flower SuperNodes: a connection file (`secfed flower --help`).")
@click.option("--json", "json_output", is_flag=True, help="Print one JSON object on stdout; the rest on stderr.")
@config_options
@option_panels(COMMAND_OPTIONS)
def train_command(**params: Any) -> None:
    """Train a federated ReID model (FedPav by default) and report it per domain.

    Every setting is a flag and a TOML key (`secfed train --help` lists both); a TOML file given
    with --config is overridden by flags.
    """
    from secfed.cli.progress import RichReporter
    from secfed.evaluation.communication import format_bytes
    from secfed.federation import checkpoint as ckpt
    from secfed.federation.leave_one_out import is_sweep
    from secfed.federation.runtime import run

    console = human_console(params["json_output"])
    connection = None
    if params["flower"] is not None:
        from secfed.cli.flower import Connection

        connection = Connection.load(params["flower"])
    cfg, run_dir, resuming = resolve_config(params, public_root=bool(connection and connection.public_root))
    if connection is not None and params["leave_one_out"]:
        raise click.UsageError("--leave-one-out runs in-process only; on Flower, hold domains out with --leave-out")
    if connection is not None:
        from secfed.cli.flower import train_on_flower

        train_on_flower(cfg, run_dir, connection, json_output=params["json_output"],
                        resuming=resuming)
        return
    set_threads(cfg.run.threads)
    given = given_overrides(params).keys()  # what this command line sets (a resume's rates among them)
    data_root = Path(cfg.data.root) if resuming and "data.root" in given else None
    if params["leave_one_out"] or (resuming and is_sweep(run_dir)):
        sweep(console, cfg, run_dir, resuming, data_root, params["json_output"], given)
        return
    if resuming:  # a deployment's run, or one whose checkpoints were removed, is refused before anything
        # says it starts (review 89, review 90)
        from secfed.federation.runtime import refuse_a_deployment, refuse_lost_checkpoints

        with cli_errors():
            refuse_a_deployment(run_dir, None, None)
            refuse_lost_checkpoints(run_dir)
    if resuming and not ckpt.list_checkpoints(run_dir):
        console.print(f"[yellow]{run_dir}: no round had finished before the interruption; starting from round 1 "
                      "with its saved configuration.[/]")
    with cli_errors(), RichReporter(human_console(True)) as reporter:
        try:
            result = run(cfg, run_dir, resume=resuming, reporter=reporter, data_root=data_root, rates_given=given)
        except KeyboardInterrupt:
            done = ckpt.list_checkpoints(run_dir)
            where = f"after round {ckpt.round_of(done[-1])}" if done else "before the first round finished"
            # before the run wrote its configuration nothing is left to continue (found by review: the advice
            # to resume was refused, "no config.json")
            then = f"continue with: secfed train --resume {run_dir}" if (run_dir / "config.json").is_file() else \
                "nothing was kept; start it again"
            from secfed.federation.runtime import unresumable_dp_sgd_rounds

            if lost := unresumable_dp_sgd_rounds(cfg, run_dir):  # (review: the advice was to resume, refused)
                then = (f"round(s) {', '.join(map(str, lost))} may have released a model trained with DP-SGD whose "
                        "local steps are lost, so a resume is refused: start a new run")
            reporter.console.print(f"[yellow]interrupted {where}; {then}[/]")
            sys.exit(130)
    show_summary(console, result.summary)
    console.print(f"run directory: {run_dir} ({format_bytes(result.summary['storage']['run_dir_bytes'])} on disk)")
    if params["json_output"]:
        emit_json(result.summary)


def sweep(console: Any, cfg: RunConfig, run_dir: Path, resuming: bool, data_root: Path | None,
          json_output: bool, rates_given: Collection[str] = ()) -> None:
    """--leave-one-out: every training domain held out in turn; a table of the held-out scores."""
    from rich.table import Table

    from secfed.cli.progress import RichReporter
    from secfed.federation.leave_one_out import leave_one_out

    with cli_errors(), RichReporter(human_console(True)) as reporter:
        try:
            result = leave_one_out(cfg, run_dir, resume=resuming, reporter=reporter, data_root=data_root,
                                   rates_given=rates_given)
        except KeyboardInterrupt:
            reporter.console.print(f"[yellow]interrupted; continue with: secfed train --resume {run_dir}[/]")
            sys.exit(130)
    table = Table(title="Leave-one-domain-out: each domain scored by the model trained without it")
    for column in ("held-out domain", "rank-1", "mAP", "run"):
        table.add_column(column, justify="left" if column in ("held-out domain", "run") else "right")
    for t in result.targets:
        table.add_row(t["name"], f"{100 * t['rank1']:.1f}", f"{100 * t['mAP']:.1f}", t["run"])
    table.add_row("mean", f"{100 * result.mean['rank1']:.1f}", f"{100 * result.mean['mAP']:.1f}", "", style="bold")
    console.print(table)
    for key, what in (("client_level", "client-level ε"), ("dfs", "identity-level DFS ε")):
        if result.privacy and key in result.privacy:
            composed = result.privacy[key]
            console.print(f"{what} over the sweep: each run's is its own, but a client's data trains every run except "
                          f"the one holding its domain out; by basic composition a client's ε ≤ {composed['epsilon']:.4g} "
                          f"(δ ≤ {composed['delta']:.3g}), per domain in leave-one-out.json; a person whose pictures lie "
                          "at k clients is protected over k of them together (group privacy only)")
    if result.privacy and "dp_sgd" in result.privacy:
        composed = result.privacy["dp_sgd"]
        console.print(f"example-level DP-SGD ε over the sweep: each model's is its own, but a client's examples train "
                      f"its model in every run except the one holding its domain out (and its local-only baseline in "
                      f"each, where one trains); by basic composition a client's ε ≤ {composed['epsilon']:.4g} (δ ≤ "
                      f"{composed['delta']:.3g}), per client in leave-one-out.json")
    console.print(f"run directory: {run_dir}")
    if json_output:
        emit_json(result.to_dict())


def print_domains(console: Any, seen: list[dict[str, Any]], unseen: list[dict[str, Any]]) -> None:
    """The per-domain tables: domains clients trained on, then unseen ones (never trained on)."""
    from secfed.evaluation.report import DomainResult, results_table

    console.print(results_table([DomainResult.from_dict(_row(d)) for d in seen]))
    if unseen:
        console.print(results_table([DomainResult.from_dict(_row(d)) for d in unseen],
                                    title="Unseen domains (no client trained on them)"))


def show_summary(console: Any, summary: dict[str, Any]) -> None:
    from rich.markup import escape

    from secfed.evaluation.report import privacy_cell, summary_table
    from secfed.privacy.adversary import Guarantee

    print_domains(console, summary["domains"], summary.get("unseen", []))
    if verdict := federated_vs_local(summary["domains"]):
        console.print(verdict)
    console.print(summary_table(_summary_view(summary)))
    for line in summary["privacy"]["statements"]:
        console.print(f"[yellow]privacy:[/] {line}")
    for guarantee in summary["privacy"].get("epsilon_against", []):  # each ε, and whom it protects against
        console.print(f"[bold]ε:[/] {escape(Guarantee(**guarantee).sentence())}")


def federated_vs_local(domains: list[dict[str, Any]]) -> str | None:
    """One sentence: where federation beat training alone (rank-1), smallest domains first."""
    compared = sorted((d for d in domains if "local_rank1" in d), key=lambda d: d["train_images"])
    if not compared:
        return None

    def delta(d: dict[str, Any]) -> str:
        return f"{d['name']} ({d['train_images']} images, {100 * (d['rank1'] - d['local_rank1']):+.1f})"

    wins = [delta(d) for d in compared if d["rank1"] > d["local_rank1"]]
    rest = [delta(d) for d in compared if d["rank1"] <= d["local_rank1"]]
    text = f"Federated beats local-only training (rank-1 points, one run) on {', '.join(wins) or 'no domain'}"
    return text + (f"; not on {', '.join(rest)}." if rest else ".")


def _row(domain: dict[str, Any]) -> dict[str, Any]:
    keep = {"rank1", "rank5", "rank10", "mAP", "local_rank1", "local_mAP", "local_model_rank1", "raw_pixels_rank1"}
    return {"domain": domain["name"], **{k: v for k, v in domain.items() if k in keep}}


def _summary_view(summary: dict[str, Any]) -> dict[str, Any]:
    from secfed.evaluation.report import privacy_cell

    comm = summary["communication"]
    return {
        "rounds": summary["rounds"],
        "wall_time_s": summary["wall_seconds"],
        "shared_bytes": comm["shared_model_bytes"],
        "communication_bytes": comm["cost_bytes"],
        "bytes_up": comm["measured_up_bytes"],
        "bytes_down": comm["measured_down_bytes"],
        "algorithm": summary["algorithm"],
        "channel": summary["channel"],
        "privacy": privacy_cell(summary["privacy"]),
        **_storage_cells(summary.get("storage")),
    }


def _storage_cells(storage: dict[str, int] | None) -> dict[str, int]:
    """What the run directory weighs (a summary from before secfed measured it has none)."""
    if not storage:
        return {}
    shown = {"run_dir_bytes": storage["run_dir_bytes"], "checkpoint_bytes": storage["checkpoint_bytes"]}
    return shown | ({"uploads_bytes": storage["uploads_bytes"]} if storage["uploads_bytes"] else {})
