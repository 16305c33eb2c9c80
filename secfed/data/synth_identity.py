"""Synthetic pedestrians: what one identity looks like, drawn from a distribution every domain shares.

An identity is its body shape, clothing, hair, skin and accessories — everything that stays the same
from one camera to the next. Per-image variation (pose, viewpoint, box jitter, occlusion) and per-camera
effects live elsewhere (:mod:`secfed.data.synth_render`, :mod:`secfed.data.synth_camera`).

The distribution is deliberately crowded: clothing colours come from a palette weighted towards the
dark and neutral colours people actually wear, each jittered a little, so many identities share a
black top or blue jeans and must be told apart by the combination of cues. That is what keeps ReID
non-trivial on this data.
"""

from __future__ import annotations

import colorsys
from dataclasses import dataclass
from typing import Literal

import numpy as np

RGB = tuple[int, int, int]
Pattern = Literal["plain", "stripes", "checks", "print"]
Lower = Literal["trousers", "shorts", "skirt"]
Hair = Literal["short", "long", "bald"]

# (name, RGB, weight as a top, weight as a bottom). Weights follow what street clothing looks like:
# mostly black, grey, navy, denim and white; saturated colours are rarer (more so for bottoms).
_PALETTE: tuple[tuple[str, RGB, float, float], ...] = (
    ("black", (28, 28, 30), 10, 18),
    ("charcoal", (62, 62, 66), 8, 10),
    ("grey", (128, 128, 130), 8, 6),
    ("white", (226, 226, 222), 8, 2),
    ("navy", (32, 40, 84), 8, 10),
    ("denim", (62, 88, 134), 3, 16),
    ("light-blue", (128, 170, 214), 5, 3),
    ("khaki", (186, 166, 122), 4, 8),
    ("brown", (104, 70, 44), 4, 5),
    ("red", (186, 34, 40), 5, 1),
    ("maroon", (110, 28, 40), 3, 1),
    ("green", (46, 128, 64), 3, 1),
    ("olive", (96, 104, 52), 3, 4),
    ("yellow", (226, 196, 48), 3, 0.5),
    ("orange", (226, 118, 38), 2, 0.5),
    ("pink", (226, 150, 176), 3, 1),
    ("purple", (104, 60, 140), 2, 0.5),
    ("teal", (32, 128, 132), 2, 0.5),
)
_TOP_P = np.array([w for _, _, w, _ in _PALETTE]) / sum(w for _, _, w, _ in _PALETTE)
_BOTTOM_P = np.array([w for _, _, _, w in _PALETTE]) / sum(w for _, _, _, w in _PALETTE)

_SKIN = ((242, 206, 178), (226, 182, 146), (198, 146, 108), (160, 110, 76), (112, 76, 52), (84, 56, 40))
_HAIR = ((20, 16, 14), (52, 36, 26), (96, 66, 40), (160, 120, 70), (206, 176, 120), (150, 150, 150))
_HAIR_P = np.array([40, 22, 14, 8, 6, 4], dtype=float) / 94
_SHOES = ((24, 24, 24), (236, 236, 236), (92, 64, 44), (60, 60, 64))
_SHOES_P = np.array([45, 30, 15, 10], dtype=float) / 100


@dataclass(frozen=True)
class Identity:
    """Everything about one person that does not change between images."""

    # Body shape, in units of the person's height (the detector box is fitted to the person,
    # so stature shows up as how wide the figure looks, through ``build``).
    build: float  # width multiplier, 0.8 (slim) .. 1.25 (broad)
    head: float  # head height / body height
    legs: float  # leg length / body height
    skin: RGB
    hair: Hair
    hair_colour: RGB
    top: RGB
    top_pattern: Pattern
    top_secondary: RGB  # stripes, checks and prints are drawn in this colour
    pattern_scale: float  # stripe / check period, in units of body height
    long_sleeves: bool
    lower: Lower
    bottom: RGB
    shoes: RGB
    backpack: RGB | None
    bag: RGB | None  # a bag hanging on one side, strap across the body
    bag_side: int  # -1: on the person's left, +1: on the right
    hat: RGB | None
    glasses: bool


def _jitter(rng: np.random.Generator, rgb: RGB, hue: float, sat: float, val: float) -> RGB:
    """A colour near ``rgb``: the same garment colour is never exactly the same dye."""
    h, s, v = colorsys.rgb_to_hsv(*(c / 255.0 for c in rgb))
    h = (h + rng.normal(0.0, hue)) % 1.0
    s = float(np.clip(s * np.exp(rng.normal(0.0, sat)), 0.0, 1.0))
    v = float(np.clip(v * np.exp(rng.normal(0.0, val)), 0.04, 1.0))
    r, g, b = colorsys.hsv_to_rgb(h, s, v)
    return (round(r * 255), round(g * 255), round(b * 255))


def _pick(rng: np.random.Generator, choices: tuple[RGB, ...], p: np.ndarray | None = None) -> RGB:
    return choices[int(rng.choice(len(choices), p=p))]


def _garment(rng: np.random.Generator, p: np.ndarray) -> RGB:
    _, rgb, _, _ = _PALETTE[int(rng.choice(len(_PALETTE), p=p))]
    return _jitter(rng, rgb, hue=0.015, sat=0.15, val=0.12)


def _contrasting(rng: np.random.Generator, base: RGB) -> RGB:
    """A secondary colour that stands out from ``base`` (a pattern nobody can see is not a pattern)."""
    for _ in range(8):
        cand = _garment(rng, _TOP_P)
        if sum(abs(a - b) for a, b in zip(cand, base)) > 150:
            return cand
    return (236, 236, 232) if sum(base) < 380 else (30, 30, 32)


def sample_identity(rng: np.random.Generator) -> Identity:
    """Draw one person. Every domain calls this with its own seeds: one distribution, disjoint people."""
    top = _garment(rng, _TOP_P)
    lower: Lower = ("trousers", "shorts", "skirt")[int(rng.choice(3, p=[0.72, 0.14, 0.14]))]
    hair: Hair = ("short", "long", "bald")[int(rng.choice(3, p=[0.55, 0.38, 0.07]))]
    pattern: Pattern = ("plain", "stripes", "checks", "print")[int(rng.choice(4, p=[0.5, 0.2, 0.12, 0.18]))]
    return Identity(
        build=float(np.clip(rng.normal(1.0, 0.1), 0.8, 1.25)),
        head=float(rng.uniform(0.115, 0.14)),
        legs=float(rng.uniform(0.43, 0.5)),
        skin=_jitter(rng, _pick(rng, _SKIN), hue=0.01, sat=0.08, val=0.05),
        hair=hair,
        hair_colour=_jitter(rng, _pick(rng, _HAIR, _HAIR_P), hue=0.01, sat=0.1, val=0.1),
        top=top,
        top_pattern=pattern,
        top_secondary=_contrasting(rng, top),
        pattern_scale=float(rng.uniform(0.035, 0.07)),
        long_sleeves=bool(rng.random() < 0.6),
        lower=lower,
        bottom=_garment(rng, _BOTTOM_P),
        shoes=_jitter(rng, _pick(rng, _SHOES, _SHOES_P), hue=0.01, sat=0.1, val=0.1),
        backpack=_garment(rng, _TOP_P) if rng.random() < 0.3 else None,
        bag=_garment(rng, _BOTTOM_P) if rng.random() < 0.22 else None,
        bag_side=int(rng.choice((-1, 1))),
        hat=_garment(rng, _TOP_P) if rng.random() < 0.14 else None,
        glasses=bool(rng.random() < 0.2),
    )
