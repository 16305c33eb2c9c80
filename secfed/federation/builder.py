"""From a RunConfig to a ready federation: datasets, sites with their shards in memory, the method,
the server side, the client sides, the channel and the evaluation domains.

Everything here happens once per run (and again on ``--resume`` or ``evaluate``, deterministically):
the round loop in :mod:`secfed.federation.runtime` only moves messages.
"""

from __future__ import annotations

import hashlib
import os
import warnings
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from secfed.algorithms import Method, Site, base_method, with_options
from secfed.config import ConfigError, ConfigIssue, RunConfig
from secfed.data.errors import DataError
from secfed.data.images import MAX_IMAGE_BYTES, load_images
from secfed.data.listing import Resolver
from secfed.data.overlap import shared_pictures
from secfed.data.registry import FORMATS, guess_format, load_dataset
from secfed.data.split_file import inside
from secfed.data.splits import ClientShard, by_camera, by_dataset, by_identity
from secfed.data.synth import DEFAULT_PUBLIC_IMAGES, SynthManifest, cached
from secfed.data.types import UNLABELED, ReidDataset, Sample, check_sample
from secfed.data.unlabeled import load_unlabeled
from secfed.data.usable import matched_queries
from secfed.data.validation import ValidationSplitError, validation_split
from secfed.errors import printable
from secfed.federation.channel import Channel, PlainChannel
from secfed.federation.client import ClientSide
from secfed.federation.secure_channel import RING_BITS, SecureChannel
from secfed.federation.server import ServerSide
from secfed.models import pretrain
from secfed.models.copying import copy_model
from secfed.models.reid import make_classifier
from secfed.models.sharing import SharedLayout
from secfed.privacy.accountant import SampledGaussianAccountant
from secfed.privacy.dfs import dfs_settings
from secfed.privacy.dpsgd import ClientDpSgd, dp_compatible
from secfed.privacy.noise import NoiseSource
from secfed.privacy.policy import DESIGN_DROPOUT, KD_UPLOAD, DpSgdPlan, PrivacyPlan, claims_client_level, resolve
from secfed.privacy.round import ClientPrivacy, ServerPrivacy
from secfed.seeding import derive_seed
from secfed.validation import check

SYNTH_IMAGE_SIZE = (128, 64)  # the synthetic default is written at this size, then resized to the input
SPLIT_FILE = "splits.json"
BACKBONE_KEY = "pretrained_sha256"  # census: the synthetic backbone's SHA-256 a site's models start from
LOCAL_INFO = ("root", "fingerprint_links_resolved")  # data.json's entries of one machine's layout, not the data's
ImageLoader = Callable[[Sequence[Sample], int, int], torch.Tensor]  # samples, height, width → uint8 (N, 3, H, W)  # seeded splits of the small sets, kept in the run directory by default


def cache_dir() -> Path:
    """Where the embedded synthetic default is generated: $SECFED_CACHE, else $XDG_CACHE_HOME/secfed."""
    if env := os.environ.get("SECFED_CACHE"):
        try:
            return Path(env).expanduser()  # "~/c" is the home folder's (found by review: ./~/c)
        except RuntimeError as exc:
            raise ConfigError("SECFED_CACHE", f"{env}: {exc}") from None
    # an empty or relative XDG_CACHE_HOME counts as unset, as the XDG spec says (found by review: ./secfed)
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    return (Path(xdg) if os.path.isabs(xdg) else Path.home() / ".cache") / "secfed"


def _split_file(named: str) -> Path:
    try:
        return Path(named).expanduser()
    except RuntimeError as exc:  # ~user of nobody (found by review: a traceback)
        raise ConfigError("data.split_file", f"{named}: {exc}") from None


@dataclass
class DomainInfo:
    """An evaluation domain by name, and the clients whose data came from it (none for an unseen
    domain: no client trained on it). What the server knows of a domain."""

    name: str
    client_ids: tuple[int, ...]

    @property
    def unseen(self) -> bool:
        return not self.client_ids


@dataclass
class EvalDomain(DomainInfo):
    """A domain's query/gallery split in memory (held where the data lives)."""

    query: torch.Tensor = field(default_factory=lambda: torch.empty(0))  # uint8 (Nq, 3, H, W)
    gallery: torch.Tensor = field(default_factory=lambda: torch.empty(0))
    query_pids: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=np.int64))
    query_camids: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=np.int64))
    gallery_pids: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=np.int64))
    gallery_camids: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=np.int64))


@dataclass
class Federation:
    config: RunConfig
    method: Method
    layout: SharedLayout
    clients: list[ClientSide]
    server: ServerSide
    channel: Channel
    domains: list[DomainInfo]  # EvalDomain (with query/gallery) where the data is
    plan: PrivacyPlan
    baselines: dict[int, Site] = field(default_factory=dict)  # local-only training, one per client
    baseline_dp: dict[int, ClientDpSgd] = field(default_factory=dict)
    data_info: dict[str, Any] = field(default_factory=dict)
    census: Census | None = None  # what the server is told of the data (build_from_census)

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
    named = _split_file(data.split_file) if data.split_file is not None else None
    for name, _ in (*entries, *tests):  # any dataset's folder, not only the seeded set's that writes the file
        # (found by review: written into VIPeR/cam_a, then listed as a picture). Only the file one names: a
        # run's own (RUN/splits.json) goes where its --out is, and runs kept there before still open (review)
        if named is not None and inside(named, base / name):
            raise ConfigError("data.split_file", f"{data.split_file} is inside the dataset folder {base / name}: a "
                              "split file is kept outside every dataset folder")

    def read(name: str, fmt: str) -> ReidDataset:
        return load_dataset(base / name if name else base, fmt, name=name or base.name, seed=data.seed,
                            split_path=split_path)

    trained = [read(n, f) for n, f in entries]
    unseen = [read(n, f) for n, f in tests]
    trained, left_out = _leave_out(cfg, trained)
    public = _public_from(cfg, base)
    info = {"source": "disk", "root": str(base)}
    return _validation(cfg, _public_apart(RunData(trained, left_out + unseen, public, info)))


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
    return _validation(cfg, _public_apart(RunData(trained, left_out + unseen, public, info)))


def _public_apart(data: RunData) -> RunData:
    """``data`` once no public image is one of the images a site trains or scores on: the server
    distils on the public set, and its soft labels of a private image would be that image's features
    (found by review: a Flower server pointed `method.kd_public` at a site's training folder)."""
    if not data.public:
        return data

    def identity(path: Path) -> tuple[int, int]:  # the file itself: a link or another spelling is the same
        st = os.stat(path)
        return st.st_dev, st.st_ino

    private = {identity(s.path) for d in (*data.trained, *data.unseen) for s in (*d.train, *d.query, *d.gallery)}
    shared = [p for p in data.public if identity(p) in private]
    if shared:
        raise ConfigError("method.kd_public", f"{len(shared)} of its {len(data.public)} images are images of the "
                          f"datasets the run trains or scores on (e.g. {shared[0]}); the public set must be "
                          "apart from them")
    return data


def _validation(cfg: RunConfig, data: RunData) -> RunData:
    """Under `data.validation`, the training domains scored on held-out training identities and no
    unseen domain scored at all: what a hyper-parameter is chosen on never includes a reported test set."""
    if cfg.data.validation <= 0:
        return data
    try:
        trained = [validation_split(d, cfg.data.validation) for d in data.trained]
    except ValidationSplitError as exc:
        raise ConfigError("data.validation", str(exc)) from exc
    return RunData(trained, [], data.public, {**data.info, "validation": cfg.data.validation})


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
    # as `data inspect --format unlabeled` reads it (found by review: it counted 4 images of 8 trained on):
    # regular files only (a FIFO named *.jpg hung the run, found by review), named in UTF-8 as every
    # dataset's images must be (types.check_sample)
    try:
        images = [s.path for s in load_unlabeled(folder).train]
        for path in images:
            check_sample(Sample(path, UNLABELED, UNLABELED))
    except DataError as exc:
        raise ConfigError("method.kd_public", str(exc)) from None
    if len(images) < 2:
        raise ConfigError("method.kd_public", f"{folder} holds {len(images)} images; distillation needs some")
    return images


def public_fingerprint(images: Sequence[Path]) -> str:
    """SHA-256 over each public image's name below the set's folder and its bytes ("" for none).

    Distillation sums the sites' soft labels image by image, so the server and every Flower node must
    distil on the same images in the same order wherever each keeps them; unlike the datasets'
    :func:`fingerprint` it reads the images themselves (a public set is small, and a changed image
    would silently pair one node's soft label with another image)."""
    if not images:
        return ""
    base = Path(os.path.commonpath(images)) if len(images) > 1 else images[0].parent
    h = hashlib.sha256()
    for path in images:
        try:
            if path.stat().st_size > MAX_IMAGE_BYTES:
                raise ConfigError("method.kd_public", f"{printable(path)}: larger than any image ({MAX_IMAGE_BYTES} "
                                  "bytes at most)")
            content = path.read_bytes()
        except OSError as exc:
            raise ConfigError("method.kd_public", f"cannot read the public image {path}: {exc.strerror or exc}") from None
        h.update(path.relative_to(base).as_posix().encode() + b"\0" + hashlib.sha256(content).digest())
    return h.hexdigest()


def within(root: Path, name: str | Path) -> bool:
    """Whether ``name`` names a place under ``root`` as written — neither absolute elsewhere nor with a
    ``..`` anywhere (the system resolves ``link/..`` against the link's target, so a ``..`` that stays
    inside by spelling may lead out through a link: found by review). Lexical otherwise, on purpose: a
    link inside ``root`` to data kept on another disk is the operator's own layout (whoever names
    ``name`` cannot make links there)."""
    named = Path(name).expanduser()
    if ".." in named.parts:
        return False
    return Path(os.path.normpath(root / named)).is_relative_to(os.path.normpath(root))


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
            if not within(root, name):
                raise ConfigError(key, f"{entry}: a dataset is a folder under `data.root` ({root}), not outside it")
            if not (root / name).is_dir():
                raise ConfigError(key, f"{root / name} is not a directory")
            if FORMATS[fmt].train_only:  # (found by review: it trained, then the first evaluation raised)
                raise ConfigError(key, f"{entry}: a {fmt} folder is a public set with no query or gallery to score, "
                                  f"not a domain; give it to distillation as --kd-public {root / name}")
            entries.append((name, fmt))
        return entries
    if (root / "manifest.json").is_file():
        return [(d.name, "market1501") for d in SynthManifest.load(root).domains]
    if (fmt := guess_format(root.name)) and FORMATS[fmt].train_only:
        raise ConfigError("data.root", f"{root} is a {fmt} public set with no query or gallery to score, not a "
                          f"dataset to train on; give it to distillation as --kd-public {root}")
    if fmt:
        return [("", fmt)]
    # a public set beside the domains (FedReIDBench's data folder holds CUHK02) is not a domain to train and score
    found = [(p.name, f) for p in sorted(root.iterdir())
             if p.is_dir() and (f := guess_format(p.name)) and not FORMATS[f].train_only]
    if not found:
        raise ConfigError(key, f"no dataset folder with a known name under {root}; name them NAME:FORMAT")
    return found


def fingerprint(datasets: Sequence[ReidDataset], root: Path) -> tuple[str, str]:
    """SHA-256 over the relative path and size of every image a run reads: the same data, wherever it
    lives. Two spellings: each path as listed under the root — a dataset folder linked from another
    disk keeps its name (found by review: its target's absolute path differed per node) — and, as
    runs before that recorded it, with links resolved first (a run of then still resumes)."""
    listed, resolved, resolve = hashlib.sha256(), hashlib.sha256(), Resolver()
    for d in datasets:
        for h in (listed, resolved):
            h.update(d.name.encode() + b"\0")
        for part in (d.train, d.query, d.gallery):
            for s in part:
                real = resolve(s.path)
                as_resolved = real.relative_to(root) if real.is_relative_to(root) else s.path
                as_listed = s.path.relative_to(root) if s.path.is_relative_to(root) else as_resolved
                tail = f"|{s.path.stat().st_size}|{s.pid}|{s.camid}\n".encode()
                listed.update(as_listed.as_posix().encode() + tail)
                resolved.update(as_resolved.as_posix().encode() + tail)
    return listed.hexdigest(), resolved.hexdigest()


class SharedPicturesWarning(UserWarning):
    """A saved run's clients trained on the same pictures under an ε (overlap.py): it does not hold for them."""


def asks_for_epsilon(cfg: RunConfig) -> bool:
    """Whether any ε is claimed: client-level, example-level (DP-SGD) or DFH's identity-level DFS one."""
    return claims_client_level(cfg.privacy, ()) or cfg.privacy.dp_sgd or cfg.method.dfs_noise > 0


def check_overlaps(cfg: RunConfig, shards: list[ClientShard], trained: list[ReidDataset],
                   unseen: list[ReidDataset], *, saved: bool, unseen_key: str | None = None) -> None:
    """Refuse (a new run) or warn (``saved``: a run being evaluated or audited) where two clients train on
    the same picture under an ε; refuse a new run whose unseen domain holds pictures a client trains on
    (overlap.py; its own training part too, unused while it is unseen: a trained domain named again).
    ``unseen_key``: the setting that made them unseen (default: `data.leave_out` for a domain it names,
    else `data.test_datasets`)."""
    problems = []
    if asks_for_epsilon(cfg) and (shared := shared_pictures([(s.name, (x.path for x in s.samples)) for s in shards])):
        a, b, path_a, path_b = shared[0]
        problems.append(("data.datasets", f"clients {printable(a)} and {printable(b)} train on the same picture "
                        f"({printable(str(path_a))} and {printable(str(path_b))}; {len(shared)} shared in all), and an "
                        "ε protects one client's contribution (one picture of one client): a person in both is "
                        "protected only over both"))
    if unseen and not saved:  # a saved run's scores are examined as they are (and 72k files cost 4.5 s)
        groups = [(f"train:{i}", (x.path for x in d.train)) for i, d in enumerate(trained)]
        groups += [(f"test:{j}", (x.path for x in (*d.train, *d.query, *d.gallery))) for j, d in enumerate(unseen)]
        pairs = [(int(a[6:]), int(b[5:]), pa, pb) for a, b, pa, pb in shared_pictures(groups)
                 if a.startswith("train:") and b.startswith("test:")]
        crossed = [(trained[i].name, unseen[j].name, pa, pb) for i, j, pa, pb in pairs
                   if trained[i] is not unseen[j]]  # a sweep tests each domain against the others
        if crossed:
            a, b, path_a, path_b = crossed[0]
            same = printable(str(path_b)) + ("" if path_a == path_b else f" is {printable(str(path_a))}")
            key = unseen_key or ("data.leave_out" if b in cfg.data.leave_out else "data.test_datasets")
            problems.append((key, f"unseen domain {printable(b)} holds pictures that {printable(a)}'s client trains "
                             f"on ({same}; {len(crossed)} in all): its scores would not be unseen"))
    if problems and not saved:
        raise ConfigError([ConfigIssue(key, why + ". Keep each picture in one place (a dataset folder linked or "
                                       "copied under two names?)") for key, why in problems])
    for _, why in problems:
        warnings.warn(SharedPicturesWarning(f"{why}: this run's ε does not hold for them"), stacklevel=2)


def make_shards(cfg: RunConfig, datasets: list[ReidDataset]) -> tuple[list[ClientShard], list[tuple[ReidDataset, tuple[int, ...]]]]:
    """Client shards per the scenario, and which clients each evaluated dataset belongs to."""
    scenario = cfg.data.scenario
    if scenario == "by-dataset":
        if len(datasets) < 2:
            raise ConfigError("data.scenario", "by-dataset needs at least two training datasets (one client each); "
                              f"got {', '.join(d.name for d in datasets) or 'none'}")
        return _trainable(by_dataset(datasets), "data.datasets"), [(d, (k,)) for k, d in enumerate(datasets)]
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
    return _trainable(shards, "data.num_clients" if scenario == "by-identity" else "data.scenario"), \
        [(dataset, tuple(range(len(shards))))]


def _trainable(shards: list[ClientShard], key: str) -> list[ClientShard]:
    """``shards`` once each holds two training images at least (a batch of one cannot train BatchNorm;
    found by review: a camera with one training image stopped the run in round 1, its files written)."""
    few = [f"{s.name} ({len(s)})" for s in shards if len(s) < 2]
    if few:
        raise ConfigError(key, f"clients {', '.join(few)} hold fewer than 2 training images; a training batch "
                          "needs 2 — leave their data out or split it otherwise")
    return shards


def _eval_domain(dataset: ReidDataset, clients: tuple[int, ...], height: int, width: int,
                 images: ImageLoader = load_images) -> EvalDomain:
    def arrays(samples: list[Sample]) -> tuple[np.ndarray, np.ndarray]:
        return np.array([s.pid for s in samples], dtype=np.int64), np.array([s.camid for s in samples], dtype=np.int64)

    qp, qc = arrays(dataset.query)
    gp, gc = arrays(dataset.gallery)
    return EvalDomain(dataset.name, clients, query=images(dataset.query, height, width),
                      gallery=images(dataset.gallery, height, width), query_pids=qp, query_camids=qc,
                      gallery_pids=gp, gallery_camids=gc)


# ---- the federation ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Census:
    """What the server must know of the sites' data, and nothing more: ``info`` (data.json: datasets,
    per client its name, image and identity counts, the data fingerprint), the identity count
    over the federation (one shared head under FedAvg) and the evaluation domains by name with the
    clients that trained on each. The Flower ServerApp builds its federation from this (the nodes
    send it), so it never lists or decodes a site's data."""

    info: dict[str, Any]
    global_classes: int
    domains: tuple[tuple[str, tuple[int, ...]], ...]

    def to_dict(self) -> dict[str, Any]:
        return {"info": self.info, "global_classes": self.global_classes,
                "domains": [[name, list(ids)] for name, ids in self.domains]}

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> Census:
        return cls(dict(raw["info"]), int(raw["global_classes"]),
                   tuple((str(name), tuple(int(k) for k in ids)) for name, ids in raw["domains"]))


def build(
    cfg: RunConfig,
    progress: Callable[[str, int, int], None] | None = None,
    *,
    run_dir: Path | None = None,
    data_root: Path | None = None,
    train_images: bool = True,
    eval_images: bool | Callable[[Federation], Collection[str]] = True,
    images: ImageLoader = load_images,
    saved: bool = False,
    resumed: bool = False,
) -> Federation:
    """Read data, split it, and create the sites (with their initial models), server and channel.

    ``run_dir`` keeps drawn dataset splits (unless `data.split_file` says where); ``data_root``
    overrides `data.root` for moved data. ``train_images=False`` skips decoding the clients'
    training images (evaluation only needs the models and the query/gallery sets);
    ``eval_images=False`` skips the query/gallery sets (the domains are then names and owners, as
    the server holds them: a Flower node's train message scores nothing); a function of the federation
    (its domains still names and owners) decodes only the domains it names — a Flower node's, those
    its sites score. ``images`` decodes a list of samples (a Flower node passes one that keeps what it
    decoded). ``saved``: a finished run opened to be evaluated or audited — what a new run is refused
    for (:func:`check_overlaps`) is a warning there, so that the run can still be examined. ``resumed``: the
    configuration is the run's own (a setting it never reads stands, as in a saved one)."""
    check(cfg, saved=saved or resumed)
    pretrain.require(cfg.model.pretrained, cfg.model.backbone, cfg.data.height, cfg.data.width)  # before any data
    split_path = _split_file(cfg.data.split_file) if cfg.data.split_file else (run_dir / SPLIT_FILE if run_dir else None)
    data = resolve_data(cfg, split_path=split_path, root=data_root, progress=progress)
    shards, evaluated = make_shards(cfg, data.trained)
    check_overlaps(cfg, shards, data.trained, data.unseen, saved=saved)
    h, w = cfg.data.height, cfg.data.width
    info = dict(data.info)
    info["datasets"] = [_describe(d) for d in data.trained]
    info["unseen"] = [_describe(d) for d in data.unseen]
    info["public_images"] = len(data.public)
    if data.public:
        info["public_fingerprint"] = public_fingerprint(data.public)
    info["fingerprint"], resolved = fingerprint([*data.trained, *data.unseen], Path(info["root"]))
    if resolved != info["fingerprint"]:  # linked dataset folders: what a run of before recorded
        info["fingerprint_links_resolved"] = resolved
    info["clients"] = [{"id": k, "name": s.name, "images": len(s), "classes": s.num_classes} for k, s in enumerate(shards)]
    census = Census(info, shards[0].num_global_classes,
                    tuple((d.name, ids) for d, ids in evaluated) + tuple((d.name, ()) for d in data.unseen))
    fed = assemble(cfg, census, data.public, shards=shards, train_images=train_images,
                   images=images)
    if started_from := fed.data_info["pretrained"].get("backbone_sha256"):
        # what a Flower node's hello says it starts from: its local heads and baselines start there
        census.info[BACKBONE_KEY] = started_from
    if eval_images:
        wanted = None if eval_images is True else set(eval_images(fed))  # type: ignore[operator]
        fed.domains = [_eval_domain(d, ids, h, w, images) if wanted is None or d.name in wanted else DomainInfo(d.name, ids)
                       for d, ids in [*evaluated, *((d, ()) for d in data.unseen)]]
    return fed


def build_from_census(cfg: RunConfig, census: Census, public: list[Path] | None = None) -> Federation:
    """The server's federation: models, server side, channel and privacy plan from the census alone.

    Its clients hold no images and no labels and its domains no query/gallery (DomainInfo: names and
    owners): the sites train and evaluate where their data lives. The public set KD distils on is the
    server's own (``public``: :func:`server_public`'s), and must be the one the nodes' census describes."""
    check(cfg)
    public = server_public(cfg, None) if public is None else public
    theirs, ours = str(census.info.get("public_fingerprint", "")), public_fingerprint(public)
    if theirs != ours:
        where = f" under {Path(os.path.commonpath(public))}" if len(public) > 1 else ""
        raise ConfigError("method.kd_public", f"the sites' public set ({census.info.get('public_images', 0)} images, "
                          f"fingerprint {theirs[:12] or 'none'}) is not the server's ({len(public)} images{where}, "
                          f"fingerprint {ours[:12] or 'none'}): distillation sums the soft labels image by image, so "
                          "every node's public root must hold the server's images under the same names")
    fed = assemble(cfg, census, public, shards=None, train_images=False)
    theirs, ours = census.info.get(BACKBONE_KEY), fed.data_info["pretrained"].get("backbone_sha256")
    if theirs != ours:  # (found by review: never compared; another CPU's `secfed pretrain` writes other weights)
        raise ConfigError("model.pretrained", f"the sites start from another synthetic backbone "
                          f"({str(theirs)[:12]}) than the server's ({str(ours)[:12]}): copy the server's file "
                          f"{fed.data_info['pretrained'].get('file', '')} into every node's cache")
    return fed


def server_public(cfg: RunConfig, public_root: Path | None) -> list[Path]:
    """The public images the server holds: none without KD; `method.kd_public` (inside ``public_root``
    when given, where a relative name is read; absolute otherwise: the ServerApp's working folder is
    no place to name); else the synthetic default's public folder (generated on this machine, never a
    site's data)."""
    if not cfg.method.kd:
        return []
    if cfg.method.kd_public is not None:
        named = Path(cfg.method.kd_public).expanduser()
        if public_root is not None:
            if not within(public_root, named):
                raise ConfigError("method.kd_public", f"{cfg.method.kd_public!r} lies outside the server's public "
                                  f"root {public_root} (the connection file's public-root)")
            return _list_images(public_root / named)
        if not named.is_absolute():
            raise ConfigError("method.kd_public", f"{cfg.method.kd_public!r} is relative, and the connection file "
                              "names no public-root to read it in: give public-root, or the folder's absolute path")
        return _list_images(named)
    if cfg.data.root is not None:
        return _public_from(cfg, Path("."))  # names the missing public set
    root, manifest = cached(cache_dir(), domains=cfg.data.synth_domains, seed=cfg.data.seed, scale=cfg.data.synth_scale,
                            height=SYNTH_IMAGE_SIZE[0], width=SYNTH_IMAGE_SIZE[1], unseen=cfg.data.synth_unseen,
                            public=DEFAULT_PUBLIC_IMAGES)
    return _list_images(root / manifest.public.folder)


def assemble(cfg: RunConfig, census: Census, public_paths: list[Path], *, shards: list[ClientShard] | None,
             train_images: bool, images: ImageLoader = load_images) -> Federation:
    """The federation from the census: ``shards`` (a site's side) give the sites their labels and,
    with ``train_images``, their images; without them (the server's side) sites are empty."""
    clients_info = census.info["clients"]
    h, w = cfg.data.height, cfg.data.width
    device = resolve_device(cfg.run.device)
    method = base_method(cfg)

    # One initial model for everyone: the server's w^0. Each site adds its own head (FedPav) or
    # shares one over the union of identities (FedAvg). DP-SGD swaps BatchNorm for GroupNorm in
    # every model (Opacus' rule), so it happens here, once, before anything is copied.
    torch.manual_seed(derive_seed(cfg.seed, "init"))
    initial = method.build_model(census.global_classes)
    if cfg.privacy.dp_sgd:
        initial = dp_compatible(initial)
    layout = method.layout(initial)
    public = load_images(public_paths, h, w) if public_paths else None
    if cfg.method.kd_images and public is not None:
        public = public[: cfg.method.kd_images]
    method = with_options(method, cfg, public_images=public, server_model=initial.to(device), layout=layout)

    num_clients = len(clients_info)
    channel: Channel = SecureChannel.for_run(cfg, num_clients) if cfg.secagg.enabled else PlainChannel()
    extra_uploads = [KD_UPLOAD] if cfg.method.kd else []
    plan = resolve(
        cfg.privacy, num_clients=num_clients, clients_per_round=cfg.schedule.clients_per_round,
        rounds=cfg.schedule.rounds, aggregation="weighted" if cfg.method.aggregation == "weighted" else "unweighted",
        secagg=cfg.secagg.enabled, bn_stats=cfg.model.bn_stats, extra_uploads=extra_uploads, model_dim=layout.size,
        quantiser_scale=channel.scale if isinstance(channel, SecureChannel) else None, ring_bits=RING_BITS,
        design_dropout=max(DESIGN_DROPOUT, cfg.secagg.dropout_rate), dfs=dfs_settings(cfg, method),
        authenticated=cfg.secagg.authenticated, dfs_identities=min(int(c["classes"]) for c in clients_info),
    )
    sizes = [int(c["images"]) for c in clients_info]
    weight_scale = 1.0 / sum(sizes)
    if isinstance(channel, SecureChannel):  # CDW's weights are the clients' secret: a nominal share for them
        channel.check_weights_resolved(1.0 / len(sizes) if cfg.method.cdw else
                                       min(sizes) * weight_scale if cfg.method.aggregation == "weighted" else 1.0)
        if cfg.model.bn_stats == "shared":
            channel.check_statistics_resolved()
    reproducible = cfg.privacy.reproducible_noise
    clients: list[ClientSide] = []
    baselines: dict[int, Site] = {}
    baseline_dp: dict[int, ClientDpSgd] = {}
    for k, entry in enumerate(clients_info):
        model = copy_model(initial)
        if not method.uses_global_labels:
            torch.manual_seed(derive_seed(cfg.seed, "classifier", k))
            model.classifier = make_classifier(model.feature_dim, int(entry["classes"]))  # the site's own head
        model = model.to(device)
        pixels, labels = _site_data(shards[k] if shards else None, method.uses_global_labels, train_images, h, w,
                                    images)
        site = Site(k, str(entry["name"]), pixels.to(device), labels.to(device), model, weight_scale)
        noise = NoiseSource(derive_seed(cfg.seed, "client-noise", k), reproducible=reproducible)
        dp = client_dp_sgd(plan.dp_sgd, cfg, sizes[k], noise) if plan.dp_sgd is not None else None
        clients.append(ClientSide(site, method, layout, ClientPrivacy(plan, cfg.seed, noise),
                                  hash_models=channel.needs_model_hash, dp_sgd=dp))
        if cfg.run.local_baseline:
            alone = Site(k, site.name, site.images, site.labels, copy_model(model), weight_scale)
            baselines[k] = alone
            if plan.dp_sgd is not None:
                baseline_dp[k] = client_dp_sgd(plan.dp_sgd, cfg, sizes[k], noise)

    server = ServerSide(
        method=method, layout=layout, weights=layout.flatten(initial.state_dict()).cpu(),
        privacy=ServerPrivacy.from_plan(plan, layout.trainable_mask(), cfg.seed,
                                        NoiseSource(derive_seed(cfg.seed, "server-noise"), reproducible=reproducible)),
        enrolled=dict(enumerate(sizes)), weight_scale=weight_scale,
    )
    domains: list[DomainInfo] = [DomainInfo(name, ids) for name, ids in census.domains]
    info = {**census.info, "privacy": plan.to_dict(), "pretrained": pretrain.describe_initial(
        cfg.model.pretrained, pretrain.default_recipe(cfg.model.backbone, cfg.data.height, cfg.data.width), initial)}
    return Federation(cfg, method, layout, clients, server, channel, domains, plan, baselines, baseline_dp, info,
                      census)


def _site_data(shard: ClientShard | None, global_labels: bool, train_images: bool, h: int, w: int,
               images: ImageLoader) -> tuple[torch.Tensor, torch.Tensor]:
    """A site's images (empty unless ``train_images``) and labels (empty without its shard)."""
    if shard is None:
        return torch.empty((0, 3, h, w), dtype=torch.uint8), torch.empty(0, dtype=torch.int64)
    labels = torch.tensor(shard.global_labels if global_labels else shard.labels, dtype=torch.int64)
    pixels = images(shard.samples, h, w) if train_images else torch.empty((0, 3, h, w), dtype=torch.uint8)
    return pixels, labels


def _describe(d: ReidDataset) -> dict[str, Any]:
    return {"name": d.name, "train_images": len(d.train), "train_ids": d.num_train_pids, "query": len(d.query),
            # queries no gallery image matches from another camera: left out of CMC and mAP (the standard protocol)
            "query_unmatched": len(d.query) - matched_queries(d.query, d.gallery),
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
    if device.type == "mps" and not torch.backends.mps.is_available():  # (found by review: torch's traceback)
        raise ConfigError("run.device", f"{name} was asked for, but torch sees no Apple GPU (MPS) here")
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError("run.device", f"{name} was asked for, but torch sees no CUDA GPU")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise ConfigError("run.device", f"{name} was asked for, but torch sees {torch.cuda.device_count()} "
                              "CUDA GPU(s), numbered from 0")
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
    return ClientDpSgd(z, dp.max_grad_norm, dp.delta_for(num_examples), SampledGaussianAccountant(), noise,
                       num_examples)
