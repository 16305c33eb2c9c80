"""The pretraining identity set: many labelled people nobody federates, rendered in memory.

`secfed pretrain` trains a backbone on it once (:mod:`secfed.models.pretrain`), the offline
equivalent of the papers' ImageNet start. Its people come from the same appearance distribution as
every domain's (:func:`secfed.data.synth_identity.sample_identity`) but are drawn under their own
seed purpose, ``synth/pretrain/identity``: a client, unseen or public person's seed is
``derive_seed(s, "synth/identity", pid)``, whose hashed message ``secfed/<s>/synth/identity/<pid>``
can never equal ``secfed/<s'>/synth/pretrain/identity/<k>`` for any data seeds s, s', so no
pretraining person is anyone a domain holds, whatever the data seed. Its cameras are new ones
(their own seeds, domain index 100; domains are 0-8, the public set 99) in the styles of all nine
presets: the pretrained backbone has seen no client's or unseen domain's actual camera either.

Images are rendered at the synthetic domains' size, go through the same JPEG encoding as the
files `secfed data synth` writes and are resized as :func:`secfed.data.images.load_images` resizes,
so pretraining sees what training will see. Every random choice derives from (seed, purpose,
identity, camera, image): the same seed gives the same pixels.
"""

from __future__ import annotations

import io
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from PIL import Image
from torchvision.io import ImageReadMode, decode_image
from torchvision.transforms.v2 import functional as TF

from secfed.data.synth import JPEG_QUALITY
from secfed.data.synth_camera import sample_camera
from secfed.data.synth_domains import PRESETS, Shot
from secfed.data.synth_shot import CameraRig, ShotRenderer
from secfed.seeding import numpy_rng

IDENTITY_PURPOSE = "synth/pretrain/identity"
PRETRAIN_DOMAIN_INDEX = 100  # its cameras' and images' index in every seed purpose
PRETRAIN_CAMERAS = 18  # two per preset style
CAMERAS_PER_ID = (2, 4)  # inclusive: how many cameras see one person
SHOTS_PER_CAMERA = (2, 3)  # inclusive: images per person per camera
RENDER_SIZE = (128, 64)  # the size `secfed train` writes its synthetic domains at (builder.SYNTH_IMAGE_SIZE)

Progress = Callable[[int, int], None]  # (images rendered, images in the set)


@dataclass(frozen=True)
class IdentitySet:
    """Rendered images, uint8 (N, 3, H, W), and their identity labels 0..identities-1."""

    images: torch.Tensor
    labels: torch.Tensor
    identities: int


def plan_identities(seed: int, identities: int) -> tuple[Shot, ...]:
    """Which cameras see each person and how many images each takes; person k's draws are its own."""
    shots: list[Shot] = []
    for k in range(identities):
        rng = numpy_rng(seed, "synth/pretrain/plan", k)
        cams = sorted(rng.choice(PRETRAIN_CAMERAS, int(rng.integers(CAMERAS_PER_ID[0], CAMERAS_PER_ID[1] + 1)),
                                 replace=False).tolist())
        for cam in cams:
            for j in range(int(rng.integers(SHOTS_PER_CAMERA[0], SHOTS_PER_CAMERA[1] + 1))):
                shots.append(Shot("train", "person", k + 1, k, cam, 1, j, 1, j))
    return tuple(shots)


def _renderer(seed: int) -> ShotRenderer:
    cameras = [sample_camera(numpy_rng(seed, "synth/pretrain/camera", c), PRESETS[c % len(PRESETS)].style, c)
               for c in range(PRETRAIN_CAMERAS)]
    rigs = [CameraRig.build(cam, RENDER_SIZE, seed, PRETRAIN_DOMAIN_INDEX, c) for c, cam in enumerate(cameras)]
    return ShotRenderer(seed, PRETRAIN_DOMAIN_INDEX, rigs, RENDER_SIZE, identity_purpose=IDENTITY_PURPOSE)


def _as_jpeg_file_reads(pixels: np.ndarray) -> torch.Tensor:
    """The image as `secfed train` reads it back from the JPEG file `secfed data synth` writes."""
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, "JPEG", quality=JPEG_QUALITY)
    return decode_image(torch.frombuffer(bytearray(buffer.getvalue()), dtype=torch.uint8), mode=ImageReadMode.RGB)


def render_identities(seed: int, identities: int, height: int, width: int,
                      progress: Progress | None = None) -> IdentitySet:
    """The pretraining set of ``identities`` people at ``height`` × ``width``."""
    if identities < 2:
        raise ValueError(f"pretraining needs at least 2 identities, got {identities}")
    shots = plan_identities(seed, identities)
    renderer = _renderer(seed)
    images = torch.empty((len(shots), 3, height, width), dtype=torch.uint8)
    batch: list[torch.Tensor] = []
    for i, shot in enumerate(shots):
        batch.append(_as_jpeg_file_reads(renderer.render(shot)))
        if len(batch) == 256 or i == len(shots) - 1:  # resize in batches, as load_images does
            stacked = torch.stack(batch)
            if stacked.shape[-2:] != (height, width):
                stacked = TF.resize(stacked, [height, width], antialias=True)
            images[i + 1 - len(batch): i + 1] = stacked
            batch = []
        if progress is not None:
            progress(i + 1, len(shots))
    labels = torch.tensor([s.identity for s in shots], dtype=torch.int64)
    return IdentitySet(images, labels, identities)
