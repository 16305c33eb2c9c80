"""``secfed train``: a federated run from the embedded synthetic default, a TOML file, or flags."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import click
from click.core import ParameterSource

from secfed.config import RunConfig, from_dict, load_toml, override
from secfed.models.reid import BACKBONES
from secfed.cli.common import cli_errors, emit_json, human_console, set_threads

# flag parameter name → dotted RunConfig key. Only flags the user actually typed override the file.
FLAG_KEYS: dict[str, str] = {
    "data_root": "data.root",
    "datasets": "data.datasets",
    "scenario": "data.scenario",
    "num_clients": "data.num_clients",
    "data_seed": "data.seed",
    "synth_domains": "data.synth_domains",
    "synth_scale": "data.synth_scale",
    "height": "data.height",
    "width": "data.width",
    "backbone": "model.backbone",
    "pretrained": "model.pretrained",
    "bn_stats": "model.bn_stats",
    "algorithm": "train.algorithm",
    "rounds": "train.rounds",
    "local_epochs": "train.local_epochs",
    "batch_size": "train.batch_size",
    "clients_per_round": "train.clients_per_round",
    "lr": "train.lr_new",
    "lr_backbone": "train.lr_backbone",
    "lr_step": "train.lr_step",
    "lr_gamma": "train.lr_gamma",
    "local_baseline": "train.local_baseline",
    "eval_every": "train.eval_every",
    "secagg": "secagg.enabled",
    "dropout_rate": "secagg.dropout_rate",
    "secagg_graph": "secagg.graph",
    "authenticated": "secagg.authenticated",
    "secagg_clip": "secagg.clip",
    "aggregation": "train.aggregation",
    "dp_beta": "privacy.dp_beta",
    "dp_beta_mode": "privacy.dp_beta_mode",
    "clip": "privacy.clip",
    "noise_multiplier": "privacy.noise_multiplier",
    "target_epsilon": "privacy.target_epsilon",
    "delta": "privacy.delta",
    "sampling": "privacy.sampling",
    "sample_rate": "privacy.sample_rate",
    "dp_distributed": "privacy.distributed",
    "dp_sgd": "privacy.dp_sgd",
    "dp_sgd_noise_multiplier": "privacy.dp_sgd_noise_multiplier",
    "dp_sgd_clip": "privacy.dp_sgd_clip",
    "dp_sgd_target_epsilon": "privacy.dp_sgd_target_epsilon",
    "dp_sgd_delta": "privacy.dp_sgd_delta",
    "seed": "seed",
    "device": "device",
    "out": "out_dir",
    "name": "name",
}
# Flags that do not change what is trained, so they may accompany --resume.
RESUME_COMPATIBLE = {"resume", "json_output", "threads", "device"}


def _typed(params: dict[str, Any], ctx: click.Context) -> dict[str, Any]:
    given = {}
    for param, key in FLAG_KEYS.items():
        if ctx.get_parameter_source(param) in (ParameterSource.COMMANDLINE, ParameterSource.ENVIRONMENT):
            value = params[param]
            if param == "datasets":
                value = [d.strip() for d in value.split(",") if d.strip()]
            if isinstance(value, Path):
                value = str(value)
            given[key] = value
    return given


def _flag_name(param: str) -> str:
    return "--" + param.replace("_", "-")


def resolve_config(ctx: click.Context, params: dict[str, Any]) -> tuple[RunConfig, Path, bool]:
    """(config, run directory, resuming?) from --config, the flags and --resume."""
    if params["resume"] is not None:
        typed = [p for p, src in ((p, ctx.get_parameter_source(p)) for p in params)
                 if src == ParameterSource.COMMANDLINE and p not in RESUME_COMPATIBLE]
        if typed:
            raise click.UsageError(
                f"{_flag_name(typed[0])} cannot be combined with --resume: a resumed run keeps the "
                "configuration saved in its run directory"
            )
        run_dir = Path(params["resume"])
        config_file = run_dir / "config.json"
        if not config_file.is_file():
            raise click.BadParameter(f"{run_dir} has no config.json; is it a secfed run directory?",
                                     param_hint="--resume")
        cfg = from_dict(json.loads(config_file.read_text()), source=str(config_file))
        if ctx.get_parameter_source("device") == ParameterSource.COMMANDLINE:
            cfg.device = params["device"]  # where to continue is not part of what is trained
        return cfg, run_dir, True
    cfg = load_toml(params["config"]) if params["config"] is not None else RunConfig()
    override(cfg, _typed(params, ctx))
    name = cfg.name or f"{cfg.train.algorithm}-{cfg.data.scenario}-{time.strftime('%Y%m%d-%H%M%S')}"
    run_dir = Path(cfg.out_dir) / name
    if run_dir.exists() and any(run_dir.iterdir()):
        raise click.BadParameter(f"{run_dir} already exists and is not empty; choose another --name or use "
                                 f"--resume {run_dir}", param_hint="--name")
    return cfg, run_dir, False


@click.command("train")
@click.option("--config", type=click.Path(dir_okay=False, path_type=Path), help="TOML file; flags override it.")
@click.option("--data-root", type=click.Path(file_okay=False, path_type=Path),
              help="Folder of datasets (default: the embedded synthetic domains).")
@click.option("--datasets", help="Comma-separated NAME[:FORMAT] folders under --data-root (default: all found).")
@click.option("--scenario", type=click.Choice(["by-dataset", "by-camera", "by-identity"]), default="by-dataset",
              show_default=True)
@click.option("--num-clients", type=int, default=0, help="Clients for --scenario by-identity.")
@click.option("--data-seed", type=int, default=0, show_default=True,
              help="Seed of the synthetic data and of seeded dataset splits.")
@click.option("--synth-domains", type=click.IntRange(2, 9), default=4, show_default=True,
              help="Synthetic default: number of domains (clients).")
@click.option("--synth-scale", type=click.FloatRange(min=0.05, max=50), default=1.0, show_default=True,
              help="Synthetic default: size multiplier.")
@click.option("--height", type=int, default=64, show_default=True, help="Model input height (FedReIDBench: 256).")
@click.option("--width", type=int, default=32, show_default=True, help="Model input width (FedReIDBench: 128).")
@click.option("--backbone", type=click.Choice(BACKBONES), default="resnet18", show_default=True)
@click.option("--pretrained/--no-pretrained", default=False, show_default=True,
              help="Start from ImageNet weights (must be cached, or downloadable).")
@click.option("--bn-stats", type=click.Choice(["shared", "local"]), default="shared", show_default=True,
              help="BatchNorm running statistics: averaged with the weights, or kept per client.")
@click.option("--algorithm", type=click.Choice(["fedpav", "fedavg"]), default="fedpav", show_default=True)
@click.option("--rounds", type=int, default=RunConfig().train.rounds, show_default=True)
@click.option("--local-epochs", type=int, default=1, show_default=True)
@click.option("--batch-size", type=int, default=32, show_default=True)
@click.option("--clients-per-round", type=int, default=0, help="K of N per round (default: all).")
@click.option("--lr", type=float, help="Learning rate of new layers (default 0.05 with --pretrained, else 0.02).")
@click.option("--lr-backbone", type=float, help="Backbone learning rate (default 0.005 with --pretrained, else --lr).")
@click.option("--lr-step", type=int, help="Rounds between learning-rate decays (default: one decay at 3/4 of the rounds).")
@click.option("--lr-gamma", type=float, default=0.1, show_default=True)
@click.option("--local-baseline/--no-local-baseline", default=True, show_default=True,
              help="Also train every client alone with the same budget.")
@click.option("--eval-every", type=int, default=RunConfig().train.eval_every, show_default=True,
              help="Evaluate every N rounds and after the last; 0: after the last only.")
@click.option("--secagg/--no-secagg", default=True, show_default=True, help="Secure aggregation of uploads.")
@click.option("--dropout-rate", type=float, default=0.0, show_default=True,
              help="Probability that a selected client vanishes mid-round.")
@click.option("--secagg-graph", type=click.Choice(["auto", "complete"]), default="auto", show_default=True,
              help="auto: SecAgg+ sparse graph where it meets the targets (else complete); complete: plain SecAgg.")
@click.option("--authenticated", is_flag=True, help="Signed transcript and model-consistency check.")
@click.option("--secagg-clip", type=float, default=8.0, show_default=True,
              help="Per-coordinate range of uploads before quantisation.")
@click.option("--aggregation", type=click.Choice(["weighted", "unweighted"]), default="weighted", show_default=True,
              help="n_k-weighted mean (FedPav) or plain mean (needed for client-level DP).")
@click.option("--dp-beta", type=float, default=0.0, show_default=True,
              help="β white noise on the aggregated weights (Wu & Gong 2021, Eq. 14). Not DP without --clip.")
@click.option("--dp-beta-mode", type=click.Choice(["single", "double"]), default="single", show_default=True,
              help="double: also noise what each client receives (Eq. 15).")
@click.option("--clip", type=float, help="L2 bound of each client's whole shared update.")
@click.option("--noise-multiplier", type=float, help="Client-level DP-FedAvg noise multiplier z (needs --clip).")
@click.option("--target-epsilon", type=float, help="Derive z for this ε at --delta over all rounds.")
@click.option("--delta", type=float, help="δ of client-level DP (default min(1e-5, N^-1.1)).")
@click.option("--sampling", type=click.Choice(["fixed", "poisson"]), default="fixed", show_default=True,
              help="Client selection: K of N, or Poisson with --sample-rate (amplifies ε).")
@click.option("--sample-rate", type=float, help="Poisson client-sampling rate q.")
@click.option("--dp-distributed", is_flag=True, help="Clients add Skellam noise shares inside secure aggregation.")
@click.option("--dp-sgd", is_flag=True, help="Example-level DP-SGD inside every client (Opacus).")
@click.option("--dp-sgd-noise-multiplier", type=float, help="DP-SGD noise multiplier.")
@click.option("--dp-sgd-clip", type=float, default=1.0, show_default=True, help="DP-SGD per-example gradient norm.")
@click.option("--dp-sgd-target-epsilon", type=float, help="Calibrate each client's DP-SGD noise to this ε.")
@click.option("--dp-sgd-delta", type=float, help="δ of DP-SGD (default min(1e-5, n_k^-1.1)).")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--device", default="auto", show_default=True,
              help="Where models train: auto (a CUDA GPU if any, else CPU), cpu, cuda, cuda:1, ...")
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=Path("runs"), show_default=True,
              help="Parent folder of run directories.")
@click.option("--name", help="Run directory name (default: algorithm-scenario-time).")
@click.option("--resume", type=click.Path(file_okay=False, path_type=Path), help="Continue the run in this directory.")
@click.option("--threads", type=click.IntRange(min=1), help="torch CPU threads.")
@click.option("--json", "json_output", is_flag=True, help="Print one JSON object on stdout; the rest on stderr.")
@click.pass_context
def train_command(ctx: click.Context, **params: Any) -> None:
    """Train a federated ReID model (FedPav by default) and report it per domain."""
    from secfed.evaluation.report import DomainResult, results_table, summary_table
    from secfed.federation.runtime import run
    from secfed.cli.progress import RichReporter

    console = human_console(params["json_output"])
    set_threads(params["threads"])
    with cli_errors():
        cfg, run_dir, resuming = resolve_config(ctx, params)
        with RichReporter(human_console(True)) as reporter:
            result = run(cfg, run_dir, resume=resuming, reporter=reporter)
    summary = result.summary
    console.print(results_table([DomainResult.from_dict(_row(d)) for d in summary["domains"]]))
    if verdict := federated_vs_local(summary["domains"]):
        console.print(verdict)
    console.print(summary_table(_summary_view(summary)))
    for line in summary["privacy"]["statements"]:
        console.print(f"[yellow]privacy:[/] {line}")
    for who, dp in summary["privacy"].get("dp_sgd", {}).items():
        console.print(f"DP-SGD {who}: (ε = {dp['epsilon']:.3g}, δ = {dp['delta']:.2g}), z = {dp['noise_multiplier']:.3g}")
    console.print(f"run directory: {run_dir}")
    if params["json_output"]:
        emit_json(summary)


def federated_vs_local(domains: list[dict[str, Any]]) -> str | None:
    """One sentence: where federation beat training alone (rank-1), smallest domains first."""
    compared = sorted((d for d in domains if "local_rank1" in d), key=lambda d: d["train_images"])
    if not compared:
        return None

    def delta(d: dict[str, Any]) -> str:
        return f"{d['name']} ({d['train_images']} images, {100 * (d['rank1'] - d['local_rank1']):+.1f})"

    wins = [delta(d) for d in compared if d["rank1"] > d["local_rank1"]]
    rest = [delta(d) for d in compared if d["rank1"] <= d["local_rank1"]]
    text = f"Federated beats local-only training (rank-1 points) on {', '.join(wins) or 'no domain'}"
    return text + (f"; not on {', '.join(rest)}." if rest else ".")


def _row(domain: dict[str, Any]) -> dict[str, Any]:
    keep = {"rank1", "rank5", "rank10", "mAP", "local_rank1", "local_mAP", "local_model_rank1"}
    row = {"domain": domain["name"], **{k: v for k, v in domain.items() if k in keep}}
    if "raw_pixels_rank1" in domain:
        row["raw_pixels_rank1"] = domain["raw_pixels_rank1"]
    return row


def _summary_view(summary: dict[str, Any]) -> dict[str, Any]:
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
        "privacy": _privacy_cell(summary["privacy"]),
    }


def _privacy_cell(privacy: dict[str, Any]) -> str:
    if "epsilon" in privacy:
        return f"(ε = {privacy['epsilon']:.3g}, δ = {privacy['delta']:.2g}) client-level, {privacy['mechanism']}"
    if privacy["mechanism"] == "beta":
        return "β noise, no formal guarantee"
    return "no client-level DP" + (" (example-level DP-SGD per client, below)" if "dp_sgd" in privacy else "")

