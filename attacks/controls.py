"""Calibration controls: updates made on purpose, whose victims are known, for the audit to attack.

A positive control is an update that must leak (one local step on two images of two people, no
secure aggregation); a negative control one that must not be called a leak (an untrained model's
step on random-noise images, whose "identities" share nothing). :func:`client_update` runs the
method's real client step — the code a run uses — on given images from given weights, so the audit
is calibrated on exactly what it attacks; :func:`gallery_of` lays out the images the judge searches.
The tests run these at toy sizes, ``bench/bench_audit.py`` at the default model and size.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np
import torch
from torch import nn

from secfed.algorithms import base_method
from secfed.algorithms.base import Schedule, Site
from secfed.attacks.judge import Gallery
from secfed.attacks.local_training import LocalSteps
from secfed.config import RunConfig
from secfed.federation.messages import MODEL, Broadcast
from secfed.federation.runtime import schedule_for
from secfed.models.reid import make_classifier
from secfed.models.sharing import SharedLayout


@dataclass
class Control:
    model: nn.Module  # the start model (the judge and the attacks use copies)
    layout: SharedLayout
    start: torch.Tensor  # flat shared weights before the step
    update: torch.Tensor  # flat shared update the client would upload (before any privacy step)
    steps: LocalSteps
    neck_inputs: torch.Tensor | None  # what the neck's first layer really received in the first step


def client_update(cfg: RunConfig, model: nn.Module, images: torch.Tensor, labels: torch.Tensor, *, seed: int = 0,
                  batch_size: int | None = None, epochs: int | None = None, round_index: int = 0) -> Control:
    """One client's real local training (the configured method's ``client_step``) on ``images`` from
    ``model``'s weights, with a fresh classifier over ``labels``."""
    method = base_method(cfg)
    layout = method.layout(model)
    site_model = copy.deepcopy(model)
    classes = int(labels.max()) + 1
    if not method.uses_global_labels:
        torch.manual_seed(seed)
        site_model.classifier = make_classifier(site_model.feature_dim, classes)
    schedule: Schedule = schedule_for(cfg, round_index)
    schedule = replace(schedule, batch_size=batch_size or schedule.batch_size, epochs=epochs or schedule.epochs)
    site = Site(0, "control", images, labels, site_model, 1.0 / len(images))
    start = layout.flatten(model.state_dict()).cpu()
    seen: list[torch.Tensor] = []
    neck = getattr(site_model, "neck", None)
    hook = neck[0].register_forward_hook(lambda m, i, o: seen.append(i[0].detach().clone())) \
        if isinstance(neck, nn.Sequential) else None
    try:
        contribution = method.client_step(site, Broadcast(0, start.clone(), layout.fingerprint()), layout, schedule, seed)
    finally:
        if hook is not None:
            hook.remove()
    steps = LocalSteps.from_schedule(schedule, len(images))
    return Control(copy.deepcopy(model).eval(), layout, start, contribution.summed[MODEL].vector.clone(), steps,
                   seen[0] if seen else None)


def noise_images(count: int, height: int, width: int, seed: int = 0) -> torch.Tensor:
    """Uniform random uint8 images: nobody is in them."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (count, 3, height, width), dtype=torch.uint8, generator=gen)


PHOTOGRAPHS = ("astronaut", "coffee", "chelsea", "rocket", "immunohistochemistry", "hubble_deep_field", "retina")


def photographs(height: int, width: int, *, per_photo: int = 1) -> torch.Tensor:
    """Natural photographs the synthetic generator did not draw: scikit-image's sample pictures
    (shipped with the package, offline), each cut into ``per_photo`` side-by-side crops of the
    person-crop shape and resized to height × width. uint8 (len(PHOTOGRAPHS)·per_photo, 3, H, W)."""
    from skimage import data
    from skimage.transform import resize

    out = []
    for name in PHOTOGRAPHS:
        photo = getattr(data, name)()[..., :3]
        rows, cols = photo.shape[:2]
        crop_w = min(cols // per_photo, rows * width // height)
        crop_h = crop_w * height // width
        top = (rows - crop_h) // 2
        for i in range(per_photo):
            left = i * (cols // per_photo) + (cols // per_photo - crop_w) // 2
            piece = resize(photo[top:top + crop_h, left:left + crop_w], (height, width), anti_aliasing=True)
            out.append(torch.from_numpy((piece * 255).round().astype(np.uint8)).permute(2, 0, 1))
    return torch.stack(out)


def gallery_of(groups: Sequence[tuple[str, torch.Tensor]], *, own: Sequence[bool]) -> tuple[Gallery, list[list[int]]]:
    """A gallery from (identity, images) groups; ``own``: which groups are the client's. Returns it and
    each group's indices."""
    images, ids, mine, where = [], [], [], []
    for (identity, imgs), is_own in zip(groups, own):
        where.append(list(range(len(ids), len(ids) + len(imgs))))
        images.append(imgs)
        ids += [identity] * len(imgs)
        mine += [is_own] * len(imgs)
    return Gallery(torch.cat(images), ids, np.array(mine, dtype=bool)), where
