"""From a RunConfig to a ready federation: datasets, sites with their shards in memory, the method,
the server side, the client sides, the channel and the evaluation domains.

Everything here happens once per run (and again on ``--resume`` or ``evaluate``, deterministically):
the round loop in :mod:`secfed.federation.runtime` only moves messages.
"""

from __future__ import annotations

import copy
import hashlib
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from secfed.algorithms import Method, Site, base_method, with_options
from secfed.config import ConfigError, RunConfig, check
from secfed.data.images import load_images
from secfed.data.registry import FORMATS, guess_format, load_dataset
from secfed.data.splits import ClientShard, by_camera, by_dataset, by_identity
from secfed.data.synth import DEFAULT_PUBLIC_IMAGES, SynthManifest, cached
from secfed.data.types import ReidDataset, Sample
from secfed.federation.channel import Channel, PlainChannel
from secfed.federation.client import ClientSide
from secfed.federation.secure_channel import RING_BITS, SecureChannel
from secfed.federation.server import ServerSide
from secfed.models import pretrain
from secfed.models.sharing import SharedLayout
from secfed.privacy.accountant import SampledGaussianAccountant
from secfed.privacy.dfs import dfs_settings
from secfed.privacy.dpsgd import ClientDpSgd, dp_compatible
from secfed.privacy.noise import NoiseSource
from secfed.privacy.policy import DESIGN_DROPOUT, DpSgdPlan, PrivacyPlan, resolve
from secfed.privacy.round import ClientPrivacy, ServerPrivacy
from secfed.seeding import derive_seed

SYNTH_IMAGE_SIZE = (128, 64)  # the synthetic default is written at this size, then resized to the input
SPLIT_FILE = "splits.json"  # seeded splits of the small sets, kept in the run directory by default


def cache_dir() -> Path:
    """Where the embedded synthetic default is generated: $SECFED_CACHE, else $XDG_CACHE_HOME/secfed."""
    if env := os.environ.get("SECFED_CACHE"):
        return Path(env)
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "secfed"


@dataclass
class EvalDomain:
    """A query/gallery split in memory, and the clients whose data came from this domain (none for an
    unseen domain: no client trained on it)."""

    name: str
    query: torch.Tensor  # uint8 (Nq, 3, H, W)
    gallery: torch.Tensor
    query_pids: np.ndarray
    query_camids: np.ndarray
    gallery_pids: np.ndarray
    gallery_camids: np.ndarray
    client_ids: tuple[int, ...]

    @property
    def unseen(self) -> bool:
        return not self.client_ids


@dataclass
class Federation:
    config: RunConfig
    method: Method
    layout: SharedLayout
    clients: list[ClientSide]
    server: ServerSide
    channel: Channel
    domains: list[EvalDomain]
    plan: PrivacyPlan
    baselines: dict[int, Site] = field(default_factory=dict)  # local-only training, one per client
    baseline_dp: dict[int, ClientDpSgd] = field(default_factory=dict)
    data_info: dict[str, Any] = field(default_factory=dict)

    @property
    def sites(self) -> list[Site]:
        return [c.site for c in self.clients]


# ---- data ----------------------------------------------------------------------------------------


@dataclass
class RunData:
    trained: list[ReidDataset]
    unseen: list[ReidDataset]
    public: list[Path]  # unlabelled images for knowledge distillation (empty without --kd)
    info: dict[str, Any]


def resolve_data(cfg: RunConfig, *, split_path: Path | None = None, root: Path | None = None,
                 progress: Callable[[str, int, int], None] | None = None) -> RunData:
    """The datasets a run trains on and evaluates as unseen, the public set, and a description of them.

    ``root`` overrides `data.root` (a run directory and its data moved to another place).
    """
    data = cfg.data
    if data.root is None and root is None:
        return _synthetic(cfg, progress)
    base = Path(root if root is not None else data.root).expanduser().resolve()
    if not base.is_dir():
        raise ConfigError("data.root", f"{base} is not a directory")
    entries = _entries_under(base, data.datasets, "data.datasets")
    tests = _entries_under(base, data.test_datasets, "data.test_datasets") if data.test_datasets else []

    def read(name: str, fmt: str) -> ReidDataset:
        return load_dataset(base / name if name else base, fmt, name=name or base.name, seed=data.seed,
                            split_path=split_path)

    trained = [read(n, f) for n, f in entries]
    unseen = [read(n, f) for n, f in tests]
    trained, left_out = _leave_out(cfg, trained)
    public = _public_from(cfg, base)
    info = {"source": "disk", "root": str(base)}
    return RunData(trained, left_out + unseen, public, info)


def _synthetic(cfg: RunConfig, progress: Callable[[str, int, int], None] | None) -> RunData:
    data = cfg.data
    public_images = DEFAULT_PUBLIC_IMAGES if cfg.method.kd and not cfg.method.kd_public else 0
    root, manifest = cached(
        cache_dir(), domains=data.synth_domains, seed=data.seed, scale=data.synth_scale,
        height=SYNTH_IMAGE_SIZE[0], width=SYNTH_IMAGE_SIZE[1], unseen=data.synth_unseen,
        public=public_images, progress=progress,
    )
    names = [d.name for d in manifest.domains]
    chosen = _choose_synthetic(cfg, names)
    trained = [load_dataset(root / n, "market1501", name=n) for n in chosen]
    unseen = [load_dataset(root / d.name, "market1501", name=d.name) for d in manifest.unseen]
    trained, left_out = _leave_out(cfg, trained)
    public = _public_from(cfg, root) if cfg.method.kd_public else (
        _list_images(root / manifest.public.folder) if cfg.method.kd else [])
    info = {"source": "synthetic", "root": str(root), "generator_version": manifest.version, "seed": data.seed}
    return RunData(trained, left_out + unseen, public, info)


def _choose_synthetic(cfg: RunConfig, names: list[str]) -> list[str]:
    """The synthetic domains to train on: `data.datasets` when given; all for by-dataset; for a
    scenario that splits one dataset, the largest domain (the one with the most cameras)."""
    requested = cfg.data.datasets
    if requested:
        unknown = [n for n in requested if n not in names]
        if unknown:
            raise ConfigError("data.datasets", f"no synthetic domain named {', '.join(unknown)}; the default has "
                              f"{', '.join(names)}")
        return list(requested)
    if cfg.data.scenario == "by-dataset":
        return names
    return names[:1]  # PRESETS put the largest, most-camera domain first


def _leave_out(cfg: RunConfig, trained: list[ReidDataset]) -> tuple[list[ReidDataset], list[ReidDataset]]:
    names = {d.name for d in trained}
    unknown = [n for n in cfg.data.leave_out if n not in names]
    if unknown:
        raise ConfigError("data.leave_out", f"{', '.join(unknown)} is not among the training domains "
                          f"({', '.join(sorted(names))})")
    kept = [d for d in trained if d.name not in cfg.data.leave_out]
    return kept, [d for d in trained if d.name in cfg.data.leave_out]


def _public_from(cfg: RunConfig, base: Path) -> list[Path]:
    if not cfg.method.kd:
        return []
    if cfg.method.kd_public is None:
        raise ConfigError("method.kd_public", "knowledge distillation on datasets from disk needs a public set: "
                          "a folder of unlabelled images (e.g. CUHK02)")
    return _list_images(Path(cfg.method.kd_public).expanduser())


def _list_images(folder: Path) -> list[Path]:
    if not folder.is_dir():
        raise ConfigError("method.kd_public", f"{folder} is not a directory")
    images = sorted(p for p in folder.rglob("*") if p.suffix.lower() in (".jpg", ".jpeg", ".png", ".bmp"))
    if len(images) < 2:
        raise ConfigError("method.kd_public", f"{folder} holds {len(images)} images; distillation needs some")
    return images


def _entries_under(root: Path, requested: Sequence[str], key: str) -> list[tuple[str, str]]:
    """(folder, format) pairs: the requested NAME[:FORMAT] folders, a synthetic manifest's domains,
    the root itself when it is one dataset, or every sub-folder whose name implies a format."""
    if requested:
        entries = []
        for entry in requested:
            name, _, fmt = entry.partition(":")
            fmt = fmt or ("market1501" if (root / "manifest.json").is_file() else guess_format(name)) or ""
            if fmt not in FORMATS:
                raise ConfigError(key, f"{entry}: cannot tell the format; write {name}:FORMAT with FORMAT one of "
                                  f"{', '.join(FORMATS)}")
            if not (root / name).is_dir():
                raise ConfigError(key, f"{root / name} is not a directory")
            entries.append((name, fmt))
        return entries
    if (root / "manifest.json").is_file():
        return [(d.name, "market1501") for d in SynthManifest.load(root).domains]
    if fmt := guess_format(root.name):
        return [("", fmt)]
    found = [(p.name, f) for p in sorted(root.iterdir()) if p.is_dir() and (f := guess_format(p.name))]
    if not found:
        raise ConfigError(key, f"no dataset folder with a known name under {root}; name them NAME:FORMAT")
    return found


def fingerprint(datasets: Sequence[ReidDataset], root: Path) -> str:
    """SHA-256 over the relative path and size of every image a run reads: the same data, wherever it lives."""
    h = hashlib.sha256()
    for d in datasets:
        h.update(d.name.encode() + b"\0")
        for part in (d.train, d.query, d.gallery):
            for s in part:
                try:
                    rel = s.path.resolve().relative_to(root)
                except ValueError:
                    rel = s.path
                h.update(f"{rel.as_posix()}|{s.path.stat().st_size}|{s.pid}|{s.camid}\n".encode())
    return h.hexdigest()


def make_shards(cfg: RunConfig, datasets: list[ReidDataset]) -> tuple[list[ClientShard], list[tuple[ReidDataset, tuple[int, ...]]]]:
    """Client shards per the scenario, and which clients each evaluated dataset belongs to."""
    scenario = cfg.data.scenario
    if scenario == "by-dataset":
        if len(datasets) < 2:
            raise ConfigError("data.scenario", "by-dataset needs at least two training datasets (one client each); "
                              f"got {', '.join(d.name for d in datasets) or 'none'}")
        return by_dataset(datasets), [(d, (k,)) for k, d in enumerate(datasets)]
    if len(datasets) != 1:
        raise ConfigError("data.datasets", f"{scenario} splits ONE dataset into clients; {len(datasets)} were "
                          f"given ({', '.join(d.name for d in datasets)}): name one")
    dataset = datasets[0]
    try:
        if scenario == "by-camera":
            shards = by_camera(dataset)
        else:
            shards = by_identity(dataset, cfg.data.num_clients, derive_seed(cfg.seed, "split"))
    except ValueError as exc:  # more clients than identities, a dataset with no training images
        raise ConfigError("data.num_clients" if scenario == "by-identity" else "data.scenario", str(exc)) from None
    if len(shards) < 2:
        raise ConfigError("data.scenario", f"{scenario} of {dataset.name} yields {len(shards)} client(s); need 2 or more")
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


# ---- the federation ------------------------------------------------------------------------------


def build(
    cfg: RunConfig,
    progress: Callable[[str, int, int], None] | None = None,
    *,
    run_dir: Path | None = None,
    data_root: Path | None = None,
    train_images: bool = True,
) -> Federation:
    """Read data, split it, and create the sites (with their initial models), server and channel.

    ``run_dir`` keeps drawn dataset splits (unless `data.split_file` says where); ``data_root``
    overrides `data.root` for moved data. ``train_images=False`` skips decoding the clients'
    training images (evaluation only needs the models and the query/gallery sets)."""
    check(cfg)
    pretrain.require(cfg.model.pretrained, cfg.model.backbone, cfg.data.height, cfg.data.width)  # before any data
    split_path = Path(cfg.data.split_file) if cfg.data.split_file else (run_dir / SPLIT_FILE if run_dir else None)
    data = resolve_data(cfg, split_path=split_path, root=data_root, progress=progress)
    shards, evaluated = make_shards(cfg, data.trained)
    h, w = cfg.data.height, cfg.data.width
    device = resolve_device(cfg.run.device)
    method = base_method(cfg)

    # One initial model for everyone: the server's w^0. Each site adds its own head (FedPav) or
    # shares one over the union of identities (FedAvg). DP-SGD swaps BatchNorm for GroupNorm in
    # every model (Opacus' rule), so it happens here, once, before anything is copied.
    torch.manual_seed(derive_seed(cfg.seed, "init"))
    initial = method.build_model(shards[0].num_global_classes)
    if cfg.privacy.dp_sgd:
        initial = dp_compatible(initial)
    layout = method.layout(initial)
    public = load_images(data.public, h, w) if data.public else None
    if cfg.method.kd_images and public is not None:
        public = public[: cfg.method.kd_images]
    method = with_options(method, cfg, public_images=public, server_model=initial.to(device), layout=layout)

    num_clients = len(shards)
    channel: Channel = SecureChannel.for_run(cfg, num_clients) if cfg.secagg.enabled else PlainChannel()
    extra_uploads = ["KD soft labels (features on the public set)"] if cfg.method.kd else []
    plan = resolve(
        cfg.privacy, num_clients=num_clients, clients_per_round=cfg.schedule.clients_per_round,
        rounds=cfg.schedule.rounds, aggregation="weighted" if cfg.method.aggregation == "weighted" else "unweighted",
        secagg=cfg.secagg.enabled, bn_stats=cfg.model.bn_stats, extra_uploads=extra_uploads, model_dim=layout.size,
        quantiser_scale=channel.scale if isinstance(channel, SecureChannel) else None, ring_bits=RING_BITS,
        design_dropout=max(DESIGN_DROPOUT, cfg.secagg.dropout_rate), dfs=dfs_settings(cfg),
    )
    if cfg.schedule.clients_per_round > num_clients:
        raise ConfigError("schedule.clients_per_round", f"{cfg.schedule.clients_per_round} > the {num_clients} clients")

    total_examples = sum(len(s) for s in shards)
    weight_scale = 1.0 / total_examples
    reproducible = cfg.privacy.reproducible_noise
    clients: list[ClientSide] = []
    baselines: dict[int, Site] = {}
    baseline_dp: dict[int, ClientDpSgd] = {}
    for k, shard in enumerate(shards):
        model = copy.deepcopy(initial)
        if not method.uses_global_labels:
            torch.manual_seed(derive_seed(cfg.seed, "classifier", k))
            method.new_head(model, shard.num_classes)
        model = model.to(device)
        labels = shard.global_labels if method.uses_global_labels else shard.labels
        images = load_images(shard.samples, h, w) if train_images else torch.empty((0, 3, h, w), dtype=torch.uint8)
        site = Site(k, shard.name, images.to(device), torch.tensor(labels, dtype=torch.int64, device=device),
                    model, weight_scale)
        method.setup_site(site)
        noise = NoiseSource(derive_seed(cfg.seed, "client-noise", k), reproducible=reproducible)
        dp = client_dp_sgd(plan.dp_sgd, cfg, len(shard), noise) if plan.dp_sgd is not None else None
        clients.append(ClientSide(site, method, layout, ClientPrivacy(plan, cfg.seed, noise),
                                  hash_models=channel.needs_model_hash, dp_sgd=dp))
        if cfg.run.local_baseline:
            alone = Site(k, shard.name, site.images, site.labels, copy.deepcopy(model), weight_scale)
            method.setup_site(alone)
            baselines[k] = alone
            if plan.dp_sgd is not None:
                baseline_dp[k] = client_dp_sgd(plan.dp_sgd, cfg, len(shard), noise)

    server = ServerSide(
        method=method, layout=layout, weights=layout.flatten(initial.state_dict()).cpu(),
        privacy=ServerPrivacy.from_plan(plan, layout.trainable_mask(), cfg.seed,
                                        NoiseSource(derive_seed(cfg.seed, "server-noise"), reproducible=reproducible)),
        enrolled={k: len(s) for k, s in enumerate(shards)}, weight_scale=weight_scale,
    )
    domains = [_eval_domain(d, ids, h, w) for d, ids in evaluated]
    domains += [_eval_domain(d, (), h, w) for d in data.unseen]
    info = dict(data.info)
    info["datasets"] = [_describe(d) for d in data.trained]
    info["unseen"] = [_describe(d) for d in data.unseen]
    info["public_images"] = len(data.public)
    info["fingerprint"] = fingerprint([*data.trained, *data.unseen], Path(info["root"]))
    info["clients"] = [{"id": k, "name": s.name, "images": len(s), "classes": s.num_classes} for k, s in enumerate(shards)]
    info["privacy"] = plan.to_dict()
    info["pretrained"] = pretrain.describe_initial(
        cfg.model.pretrained, pretrain.default_recipe(cfg.model.backbone, h, w), initial)
    return Federation(cfg, method, layout, clients, server, channel, domains, plan, baselines, baseline_dp, info)


def _describe(d: ReidDataset) -> dict[str, Any]:
    return {"name": d.name, "train_images": len(d.train), "train_ids": d.num_train_pids, "query": len(d.query),
            "gallery": len(d.gallery), "skipped": d.skipped}


def resolve_device(name: str) -> torch.device:
    """``auto``: the first CUDA GPU when there is one, else the CPU. Models and each client's images
    live there; the server's weights, the channel and checkpoints stay on the CPU."""
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        device = torch.device(name)
    except RuntimeError as exc:
        raise ConfigError("run.device", f"{name!r} is not a torch device ({exc})") from None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError("run.device", f"{name} was asked for, but torch sees no CUDA GPU")
        # Reproducible convolutions (resumed runs then agree; a few CUDA kernels, e.g. adaptive
        # average pooling's backward, stay nondeterministic: see the README).
        torch.backends.cudnn.deterministic = True
        torch.backends.cudnn.benchmark = False
    return device


def client_dp_sgd(dp: DpSgdPlan, cfg: RunConfig, num_examples: int, noise: NoiseSource) -> ClientDpSgd:
    """A client's DP-SGD state: its noise multiplier (fixed or calibrated to its size), accountant, noise."""
    s = cfg.schedule
    z = dp.noise_multiplier_for(num_examples=num_examples, batch_size=s.batch_size, local_epochs=s.local_epochs,
                                rounds=s.rounds)
    return ClientDpSgd(z, dp.max_grad_norm, dp.delta_for(num_examples), SampledGaussianAccountant(), noise)
