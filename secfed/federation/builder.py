"""From a RunConfig to a ready federation: datasets, client shards in memory, models, server, channel.

Everything here happens once per run (and again on ``--resume``, deterministically): the round
loop in :mod:`secfed.federation.runtime` only moves weights.
"""

from __future__ import annotations

import copy
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from secfed.algorithms import get_algorithm
from secfed.config import ConfigError, RunConfig
from secfed.data.images import load_images
from secfed.data.registry import FORMATS, guess_format, load_dataset
from secfed.data.splits import ClientShard, by_camera, by_dataset, by_identity
from secfed.data.synth import SynthManifest, cached
from secfed.data.types import ReidDataset, Sample
from secfed.federation.channel import Channel, PlainChannel
from secfed.federation.secure_channel import RING_BITS, SecureChannel
from secfed.federation.client import Client
from secfed.federation.server import Server
from secfed.models.reid import ReIDModel, make_classifier
from secfed.models.sharing import SharedLayout, shared_layout
from secfed.privacy.accountant import SampledGaussianAccountant
from secfed.privacy.dpsgd import ClientDpSgd, dp_compatible
from secfed.privacy.policy import DpSgdPlan, PrivacyPlan
from secfed.privacy.policy import resolve as resolve_privacy
from secfed.privacy.round import RoundPrivacy
from secfed.seeding import derive_seed

SYNTH_IMAGE_SIZE = (128, 64)  # the synthetic default is written at this size, then resized to the input


def cache_dir() -> Path:
    """Where the embedded synthetic default is generated: $SECFED_CACHE, else $XDG_CACHE_HOME/secfed."""
    if env := os.environ.get("SECFED_CACHE"):
        return Path(env)
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "secfed"


@dataclass
class EvalDomain:
    """A query/gallery split in memory, and the clients whose data came from this domain."""

    name: str
    query: torch.Tensor  # uint8 (Nq, 3, H, W)
    gallery: torch.Tensor
    query_pids: np.ndarray
    query_camids: np.ndarray
    gallery_pids: np.ndarray
    gallery_camids: np.ndarray
    client_ids: tuple[int, ...]


@dataclass
class Federation:
    config: RunConfig
    algorithm: type
    layout: SharedLayout
    clients: list[Client]
    server: Server
    channel: Channel
    domains: list[EvalDomain]
    privacy: RoundPrivacy
    baselines: dict[int, ReIDModel] = field(default_factory=dict)  # local-training baseline per client
    dp_sgd: dict[str, ClientDpSgd] = field(default_factory=dict)  # "fed/<id>", "local/<id>" → DP-SGD state
    data_info: dict[str, Any] = field(default_factory=dict)


def _parse_dataset_arg(entry: str) -> tuple[str, str | None]:
    name, _, fmt = entry.partition(":")
    return name, (fmt or None)


def resolve_datasets(cfg: RunConfig, progress: Callable[[str, int, int], None] | None = None) -> tuple[list[ReidDataset], dict[str, Any]]:
    """The datasets a run trains and evaluates on, and a description of them for the run directory."""
    data = cfg.data
    if data.root is None:
        root, manifest = cached(
            cache_dir(), domains=data.synth_domains, seed=data.seed, scale=data.synth_scale,
            height=SYNTH_IMAGE_SIZE[0], width=SYNTH_IMAGE_SIZE[1], progress=progress,
        )
        entries = [(d.name, "market1501") for d in manifest.domains]
        info = {"source": "synthetic", "root": str(root), "generator_version": manifest.version, "seed": data.seed}
    else:
        root = Path(data.root).expanduser()
        if not root.is_dir():
            raise ConfigError("--data-root", f"{root} is not a directory")
        entries = _entries_under(root, data.datasets)
        info = {"source": "disk", "root": str(root)}
    datasets = []
    for name, fmt in entries:
        path = root / name if name else root
        datasets.append(load_dataset(path, fmt, name=name or root.name, seed=data.seed))
    info["datasets"] = [
        {"name": d.name, "train_images": len(d.train), "train_ids": d.num_train_pids,
         "query": len(d.query), "gallery": len(d.gallery), "skipped": d.skipped}
        for d in datasets
    ]
    return datasets, info


def _entries_under(root: Path, requested: list[str]) -> list[tuple[str, str]]:
    """(folder, format) pairs: the requested NAME[:FORMAT] folders, a synthetic manifest's domains,
    the root itself when it is one dataset, or every sub-folder whose name implies a format."""
    if requested:
        entries = []
        for entry in requested:
            name, fmt = _parse_dataset_arg(entry)
            fmt = fmt or _format_of(root, name)
            if fmt not in FORMATS:
                raise ConfigError("--datasets", f"{entry}: unknown format {fmt!r}; known: {', '.join(FORMATS)}")
            if not (root / name).is_dir():
                raise ConfigError("--datasets", f"{root / name} is not a directory")
            entries.append((name, fmt))
        return entries
    if (root / "manifest.json").is_file():
        return [(d.name, "market1501") for d in SynthManifest.load(root).domains]
    if fmt := guess_format(root.name):
        return [("", fmt)]
    found = [(p.name, f) for p in sorted(root.iterdir()) if p.is_dir() and (f := guess_format(p.name))]
    if not found:
        raise ConfigError(
            "--datasets", f"no dataset folder with a known name under {root}; name them with --datasets NAME:FORMAT"
        )
    return found


def _format_of(root: Path, name: str) -> str:
    if (root / "manifest.json").is_file():
        return "market1501"
    fmt = guess_format(name)
    if fmt is None:
        raise ConfigError("--datasets", f"cannot tell the format of {name!r} from its name; write {name}:FORMAT")
    return fmt


def make_shards(cfg: RunConfig, datasets: list[ReidDataset]) -> tuple[list[ClientShard], list[tuple[ReidDataset, tuple[int, ...]]]]:
    """Client shards per the scenario, and which clients each evaluated dataset belongs to."""
    scenario = cfg.data.scenario
    if scenario == "by-dataset":
        if len(datasets) < 2:
            raise ConfigError("--scenario", "by-dataset needs at least two datasets (one client each)")
        shards = by_dataset(datasets)
        return shards, [(d, (k,)) for k, d in enumerate(datasets)]
    if len(datasets) != 1:
        raise ConfigError("--datasets", f"--scenario {scenario} splits ONE dataset; {len(datasets)} were given")
    dataset = datasets[0]
    if scenario == "by-camera":
        shards = by_camera(dataset)
    else:
        if cfg.data.num_clients < 2:
            raise ConfigError("--num-clients", "by-identity needs --num-clients of at least 2")
        shards = by_identity(dataset, cfg.data.num_clients, derive_seed(cfg.seed, "split"))
    if len(shards) < 2:
        raise ConfigError("--scenario", f"{scenario} of {dataset.name} yields {len(shards)} client(s); need 2 or more")
    return shards, [(dataset, tuple(range(len(shards))))]


def _eval_domain(dataset: ReidDataset, clients: tuple[int, ...], height: int, width: int) -> EvalDomain:
    def arrays(samples: list[Sample]) -> tuple[np.ndarray, np.ndarray]:
        return np.array([s.pid for s in samples], dtype=np.int64), np.array([s.camid for s in samples], dtype=np.int64)

    qp, qc = arrays(dataset.query)
    gp, gc = arrays(dataset.gallery)
    return EvalDomain(
        dataset.name, load_images(dataset.query, height, width), load_images(dataset.gallery, height, width),
        qp, qc, gp, gc, clients,
    )


def build_model(cfg: RunConfig, num_classes: int) -> ReIDModel:
    m = cfg.model
    return ReIDModel(m.backbone, num_classes, pretrained=m.pretrained, neck_dim=m.neck_dim, dropout=m.dropout)


def build(
    cfg: RunConfig,
    progress: Callable[[str, int, int], None] | None = None,
    *,
    train_images: bool = True,
) -> Federation:
    """Read data, split it, and create clients (with their initial models), server and channel.

    ``train_images=False`` skips decoding the clients' training images (evaluation only needs the
    models and the query/gallery sets)."""
    validate(cfg)
    algorithm = get_algorithm(cfg.train.algorithm)
    datasets, info = resolve_datasets(cfg, progress)
    shards, evaluated = make_shards(cfg, datasets)
    h, w = cfg.data.height, cfg.data.width
    device = resolve_device(cfg.device)

    # One initial model for everyone: the server's w^0. Each client adds its own classifier
    # (FedPav) or shares one over the union of identities (FedAvg). DP-SGD swaps BatchNorm for
    # GroupNorm in every model (Opacus' rule), so it happens here, once, before anything is copied.
    torch.manual_seed(derive_seed(cfg.seed, "init"))
    num_global = shards[0].num_global_classes
    initial = build_model(cfg, num_global)
    if cfg.privacy.dp_sgd:
        initial = dp_compatible(initial)
    layout = shared_layout(initial, algorithm.shares_classifier, cfg.model.bn_stats)
    plan = resolve_privacy(
        cfg.privacy, num_clients=len(shards), clients_per_round=cfg.train.clients_per_round,
        rounds=cfg.train.rounds, aggregation=cfg.train.aggregation, secagg=cfg.secagg.enabled,
        bn_stats=cfg.model.bn_stats, model_dim=layout.size, ring_bits=RING_BITS,
    )
    channel = make_channel(cfg, layout, plan, num_clients=len(shards))
    if cfg.secagg.enabled and plan.skellam is None:
        plan = plan.for_quantised_channel(scale=channel.scale, dim=layout.size)
    privacy = RoundPrivacy.from_plan(plan, layout.trainable_mask(), cfg.seed)

    clients: list[Client] = []
    baselines: dict[int, ReIDModel] = {}
    dp_sgd: dict[str, ClientDpSgd] = {}
    for k, shard in enumerate(shards):
        model = copy.deepcopy(initial)
        if not algorithm.uses_global_labels:
            torch.manual_seed(derive_seed(cfg.seed, "classifier", k))
            model.classifier = make_classifier(model.feature_dim, shard.num_classes)
        model = model.to(device)
        labels = shard.global_labels if algorithm.uses_global_labels else shard.labels
        images = load_images(shard.samples, h, w) if train_images else torch.empty((0, 3, h, w), dtype=torch.uint8)
        clients.append(Client(
            id=k, name=shard.name, images=images.to(device),
            labels=torch.tensor(labels, dtype=torch.int64, device=device), model=model, layout=layout,
            algorithm=algorithm,
        ))
        if cfg.train.local_baseline:
            baselines[k] = copy.deepcopy(model)
        if plan.dp_sgd is not None:
            for role in ("fed", "local") if cfg.train.local_baseline else ("fed",):
                dp_sgd[f"{role}/{k}"] = client_dp_sgd(plan.dp_sgd, cfg, len(shard))

    if cfg.train.clients_per_round > len(clients):
        raise ConfigError("--clients-per-round", f"{cfg.train.clients_per_round} > the {len(clients)} clients")
    total_examples = sum(len(shard) for shard in shards)
    server = Server(
        layout=layout,
        weights=layout.flatten(initial.state_dict()),
        server_rule=algorithm.server_rule,
        aggregation_weight=algorithm.aggregation_weight,
        weight_scale=1.0 / total_examples,
        enrolled={k: len(shard) for k, shard in enumerate(shards)},
        weighted=cfg.train.aggregation == "weighted",
        privacy=privacy,
    )
    domains = [_eval_domain(d, ids, h, w) for d, ids in evaluated if d.query and d.gallery]
    info["clients"] = [{"id": k, "name": s.name, "images": len(s), "classes": s.num_classes}
                       for k, s in enumerate(shards)]
    info["privacy"] = plan.to_dict()
    return Federation(cfg, algorithm, layout, clients, server, channel, domains, privacy, baselines, dp_sgd, info)


def resolve_device(name: str) -> torch.device:
    """``auto``: the first CUDA GPU when there is one, else the CPU. Models and each client's images
    live there; the server's weights, the channel and checkpoints stay on the CPU."""
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        device = torch.device(name)
    except RuntimeError as exc:
        raise ConfigError("--device", f"{name!r} is not a torch device ({exc})") from None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError("--device", f"{name} was asked for, but torch sees no CUDA GPU")
        # Reproducible convolutions (resumed runs then agree; a few CUDA kernels, e.g. adaptive
        # average pooling's backward, stay nondeterministic: see the README).
        torch.backends.cudnn.deterministic = True
        torch.backends.cudnn.benchmark = False
    return device


def client_dp_sgd(dp: DpSgdPlan, cfg: RunConfig, num_examples: int) -> ClientDpSgd:
    """A client's DP-SGD state: its noise multiplier (fixed or calibrated to its size) and accountant."""
    t = cfg.train
    z = dp.noise_multiplier_for(num_examples=num_examples, batch_size=t.batch_size, local_epochs=t.local_epochs,
                                rounds=t.rounds)
    return ClientDpSgd(z, dp.max_grad_norm, dp.delta_for(num_examples), SampledGaussianAccountant())


def make_channel(cfg: RunConfig, layout: SharedLayout, plan: PrivacyPlan, num_clients: int) -> Channel:
    """Plain sums, or secure aggregation (with the plan's distributed noise when it has one)."""
    if not cfg.secagg.enabled:
        return PlainChannel()
    return SecureChannel.for_run(cfg, layout.size, num_clients, plan.skellam)


def validate(cfg: RunConfig) -> None:
    """Checks that span settings; each names the flag to change."""
    t, d, m = cfg.train, cfg.data, cfg.model
    positive = {"--rounds": t.rounds, "--local-epochs": t.local_epochs, "--batch-size": t.batch_size,
                "--lr-step": t.resolved_lr_step, "--height": d.height, "--width": d.width}
    for flag, value in positive.items():
        if value < 1:
            raise ConfigError(flag, f"must be at least 1, got {value}")
    if t.clients_per_round < 0:
        raise ConfigError("--clients-per-round", f"must be 0 (all) or positive, got {t.clients_per_round}")
    if t.eval_every < 0:
        raise ConfigError("--eval-every", f"must be 0 (last round only) or positive, got {t.eval_every}")
    if m.bn_stats == "local" and d.scenario != "by-dataset":
        raise ConfigError("--bn-stats", "local BatchNorm statistics need --scenario by-dataset "
                          "(each evaluated domain must belong to exactly one client)")
    if not 0.0 <= cfg.secagg.dropout_rate < 1.0:
        raise ConfigError("--dropout-rate", f"must be in [0, 1), got {cfg.secagg.dropout_rate}")
    if cfg.secagg.authenticated and not cfg.secagg.enabled:
        raise ConfigError("--authenticated", "is a mode of secure aggregation; drop --no-secagg")
    if cfg.secagg.authenticated and cfg.privacy.dp_beta_mode == "double":
        raise ConfigError("--dp-beta-mode", "double gives every client a differently noised model, which the "
                          "--authenticated model-consistency check rejects (as it must); use single")
    if not cfg.secagg.clip >= 1:
        raise ConfigError("--secagg-clip", f"must be at least 1 (aggregation weights in (0, 1] travel in the same "
                          f"clipped vector), got {cfg.secagg.clip}")
