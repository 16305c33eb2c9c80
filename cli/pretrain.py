"""``secfed pretrain``: build (once) the backbone `secfed train --pretrained synthetic` starts from."""

from __future__ import annotations

from dataclasses import asdict
from typing import TYPE_CHECKING

import rich_click as click
from rich.console import Console
from rich.progress import TaskID

from secfed.cli.common import cli_errors, emit_json, eta_bars, human_console, set_threads
from secfed.config import MAX_THREADS
from secfed.models.recipe import BACKBONES, Recipe

if TYPE_CHECKING:
    from secfed.models.pretrain import Built

# Training is imported when the command runs: `secfed pretrain --help` needs no torch.

_DEFAULT = Recipe()


class _Bars:
    """One bar per stage (rendering the identity set, training), each with its elapsed time and ETA."""

    def __init__(self, console: Console) -> None:
        self.progress = eta_bars(console)
        self.tasks: dict[str, TaskID] = {}

    def __call__(self, stage: str, done: int, total: int, note: str) -> None:
        if stage not in self.tasks:
            title = {"render": "rendering identities", "train": "training backbone"}.get(stage, stage)
            self.tasks[stage] = self.progress.add_task(title, total=total, info=note)
        self.progress.update(self.tasks[stage], completed=done, total=total, info=note)


def _report(built: Built, console: Console) -> None:
    if built.refused:
        console.print(f"[yellow]{built.refused}[/]\nrebuilt it.")
    verb = "trained and wrote" if built.trained else "already built (verified, nothing trained):"
    console.print(f"{verb} {built.path}\n  sha256 {built.sha256} · {built.seconds:.1f} s")
    if built.recipe != Recipe(backbone=built.recipe.backbone, height=built.recipe.height, width=built.recipe.width):
        console.print("[yellow]not the default recipe: `secfed train --pretrained synthetic` uses the default "
                      "--identities, --epochs and --seed[/]")


def _check_memory(recipe: Recipe) -> None:
    """Refuse a set whose images alone take more than half this machine's memory, naming the flags: values
    each within its range together asked torch for 1.1 TB and ended in a traceback (found by review)."""
    import os

    from secfed.data.synth_pretrain import CAMERAS_PER_ID, SHOTS_PER_CAMERA, plan_identities

    try:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # no sysconf: nothing to compare with
        return
    per_image = 3 * recipe.height * recipe.width
    most, least = (recipe.identities * CAMERAS_PER_ID[i] * SHOTS_PER_CAMERA[i] * per_image for i in (1, 0))
    if most <= memory // 2:
        return
    # the plan itself only where the bounds cannot tell (planning 100,000 people takes seconds)
    need = least if least > memory // 2 else len(plan_identities(recipe.seed, recipe.identities)) * per_image
    if need > memory // 2:
        raise click.BadParameter(
            f"{recipe.identities:,} identities at {recipe.height}×{recipe.width} need {need / 2**30:,.1f} GiB or more for their "
            f"images alone, more than half of this machine's {memory / 2**30:,.1f} GiB: fewer --identities or a "
            "smaller --height/--width", param_hint="--identities")


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--backbone", type=click.Choice(BACKBONES), default=_DEFAULT.backbone, show_default=True,
              help="torchvision ResNet, as `secfed train --backbone`.")
@click.option("--height", type=click.IntRange(16, 1024), default=_DEFAULT.height, show_default=True,
              help="Input height, as `secfed train --height` (weights are made per input size).")
@click.option("--width", type=click.IntRange(8, 512), default=_DEFAULT.width, show_default=True,
              help="Input width, as `secfed train --width`.")
@click.option("--identities", type=click.IntRange(2, 100_000), default=_DEFAULT.identities, show_default=True,
              help="People in the synthetic pretraining set (disjoint from every domain's).")
@click.option("--epochs", type=click.IntRange(1, 1000), default=_DEFAULT.epochs, show_default=True,
              help="Training epochs over the set.")
@click.option("--seed", type=click.IntRange(0, 2**63 - 1), default=_DEFAULT.seed, show_default=True,
              help="Seed of the set and of training.")
@click.option("--threads", type=click.IntRange(1, MAX_THREADS), default=None,
              help="torch CPU threads (the same machine and threads write the same bytes).")
@click.option("--force", is_flag=True, help="Train again even when a verified file exists.")
@click.option("--json", "json_output", is_flag=True, help="Print one JSON object on stdout; the rest on stderr.")
def pretrain_command(backbone: str, height: int, width: int, identities: int, epochs: int, seed: int,
                     threads: int | None, force: bool, json_output: bool) -> None:
    """Pretrain a backbone on synthetic people no domain holds, once; cached by the hash of its recipe.

    The offline equivalent of ImageNet weights: `secfed train --pretrained synthetic` starts from it.
    A cached file is verified (its recipe and the SHA-256 of its weights) and reused; a corrupt or mismatching one is refused
    by name and rebuilt. Training runs on the CPU.
    """
    from secfed.algorithms.base import TrainingDiverged
    from secfed.models.pretrain import build, weights_path

    console = human_console(json_output)
    set_threads(threads)
    recipe = Recipe(backbone=backbone, height=height, width=width, identities=identities, epochs=epochs, seed=seed)
    _check_memory(recipe)
    bars = _Bars(console)
    console.print(f"[bold]secfed pretrain[/] {recipe.backbone} {height}×{width} · {identities} synthetic identities "
                  f"· {epochs} epochs · seed {seed} → {weights_path(recipe)}")
    with cli_errors(), bars.progress:
        try:
            built = build(recipe, bars, force=force)
        except TrainingDiverged as exc:  # nothing was written: the cache holds no half-trained file
            raise click.ClickException(f"pretraining diverged ({exc}); nothing was written") from None
    if json_output:
        emit_json({"path": str(built.path), "sha256": built.sha256, "trained": built.trained,
                   "refused": built.refused, "seconds": round(built.seconds, 3), "recipe": asdict(recipe),
                   "key_digest": recipe.digest})
    else:
        _report(built, console)
