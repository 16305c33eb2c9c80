"""What every subcommand shares: consoles, JSON mode, and turning library errors into CLI errors."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from typing import Any

import rich_click as click
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from secfed.config import ConfigError
from secfed.data.errors import DataError
from secfed.protocols import ProtocolError


def human_console(json_mode: bool) -> Console:
    """Tables and messages: stdout normally, stderr when stdout is reserved for one JSON object."""
    return Console(stderr=json_mode)


def emit_json(obj: Any) -> None:
    click.echo(json.dumps(obj, indent=2, sort_keys=False))


@contextlib.contextmanager
def cli_errors() -> Iterator[None]:
    """Library errors → click errors that name the flag or path, exit code 2 (usage) or 1."""
    # Imported here, not with the module: they bring torch and torchvision (≈ 3 s), which
    # `secfed --help` and every subcommand's --help do not need.
    from secfed.cli.options import render
    from secfed.federation.checkpoint import CheckpointError
    from secfed.federation.codec import CodecError
    from secfed.federation.runtime import RunDiverged, SiteDiverged
    from secfed.models.reid import PretrainedWeightsUnavailable

    try:
        yield
    except ConfigError as exc:
        raise click.UsageError(render(exc)) from None
    except (DataError, CheckpointError, PretrainedWeightsUnavailable, CodecError, RunDiverged, SiteDiverged) as exc:
        raise click.ClickException(str(exc)) from None
    except ProtocolError as exc:  # e.g. a model-inconsistency attack detected in authenticated mode
        raise click.ClickException(f"secure aggregation aborted: {type(exc).__name__}: {exc}") from None


def set_threads(threads: int | None) -> None:
    if threads is not None:
        import torch

        torch.set_num_threads(threads)


def eta_bars(console: Console) -> Progress:
    """Transient bars: what is under way, how far, elapsed time, ETA and a free ``info`` field (set
    ``info=`` on every task)."""
    return Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                    TextColumn("ETA"), TimeRemainingColumn(), TextColumn("{task.fields[info]}"), console=console,
                    transient=True)
