"""Drawing one pedestrian (and the things that get in front of one) onto an RGBA layer.

The figure is a handful of PIL polygons and ellipses laid out in units of the person's height, so it
renders at any resolution in well under a millisecond. What changes between images of the same
person is passed in: the viewpoint (front, back, facing left, facing right — accessories and prints
render differently from each), the walking phase (legs and arms swing), and where the detector put
the box. Clothing patterns are painted through a mask of the torso with numpy.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import numpy as np
from PIL import Image, ImageDraw

from secfed.data.synth_identity import RGB, Identity

View = Literal["front", "back", "left", "right"]
VIEWS: tuple[View, ...] = ("front", "back", "left", "right")

Point = tuple[float, float]


@dataclass(frozen=True)
class Placement:
    """Where the figure stands on the canvas: horizontal centre, top of the head, height, all in pixels."""

    cx: float
    top: float
    height: float


def _limb(a: Point, b: Point, wa: float, wb: float) -> list[Point]:
    """A quadrilateral from ``a`` (width ``wa``) to ``b`` (width ``wb``): an arm or leg segment."""
    dx, dy = b[0] - a[0], b[1] - a[1]
    n = math.hypot(dx, dy) or 1.0
    px, py = -dy / n / 2, dx / n / 2
    return [
        (a[0] + px * wa, a[1] + py * wa),
        (b[0] + px * wb, b[1] + py * wb),
        (b[0] - px * wb, b[1] - py * wb),
        (a[0] - px * wa, a[1] - py * wa),
    ]


def _shade(rgb: RGB, factor: float) -> RGB:
    return (min(255, round(rgb[0] * factor)), min(255, round(rgb[1] * factor)), min(255, round(rgb[2] * factor)))


def _ellipse(draw: ImageDraw.ImageDraw, cx: float, cy: float, rx: float, ry: float, fill: RGB) -> None:
    draw.ellipse((cx - rx, cy - ry, cx + rx, cy + ry), fill=fill)


class _Figure:
    """One person at one placement, view and phase. Call :meth:`draw` once."""

    def __init__(self, ident: Identity, view: View, phase: float, at: Placement) -> None:
        self.ident, self.view = ident, view
        self.side = view in ("left", "right")
        # facing: +1 when walking towards image-right, -1 towards image-left (side views only).
        # mirror: on which image side the person's own right falls (front: image-left, back: image-right).
        self.facing = {"left": -1, "right": 1}.get(view, 0)
        self.mirror = {"front": -1, "back": 1}.get(view, 0)
        P = at.height
        self.P, self.cx = P, at.cx
        self.y0 = at.top + 0.012 * P * abs(math.sin(phase))  # the head bobs with each step
        self.phase = phase
        b = ident.build
        self.y_neck = self.y0 + ident.head * P
        self.y_sh = self.y_neck + 0.025 * P
        self.y_an = at.top + 0.97 * P
        self.y_hip = self.y_an - ident.legs * P
        self.sw = (0.082 if self.side else 0.13) * P * b  # half-width at the shoulders
        self.hw = (0.075 if self.side else 0.105) * P * b  # half-width at the hips
        self.lw = 0.085 * P * b
        self.aw = 0.055 * P * b

    # -- parts -------------------------------------------------------------------------------
    def _legs(self, draw: ImageDraw.ImageDraw, far: bool) -> None:
        idn, P = self.ident, self.P
        L = self.y_an - self.y_hip
        if self.side:
            swing = 0.42 * math.sin(self.phase) * (-1 if far else 1)
            hips = [(self.cx, self.y_hip)]
            angles = [swing]
        else:
            # Seen from the front or back, a stride only shortens the leg that swings forward.
            hips = [(self.cx - 0.5 * self.hw, self.y_hip), (self.cx + 0.5 * self.hw, self.y_hip)]
            s = math.sin(self.phase)
            angles = [0.28 * s, -0.28 * s]
        for (hx, hy), ang in zip(hips, angles):
            if self.side:
                ax, ay = hx + self.facing * L * math.sin(ang), hy + L * math.cos(ang)
            else:
                ax, ay = hx + 0.03 * P * math.sin(ang), hy + L * (1 - 0.12 * abs(ang))
            tone = 0.78 if far else 1.0
            skin_legs = idn.lower != "trousers"
            draw.polygon(_limb((hx, hy), (ax, ay), self.lw, self.lw * 0.8),
                         fill=_shade(idn.skin if skin_legs else idn.bottom, tone))
            if idn.lower == "shorts":
                kx, ky = hx + 0.45 * (ax - hx), hy + 0.45 * (ay - hy)
                draw.polygon(_limb((hx, hy), (kx, ky), self.lw * 1.15, self.lw * 1.1), fill=_shade(idn.bottom, tone))
            shoe_dx = 0.035 * P * (self.facing if self.side else 0)
            _ellipse(draw, ax + shoe_dx, ay + 0.012 * P, self.lw * (0.75 if not self.side else 0.95), 0.022 * P,
                     _shade(idn.shoes, tone))

    def _pelvis(self, draw: ImageDraw.ImageDraw) -> None:
        idn, P = self.ident, self.P
        if idn.lower == "skirt":
            bottom = self.y_hip + 0.22 * P
            flare = 1.3 * self.hw
            draw.polygon([(self.cx - self.hw, self.y_hip - 0.02 * P), (self.cx + self.hw, self.y_hip - 0.02 * P),
                          (self.cx + flare, bottom), (self.cx - flare, bottom)], fill=idn.bottom)
        else:
            draw.rectangle((self.cx - self.hw, self.y_hip - 0.02 * P, self.cx + self.hw, self.y_hip + 0.06 * P),
                           fill=idn.bottom)

    def _torso_outline(self) -> list[Point]:
        waist = self.y_hip + 0.015 * self.P
        lean = 0.02 * self.P * self.facing  # walkers lean into their step
        return [(self.cx - self.sw + lean, self.y_sh), (self.cx + self.sw + lean, self.y_sh),
                (self.cx + self.hw, waist), (self.cx - self.hw, waist)]

    def _torso(self, layer: Image.Image, draw: ImageDraw.ImageDraw) -> None:
        idn, P = self.ident, self.P
        outline = self._torso_outline()
        draw.polygon(outline, fill=idn.top)
        if idn.top_pattern in ("stripes", "checks"):
            mask = Image.new("L", layer.size, 0)
            ImageDraw.Draw(mask).polygon(outline, fill=255)
            period = max(2.0, idn.pattern_scale * P)
            h, w = layer.size[1], layer.size[0]
            yy = (np.arange(h, dtype=np.float32)[:, None] - self.y_sh) / period
            on = np.broadcast_to((yy % 1.0) < 0.45, (h, w))
            if idn.top_pattern == "checks":
                xx = (np.arange(w, dtype=np.float32)[None, :] - self.cx) / period
                on = on ^ ((xx % 1.0) < 0.5)
            painted = np.asarray(mask) & np.where(on, 255, 0).astype(np.uint8)
            layer.paste(idn.top_secondary, (0, 0), Image.fromarray(painted))
        elif idn.top_pattern == "print" and self.view == "front":
            # A chest print: what distinguishes this shirt from the front, invisible from behind.
            r = 0.45 * self.sw
            cy = self.y_sh + 0.3 * (self.y_hip - self.y_sh)
            _ellipse(draw, self.cx, cy, r, r * 0.8, idn.top_secondary)
        elif idn.top_pattern == "print" and self.side:
            x = self.cx + self.facing * 0.55 * self.sw
            cy = self.y_sh + 0.3 * (self.y_hip - self.y_sh)
            _ellipse(draw, x, cy, 0.3 * self.sw, 0.35 * self.sw, idn.top_secondary)

    def _arm(self, draw: ImageDraw.ImageDraw, shoulder: Point, angle: float, far: bool) -> None:
        idn, P = self.ident, self.P
        length = 0.37 * P
        if self.side:
            hand = (shoulder[0] + self.facing * length * math.sin(angle), shoulder[1] + length * math.cos(angle))
        else:
            hand = (shoulder[0] + 0.02 * P * math.copysign(1, shoulder[0] - self.cx),
                    shoulder[1] + length * (1 - 0.08 * abs(angle)))
        tone = 0.78 if far else 1.0
        sleeve = idn.top if idn.long_sleeves else idn.skin
        draw.polygon(_limb(shoulder, hand, self.aw * 1.1, self.aw * 0.8), fill=_shade(sleeve, tone))
        if not idn.long_sleeves:
            elbow = (shoulder[0] + 0.4 * (hand[0] - shoulder[0]), shoulder[1] + 0.4 * (hand[1] - shoulder[1]))
            draw.polygon(_limb(shoulder, elbow, self.aw * 1.25, self.aw * 1.15), fill=_shade(idn.top, tone))
        _ellipse(draw, hand[0], hand[1], self.aw * 0.55, self.aw * 0.6, _shade(idn.skin, tone))

    def _arms(self, draw: ImageDraw.ImageDraw, far: bool) -> None:
        swing = 0.5 * math.sin(self.phase)
        if self.side:
            self._arm(draw, (self.cx, self.y_sh + 0.02 * self.P), swing if far else -swing, far)
        elif not far:
            x = self.sw + 0.45 * self.aw
            self._arm(draw, (self.cx - x, self.y_sh + 0.02 * self.P), swing, False)
            self._arm(draw, (self.cx + x, self.y_sh + 0.02 * self.P), -swing, False)

    def _head(self, draw: ImageDraw.ImageDraw) -> None:
        idn, P = self.ident, self.P
        hh = idn.head * P
        rx, ry = hh * (0.42 if self.side else 0.38), hh * 0.5
        cx = self.cx + 0.015 * P * self.facing
        cy = self.y0 + ry
        hair = idn.hair_colour
        if idn.hair == "long":  # hair falls behind the head and neck, past the shoulders from behind
            drop = 0.12 * P if self.view == "back" else 0.07 * P
            back_dx = -self.facing * 0.3 * rx
            draw.rectangle((cx + back_dx - 1.05 * rx, cy, cx + back_dx + 1.05 * rx, self.y_sh + drop), fill=hair)
        if self.view != "back" or idn.hair != "long":
            neck = (self.cx - 0.3 * rx, cy, self.cx + 0.3 * rx, self.y_sh + 0.01 * P)
            draw.rectangle(neck, fill=_shade(idn.skin, 0.9))
        skin_visible = self.view != "back" or idn.hair == "bald"
        _ellipse(draw, cx, cy, rx, ry, idn.skin if skin_visible else hair)
        if idn.hair != "bald":
            if self.side:  # the back half of the head, and the crown
                draw.pieslice((cx - rx, cy - ry, cx + rx, cy + ry), 90 if self.facing > 0 else -90,
                              270 if self.facing > 0 else 90, fill=hair)
            _ellipse(draw, cx, cy - 0.55 * ry, rx * 1.02, ry * 0.5, hair)
        if idn.hat is not None:
            draw.chord((cx - 1.08 * rx, cy - 1.15 * ry, cx + 1.08 * rx, cy + 0.35 * ry), 180, 360, fill=idn.hat)
            if self.view != "back":
                brim = 0.9 * rx
                bx = cx + self.facing * 0.8 * rx
                draw.rectangle((bx - brim * (0.5 if self.side else 1), cy - 0.45 * ry,
                                bx + brim * (0.5 if self.side else 1), cy - 0.3 * ry), fill=_shade(idn.hat, 0.8))
        if idn.glasses and self.view != "back":
            gy = cy - 0.05 * ry
            if self.side:
                gx = cx + self.facing * 0.55 * rx
                draw.rectangle((gx - 0.35 * rx, gy - 0.08 * ry, gx + 0.45 * rx, gy + 0.1 * ry), fill=(20, 20, 24))
            else:
                draw.rectangle((cx - 0.8 * rx, gy - 0.1 * ry, cx + 0.8 * rx, gy + 0.12 * ry), fill=(20, 20, 24))

    def _backpack(self, draw: ImageDraw.ImageDraw) -> None:
        """Front: two straps. Back: the pack itself. Side: the pack sticking out behind."""
        pack = self.ident.backpack
        assert pack is not None
        P, top, bottom = self.P, self.y_sh + 0.02 * self.P, self.y_sh + 0.58 * (self.y_hip - self.y_sh) + 0.06 * self.P
        if self.view == "back":
            w = 0.78 * self.sw
            draw.rounded_rectangle((self.cx - w, top, self.cx + w, bottom), radius=0.02 * P, fill=pack)
            draw.rectangle((self.cx - 0.6 * w, bottom - 0.35 * (bottom - top), self.cx + 0.6 * w, bottom - 0.04 * P),
                           fill=_shade(pack, 0.75))
        elif self.view == "front":
            for sx in (-0.55, 0.55):
                x = self.cx + sx * self.sw
                draw.rectangle((x - 0.018 * P, self.y_sh, x + 0.018 * P, bottom - 0.04 * P), fill=_shade(pack, 0.85))
        else:
            x0 = self.cx - self.facing * self.sw
            x1 = x0 - self.facing * 0.11 * P
            draw.rounded_rectangle((min(x0, x1), top, max(x0, x1), bottom), radius=0.02 * P, fill=pack)

    def _bag(self, draw: ImageDraw.ImageDraw, near_only: bool | None) -> None:
        """A shoulder bag on ``bag_side``. ``near_only``: side view, draw only if it is on the near/far side."""
        idn, P = self.ident, self.P
        bag = idn.bag
        assert bag is not None
        if self.side:
            near = (idn.bag_side == self.facing)  # facing right, a right-side bag is on the camera's side
            if near_only is not None and near != near_only:
                return
            x = self.cx - self.facing * 0.02 * P
        else:
            x = self.cx + idn.bag_side * self.mirror * (self.hw + 0.03 * P)
            shoulder = (self.cx - idn.bag_side * self.mirror * 0.7 * self.sw, self.y_sh)
            draw.line([shoulder, (x, self.y_hip - 0.02 * P)], fill=_shade(bag, 0.7), width=max(1, round(0.022 * P)))
        w, h = 0.065 * P, 0.1 * P
        draw.rounded_rectangle((x - w, self.y_hip - 0.04 * P, x + w, self.y_hip - 0.04 * P + h),
                               radius=0.015 * P, fill=bag)

    def draw(self, layer: Image.Image) -> None:
        draw = ImageDraw.Draw(layer)
        idn = self.ident
        if self.side:
            self._arms(draw, far=True)
            self._legs(draw, far=True)
            if idn.bag is not None:
                self._bag(draw, near_only=False)
        self._legs(draw, far=False)
        self._pelvis(draw)
        if idn.backpack is not None and self.side:  # behind the torso
            self._backpack(draw)
        self._torso(layer, draw)
        if idn.backpack is not None and self.view == "back":  # over the torso
            self._backpack(draw)
        self._arms(draw, far=False)
        self._head(draw)
        if idn.backpack is not None and self.view == "front":  # the straps, over arms and torso
            self._backpack(draw)
        if idn.bag is not None:
            self._bag(draw, near_only=True if self.side else None)


def render_person(size: tuple[int, int], ident: Identity, view: View, phase: float,
                  at: Placement) -> tuple[np.ndarray, np.ndarray]:
    """Draw ``ident`` on a transparent (height, width) canvas; return shaded RGB and alpha, float32 in [0, 1].

    The shading (darker towards the silhouette's edges, lighter at the top) is what makes flat colour
    fields read as a rounded body, and it varies with placement, as real shading does.
    """
    h, w = size
    layer = Image.new("RGBA", (w, h), (0, 0, 0, 0))
    _Figure(ident, view, phase, at).draw(layer)
    rgba = np.asarray(layer)
    half = 0.2 * at.height * ident.build
    xs = (np.arange(w, dtype=np.float32) - at.cx) / half
    ys = (np.arange(h, dtype=np.float32) - at.top) / at.height
    # The shade carries the 1/255 of the uint8 → [0, 1] conversion: one float pass over the pixels.
    shade = np.clip(1.0 - 0.22 * xs[None, :] ** 2, 0.62, 1.0) * ((1.06 - 0.12 * ys[:, None]) / 255.0)
    return rgba[..., :3] * shade[..., None], rgba[..., 3] * np.float32(1 / 255)


def render_occluder(size: tuple[int, int], rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """A static object in front of the person: a bollard, a railing, a bin or a car's edge."""
    h, w = size
    layer = Image.new("RGBA", (w, h), (0, 0, 0, 0))
    draw = ImageDraw.Draw(layer)
    grey = int(rng.integers(40, 200))
    tint = rng.integers(-30, 31, size=3)
    colour = tuple(int(np.clip(grey + t, 0, 255)) for t in tint) + (255,)
    kind = int(rng.integers(4))
    if kind == 0:  # a low object along the bottom edge
        top = h * rng.uniform(0.72, 0.88)
        draw.rectangle((0, top, w, h), fill=colour)
    elif kind == 1:  # a post or pillar at one side
        x = w * rng.choice((rng.uniform(-0.05, 0.25), rng.uniform(0.75, 1.05)))
        half = w * rng.uniform(0.08, 0.18)
        draw.rectangle((x - half, 0, x + half, h), fill=colour)
    elif kind == 2:  # a railing across the legs
        y = h * rng.uniform(0.55, 0.75)
        draw.rectangle((0, y, w, y + h * 0.03), fill=colour)
        for x in np.linspace(0, w, int(rng.integers(2, 5))):
            draw.rectangle((x - w * 0.03, y, x + w * 0.03, h), fill=colour)
    else:  # a rounded object in a bottom corner (a bin, a car's bonnet)
        cx = w * rng.choice((0.0, 1.0))
        r = w * rng.uniform(0.35, 0.6)
        draw.ellipse((cx - r, h - 0.8 * r, cx + r, h + 1.2 * r), fill=colour)
    arr = np.asarray(layer, dtype=np.float32) / 255.0
    return arr[..., :3], arr[..., 3]
