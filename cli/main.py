"""The ``secfed`` command: one click group, one module per subcommand."""

from __future__ import annotations

import signal
import warnings

import rich_click as click

from secfed import __version__
from secfed.cli.audit import audit_command
from secfed.cli.compare import compare_command
from secfed.cli.data_inspect import inspect_command
from secfed.cli.data_synth import synth_command
from secfed.cli.evaluate import evaluate_command
from secfed.cli.flower import flower_group
from secfed.cli.pretrain import pretrain_command
from secfed.cli.train import train_command
from secfed.memory import reuse_freed_memory


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="secfed")
def cli() -> None:
    """Privacy-hardened federated learning for person re-identification."""


@cli.group()
def data() -> None:
    """Make synthetic ReID domains and inspect datasets on disk."""


cli.add_command(train_command)
cli.add_command(evaluate_command)
cli.add_command(compare_command)
cli.add_command(pretrain_command)
cli.add_command(flower_group)
cli.add_command(audit_command)
data.add_command(synth_command, "synth")
data.add_command(inspect_command, "inspect")


def stop_politely_on_termination() -> None:
    """SIGTERM (``kill``, a service manager, a CI timeout) and SIGHUP (a closed terminal) stop a command
    as Ctrl-C does: the run says where it stopped and how to resume, a round that released nothing
    withdraws its privacy note, and ``secfed flower local`` stops the SuperLink and SuperNodes it
    started. Python's default for both ends the process at once: the Flower processes, each leading
    its own process group, were left running (found by review)."""
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _stop_once)


def _stop_once(signum: int, frame: object) -> None:
    """Stop as Ctrl-C does, once: a repeat while the command stops (a closed terminal sends SIGHUP twice)
    is ignored, so that it cannot cut the cleanup short (found by review)."""
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    raise KeyboardInterrupt


def _warning_line(message: Warning | str, category: type[Warning], *args: object, **kwargs: object) -> str:
    """A warning as one line that names it, without Python's source line (found by review: a damaged
    checkpoint's warning showed the line of runtime.py that loaded it)."""
    return f"warning: {message}\n"


def main() -> None:
    warnings.formatwarning = _warning_line
    stop_politely_on_termination()
    reuse_freed_memory()  # every round frees and reallocates model-sized vectors: keep them mapped
    cli(prog_name="secfed")
