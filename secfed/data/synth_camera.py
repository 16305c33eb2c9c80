"""Synthetic cameras: the scene behind the pedestrians and what the camera does to the picture.

A camera is a background (a wall or street with a floor line, seen as a wide panorama from which each
detection box cuts its own window), an exposure (brightness, gamma, white balance, haze), optics and
sensor (blur, resolution, noise), a viewpoint bias (which way people walk past it) and an occlusion
rate. Each domain draws its cameras from its own :class:`CameraStyle`, so domains differ the way
real datasets do: indoor against outdoor, sharp against blurry, neutral against colour-cast.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from PIL import Image, ImageFilter

from secfed.data.synth_identity import RGB

Range = tuple[float, float]

_INDOOR_WALLS, _OUTDOOR_WALLS = ("panels", "windows", "plain", "brick"), ("brick", "windows", "foliage", "plain")
_INDOOR_FLOORS, _OUTDOOR_FLOORS = ("tiles", "tiles", "paving"), ("asphalt", "paving", "grass", "asphalt")


@dataclass(frozen=True)
class CameraStyle:
    """The ranges a domain draws its cameras' parameters from."""

    indoor: float  # probability that a camera is indoors
    resolution: Range  # render scale relative to the written image (1.0: full resolution)
    blur: Range  # Gaussian sigma, in pixels of a 128-pixel-tall image
    noise: Range  # sensor noise std, in [0, 1] intensity units
    occlusion: Range  # probability that an image has something in front of the person
    brightness: Range
    cast: float  # std of the log white-balance gains: how colour-cast the cameras are
    along: Range  # probability that people walk towards/away from the camera (else across it)
    alternate_views: bool = False  # cameras alternate along/across (VIPeR-style front vs side pairs)


@dataclass(frozen=True)
class Scene:
    """What is behind the pedestrians at one camera."""

    wall: str
    wall_colour: RGB
    floor: str
    floor_colour: RGB
    horizon: float  # where floor meets wall, as a fraction of the image height from the top


@dataclass(frozen=True)
class Camera:
    """One camera's parameters (all written to the manifest)."""

    scene: Scene
    resolution: float
    brightness: float
    gamma: float
    white_balance: tuple[float, float, float]
    haze: float  # fraction of a flat haze colour mixed in (low contrast)
    haze_colour: tuple[float, float, float]
    blur: float
    noise: float
    occlusion: float
    views: tuple[float, float, float, float]  # P(front), P(back), P(facing left), P(facing right)
    box_jitter: float  # detector box noise, as a fraction of the box


def _colour(rng: np.random.Generator, lo: int, hi: int, tint: float) -> RGB:
    base = rng.uniform(lo, hi)
    r, g, b = (int(np.clip(base * np.exp(rng.normal(0, tint)), 0, 255)) for _ in range(3))
    return (r, g, b)


def sample_camera(rng: np.random.Generator, style: CameraStyle, index: int) -> Camera:
    """Draw one camera of a domain. ``index`` only matters for styles that alternate viewpoints."""
    indoor = bool(rng.random() < style.indoor)
    wall = str(rng.choice(_INDOOR_WALLS if indoor else _OUTDOOR_WALLS))
    floor = str(rng.choice(_INDOOR_FLOORS if indoor else _OUTDOOR_FLOORS))
    floor_colour = (
        (int(rng.integers(70, 110)), int(rng.integers(110, 150)), int(rng.integers(50, 80)))
        if floor == "grass" else _colour(rng, 70, 200, 0.08)
    )
    scene = Scene(wall, _colour(rng, 60, 220, 0.1), floor, floor_colour, float(rng.uniform(0.5, 0.85)))
    if style.alternate_views:
        along = 0.88 if index % 2 == 0 else 0.12
    else:
        along = float(rng.uniform(*style.along))
    towards = float(rng.uniform(0.2, 0.8))
    rightwards = float(rng.uniform(0.2, 0.8))
    views = (along * towards, along * (1 - towards), (1 - along) * (1 - rightwards), (1 - along) * rightwards)
    wb = np.exp(rng.normal(0.0, style.cast, size=3))
    wb = wb / np.exp(np.log(wb).mean())  # white balance shifts hue, brightness is separate
    haze = float(rng.uniform(0.0, 0.25)) if rng.random() < 0.4 else 0.0
    resolution = float(rng.uniform(*style.resolution))
    brightness = float(rng.uniform(*style.brightness))
    gamma = float(np.exp(rng.normal(0.0, 0.18)))
    haze_rgb = rng.uniform(0.5, 0.9) * np.exp(rng.normal(0, 0.08, 3))
    return Camera(
        scene=scene,
        resolution=resolution,
        brightness=brightness,
        gamma=gamma,
        white_balance=(float(wb[0]), float(wb[1]), float(wb[2])),
        haze=haze,
        haze_colour=(float(haze_rgb[0]), float(haze_rgb[1]), float(haze_rgb[2])),
        blur=float(rng.uniform(*style.blur)),
        noise=float(rng.uniform(*style.noise)),
        occlusion=float(rng.uniform(*style.occlusion)),
        views=views,
        box_jitter=float(rng.uniform(0.035, 0.07)),
    )


# -- backgrounds ---------------------------------------------------------------------------------
def _smooth(rng: np.random.Generator, h: int, w: int, cell: float) -> np.ndarray:
    """Zero-mean, unit-ish noise varying over ``cell`` pixels (a bilinearly upsampled random grid)."""
    gh, gw = max(2, round(h / cell) + 1), max(2, round(w / cell) + 1)
    grid = Image.fromarray(rng.normal(0.0, 1.0, (gh, gw)).astype(np.float32), mode="F")
    return np.asarray(grid.resize((w, h), Image.Resampling.BILINEAR), dtype=np.float32)


def _blocks(rng: np.random.Generator, h: int, w: int, bh: float, bw: float, jitter: float,
            stagger: bool) -> tuple[np.ndarray, np.ndarray]:
    """Per-pixel brightness of a wall of blocks (bricks, panels, tiles), and a mask of the joints."""
    y = np.arange(h, dtype=np.float32)[:, None]
    x = np.arange(w, dtype=np.float32)[None, :]
    row = np.floor(y / bh).astype(np.int64)
    shifted = x + (row % 2) * (bw / 2 if stagger else 0.0)
    col = np.floor(shifted / bw).astype(np.int64)
    tone = rng.normal(0.0, jitter, (int(row.max()) + 1, int(col.max()) + 1)).astype(np.float32)
    joint = ((y % bh) < max(1.0, bh * 0.12)) | ((shifted % bw) < max(1.0, bw * 0.06))
    return 1.0 + tone[row, col], joint


def build_panorama(scene: Scene, rng: np.random.Generator, h: int, w: int) -> np.ndarray:
    """A float32 (h, w, 3) picture of the scene in [0, 1]; detection boxes crop windows from it."""
    wall = np.asarray(scene.wall_colour, dtype=np.float32) / 255.0
    floor = np.asarray(scene.floor_colour, dtype=np.float32) / 255.0
    y_floor = int(scene.horizon * h)
    img = np.empty((h, w, 3), dtype=np.float32)
    hw, hf = y_floor, h - y_floor
    unit = h / 40.0  # texture sizes scale with the image so every resolution looks alike

    if scene.wall == "brick":
        tone, joint = _blocks(rng, hw, w, 1.8 * unit, 4.2 * unit, 0.07, stagger=True)
        top = wall * tone[..., None]
        top[joint] = wall * 1.3
    elif scene.wall == "panels":
        tone, joint = _blocks(rng, hw, w, hw + 1.0, rng.uniform(6, 14) * unit, 0.06, stagger=False)
        top = wall * tone[..., None]
        top[joint] = wall * 0.55
    elif scene.wall == "windows":
        top = np.broadcast_to(wall, (hw, w, 3)).copy()
        tone, joint = _blocks(rng, hw, w, rng.uniform(6, 10) * unit, rng.uniform(5, 9) * unit, 0.1, stagger=False)
        glass = np.array([0.25, 0.32, 0.4], dtype=np.float32) * float(rng.uniform(0.6, 1.6))
        frame = joint | (np.arange(hw)[:, None] > hw * 0.8)
        top = np.where(frame[..., None], top, glass * tone[..., None])
    elif scene.wall == "foliage":
        sky = np.array([0.75, 0.82, 0.9], dtype=np.float32) * float(rng.uniform(0.8, 1.1))
        leaves = np.array([0.22, 0.4, 0.18], dtype=np.float32) * float(rng.uniform(0.7, 1.3))
        canopy = _smooth(rng, hw, w, 3 * unit) + np.linspace(-1.0, 1.5, hw, dtype=np.float32)[:, None]
        fine = 1.0 + 0.18 * _smooth(rng, hw, w, 0.7 * unit)
        top = np.where((canopy > 0)[..., None], leaves * fine[..., None], sky)
    else:  # plain: painted wall with stains and a gradient
        grad = np.linspace(1.05, 0.9, hw, dtype=np.float32)[:, None]
        top = wall * (grad * (1.0 + 0.06 * _smooth(rng, hw, w, 6 * unit)))[..., None]
    img[:y_floor] = top

    if scene.floor == "tiles":
        depth = (np.arange(hf, dtype=np.float32) / max(hf, 1)) ** 1.6 * 8  # lines closer near the horizon
        x = np.arange(w, dtype=np.float32)[None, :] / (5 * unit)
        checker = ((np.floor(depth)[:, None] + np.floor(x)) % 2) * 0.1 + 0.95
        joint = ((depth % 1.0) < 0.08)[:, None] | ((x % 1.0) < 0.05)
        bottom = floor * np.where(joint, 0.75, checker)[..., None]
    elif scene.floor == "paving":
        tone, joint = _blocks(rng, hf, w, 1.2 * unit, 2.6 * unit, 0.06, stagger=True)
        bottom = floor * np.where(joint, 0.7, tone)[..., None]
    else:  # asphalt, grass: a fine irregular texture
        amp = 0.16 if scene.floor == "grass" else 0.08
        bottom = floor * (1.0 + amp * _smooth(rng, hf, w, 0.5 * unit))[..., None]
    img[y_floor:] = bottom

    # Clutter: pillars, doors, bins and signs standing on the floor line.
    for _ in range(int(rng.integers(1, 5))):
        cw = rng.uniform(2, 9) * unit
        x0 = rng.uniform(0, w - cw)
        y0 = rng.uniform(0, y_floor * 0.9)
        y1 = y_floor + rng.uniform(0, 0.3) * hf
        tone = rng.uniform(0.15, 0.85) * np.exp(rng.normal(0.0, 0.15, 3))  # man-made things: mostly greyish
        img[int(y0):int(y1), int(x0):int(x0 + cw)] = tone.astype(np.float32)

    # Light falls unevenly across a scene: broad brighter and darker patches.
    light = 1.0 + 0.12 * _smooth(rng, h, w, 15 * unit)
    return np.clip(img * light[..., None], 0.0, 1.0)


# -- exposure, optics, sensor --------------------------------------------------------------------
def expose(scene_rgb: np.ndarray, camera: Camera, rng: np.random.Generator, out_size: tuple[int, int],
           gain: float = 1.0) -> np.ndarray:
    """What ``camera`` records of ``scene_rgb`` (float (h, w, 3) at the camera's resolution).

    Returns uint8 (out_h, out_w, 3): exposed (brightness × ``gain``, white balance, gamma, haze),
    blurred, upsampled to the written size and given sensor noise.
    """
    img = scene_rgb * (np.asarray(camera.white_balance, dtype=np.float32) * (camera.brightness * gain))
    img = np.clip(img, 0.0, 1.0) ** camera.gamma
    if camera.haze:
        img = img * (1.0 - camera.haze) + np.asarray(camera.haze_colour, dtype=np.float32) * camera.haze
    pic = Image.fromarray(np.clip(img * 255.0 + 0.5, 0, 255).astype(np.uint8))
    sigma = camera.blur * pic.height / 128.0
    if sigma > 0.15:
        pic = pic.filter(ImageFilter.GaussianBlur(sigma))
    out_h, out_w = out_size
    if pic.size != (out_w, out_h):
        pic = pic.resize((out_w, out_h), Image.Resampling.BILINEAR)
    arr = np.asarray(pic, dtype=np.float32)
    arr += sensor_noise(rng, arr.shape, camera.noise * 255.0)
    return np.clip(arr + 0.5, 0, 255).astype(np.uint8)


_TRIANGULAR_STD = float(np.sqrt(2 * (256**2 - 1) / 12))  # std of the sum of two uniform bytes


def sensor_noise(rng: np.random.Generator, shape: tuple[int, ...], std: float) -> np.ndarray:
    """Zero-mean float32 noise of standard deviation ``std``: the sum of two uniform random bytes
    (a triangular distribution), which looks like Gaussian sensor noise at a fifth of the cost of
    drawing normals, the largest single cost of an image otherwise."""
    pair = np.frombuffer(rng.bytes(2 * int(np.prod(shape))), dtype=np.uint8).reshape(2, *shape)
    noise = pair[0].astype(np.float32)
    noise += pair[1]
    noise -= np.float32(255.0)
    noise *= np.float32(std / _TRIANGULAR_STD)
    return noise
