"""Rendering one planned shot: a window of the camera's scene, the person where the detector boxed
them, whatever stands in front, and the camera's exposure, optics and noise.

Randomness is layered so that images of one person at one camera look like one pass in front of it:
the pass (viewpoint, where in the walk cycle it starts, a lighting change) is drawn from a seed of
(domain, person, camera); each image then draws its own pose step, box jitter and occlusion from a
seed of (domain, person, camera, image). Nothing depends on what was rendered before.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from secfed.data.synth_camera import Camera, build_panorama, expose
from secfed.data.synth_domains import Shot
from secfed.data.synth_identity import Identity, sample_identity
from secfed.data.synth_render import VIEWS, Placement, render_occluder, render_person
from secfed.seeding import numpy_rng

SUPERSAMPLE = 2  # figures are drawn at twice the camera's resolution and box-filtered: no jagged edges
_KIND_CODE = {"person": 0, "distractor": 1, "junk": 2}
IDENTITY_PURPOSE = "synth/identity"  # the seed purpose of every client, unseen and public person


@dataclass
class CameraRig:
    """A camera with its scene panorama, built once per domain and camera at its drawing resolution."""

    camera: Camera
    canvas: tuple[int, int]  # (h, w) the figure is drawn at: SUPERSAMPLE × the camera's resolution
    panorama: np.ndarray = field(repr=False)

    @classmethod
    def build(cls, camera: Camera, out_size: tuple[int, int], seed: int, domain: int, cam: int) -> CameraRig:
        h, w = out_size
        rh, rw = max(16, round(h * camera.resolution)), max(8, round(w * camera.resolution))
        ch, cw = rh * SUPERSAMPLE, rw * SUPERSAMPLE
        rng = numpy_rng(seed, "synth/scene", domain, cam)
        return cls(camera, (ch, cw), build_panorama(camera.scene, rng, round(ch * 1.15), cw * 5))


def _window(rig: CameraRig, rng: np.random.Generator) -> np.ndarray:
    ch, cw = rig.canvas
    ph, pw, _ = rig.panorama.shape
    y, x = int(rng.integers(0, ph - ch + 1)), int(rng.integers(0, pw - cw + 1))
    return rig.panorama[y:y + ch, x:x + cw]


def _over(base: np.ndarray, layer: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
    """Alpha-composite ``layer`` (rgb, alpha) onto ``base`` in place."""
    rgb, alpha = layer
    rgb -= base
    rgb *= alpha[..., None]
    base += rgb
    return base


def _placement(rng: np.random.Generator, canvas: tuple[int, int], jitter: float) -> Placement:
    """Where a detector's box puts the person: roughly filling it, never exactly."""
    ch, cw = canvas
    height = ch * float(np.clip(0.9 * math.exp(rng.normal(0.0, jitter)), 0.74, 1.0))
    top = (ch - height) * rng.uniform(0.2, 0.8) + rng.normal(0.0, jitter * 0.5) * ch
    cx = cw / 2 + rng.normal(0.0, jitter * 1.5) * cw
    return Placement(cx, top, height)


def _passer_by(rng: np.random.Generator, canvas: tuple[int, int], at: Placement) -> tuple[np.ndarray, np.ndarray]:
    """Someone else walking at the edge of the box, partly inside it."""
    _, cw = canvas
    side = rng.choice((-1.0, 1.0))
    other = Placement(at.cx + side * cw * rng.uniform(0.55, 0.85), at.top + rng.normal(0, 0.04) * at.height,
                      at.height * rng.uniform(0.9, 1.1))
    return render_person(canvas, sample_identity(rng), VIEWS[int(rng.integers(4))], rng.uniform(0, 2 * math.pi), other)


class ShotRenderer:
    """Renders the shots of one domain. Identities are drawn once and reused for every image."""

    def __init__(self, seed: int, domain: int, rigs: list[CameraRig], out_size: tuple[int, int],
                 identity_purpose: str = IDENTITY_PURPOSE) -> None:
        self.seed, self.domain, self.rigs, self.out_size = seed, domain, rigs, out_size
        self.identity_purpose = identity_purpose  # the pretraining set draws its people under another name
        self._people: dict[int, Identity] = {}

    def person(self, pid: int) -> Identity:
        """The global person ``pid``: the same appearance in every image, camera and split."""
        if pid not in self._people:
            self._people[pid] = sample_identity(numpy_rng(self.seed, self.identity_purpose, pid))
        return self._people[pid]

    def render(self, shot: Shot) -> np.ndarray:
        """uint8 (H, W, 3) image of ``shot``."""
        rig = self.rigs[shot.camid]
        cam = rig.camera
        code = _KIND_CODE[shot.kind]
        visit = numpy_rng(self.seed, "synth/pass", self.domain, code, shot.identity, shot.camid)
        view_index = int(visit.choice(4, p=cam.views))
        phase0, phase_step = visit.uniform(0, 2 * math.pi), visit.uniform(0.7, 1.4)
        pass_gain = math.exp(visit.normal(0.0, 0.08))  # clouds, a lamp switched on: light varies per pass
        rng = numpy_rng(self.seed, "synth/image", self.domain, code, shot.identity, shot.camid, shot.pass_index)
        if rng.random() < 0.1:  # people turn now and then
            view_index = int(rng.integers(4))
        phase = phase0 + phase_step * shot.pass_index + rng.normal(0, 0.2)

        scene = _window(rig, rng).copy()
        at = _placement(rng, rig.canvas, cam.box_jitter)
        if shot.kind == "junk":  # a box around part of a person: a torso, legs, half a body
            scale = rng.uniform(1.5, 2.3)
            height = at.height * scale
            at = Placement(at.cx + rng.normal(0, 0.25) * rig.canvas[1], at.top - rng.uniform(0, 0.6) * height, height)
        who = None
        if shot.kind == "person" or shot.kind == "junk":
            who = self.person(shot.identity)
        elif rng.random() < 0.5:  # distractor: half unlabelled passers-by, half false detections
            who = sample_identity(numpy_rng(self.seed, "synth/passer-by", self.domain, shot.identity))
        occluded = rng.random() < cam.occlusion
        passer_behind = occluded and rng.random() < 0.25
        if occluded and passer_behind:
            scene = _over(scene, _passer_by(rng, rig.canvas, at))
        if who is not None:
            scene = _over(scene, render_person(rig.canvas, who, VIEWS[view_index], phase, at))
        if occluded and not passer_behind:
            front = _passer_by(rng, rig.canvas, at) if rng.random() < 0.4 else render_occluder(rig.canvas, rng)
            scene = _over(scene, front)

        # Box-filter the supersampled canvas down to the sensor's resolution (SUPERSAMPLE = 2).
        sensor = (scene[0::2, 0::2] + scene[1::2, 0::2] + scene[0::2, 1::2] + scene[1::2, 1::2]) * 0.25
        return expose(sensor, cam, rng, self.out_size, gain=pass_gain * math.exp(rng.normal(0.0, 0.03)))
