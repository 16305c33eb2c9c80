"""Typed run configuration: one dataclass per section, loaded from defaults, a TOML file, then flags.

The resolved configuration is written to every run directory (``config.json``) and is all a
``--resume`` needs. Every invalid setting raises :class:`ConfigError` naming the flag to change.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Literal

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

Scenario = Literal["by-dataset", "by-camera", "by-identity"]
Algorithm = Literal["fedpav", "fedavg"]
BnStats = Literal["shared", "local"]


class ConfigError(ValueError):
    """An invalid setting. ``flag`` is the command-line flag (or TOML key) that has to change."""

    def __init__(self, flag: str, message: str) -> None:
        self.flag = flag
        super().__init__(f"{flag}: {message}")


@dataclass
class DataConfig:
    """Where images come from and how they are split among clients."""

    root: str | None = None  # None: the embedded synthetic default, generated (once) into the cache
    datasets: list[str] = field(default_factory=list)  # NAME or NAME:FORMAT folders under root; [] = all
    scenario: Scenario = "by-dataset"
    num_clients: int = 0  # by-identity: how many clients; by-camera: ignored (one per camera)
    seed: int = 0  # the data's own seed (synthetic default, seeded splits): fixed while the run seed varies
    synth_domains: int = 4  # the synthetic default: number of domains
    synth_scale: float = 1.0  # the synthetic default: size multiplier of every domain
    height: int = 64  # model input; FedReIDBench uses 256 x 128
    width: int = 32


@dataclass
class ModelConfig:
    backbone: str = "resnet18"
    pretrained: bool = False
    neck_dim: int = 512
    dropout: float = 0.5
    bn_stats: BnStats = "shared"  # BatchNorm running statistics: averaged with the weights, or kept per client


@dataclass
class TrainConfig:
    """Local training and the round schedule.

    FedReIDBench (appendix A.1) trains an ImageNet-pretrained ResNet-50 with lr 0.05 for new layers
    and 0.005 for the backbone; those are the defaults with ``--pretrained``. Trained from scratch
    (the CPU default) every layer is new, and 0.05 diverges when a small domain trains alone
    (measured on the synthetic default: loss climbing from 2.8 to 6–9 on three of four domains),
    so every layer then starts at 0.02.
    """

    algorithm: Algorithm = "fedpav"
    aggregation: Literal["weighted", "unweighted"] = "weighted"  # n_k/n (FedPav) or a plain mean; DP needs unweighted
    rounds: int = 16
    local_epochs: int = 1
    batch_size: int = 32
    clients_per_round: int = 0  # K; 0 = every client every round
    lr_new: float | None = None  # neck + classifier; None: 0.05 with a pretrained backbone, else 0.02
    lr_backbone: float | None = None  # None: 0.005 with a pretrained backbone, else the new layers' rate
    momentum: float = 0.9
    weight_decay: float = 5e-4
    lr_step: int | None = None  # rounds between decays by lr_gamma; None: one decay at 3/4 of the rounds
    lr_gamma: float = 0.1
    local_baseline: bool = True  # also train each client alone with the same budget (seed paper's baseline)
    eval_every: int = 4  # evaluate the federated model every N rounds (and always after the last); 0 = last only

    def resolved_lr_new(self, pretrained: bool) -> float:
        if self.lr_new is not None:
            return self.lr_new
        return 0.05 if pretrained else 0.02

    def resolved_backbone_lr(self, pretrained: bool) -> float:
        if self.lr_backbone is not None:
            return self.lr_backbone
        return 0.005 if pretrained else self.resolved_lr_new(pretrained)

    @property
    def resolved_lr_step(self) -> int:
        return self.lr_step if self.lr_step is not None else max(1, (3 * self.rounds) // 4)


@dataclass
class SecAggConfig:
    enabled: bool = True
    dropout_rate: float = 0.0  # simulate clients vanishing mid-round, at a seeded phase
    graph: Literal["auto", "complete"] = "auto"  # auto: SecAgg+ (Bell et al.) where a sparse graph qualifies
    authenticated: bool = False
    clip: float = 8.0  # per-coordinate range [-clip, clip] of what a client uploads, before quantisation


@dataclass
class PrivacyConfig:
    dp_beta: float = 0.0
    dp_beta_mode: Literal["single", "double"] = "single"
    clip: float | None = None
    noise_multiplier: float | None = None
    target_epsilon: float | None = None
    delta: float | None = None
    sampling: Literal["fixed", "poisson"] = "fixed"
    sample_rate: float | None = None
    distributed: bool = False
    dp_sgd: bool = False
    dp_sgd_noise_multiplier: float | None = None
    dp_sgd_clip: float = 1.0
    dp_sgd_target_epsilon: float | None = None
    dp_sgd_delta: float | None = None


@dataclass
class RunConfig:
    seed: int = 0
    out_dir: str = "runs"
    name: str | None = None  # run directory name; None: derived from time and settings
    device: str = "auto"  # where models train: "auto" (a CUDA GPU if any, else CPU), "cpu", "cuda", "cuda:1"
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    secagg: SecAggConfig = field(default_factory=SecAggConfig)
    privacy: PrivacyConfig = field(default_factory=PrivacyConfig)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)


_SECTIONS = {"data": DataConfig, "model": ModelConfig, "train": TrainConfig, "secagg": SecAggConfig, "privacy": PrivacyConfig}


def from_dict(raw: dict[str, Any], source: str = "config") -> RunConfig:
    """Build a RunConfig from nested dicts (a TOML file or a saved config.json). Unknown keys are errors."""
    cfg = RunConfig()
    for key, value in raw.items():
        if key in _SECTIONS:
            if not isinstance(value, dict):
                raise ConfigError(f"{source}: [{key}]", "must be a table")
            section = getattr(cfg, key)
            names = {f.name for f in fields(section)}
            for sub, subval in value.items():
                if sub not in names:
                    raise ConfigError(f"{source}: {key}.{sub}", f"unknown key; known: {', '.join(sorted(names))}")
                setattr(section, sub, subval)
        elif key in {"seed", "out_dir", "name", "device"}:
            setattr(cfg, key, value)
        else:
            raise ConfigError(f"{source}: {key}", "unknown key")
    return cfg


def load_toml(path: Path) -> RunConfig:
    try:
        raw = tomllib.loads(Path(path).read_text())
    except FileNotFoundError:
        raise ConfigError("--config", f"{path} does not exist") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError("--config", f"{path} is not valid TOML: {exc}") from None
    return from_dict(raw, source=str(path))


def override(cfg: RunConfig, dotted: dict[str, Any]) -> RunConfig:
    """Apply ``{"train.rounds": 5, "seed": 1}``-style overrides (what the CLI's flags produce)."""
    for key, value in dotted.items():
        target: Any = cfg
        *path, last = key.split(".")
        for part in path:
            target = getattr(target, part)
        if not hasattr(target, last):
            raise KeyError(key)
        setattr(target, last, value)
    return cfg
