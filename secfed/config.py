"""The run configuration: one typed schema for flags, TOML files, saved runs and the library API.

Every setting is declared once, below, with its type, its valid range and the command-line flag
that sets it; the CLI builds its options from these declarations, the TOML loader checks files
against them, and :func:`secfed.validation.check` applies the rules that span settings. A configuration is therefore
validated the same way wherever it comes from, and every problem of one invocation is reported at
once (:class:`ConfigError` carries them all) before any data is generated or loaded.

Sections and TOML tables correspond one to one, and so do keys and flags::

    [data]      where images come from and how they are split among clients
    [model]     backbone, input size, what BatchNorm shares
    [method]    the federated ReID method and its options (KD, CDW, FedReID, DFH)
    [schedule]  rounds, local budget, learning rates
    [secagg]    secure aggregation
    [privacy]   clipping, noise, accounting
    [run]       seed, where the run directory goes, device, evaluation cadence

The library never speaks of flags: a problem names its key (``schedule.rounds``) and writes other
keys in backticks (`` `privacy.clip` ``); the CLI renders those as the flags the user typed,
the TOML loader as the keys of the file (:meth:`ConfigError.render`).
"""

from __future__ import annotations

import json
import re
import stat
import sys
import unicodedata
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, field_validator
from pydantic.fields import FieldInfo

# The synthetic generator's ranges, so that `secfed data synth` and `secfed train` accept the same.
from secfed.errors import ConfigError, ConfigIssue
from secfed.data.synth import SCALE_HELP, SCALE_RANGE, SEED_RANGE, SYNTH_DOMAINS_RANGE, UNSEEN_RANGE

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

CONFIG_VERSION = 2


# ---- the schema ----------------------------------------------------------------------------------


MAX_THREADS = 1024  # more torch threads than any machine has cores (and below what torch's int can hold)


def setting(default: Any, flag: str, help: str, *, flag_value: str | None = None, **constraints: Any) -> Any:
    """A configuration field: its default, the flag that sets it, one line of help, and its range.

    ``flag`` is the long option (``--rounds``); a boolean's negative form is ``--no-…`` unless the
    flag is written ``--on/--off``. A choice with ``flag_value`` is also a flag: ``--pretrained``
    alone means ``flag_value``, ``--no-pretrained`` means ``none``.
    """
    extra: dict[str, Any] = {"flag": flag} if flag_value is None else {"flag": flag, "flag_value": flag_value}
    return Field(default, description=help, json_schema_extra=extra, **constraints)


class Section(BaseModel):
    # Strict: TOML's `rounds = "three"` or `rounds = 2.7` are refused, not coerced; unknown keys refused.
    model_config = ConfigDict(extra="forbid", strict=True, validate_assignment=True, allow_inf_nan=False)

    @field_validator("*")
    @classmethod
    def _no_nul(cls, value: Any) -> Any:
        """No path or name holds a NUL byte (found by review: `root = "a\\u0000b"` reached the
        filesystem calls and stopped them with a traceback)."""
        if any(isinstance(v, str) and "\x00" in v for v in (value if isinstance(value, list) else [value])):
            raise ValueError("must not contain a NUL character")
        return value


class DataConfig(Section):
    """Where images come from and how they are split among clients."""

    root: str | None = setting(None, "--data-root", "Folder of datasets (default: the embedded synthetic domains).")
    datasets: list[str] = setting([], "--datasets", "NAME[:FORMAT] folders under --data-root, or synthetic domain "
                                  "names (default: all).")
    scenario: Literal["by-dataset", "by-camera", "by-identity"] = setting(
        "by-dataset", "--scenario", "One client per dataset, per camera of one dataset, or per slice of its ids.")
    num_clients: int = setting(0, "--num-clients", "Clients for --scenario by-identity.", ge=0)
    seed: int = setting(0, "--data-seed", "Seed of the synthetic data and of drawn dataset splits.", ge=SEED_RANGE[0],
                        le=SEED_RANGE[1])
    split_file: str | None = setting(None, "--split-file", "Where drawn splits of the small sets are kept "
                                     "(default: in the run directory; never in the dataset folder).")
    synth_domains: int = setting(4, "--synth-domains", "Synthetic default: number of training domains.",
                                 ge=SYNTH_DOMAINS_RANGE[0], le=SYNTH_DOMAINS_RANGE[1])
    synth_scale: float = setting(1.0, "--synth-scale", f"Synthetic default: {SCALE_HELP[0].lower()}{SCALE_HELP[1:]}",
                                 ge=SCALE_RANGE[0], le=SCALE_RANGE[1])
    synth_unseen: int = setting(0, "--synth-unseen", "Synthetic default: extra domains never trained on, "
                                "evaluated as unseen targets (their camera styles, not their people or cameras, "
                                "are in the synthetic KD public and pretraining sets).",
                                ge=UNSEEN_RANGE[0], le=UNSEEN_RANGE[1])
    test_datasets: list[str] = setting([], "--test-datasets", "NAME[:FORMAT] folders under --data-root evaluated "
                                       "as unseen domains (never trained on).")
    leave_out: list[str] = setting([], "--leave-out", "Domains held out of training and evaluated as unseen "
                                   "targets (FedDG protocol; a synthetic one's camera style, not its people or "
                                   "cameras, is in the synthetic KD public and pretraining sets).")
    validation: float = setting(0.0, "--validation", "Tuning only: hold out this fraction of each training "
                                "domain's training identities as its query/gallery (no test set, no unseen domains "
                                "are scored); 0: off.", ge=0, lt=1)
    height: int = setting(64, "--height", "Model input height in pixels (FedReIDBench: 256).", ge=16, le=1024)
    width: int = setting(32, "--width", "Model input width in pixels (FedReIDBench: 128).", ge=8, le=512)


class ModelConfig(Section):
    backbone: Literal["resnet18", "resnet34", "resnet50"] = setting("resnet18", "--backbone", "torchvision ResNet.")
    pretrained: Literal["none", "imagenet", "synthetic"] = setting(
        "none", "--pretrained", "Initial backbone: imagenet (torchvision's cached weights; nothing is downloaded; "
        "plain --pretrained), synthetic (built once by `secfed pretrain`), or none. true/false mean imagenet/none.",
        flag_value="imagenet")
    neck_dim: int = setting(512, "--neck-dim", "Width of the ReID feature (FedReIDBench's neck: 512).", ge=8,
                            le=16384)
    neck_dropout: float = setting(0.5, "--neck-dropout", "Dropout after the neck.", ge=0.0, lt=1.0)
    bn_stats: Literal["shared", "local"] = setting(
        "shared", "--bn-stats", "BatchNorm running statistics: averaged with the weights, or kept per client.")

    @field_validator("pretrained", mode="before")
    @classmethod
    def _pretrained_from_bool(cls, value: Any) -> Any:
        """`pretrained = true` (files and saved runs from before "synthetic" existed) means ImageNet."""
        return {True: "imagenet", False: "none"}.get(value, value) if isinstance(value, bool) else value


class MethodConfig(Section):
    algorithm: str = setting("fedpav", "--algorithm", "The federated ReID method: fedpav, fedavg, fedreid, dfh "
                             "(or one registered in secfed.algorithms.METHODS).")
    aggregation: Literal["weighted", "unweighted"] = setting(
        "weighted", "--aggregation", "Mean weighted by each client's size (or CDW), or plain (needed for DP).")
    kd: bool = setting(False, "--kd", "Server knowledge distillation on a public set (MM'20 Alg. 2).")
    kd_public: str | None = setting(None, "--kd-public", "Folder of public unlabelled images for --kd (default: "
                                    "the synthetic public domain).")
    kd_epochs: int = setting(1, "--kd-epochs", "Server fine-tuning epochs over the public set per round.", ge=1)
    kd_lr: float = setting(0.005, "--kd-lr", "Server fine-tuning learning rate.", gt=0)
    kd_images: int = setting(0, "--kd-images", "Use at most this many public images (0: all).", ge=0)
    cdw: bool = setting(False, "--cdw", "Cosine distance weights for aggregation (MM'20 Alg. 3).")
    expert_temperature: float = setting(3.0, "--expert-temperature", "FedReID: temperature T of the local "
                                        "expert's KL regularisation.", gt=0)
    expert: bool = setting(True, "--expert", "FedReID: train with the local expert (CE + T²·KL); "
                           "--no-expert trains on CE alone (the paper's ablation, AAAI'21 Fig. 4(d)).")
    dfh_alpha: float = setting(1.0, "--dfh-alpha", "DFH: Dirichlet α of domain hallucinating.", gt=0)
    dfh_lambda: float = setting(1.0, "--dfh-lambda", "DFH: weight λ of the hallucinated-feature triplet losses "
                                "(the paper's §4.1: 5, which bench/bench_dfh.py uses).", ge=0)
    dfh_hallucinate: Literal["both", "features", "domains"] = setting(
        "both", "--dfh-hallucinate", "DFH ablation: feature and domain hallucinating, or one of them.")
    triplet_margin: float = setting(0.3, "--triplet-margin", "Margin of the batch-hard triplet loss (DFH's §4.1: "
                                    "0.5, which bench/bench_dfh.py uses).", gt=0)
    ids_per_batch: int = setting(8, "--ids-per-batch", "P of the P×K identity sampler (DFH).", ge=2)
    dfs_noise: float = setting(0.0, "--dfs-noise", "DFH: Gaussian noise multiplier on the shared domain "
                               "statistics (0: none).", ge=0)
    dfs_clip: float = setting(4.0, "--dfs-clip", "DFH: L2 bound of each identity's feature statistics before "
                              "the domain statistics are formed.", gt=0)


class ScheduleConfig(Section):
    """Local training and the round schedule.

    FedReIDBench (appendix A.1) trains an ImageNet-pretrained ResNet-50 with lr 0.05 for new layers
    and 0.005 for the backbone; those are the defaults with ``--pretrained`` (imagenet or synthetic). Trained from scratch
    (the CPU default) every layer is new, and 0.05 diverges when a small domain trains alone
    (measured on the synthetic default), so every layer then starts at 0.02. A method whose paper
    fixes its rates declares them (``Method.learning_rates``: FedReID's 0.1 and 0.01) and they replace
    these defaults.
    """

    rounds: int = setting(16, "--rounds", "Communication rounds.", ge=1, le=1_000_000)
    local_epochs: int = setting(1, "--local-epochs", "Local epochs per round (E).", ge=1, le=10_000)
    batch_size: int = setting(32, "--batch-size", "Local batch size (B; 2 or more unless --dp-sgd: BatchNorm "
                              "needs two images).", ge=1, le=1 << 20)
    clients_per_round: int = setting(0, "--clients-per-round", "K of N clients per round (0: all).", ge=0)
    lr: float | None = setting(None, "--lr", "Learning rate of new layers (default: 0.02 from scratch, 0.05 with --pretrained; FedReID 0.1).", gt=0)
    lr_backbone: float | None = setting(None, "--lr-backbone", "Backbone learning rate (default: --lr's from scratch, 0.005 with --pretrained; FedReID 0.01).", gt=0)
    lr_step: int | None = setting(None, "--lr-step", "Rounds between decays (default: one decay at 3/4).", ge=1)
    lr_gamma: float = setting(0.1, "--lr-gamma", "Decay factor.", gt=0, le=1)
    momentum: float = setting(0.9, "--momentum", "SGD momentum (Nesterov, as both reference codes).", ge=0, lt=1)
    weight_decay: float = setting(5e-4, "--weight-decay", "SGD weight decay.", ge=0)

    def resolved_lr(self, pretrained: bool, method_default: float | None = None) -> float:
        """``pretrained``: the run starts from pretrained weights (ImageNet or synthetic);
        ``method_default``: the rate the method's paper fixes (its ``learning_rates``), if any."""
        if self.lr is not None:
            return self.lr
        if method_default is not None:
            return method_default
        return 0.05 if pretrained else 0.02

    def resolved_backbone_lr(self, pretrained: bool, method_default: float | None = None) -> float:
        """As :meth:`resolved_lr`, for the backbone (from scratch it follows the new layers' rate)."""
        if self.lr_backbone is not None:
            return self.lr_backbone
        if method_default is not None:
            return method_default
        return 0.005 if pretrained else self.resolved_lr(pretrained)

    @property
    def resolved_lr_step(self) -> int:
        return self.lr_step if self.lr_step is not None else max(1, (3 * self.rounds) // 4)


class SecAggConfig(Section):
    enabled: bool = setting(True, "--secagg", "Secure aggregation of everything clients sum.")
    authenticated: bool = setting(True, "--authenticated", "Malicious-server mode: signed keys, consistency "
                                  "check, model binding (the model digest sealed in the key shares). "
                                  "--no-authenticated is weaker (honest-but-curious server only, over a transport "
                                  "that authenticates every client).")
    graph: Literal["auto", "complete"] = setting("auto", "--secagg-graph", "auto: SecAgg+ sparse graph where it "
                                                 "meets the targets (a deployed node refuses one in "
                                                 "authenticated mode unless it sets secfed-allow-sparse=true); "
                                                 "complete: plain SecAgg.")
    dropout_rate: float = setting(0.0, "--dropout-rate", "Simulate clients vanishing mid-round with this "
                                  "probability.", ge=0, lt=1)
    clip: float = setting(8.0, "--secagg-clip", "Per-coordinate range of what clients sum, before quantisation.",
                          ge=1)
    # BatchNorm running statistics are averaged, not trained: a round moves a running variance by as
    # much as the features' scale (842 measured for DFH's pool-5 statistics, 5.8 for FedPav's), far
    # beyond the weights' range; 4096 leaves a margin and still resolves 1e-5 at 4 clients.
    stats_clip: float = setting(4096.0, "--secagg-stats-clip", "Per-coordinate range of the BatchNorm running "
                                "statistics clients sum (their change per round, times the client's weight).", ge=1)


class PrivacyConfig(Section):
    dp_beta: float = setting(0.0, "--dp-beta", "β white noise on the aggregated weights (Wu & Gong, Eq. 14). "
                             "Not DP without --clip.", ge=0)
    dp_beta_mode: Literal["single", "double"] = setting("single", "--dp-beta-mode", "double: also noise what each "
                                                        "client receives (Eq. 15).")
    clip: float | None = setting(None, "--clip", "L2 bound of each client's whole shared update.", gt=0)
    noise_multiplier: float | None = setting(None, "--noise-multiplier", "Client-level DP-FedAvg noise "
                                             "multiplier z.", gt=0)
    target_epsilon: float | None = setting(None, "--target-epsilon", "Derive z for this ε at --delta.", gt=0)
    delta: float | None = setting(None, "--delta", "δ of client-level DP: min(1e-5, 0.1/N) unless given; --target-epsilon needs it given.", gt=0, lt=1)
    sampling: Literal["fixed", "poisson"] = setting("fixed", "--sampling", "Client selection: K of N, or Poisson "
                                                    "with --sample-rate (amplifies ε).")
    sample_rate: float | None = setting(None, "--sample-rate", "Poisson client-sampling rate q.", gt=0, le=1)
    distributed: bool = setting(False, "--dp-distributed", "Clients add Skellam noise shares inside secure "
                                "aggregation.")
    dp_sgd: bool = setting(False, "--dp-sgd", "Example-level DP-SGD inside every client (Opacus).")
    dp_sgd_noise_multiplier: float | None = setting(None, "--dp-sgd-noise-multiplier", "DP-SGD noise "
                                                    "multiplier.", gt=0)
    dp_sgd_clip: float = setting(1.0, "--dp-sgd-clip", "DP-SGD per-example gradient norm bound.", gt=0)
    dp_sgd_target_epsilon: float | None = setting(None, "--dp-sgd-target-epsilon", "Calibrate each client's "
                                                  "DP-SGD noise to this ε.", gt=0)
    dp_sgd_delta: float | None = setting(None, "--dp-sgd-delta", "δ of DP-SGD: min(1e-5, 0.1/n_k) unless given; --dp-sgd-target-epsilon needs it given.",
                                         gt=0, lt=1)
    reproducible_noise: bool = setting(False, "--reproducible-noise", "Experiments only: draw privacy noise and "
                                       "the samples an ε relies on from the run seed. The run is then NOT PRIVATE.")


class RunSection(Section):
    seed: int = setting(0, "--seed", "Run seed: every training-side random choice derives from it.", ge=0)
    out: str = setting("runs", "--out", "Parent folder of run directories.")
    name: str | None = setting(None, "--name", "Run directory name (default: algorithm-scenario-time).")
    device: str = setting("auto", "--device", "Where models train: auto (a CUDA GPU if any), cpu, cuda, cuda:1.")
    threads: int | None = setting(None, "--threads", "torch CPU threads.", ge=1, le=MAX_THREADS)
    eval_every: int = setting(4, "--eval-every", "Evaluate every N rounds and after the last (0: last only).", ge=0)
    local_baseline: bool = setting(True, "--local-baseline", "Also train every client alone with the same budget.")
    record_uploads: bool = setting(False, "--record-uploads", "Keep what every client uploaded in the run "
                                   "directory (for `secfed audit --target update`; as sensitive as the images).")
    log_to: list[Literal["tensorboard", "mlflow"]] = setting(
        [], "--log-to", "Also log every round's figures, the configuration and history.png to TensorBoard "
        "(RUN/tensorboard) and/or MLflow (MLFLOW_TRACKING_URI, else RUN/mlflow.db).")

    @field_validator("name")
    @classmethod
    def _one_folder_name(cls, value: str | None) -> str | None:
        """A run directory's own name: one folder under `run.out`, nothing a file system refuses."""
        # control and format characters too: C1 (U+0085 ends a line) and the bidirectional overrides
        # (U+202E shows a name reversed) were accepted (found by review)
        if value is not None and (value in ("", ".", "..") or any(c in value for c in "/\\")
                                  or any(unicodedata.category(c) in ("Cc", "Cf") for c in value)):
            raise ValueError("must be one folder name: no '/', '\\', control or format characters, '.' or '..'")
        return value


SYNTH_DEFAULT_DOMAINS = DataConfig.model_fields["synth_domains"].default

SECTIONS: dict[str, type[Section]] = {
    "data": DataConfig, "model": ModelConfig, "method": MethodConfig, "schedule": ScheduleConfig,
    "secagg": SecAggConfig, "privacy": PrivacyConfig, "run": RunSection,
}


class RunConfig(BaseModel):
    """The whole configuration of a run; ``RunConfig()`` is the embedded default."""

    model_config = ConfigDict(extra="forbid", strict=True, validate_assignment=True)

    data: DataConfig = Field(default_factory=DataConfig)
    model: ModelConfig = Field(default_factory=ModelConfig)
    method: MethodConfig = Field(default_factory=MethodConfig)
    schedule: ScheduleConfig = Field(default_factory=ScheduleConfig)
    secagg: SecAggConfig = Field(default_factory=SecAggConfig)
    privacy: PrivacyConfig = Field(default_factory=PrivacyConfig)
    run: RunSection = Field(default_factory=RunSection)

    @property
    def seed(self) -> int:
        return self.run.seed

    def to_dict(self) -> dict[str, Any]:
        return {"version": CONFIG_VERSION, **self.model_dump(mode="json")}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)


# ---- the registry of keys --------------------------------------------------------------------------


@dataclass(frozen=True)
class Key:
    """One setting as users see it: ``section.name``, its flag, type, default and help."""

    section: str
    name: str
    field: FieldInfo

    @property
    def dotted(self) -> str:
        return f"{self.section}.{self.name}"

    @property
    def flag(self) -> str:
        return str((self.field.json_schema_extra or {})["flag"]).split("/")[0]  # type: ignore[index]

    @property
    def help(self) -> str:
        return self.field.description or ""

    @property
    def annotation(self) -> Any:
        return self.field.annotation

    @property
    def default(self) -> Any:
        return self.field.get_default(call_default_factory=True)

    @property
    def is_flag(self) -> bool:
        return self.annotation is bool

    @property
    def flag_value(self) -> str | None:
        """What the flag alone means, for a choice that is also a flag (``--pretrained``: imagenet)."""
        return (self.field.json_schema_extra or {}).get("flag_value")  # type: ignore[union-attr,return-value]

    @property
    def is_list(self) -> bool:
        return getattr(self.annotation, "__origin__", None) is list

    def choices(self) -> tuple[str, ...] | None:
        args = getattr(self.annotation, "__args__", ())
        if getattr(self.annotation, "__origin__", None) is Literal:
            return tuple(args)
        return None


def keys() -> list[Key]:
    """Every setting, in section order: the one table flags, TOML keys and the docs are made from."""
    return [Key(section, name, field) for section, model in SECTIONS.items() for name, field in model.model_fields.items()]


KEYS: dict[str, Key] = {k.dotted: k for k in keys()}
FLAG_OF: dict[str, str] = {k.dotted: k.flag for k in KEYS.values()}


# Settings that do not change what is trained (threads, device, where figures are logged), or that
# repair a run (a lower learning rate after a divergence, the data's new place): they may accompany
# --resume, and a checkpoint is restored whatever they are.
RESUME_COMPATIBLE = frozenset({"run.threads", "run.device", "run.log_to", "data.root", "schedule.lr",
                               "schedule.lr_backbone"})


def settings_that_differ(saved: Mapping[str, Any], current: Mapping[str, Any]) -> dict[str, tuple[Any, Any]]:
    """``section.key`` → (saved, current) for every setting two configurations (:meth:`RunConfig.to_dict`,
    or that saved as JSON) disagree on, :data:`RESUME_COMPATIBLE` ones aside. A setting one of them does
    not hold (saved by a secfed before the setting existed) counts as its default, the behaviour that
    secfed had."""
    def flat(config: Mapping[str, Any]) -> dict[str, Any]:
        plain = json.loads(json.dumps(dict(config)))  # tuples and lists alike, as a saved config holds them
        return {f"{section}.{key}": value for section, table in plain.items() if isinstance(table, dict)
                for key, value in table.items()}

    defaults = flat(RunConfig().to_dict())
    a, b = {**defaults, **flat(saved)}, {**defaults, **flat(current)}
    return {k: (a.get(k), b.get(k)) for k in sorted(a.keys() | b.keys())
            if k not in RESUME_COMPATIBLE and a.get(k) != b.get(k)}


def flag_name(key: str) -> str:
    """The flag of ``key`` (``schedule.rounds`` → ``--rounds``); the key itself when it has none."""
    return FLAG_OF.get(key, key)


# ---- building and checking -------------------------------------------------------------------------


_PLAIN = {
    "int_type": "must be an integer", "int_parsing": "must be an integer", "int_from_float": "must be an integer",
    "float_type": "must be a number", "float_parsing": "must be a number", "finite_number": "must be a finite number",
    "bool_type": "must be true or false", "bool_parsing": "must be true or false", "string_type": "must be text",
    "list_type": "must be a list", "dict_type": "must be a table",
}


def _plain(error: Mapping[str, Any]) -> str:
    """A pydantic error as a short sentence (``must be ≥ 1``), with the value that was given."""
    kind, ctx = error["type"], error.get("ctx") or {}
    bounds = {"greater_than": ">", "greater_than_equal": "≥", "less_than": "<", "less_than_equal": "≤"}
    if kind in bounds:
        limit = next(iter(ctx.values()))
        message = f"must be {bounds[kind]} {limit}"
    elif kind == "literal_error":
        message = f"must be one of {ctx.get('expected', '')}".replace("'", "")
    elif kind == "value_error":  # a field validator's own sentence, without pydantic's "Value error, "
        message = str(ctx.get("error", error["msg"]))
    else:
        message = _PLAIN.get(kind, error["msg"])
    return f"{message} (got {error['input']!r})" if "input" in error else message


def _issues_of(error: ValidationError, prefix: tuple[str, ...] = ()) -> list[ConfigIssue]:
    out = []
    for e in error.errors():
        path = (*prefix, *e["loc"])
        loc = ".".join(str(p) for p in path)
        if e["type"] == "extra_forbidden":
            section = str(path[0]) if path else ""
            known = ", ".join(SECTIONS[section].model_fields) if section in SECTIONS else ", ".join(SECTIONS)
            out.append(ConfigIssue(loc, f"unknown key; known: {known}"))
        else:
            out.append(ConfigIssue(loc, _plain(e)))
    return out


def from_dict(raw: Mapping[str, Any], *, strict: bool = True) -> RunConfig:
    """A RunConfig from nested tables (a TOML file, a saved config.json); every problem at once.

    Raises :class:`ConfigError` whose issues name ``section.key``.
    """
    raw = dict(raw)
    version = raw.pop("version", CONFIG_VERSION)
    if version != CONFIG_VERSION:
        raise ConfigError("version", f"configuration version {version!r}; this secfed reads version {CONFIG_VERSION}")
    issues: list[ConfigIssue] = []
    sections: dict[str, Any] = {}
    for name, value in raw.items():
        if name not in SECTIONS:
            issues.append(ConfigIssue(name, f"unknown table; known: {', '.join(SECTIONS)}"))
        elif not isinstance(value, Mapping):
            issues.append(ConfigIssue(name, f"must be a table, got {type(value).__name__}"))
        else:
            try:
                sections[name] = SECTIONS[name].model_validate(dict(value), strict=strict)
            except ValidationError as exc:
                issues += _issues_of(exc, (name,))
    if issues:
        raise ConfigError(issues)
    return RunConfig(**sections)


MAX_TOML_BYTES = 1 << 20  # a settings file is a few KB


class TomlUnreadable(ValueError):
    """A TOML file that cannot be read or parsed; the message says why (the caller names the file)."""


def read_toml(path: Path) -> dict[str, Any]:
    """The table a small TOML file holds. Checked before it is read (found by review: /dev/zero grew until
    the kernel stopped it, a 2 GB sparse file took 7 GB and 52 s, a FIFO hung, and 500 nested arrays
    ended in a RecursionError traceback)."""
    try:
        st = Path(path).stat()
        if not stat.S_ISREG(st.st_mode):
            raise TomlUnreadable("not a regular file")
        if st.st_size > MAX_TOML_BYTES:
            raise TomlUnreadable(f"{st.st_size:,} bytes: larger than any settings file ({MAX_TOML_BYTES:,} at most)")
        with open(path, "rb") as f:
            data = f.read(MAX_TOML_BYTES + 1)  # it may have grown since
        if len(data) > MAX_TOML_BYTES:
            raise TomlUnreadable(f"larger than any settings file ({MAX_TOML_BYTES:,} bytes at most)")
        return tomllib.loads(data.decode("utf-8-sig"))  # a BOM (as Notepad writes it) is not a setting (review)
    except TomlUnreadable:
        raise
    except FileNotFoundError:
        raise TomlUnreadable("no such file") from None
    except (OSError, UnicodeDecodeError, ValueError) as exc:  # ValueError: a NUL in the path
        what = "is not valid TOML" if isinstance(exc, tomllib.TOMLDecodeError) else "cannot be read"
        raise TomlUnreadable(f"{what}: {exc}") from None
    except RecursionError:
        raise TomlUnreadable("is not valid TOML: nested too deeply") from None


def load_toml(path: Path) -> RunConfig:
    """The configuration a TOML file describes (missing tables and keys keep their defaults)."""
    try:
        raw = read_toml(path)
    except TomlUnreadable as exc:
        raise ConfigError(str(path), str(exc)) from None
    try:
        return from_dict(raw)
    except RecursionError:  # a value nested past what validation recurses into
        raise ConfigError(str(path), "a value is nested too deeply") from None


def parse_value(key: str, raw: Any) -> Any:
    """A value typed as text (a flag's argument) converted to ``key``'s type, or ValueError saying why.

    Lists are comma-separated; numbers are parsed as numbers ("three" is refused, "2.7" for an
    integer is refused), the range is checked when the whole configuration is.
    """
    spec = KEYS[key]
    if spec.is_list:
        items = raw if isinstance(raw, (list, tuple)) else [raw]
        return [part.strip() for item in items for part in str(item).split(",") if part.strip()]
    if spec.is_flag or not isinstance(raw, str):
        return raw
    try:
        return TypeAdapter(spec.annotation).validate_python(raw.strip())
    except ValidationError as exc:
        raise ValueError(_plain({k: v for k, v in exc.errors()[0].items() if k != "input"})) from None


def with_overrides(cfg: RunConfig, values: Mapping[str, Any]) -> RunConfig:
    """A copy of ``cfg`` with ``{"schedule.rounds": "3", ...}`` applied (text converted), every problem
    at once: values that do not parse, and values out of range."""
    issues: list[ConfigIssue] = []
    tables = cfg.model_dump()
    for key, raw in values.items():
        if key not in KEYS:
            issues.append(ConfigIssue(key, "unknown setting"))
            continue
        try:
            value = parse_value(key, raw)
        except ValueError as exc:
            issues.append(ConfigIssue(key, f"{exc} (got {raw!r})"))
            continue
        section, name = key.split(".")
        tables[section][name] = value
    try:
        result = from_dict(tables)
    except ConfigError as exc:
        issues += exc.issues
    if issues:
        raise ConfigError(issues)
    return result


def schema_issues(cfg: RunConfig) -> Iterable[ConfigIssue]:
    """The rules that span settings of the schema alone (no method, no privacy plan): data, model,
    secure aggregation, run. :func:`secfed.validation.check` adds the methods' and the privacy rules."""
    d, m, meth, s, sa = cfg.data, cfg.model, cfg.method, cfg.schedule, cfg.secagg
    if m.bn_stats == "local" and d.scenario != "by-dataset":
        yield ConfigIssue("model.bn_stats", "local BatchNorm statistics need `data.scenario` by-dataset "
                          "(each evaluated domain must belong to exactly one client)")
    if d.scenario == "by-identity" and d.num_clients < 2:
        yield ConfigIssue("data.num_clients", "by-identity splits one dataset's ids among clients: give at least 2")
    if d.scenario != "by-identity" and d.num_clients:
        yield ConfigIssue("data.num_clients", f"only applies to `data.scenario` by-identity, not {d.scenario}")
    if s.batch_size < 2 and not cfg.privacy.dp_sgd:  # (found by review: accepted, then round 1 raised in torch)
        yield ConfigIssue("schedule.batch_size", "BatchNorm needs two images or more in a batch (DP-SGD's GroupNorm "
                          "does not)")
    if sa.dropout_rate > 0 and not sa.enabled:
        yield ConfigIssue("secagg.dropout_rate", "simulates clients vanishing during secure aggregation; "
                          "turn `secagg.enabled` on")
    if sa.authenticated and cfg.privacy.dp_beta_mode == "double" and sa.enabled:
        yield ConfigIssue("privacy.dp_beta_mode", "double gives every client a differently noised model, which the "
                          "authenticated model-consistency check rejects (as it must); use single or "
                          "turn `secagg.authenticated` off")
    if d.root is None:
        for key in ("test_datasets",):
            if getattr(d, key):
                yield ConfigIssue(f"data.{key}", "names folders under `data.root`; the synthetic default uses "
                                  "`data.synth_unseen`")
        if d.split_file is not None:
            yield ConfigIssue("data.split_file", "the synthetic default ships its own splits")
    elif d.synth_unseen or d.synth_domains != SYNTH_DEFAULT_DOMAINS or d.synth_scale != 1.0:
        key = "data.synth_unseen" if d.synth_unseen else ("data.synth_domains" if d.synth_domains !=
                                                           SYNTH_DEFAULT_DOMAINS else "data.synth_scale")
        yield ConfigIssue(key, "applies to the synthetic default; `data.root` reads datasets from disk")
    if d.synth_domains + d.synth_unseen > SYNTH_DOMAINS_RANGE[1]:
        yield ConfigIssue("data.synth_unseen", f"the generator has {SYNTH_DOMAINS_RANGE[1]} domains: "
                          f"`data.synth_domains` + `data.synth_unseen` must be ≤ {SYNTH_DOMAINS_RANGE[1]}")
    for key in ("datasets", "test_datasets", "leave_out"):
        names = [entry.partition(":")[0] for entry in getattr(d, key)]
        if repeated := sorted({n for n in names if names.count(n) > 1}):
            yield ConfigIssue(f"data.{key}", f"names {', '.join(map(repr, repeated))} more than once")
    for key in ("kd_public", "kd_epochs", "kd_lr", "kd_images"):  # (review: ignored without a word)
        if not meth.kd and getattr(meth, key) != MethodConfig.model_fields[key].default:
            yield ConfigIssue(f"method.{key}", "has no effect without `method.kd`", unused=True)
    if meth.kd_images == 1:  # (review: a traceback from the distiller)
        yield ConfigIssue("method.kd_images", "distillation needs at least 2 public images (0: all of them)")
    if meth.cdw and meth.aggregation == "unweighted":
        yield ConfigIssue("method.cdw", "cosine distance weights are aggregation weights; `method.aggregation` "
                          "unweighted contradicts them")
    if cfg.run.device != "auto" and not re.fullmatch(r"cpu|cuda(:\d+)?|mps", cfg.run.device):
        yield ConfigIssue("run.device", f"{cfg.run.device!r} is not a device: auto, cpu, cuda, cuda:N")


def settings_table() -> str:
    """Every setting as a Markdown table: TOML key, flag, default, what it does (the README's table)."""
    rows = ["| TOML key | flag | default | what it sets |", "|---|---|---|---|"]
    for key in KEYS.values():
        default = key.default
        shown = "–" if default in (None, []) else (str(default).lower() if isinstance(default, bool) else str(default))
        flag = f"`{key.flag}`" + (f" / `--no-{key.flag[2:]}`" if key.is_flag or key.flag_value else "")
        rows.append(f"| `{key.dotted}` | {flag} | {shown} | {key.help.replace('|', '/')} |")
    return "\n".join(rows)
