"""The synthetic pedestrian generator: several Market-1501-format domains from one seed.

    generate(out, domains=4, seed=0)  ─►  out/manifest.json
                                          out/<domain>/bounding_box_train/0007_c2s3_012345_01.jpg ...
                                          out/<domain>/query/...
                                          out/<domain>/bounding_box_test/...   (with 0000_ distractors
                                                                               and -1_ junk, as Market)

People are drawn from one appearance distribution shared by every domain (so what one domain teaches
transfers to the others) but are disjoint across domains (globally unique person ids); cameras are
drawn per domain and differ in scene, light, colour, blur, resolution, viewpoint and occlusion.
Domain sizes are unbalanced like FedReIDBench's nine datasets (:mod:`secfed.data.synth_domains`).

Every random choice derives from (seed, purpose, domain, person, camera, image) through
:func:`secfed.seeding.derive_seed`, so the same seed writes byte-identical files and domain 3 does
not depend on domain 2. Output is written into ``OUT.tmp-XXXX`` and renamed into place at the end,
so an interrupted run leaves no half-written dataset behind.
"""

from __future__ import annotations

import json
import math
import os
import secrets
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

from PIL import Image

from secfed.data.errors import DataError
from secfed.data.synth_camera import Camera, Scene, sample_camera
from secfed.data.synth_domains import MAX_PID, PRESETS, DomainPlan, pid_offsets, plan_domain
from secfed.data.synth_shot import CameraRig, ShotRenderer
from secfed.seeding import numpy_rng

GENERATOR_VERSION = 2  # bump whenever the same seed would write different pixels (cache keys use it)
JPEG_QUALITY = 92
SPLIT_DIRS = {"train": "bounding_box_train", "query": "query", "gallery": "bounding_box_test"}

Progress = Callable[[str, int, int], None]  # (domain name, images written, images in the domain)


class SynthOptionError(ValueError):
    """An invalid generator option. ``option`` names it as the CLI spells it (without dashes)."""

    def __init__(self, option: str, message: str) -> None:
        self.option = option
        super().__init__(f"{option}: {message}")


@dataclass(frozen=True)
class SynthDomain:
    """One generated domain as the manifest records it."""

    name: str
    like: str  # the benchmark dataset whose shape it echoes
    cameras: tuple[Camera, ...]
    pids: tuple[int, int]  # first and last person id of this domain (train and test ids interleave)
    train_ids: int
    train_images: int
    test_ids: int
    query_images: int
    gallery_images: int  # including distractors and junk
    distractors: int
    junk: int


@dataclass(frozen=True)
class SynthManifest:
    """What ``OUT/manifest.json`` holds: enough to regenerate the data and to check a cache."""

    version: int
    seed: int
    scale: float
    height: int
    width: int
    domains: tuple[SynthDomain, ...]

    @property
    def train_images(self) -> int:
        return sum(d.train_images for d in self.domains)

    def to_json(self) -> str:
        return json.dumps({"generator": "secfed.data.synth", **asdict(self)}, indent=2, sort_keys=True) + "\n"

    @classmethod
    def from_json(cls, text: str) -> SynthManifest:
        raw = json.loads(text)
        if raw.pop("generator", None) != "secfed.data.synth":
            raise ValueError("not a secfed synthetic-data manifest")
        domains = tuple(
            SynthDomain(**{**d, "cameras": tuple(_camera(c) for c in d["cameras"]), "pids": tuple(d["pids"])})
            for d in raw.pop("domains")
        )
        return cls(**raw, domains=domains)

    @classmethod
    def load(cls, root: Path) -> SynthManifest:
        """Read ``root/manifest.json``; a missing or malformed file is a :class:`DataError` naming it."""
        path = Path(root) / "manifest.json"
        try:
            return cls.from_json(path.read_text())
        except FileNotFoundError:
            raise DataError(path, "no manifest: not a secfed synthetic dataset (make one with `secfed data synth`)") \
                from None
        except (ValueError, KeyError, TypeError) as exc:
            raise DataError(path, f"malformed manifest ({exc})") from None


def _camera(raw: dict) -> Camera:
    """A Camera from its JSON form (JSON has lists where the dataclass holds tuples)."""
    scene = raw["scene"]
    return Camera(**{
        **raw,
        "scene": Scene(**{**scene, "wall_colour": tuple(scene["wall_colour"]),
                          "floor_colour": tuple(scene["floor_colour"])}),
        "white_balance": tuple(raw["white_balance"]),
        "haze_colour": tuple(raw["haze_colour"]),
        "views": tuple(raw["views"]),
    })


def check_options(domains: int, seed: int, scale: float, height: int, width: int) -> None:
    """Raise :class:`SynthOptionError` naming the first bad option."""
    if isinstance(domains, bool) or not isinstance(domains, int) or not 1 <= domains <= len(PRESETS):
        raise SynthOptionError("domains", f"must be an integer from 1 to {len(PRESETS)}, got {domains!r}")
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**63:
        raise SynthOptionError("seed", f"must be an integer from 0 to 2**63-1, got {seed!r}")
    if not isinstance(scale, (int, float)) or not math.isfinite(scale) or scale <= 0:
        raise SynthOptionError("scale", f"must be a positive number, got {scale!r}")
    total = sum(sum(p.ids(scale)) for p in PRESETS[:domains])
    if total > MAX_PID:
        raise SynthOptionError("scale", f"{scale:g} gives {total} person ids; Market-1501 names hold at most {MAX_PID}")
    if isinstance(height, bool) or not isinstance(height, int) or not 32 <= height <= 1024:
        raise SynthOptionError("height", f"must be an integer from 32 to 1024 pixels, got {height!r}")
    if isinstance(width, bool) or not isinstance(width, int) or not 16 <= width <= 512:
        raise SynthOptionError("width", f"must be an integer from 16 to 512 pixels, got {width!r}")


def _prepare_out(out: Path) -> Path:
    """Refuse a non-empty OUT; return a fresh temporary folder beside it."""
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        what = "a file" if not out.is_dir() else "a non-empty directory"
        raise FileExistsError(f"{out} is {what}; give a new or empty directory")
    out.parent.mkdir(parents=True, exist_ok=True)
    while True:  # not tempfile.mkdtemp: its 0700 mode would stick to the dataset; mkdir honours the umask
        tmp = out.parent / f"{out.name}.tmp-{secrets.token_hex(4)}"
        try:
            tmp.mkdir()
            return tmp
        except FileExistsError:
            continue


def _write_domain(root: Path, plan: DomainPlan, renderer: ShotRenderer, progress: Progress | None) -> None:
    for folder in SPLIT_DIRS.values():
        (root / folder).mkdir(parents=True)
    total = len(plan.shots)
    for done, shot in enumerate(plan.shots, 1):
        path = root / SPLIT_DIRS[shot.split] / shot.filename
        Image.fromarray(renderer.render(shot)).save(path, "JPEG", quality=JPEG_QUALITY)
        if progress is not None:
            progress(plan.preset.name, done, total)


def generate(out: Path, *, domains: int = 4, seed: int = 0, scale: float = 1.0, height: int = 128,
             width: int = 64, progress: Progress | None = None) -> SynthManifest:
    """Write ``domains`` synthetic Market-1501-format datasets and a manifest under ``out``.

    ``out`` must not exist or be an empty directory. ``scale`` multiplies the number of ids of every
    domain; ``height`` × ``width`` is the size of the written images. ``progress`` is called after
    each image with (domain name, images written, images in that domain).
    """
    check_options(domains, seed, scale, height, width)
    out = Path(out)
    tmp = _prepare_out(out)
    try:
        presets = PRESETS[:domains]
        offsets = pid_offsets(presets, scale)
        written = []
        for index, (preset, first_pid) in enumerate(zip(presets, offsets)):
            cameras = tuple(sample_camera(numpy_rng(seed, "synth/camera", index, c), preset.style, c)
                            for c in range(preset.cameras))
            rigs = [CameraRig.build(cam, (height, width), seed, index, c) for c, cam in enumerate(cameras)]
            plan = plan_domain(seed, index, preset, scale, first_pid)
            _write_domain(tmp / preset.name, plan, ShotRenderer(seed, index, rigs, (height, width)), progress)
            written.append(SynthDomain(
                name=preset.name, like=preset.like, cameras=cameras,
                pids=(first_pid + 1, first_pid + len(plan.train_pids) + len(plan.test_pids)),
                train_ids=len(plan.train_pids), train_images=plan.count("train"),
                test_ids=len(plan.test_pids), query_images=plan.count("query"),
                gallery_images=plan.count("gallery"), distractors=plan.count("gallery", "distractor"),
                junk=plan.count("gallery", "junk"),
            ))
        manifest = SynthManifest(GENERATOR_VERSION, seed, float(scale), height, width, tuple(written))
        (tmp / "manifest.json").write_text(manifest.to_json())
        if out.is_dir():
            out.rmdir()  # it was checked empty; fails loudly if someone wrote into it meanwhile
        os.rename(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return manifest


def cached(root: Path, *, domains: int = 4, seed: int = 0, scale: float = 1.0, height: int = 128,
           width: int = 64, progress: Progress | None = None) -> tuple[Path, SynthManifest]:
    """The synthetic dataset for these options under ``root``, generated on first use.

    The folder name encodes the generator version and every option, so a cache never serves data
    made by other settings or an older generator. Safe against concurrent callers: the loser of a
    race reads the winner's data.
    """
    check_options(domains, seed, scale, height, width)
    path = Path(root) / f"synth-v{GENERATOR_VERSION}-d{domains}-seed{seed}-x{scale:g}-{height}x{width}"
    if not (path / "manifest.json").is_file():
        try:
            generate(path, domains=domains, seed=seed, scale=scale, height=height, width=width, progress=progress)
        except OSError:  # another process got there first (or OUT is unusable: then re-raise)
            if not (path / "manifest.json").is_file():
                raise
    return path, SynthManifest.load(path)
