"""A backbone pretrained once on the synthetic identity set: the ImageNet start that can be made offline.

    secfed pretrain  ─►  <cache>/pretrained/synthetic-resnet18-64x32-<key>.sfw
    secfed train --pretrained synthetic  ─►  the run's backbone starts from those tensors

The recipe (:class:`Recipe`): the same :class:`~secfed.models.reid.ReIDModel` a run trains, with one
classifier over the set's identities (:mod:`secfed.data.synth_pretrain`), cross-entropy on the
house's augmented batches (:data:`secfed.algorithms.base.AUGMENT`, :func:`train_loop`), SGD with
Nesterov momentum, a cosine-decayed learning rate per epoch. Only the backbone is kept: the
neck and classifier of a run start fresh, as they do from ImageNet weights.

The file is named by a hash of everything that makes it (generator version, recipe version and
recipe: backbone, input size, identities, epochs, seed, optimiser), and holds that key and the
SHA-256 of its tensors in its header (:func:`secfed.federation.codec.encode_tensors`; no pickle).
:func:`load` refuses, naming the file, one whose key differs or whose tensors do not hash to what
it records; :func:`build` then makes it again.

Determinism: every draw derives from the recipe's seed, and training runs on the CPU, so the same
machine (CPU, torch build, thread count) writes the same bytes. Another CPU or thread count may
round differently inside the convolutions and write different weights (the rendered images should
match given the same numpy, Pillow/libjpeg and torchvision builds, but numpy's vectorised
transcendentals may differ between CPU instruction sets; not tested across CPUs); a run records
the SHA-256 of the backbone it started from (data.json).
"""

from __future__ import annotations

import hashlib
import math
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from secfed import atomic_file
from secfed.data.synth_pretrain import render_identities
from secfed.models.recipe import Recipe
from secfed.models.reid import PretrainedWeightsUnavailable, ReIDModel, imagenet_state_dict
from secfed.seeding import derive_seed, torch_generator

if TYPE_CHECKING:
    from secfed.config import ModelConfig

FORMAT = "secfed-pretrained-backbone"

# (stage, done, total, note): "render" counts images, "train" counts batches over all epochs
Progress = Callable[[str, int, int, str], None]


def default_recipe(backbone: str, height: int, width: int) -> Recipe:
    """The recipe `secfed train --pretrained synthetic` looks for at this backbone and input size."""
    return Recipe(backbone=backbone, height=height, width=width)


def weights_dir() -> Path:
    from secfed.federation.builder import cache_dir  # here: the builder imports the methods, which import us

    return cache_dir() / "pretrained"


def weights_path(recipe: Recipe) -> Path:
    return weights_dir() / recipe.filename


class SyntheticWeightsUnavailable(PretrainedWeightsUnavailable):
    """The synthetic weights are not built yet, or their file is refused; the message names the file
    and the command that (re)builds it."""


def _tensor_digest(tensors: dict[str, torch.Tensor]) -> str:
    h = hashlib.sha256()
    for name, tensor in tensors.items():
        t = tensor.detach().cpu().contiguous()
        h.update(f"{name}|{t.dtype}|{list(t.shape)}\n".encode())
        h.update(t.numpy().tobytes())
    return h.hexdigest()


def encode(recipe: Recipe, backbone: dict[str, torch.Tensor], stats: dict[str, Any]) -> bytes:
    """The weights file's bytes (deterministic: no time, host or path inside)."""
    from secfed.federation.codec import encode_tensors

    header = {"format": FORMAT, "key": recipe.key(), "digest": recipe.digest,
              "tensors_sha256": _tensor_digest(backbone), "stats": stats}
    return encode_tensors(header, backbone)


def load(recipe: Recipe, path: Path | None = None) -> dict[str, torch.Tensor]:
    """The backbone state of ``recipe`` from its cached file, verified; refused files raise
    :class:`SyntheticWeightsUnavailable` naming the file and saying why."""
    from secfed.federation.codec import CodecError, decode_tensors

    path = Path(path) if path is not None else weights_path(recipe)
    rebuild = f"(re)build it with `{recipe.command()}`"
    if path.exists() and not path.is_file():  # a FIFO would block the read for ever (found by review)
        raise SyntheticWeightsUnavailable(f"{path}: not a regular file; remove it and {rebuild}")
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise SyntheticWeightsUnavailable(
            f"synthetic pretrained weights for {recipe.backbone} at {recipe.height}×{recipe.width} are not built "
            f"yet ({path} does not exist); make them once with `{recipe.command()}`") from None
    except OSError as exc:
        raise SyntheticWeightsUnavailable(f"{path}: cannot be read ({exc}); {rebuild}") from None
    try:
        header, tensors = decode_tensors(data)
    except CodecError as exc:
        raise SyntheticWeightsUnavailable(f"{path}: refused, not a valid weights file ({exc}); {rebuild}") from None
    if header.get("format") != FORMAT or header.get("key") != recipe.key():
        raise SyntheticWeightsUnavailable(f"{path}: refused, made by another recipe or generator than "
                                          f"{recipe.digest[:16]}; {rebuild}")
    if header.get("tensors_sha256") != _tensor_digest(tensors):
        raise SyntheticWeightsUnavailable(f"{path}: refused, its tensors do not match their recorded SHA-256 "
                                          f"(corrupt file); {rebuild}")
    if misfit := _misfit(recipe.backbone, tensors):  # a file whose digest was recomputed after an edit (review)
        raise SyntheticWeightsUnavailable(f"{path}: refused, not a {recipe.backbone} backbone ({misfit}); {rebuild}")
    return tensors


@lru_cache(maxsize=None)
def _backbone_layout(backbone: str) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    """Name → (shape, dtype) of torchvision's ``backbone`` without its classifier: built once per process
    (a run's early check and its model both load the weights)."""
    import torchvision

    model = getattr(torchvision.models, backbone)(weights=None)
    model.fc = torch.nn.Identity()
    return {k: (tuple(v.shape), v.dtype) for k, v in model.state_dict().items()}


def _misfit(backbone: str, tensors: dict[str, torch.Tensor]) -> str | None:
    """Why ``tensors`` cannot be ``backbone``'s state (torchvision's, without its classifier), or None.
    The recorded digest detects damage only — whoever can write the file can recompute it."""
    expected = _backbone_layout(backbone)
    if missing := sorted(set(expected) - set(tensors)):
        return f"missing {missing[0]}" + (f" and {len(missing) - 1} more" if len(missing) > 1 else "")
    if extra := sorted(set(tensors) - set(expected)):
        return f"unexpected {extra[0]}" + (f" and {len(extra) - 1} more" if len(extra) > 1 else "")
    wrong = next((k for k, v in tensors.items() if (tuple(v.shape), v.dtype) != expected[k]), None)
    return f"{wrong} is {tuple(tensors[wrong].shape)} {tensors[wrong].dtype}" if wrong else None


def _batches(n: int, batch_size: int, generator: torch.Generator, on_batch: Callable[[], None]) -> Iterator[torch.Tensor]:
    from secfed.data.augment import epoch_batches

    for index in epoch_batches(n, batch_size, generator):
        yield index
        on_batch()


def train(recipe: Recipe, progress: Progress | None = None) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """Render the identity set and train the backbone on it (CPU); (backbone state, final stats)."""
    from secfed.algorithms.base import Schedule, cross_entropy_loss, make_optimizer, train_loop

    report = progress or (lambda *_: None)
    data = render_identities(recipe.seed, recipe.identities, recipe.height, recipe.width,
                             lambda done, total: report("render", done, total, ""))
    torch.manual_seed(derive_seed(recipe.seed, "pretrain/init"))
    model = ReIDModel(recipe.backbone, data.identities)
    schedule = Schedule(recipe.lr, recipe.lr, 1, recipe.batch_size, recipe.momentum, recipe.weight_decay)
    optimizer = make_optimizer(model, schedule)
    generator = torch_generator(recipe.seed, "pretrain/batches")
    n = len(data.labels)
    per_epoch = max(1, n // recipe.batch_size)  # epoch_batches drops a partial last batch
    total, done, stats = per_epoch * recipe.epochs, 0, None
    for epoch in range(recipe.epochs):
        lr = recipe.lr * 0.5 * (1 + math.cos(math.pi * epoch / recipe.epochs))  # cosine, per epoch
        for group in optimizer.param_groups:
            group["lr"] = lr
        note = f"epoch {epoch + 1}/{recipe.epochs}" + (f" · loss {stats.loss:.3f} · acc {stats.accuracy:.0%}"
                                                       if stats else "")

        def step(note: str = note) -> None:
            nonlocal done
            done += 1
            report("train", done, total, note)

        stats = train_loop(model, optimizer, _batches(n, recipe.batch_size, generator, step), data.images,
                           data.labels, cross_entropy_loss, generator)
    backbone = {k: v.detach().clone() for k, v in model.backbone.state_dict().items()}
    final = {"images": n, "identities": data.identities, "loss": round(stats.loss, 6),
             "train_accuracy": round(stats.accuracy, 6)}
    return backbone, final


@dataclass(frozen=True)
class Built:
    """What :func:`build` did: the file, whether it trained, why an old file was refused, how long it took."""

    path: Path
    recipe: Recipe
    trained: bool
    refused: str | None
    seconds: float
    sha256: str  # of the whole file


def build(recipe: Recipe, progress: Progress | None = None, *, force: bool = False) -> Built:
    """The cached weights of ``recipe``: reused when the file verifies, else (re)trained and written."""
    path = weights_path(recipe)
    start = time.perf_counter()
    refused = None
    if path.exists() and not force:
        try:
            load(recipe, path)
            return Built(path, recipe, False, None, time.perf_counter() - start, _file_sha256(path))
        except SyntheticWeightsUnavailable as exc:
            refused = str(exc)
    try:  # where the file goes is checked before minutes of training (found by review: a traceback after)
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.is_dir():
            raise IsADirectoryError(f"{path} is a folder")
        with tempfile.TemporaryFile(dir=path.parent):  # writable, not only there (review: a read-only folder)
            pass
    except OSError as exc:
        raise SyntheticWeightsUnavailable(f"{path}: cannot be written ({exc}); set SECFED_CACHE to a folder "
                                          "of your own") from None
    backbone, stats = train(recipe, progress)
    try:
        atomic_file.write_bytes(path, encode(recipe, backbone, stats), mode=0o644)
    except OSError as exc:
        raise SyntheticWeightsUnavailable(f"{path}: cannot be written ({exc})") from None
    _remove_abandoned_writes(path)
    return Built(path, recipe, True, refused, time.perf_counter() - start, _file_sha256(path))


ABANDONED_AFTER_S = 600  # a write of a backbone's file takes seconds: a temporary file this old is a killed one's


def _remove_abandoned_writes(path: Path) -> None:
    """Temporary files of this file's writes that a kill left behind (found by review: one per killed
    write, a backbone's size each, kept for good). Another build of the same recipe may be writing
    now, so only those older than any write takes are removed."""
    now = time.time()
    for tmp in atomic_file.temporaries(path):
        try:
            if now - tmp.stat().st_mtime > ABANDONED_AFTER_S:
                tmp.unlink()
        except OSError:  # gone meanwhile, or not ours to remove: nothing lost
            pass


def _file_sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


_RESTORING: ContextVar[bool] = ContextVar("secfed_models_from_checkpoint", default=False)


@contextmanager
def restoring() -> Iterator[None]:
    """Within it, models are built only to be overwritten by a checkpoint (`secfed evaluate`, `audit`, a
    resume): the initial backbone is neither required nor read — the same architecture, drawing the same
    random numbers, without its weights (found by review: a finished run could not be evaluated or
    resumed where its cached synthetic backbone was missing, though its results never read it)."""
    token = _RESTORING.set(True)
    try:
        yield
    finally:
        _RESTORING.reset(token)


def require(choice: str, backbone: str, height: int, width: int) -> None:
    """Refuse a run that names weights it cannot have — synthetic ones not built yet or refused, ImageNet
    ones not in torchvision's cache — before it makes or reads any data."""
    if _RESTORING.get():
        return
    if choice == "synthetic":  # verified now: a damaged file was refused only after the data was made (review)
        load(default_recipe(backbone, height, width))  # raises the error that names `secfed pretrain`
    if choice == "imagenet":
        imagenet_state_dict(backbone)


def describe_initial(choice: str, recipe: Recipe, model: torch.nn.Module) -> dict[str, Any]:
    """What a run records of its initial backbone (data.json): the choice, and for synthetic weights
    the file and the SHA-256 of the backbone tensors the run actually started from."""
    out: dict[str, Any] = {"weights": choice}
    backbone = getattr(model, "backbone", None)
    if _RESTORING.get():  # not read: what a fresh run recorded in data.json stands
        return out | {"read": False}
    if choice == "synthetic" and backbone is not None:
        out.update(file=str(weights_path(recipe)), recipe_digest=recipe.digest,
                   backbone_sha256=_tensor_digest(backbone.state_dict()))
    return out


def initial_weights(model_cfg: ModelConfig, height: int, width: int) -> bool | dict[str, torch.Tensor]:
    """What ``ReIDModel(pretrained=...)`` gets for `model.pretrained`: False (none), True (ImageNet),
    or the verified synthetic backbone for this backbone and input size."""
    choice = model_cfg.pretrained
    if _RESTORING.get():
        return False
    if choice == "synthetic":
        return load(default_recipe(model_cfg.backbone, height, width))
    return choice == "imagenet"
