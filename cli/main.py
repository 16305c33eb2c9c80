"""The ``secfed`` command: one click group, one module per subcommand."""

from __future__ import annotations

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


def main() -> None:
    reuse_freed_memory()  # every round frees and reallocates model-sized vectors: keep them mapped
    cli(prog_name="secfed")
