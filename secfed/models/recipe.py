"""What names a pretrained backbone: its recipe, and the backbones secfed builds.

Torch-free (numbers and names only), so that `secfed pretrain --help` shows a recipe's defaults
without loading torch; :mod:`secfed.models.pretrain` builds what a recipe names.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from typing import Any

from secfed.data.synth import GENERATOR_VERSION

BACKBONES: tuple[str, ...] = ("resnet18", "resnet34", "resnet50")  # torchvision ResNets (secfed.models.reid)
RECIPE_VERSION = 1  # bump whenever the same recipe would train different weights
SUFFIX = ".sfw"


@dataclass(frozen=True)
class Recipe:
    """Everything that decides the pretrained weights; the defaults are what `--pretrained synthetic` uses."""

    backbone: str = "resnet18"
    height: int = 64
    width: int = 32
    identities: int = 500  # ≈ 4,000 images: more people than the nine domains' train sides together
    epochs: int = 24
    seed: int = 0
    batch_size: int = 64
    lr: float = 0.05  # every layer is new: the rate a run uses for new layers
    momentum: float = 0.9
    weight_decay: float = 5e-4

    def __post_init__(self) -> None:
        if self.identities < 2 or self.epochs < 1 or self.batch_size < 1:
            raise ValueError(f"a pretraining recipe needs ≥ 2 identities, ≥ 1 epoch and a batch: {self}")

    def key(self) -> dict[str, Any]:
        return {"generator_version": GENERATOR_VERSION, "recipe_version": RECIPE_VERSION, **asdict(self)}

    @property
    def digest(self) -> str:
        return hashlib.sha256(json.dumps(self.key(), sort_keys=True).encode()).hexdigest()

    @property
    def filename(self) -> str:
        return f"synthetic-{self.backbone}-{self.height}x{self.width}-{self.digest[:16]}{SUFFIX}"

    def command(self) -> str:
        """The `secfed pretrain` command that builds this recipe."""
        parts = ["secfed pretrain", f"--backbone {self.backbone}", f"--height {self.height}", f"--width {self.width}"]
        default = Recipe()
        for name in ("identities", "epochs", "seed"):
            if getattr(self, name) != getattr(default, name):
                parts.append(f"--{name} {getattr(self, name)}")
        return " ".join(parts)
