"""The synthetic pedestrian generator: several Market-1501-format domains from one seed.

    generate(out, domains=4, seed=0)  ─►  out/manifest.json
                                          out/<domain>/bounding_box_train/0007_c2s3_012345_01.jpg ...
                                          out/<domain>/query/...
                                          out/<domain>/bounding_box_test/...   (with 0000_ distractors
                                                                               and -1_ junk, as Market)
    generate(..., unseen=2)           ─►  two more domains, the presets after the trained ones, in
                                          the same format; the manifest lists them as `unseen`
                                          (evaluate on them, never train on them)
    generate(..., public=400)         ─►  out/public/0731_c4s2_001234_01.jpg ... 400 images of people
                                          no domain has, under ten cameras in every domain's style:
                                          an unlabelled set for knowledge distillation (format
                                          "unlabeled"), like CUHK02 in FedReIDBench

People are drawn from one appearance distribution shared by every domain (so what one domain teaches
transfers to the others) but are disjoint across domains (globally unique person ids); cameras are
drawn per domain and differ in scene, light, colour, blur, resolution, viewpoint and occlusion.
Domain sizes are unbalanced like FedReIDBench's nine datasets (:mod:`secfed.data.synth_domains`).

Every random choice derives from (seed, purpose, domain, person, camera, image) through
:func:`secfed.seeding.derive_seed`, so the same seed writes byte-identical files, domain 3 does
not depend on domain 2, an unseen domain is the very domain that ``domains`` one larger would
train on, and the public set is the same whatever the domains. Person ids are unique across all
of them: a domain's ids follow from the preset order, the public set's come after all nine
presets'. Output is written into ``OUT.tmp-XXXX`` and renamed into place at the end,
so an interrupted run leaves no half-written dataset behind; the folder a killed run leaves is
removed by the next run into the same OUT (a live run's is locked while written).
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

from PIL import Image

from secfed import locking
from secfed.data.errors import DataError
from secfed.data.synth_camera import Camera, Scene, sample_camera
from secfed.data.synth_domains import (
    PRESETS,
    PUBLIC_CAMERAS,
    DomainPlan,
    Shot,
    pid_offsets,
    plan_domain,
    plan_public,
)
from secfed.data.synth_shot import CameraRig, ShotRenderer
from secfed.errors import printable
from secfed.seeding import numpy_rng

GENERATOR_VERSION = 3  # bump whenever the same seed would write different pixels (cache keys use it)
JPEG_QUALITY = 92
SPLIT_DIRS = {"train": "bounding_box_train", "query": "query", "gallery": "bounding_box_test"}
PUBLIC_DIR = "public"
PUBLIC_FORMAT = "unlabeled"  # the registry format that reads OUT/public
PUBLIC_DOMAIN_INDEX = 99  # the public set's index in every seed purpose (domains are 0..8)

# The valid options, inclusive, for every entry point (`secfed data synth`, `secfed train`, the API):
# any combination in range is valid, except that domains + unseen may not exceed the nine presets.
SYNTH_DOMAINS_RANGE = (1, len(PRESETS))
UNSEEN_RANGE = (0, len(PRESETS) - 1)
SCALE_RANGE = (0.05, 4.0)  # at 4, all nine presets and the largest public set fit four-digit person ids


def _scale_help() -> str:
    """What a scale does, with the first preset's sizes: its test side is larger by design (one run's
    rank-1 must be trustworthy), so a scaled domain still has more test ids than train ids."""
    first = PRESETS[0]
    (train, test), (small_train, small_test) = first.ids(1.0), first.ids(0.2)
    return (f"Multiplies every domain's person ids, train and test alike (each rounded, at least 2); test sides are "
            f"larger by design: {first.name} has {train} train and {test} test ids at 1, {small_train} and "
            f"{small_test} at 0.2.")


SCALE_HELP = _scale_help()  # `secfed data synth --scale` and `secfed train --synth-scale` say the same
PUBLIC_RANGE = (0, 2000)
HEIGHT_RANGE = (32, 1024)
WIDTH_RANGE = (16, 512)
SEED_RANGE = (0, 2**63 - 1)
# Public images for distillation when a method needs them (MM'20 Alg. 2): about the train size of
# the largest default domain (~450), so one distillation step (every client's forward pass on it,
# then the server's fine-tuning) costs no more than one local epoch of the largest client on a CPU;
# CUHK02, the paper's public set, holds 4 images per person as this one does.
DEFAULT_PUBLIC_IMAGES = 400

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
    gallery_images: int  # files in bounding_box_test: including distractors and junk
    distractors: int
    junk: int


@dataclass(frozen=True)
class SynthPublic:
    """The unlabelled public set as the manifest records it: ``load_dataset(OUT / folder, format)``."""

    folder: str  # its folder under OUT
    format: str  # the registry format that reads it
    cameras: tuple[Camera, ...]
    pids: tuple[int, int]  # first and last person id (kept in the file names, unused by distillation)
    ids: int
    images: int


@dataclass(frozen=True)
class SynthManifest:
    """What ``OUT/manifest.json`` holds: enough to regenerate the data and to check a cache.

    ``domains`` are the clients' domains (train on them, evaluate on them); ``unseen`` are
    for evaluation only; ``public`` is the unlabelled distillation set, or None.
    """

    version: int
    seed: int
    scale: float
    height: int
    width: int
    domains: tuple[SynthDomain, ...]
    unseen: tuple[SynthDomain, ...] = ()
    public: SynthPublic | None = None

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

        def domain(d: dict) -> SynthDomain:
            return SynthDomain(**{**d, "cameras": tuple(_camera(c) for c in d["cameras"]), "pids": tuple(d["pids"])})

        domains = tuple(domain(d) for d in raw.pop("domains"))
        unseen = tuple(domain(d) for d in raw.pop("unseen", ()))
        public = raw.pop("public", None)
        if public is not None:
            public = SynthPublic(**{**public, "cameras": tuple(_camera(c) for c in public["cameras"]),
                                    "pids": tuple(public["pids"])})
        return cls(**raw, domains=domains, unseen=unseen, public=public)

    @classmethod
    def load(cls, root: Path) -> SynthManifest:
        """Read ``root/manifest.json``; a missing or malformed file is a :class:`DataError` naming it."""
        path = Path(root) / "manifest.json"
        try:
            manifest = cls.from_json(path.read_text())
        except FileNotFoundError:
            raise DataError(path, "no manifest: not a secfed synthetic dataset (make one with `secfed data synth`)") \
                from None
        except (ValueError, KeyError, TypeError, RecursionError, UnicodeDecodeError) as exc:
            raise DataError(path, f"malformed manifest ({type(exc).__name__}: {str(exc)[:200]})") from None
        except OSError as exc:
            raise DataError(path, f"cannot read the manifest: {exc.strerror or exc}") from None
        folders = [d.name for d in (*manifest.domains, *manifest.unseen)] + (
            [manifest.public.folder] if manifest.public is not None else [])
        strange = [name for name in folders if not isinstance(name, str) or not _FOLDER_NAME.fullmatch(name)
                   or name in (".", "..")]
        if strange:  # the folders are read under root: a name must not lead out of it (found by review)
            raise DataError(path, f"malformed manifest: {strange[0]!r} is not a folder name")
        from secfed.data.registry import FORMATS  # registry reads synthetic folders too: imported late

        # (found by review: an unknown format was an UnknownFormatError traceback, a list one a TypeError)
        if manifest.public is not None and (not isinstance(manifest.public.format, str)
                                            or manifest.public.format not in FORMATS):
            raise DataError(path, "malformed manifest: the public set's format "
                                  f"{printable(str(manifest.public.format))!r} is not one secfed reads")
        return manifest


_FOLDER_NAME = re.compile(r"[A-Za-z0-9_.-]+", re.ASCII)  # a domain's or the public set's folder under OUT


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


def _check_int(option: str, value: object, bounds: tuple[int, int], unit: str = "") -> None:
    lo, hi = bounds
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise SynthOptionError(option, f"must be an integer from {lo} to {hi:,}{unit}, got {value!r}")


def check_options(*, domains: int, seed: int, scale: float, height: int, width: int, unseen: int = 0,
                  public: int = 0) -> None:
    """Raise :class:`SynthOptionError` naming the first bad option (ranges: ``*_RANGE`` above)."""
    _check_int("domains", domains, SYNTH_DOMAINS_RANGE)
    _check_int("unseen", unseen, UNSEEN_RANGE)
    if domains + unseen > len(PRESETS):
        raise SynthOptionError("unseen", f"{domains} domains + {unseen} unseen is more than the "
                                         f"{len(PRESETS)} presets ({', '.join(p.name for p in PRESETS)})")
    _check_int("seed", seed, SEED_RANGE)
    lo, hi = SCALE_RANGE
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not lo <= scale <= hi:
        raise SynthOptionError("scale", f"must be a number from {lo:g} to {hi:g}, got {scale!r}")
    _check_int("public", public, PUBLIC_RANGE, " images")
    _check_int("height", height, HEIGHT_RANGE, " pixels")
    _check_int("width", width, WIDTH_RANGE, " pixels")


_WRITING = ".writing"  # in OUT.tmp-XXXXXXXX: locked while generate() writes the folder, removed before the rename
_TMP_NAME = re.compile(r"\.tmp-[0-9a-f]{8}")


def _prepare_out(out: Path) -> tuple[Path, int]:
    """Refuse a non-empty OUT or a link; remove what killed runs left beside it; return a fresh
    temporary folder beside it and the descriptor that marks it as being written."""
    if out.is_symlink():  # the finished folder is renamed onto OUT: a link would be replaced, or stop it (review)
        raise FileExistsError(f"{out} is a symbolic link; give the folder itself")
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        what = "a file" if not out.is_dir() else "a non-empty directory"
        raise FileExistsError(f"{out} is {what}; give a new or empty directory")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        _remove_abandoned(out)
        while True:  # not tempfile.mkdtemp: its 0700 mode would stick to the dataset; mkdir honours the umask
            tmp = out.parent / f"{out.name}.tmp-{secrets.token_hex(4)}"
            try:
                tmp.mkdir()
                return tmp, locking.create_held(tmp / _WRITING)
            except FileExistsError:
                continue
    except OSError as exc:  # a read-only or missing mount, a file in the way
        raise SynthOptionError("OUT", f"cannot make {out}: {exc.strerror or exc}") from None


def _remove_abandoned(out: Path) -> None:
    """The OUT.tmp-* folders a killed ``generate`` left (found by review: a SIGKILLed ``data synth`` left
    them for good); a live writer's holds its lock, and a folder without one is not touched."""
    prefix = out.name + ".tmp-"
    for tmp in out.parent.iterdir():
        if tmp.name.startswith(prefix) and _TMP_NAME.fullmatch(tmp.name[len(out.name):]) \
                and locking.abandoned(tmp / _WRITING):
            shutil.rmtree(tmp, ignore_errors=True)


def _write_shots(root: Path, name: str, shots: tuple[Shot, ...], folders: dict[str, str],
                 renderer: ShotRenderer, progress: Progress | None) -> None:
    for folder in set(folders.values()):
        (root / folder).mkdir(parents=True, exist_ok=True)
    for done, shot in enumerate(shots, 1):
        path = root / folders[shot.split] / shot.filename
        Image.fromarray(renderer.render(shot)).save(path, "JPEG", quality=JPEG_QUALITY)
        if progress is not None:
            progress(name, done, len(shots))


def _write_domain(tmp: Path, seed: int, index: int, scale: float, first_pid: int, size: tuple[int, int],
                  progress: Progress | None) -> SynthDomain:
    preset = PRESETS[index]
    cameras = tuple(sample_camera(numpy_rng(seed, "synth/camera", index, c), preset.style, c)
                    for c in range(preset.cameras))
    rigs = [CameraRig.build(cam, size, seed, index, c) for c, cam in enumerate(cameras)]
    plan: DomainPlan = plan_domain(seed, index, preset, scale, first_pid)
    _write_shots(tmp / preset.name, preset.name, plan.shots, SPLIT_DIRS, ShotRenderer(seed, index, rigs, size),
                 progress)
    return SynthDomain(
        name=preset.name, like=preset.like, cameras=cameras,
        pids=(first_pid + 1, first_pid + len(plan.train_pids) + len(plan.test_pids)),
        train_ids=len(plan.train_pids), train_images=plan.count("train"),
        test_ids=len(plan.test_pids), query_images=plan.count("query"),
        gallery_images=plan.count("gallery"), distractors=plan.count("gallery", "distractor"),
        junk=plan.count("gallery", "junk"),
    )


def _write_public(tmp: Path, seed: int, images: int, first_pid: int, size: tuple[int, int],
                  progress: Progress | None) -> SynthPublic:
    """The public set's cameras take the styles of all nine presets in turn: a mix of domains."""
    cameras = tuple(sample_camera(numpy_rng(seed, "synth/camera", PUBLIC_DOMAIN_INDEX, c),
                                  PRESETS[c % len(PRESETS)].style, c) for c in range(PUBLIC_CAMERAS))
    rigs = [CameraRig.build(cam, size, seed, PUBLIC_DOMAIN_INDEX, c) for c, cam in enumerate(cameras)]
    shots = plan_public(seed, images, first_pid)
    _write_shots(tmp / PUBLIC_DIR, PUBLIC_DIR, shots, {"train": "."},
                 ShotRenderer(seed, PUBLIC_DOMAIN_INDEX, rigs, size), progress)
    pids = sorted({s.pid for s in shots})
    return SynthPublic(PUBLIC_DIR, PUBLIC_FORMAT, cameras, (pids[0], pids[-1]), len(pids), len(shots))


def generate(out: Path, *, domains: int = 4, seed: int = 0, scale: float = 1.0, height: int = 128,
             width: int = 64, unseen: int = 0, public: int = 0, progress: Progress | None = None) -> SynthManifest:
    """Write ``domains`` synthetic Market-1501-format datasets and a manifest under ``out``.

    ``out`` must not exist or be an empty directory. ``scale`` multiplies the number of ids of every
    domain; ``height`` × ``width`` is the size of the written images. ``unseen`` more domains (the
    presets after the trained ones) are written for evaluation only; ``public`` > 0 also writes
    that many unlabelled images of new people to ``out/public``. ``progress`` is called after each
    image with (domain name, images written, images in that domain).
    """
    check_options(domains=domains, seed=seed, scale=scale, height=height, width=width, unseen=unseen,
                  public=public)
    if Path(out).is_symlink():  # (a link is refused by _prepare_out; resolving below would follow it)
        raise FileExistsError(f"{out} is a symbolic link; give a new or empty directory")
    # its folder resolved (.. and links), its own name kept: "d/../d" and a link to the current folder were
    # renamed onto paths that no longer existed (found by review)
    out = Path(out).absolute().parent.resolve() / Path(out).absolute().name
    try:  # the loaders refuse names that are not UTF-8: refused before the data is made, not after (review)
        str(out).encode("utf-8")
    except UnicodeEncodeError:
        raise SynthOptionError("OUT", f"{printable(out)}: the name is not valid UTF-8; rename it") from None
    if out == Path.cwd().resolve():  # it is replaced whole at the end: not the folder a shell stands in (review)
        raise SynthOptionError("OUT", f"{printable(out)} is the current directory: give a new folder (e.g. ./synth)")
    tmp, writing = _prepare_out(out)
    try:
        offsets = pid_offsets(PRESETS, scale)
        written = [_write_domain(tmp, seed, index, scale, offsets[index], (height, width), progress)
                   for index in range(domains + unseen)]
        public_set = None
        if public:
            after_all_presets = sum(sum(p.ids(scale)) for p in PRESETS)
            public_set = _write_public(tmp, seed, public, after_all_presets, (height, width), progress)
        manifest = SynthManifest(GENERATOR_VERSION, seed, float(scale), height, width, tuple(written[:domains]),
                                 tuple(written[domains:]), public_set)
        (tmp / "manifest.json").write_text(manifest.to_json())
        if out.is_dir():
            out.rmdir()  # it was checked empty; fails loudly if someone wrote into it meanwhile
        os.unlink(tmp / _WRITING)  # the lock stays held (the descriptor) until the folder is OUT
        os.rename(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    finally:
        os.close(writing)
    return manifest


def cached(root: Path, *, domains: int = 4, seed: int = 0, scale: float = 1.0, height: int = 128,
           width: int = 64, unseen: int = 0, public: int = 0,
           progress: Progress | None = None) -> tuple[Path, SynthManifest]:
    """The synthetic dataset for these options under ``root``, generated on first use.

    The folder name encodes the generator version and every option, so a cache never serves data
    made by other settings or an older generator. Safe against concurrent callers: the loser of a
    race reads the winner's data.
    """
    check_options(domains=domains, seed=seed, scale=scale, height=height, width=width, unseen=unseen,
                  public=public)
    exact = f"{scale:g}" if float(f"{scale:g}") == scale else repr(scale)  # 0.15 and 0.1500001 are two datasets
    name = f"synth-v{GENERATOR_VERSION}-d{domains}-u{unseen}-p{public}-seed{seed}-x{exact}-{height}x{width}"
    path = Path(root) / name
    if not (path / "manifest.json").is_file():
        try:
            generate(path, domains=domains, seed=seed, scale=scale, height=height, width=width, unseen=unseen,
                     public=public, progress=progress)
        except (OSError, SynthOptionError) as exc:  # another process got there first (or OUT is unusable)
            if not (path / "manifest.json").is_file():
                why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
                raise DataError(path, f"cannot hold the synthetic data ({why}); delete it, or set SECFED_CACHE "
                                      "to a folder of your own") from None
    manifest = SynthManifest.load(path)
    made = (manifest.version, manifest.seed, manifest.scale, manifest.height, manifest.width,
            [d.name for d in (*manifest.domains, *manifest.unseen)], len(manifest.domains),
            manifest.public.images if manifest.public is not None else 0)
    asked = (GENERATOR_VERSION, seed, scale, height, width, [p.name for p in PRESETS[:domains + unseen]], domains,
             public)
    if made != asked:  # a cache is read, not trusted (found by review, twice: seed, then version and public count)
        raise DataError(path / "manifest.json", "holds synthetic data made with other options than its folder's "
                                                "name says; delete the folder and the data is made again")
    return path, manifest
