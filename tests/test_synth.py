"""The synthetic pedestrian generator: format, protocol, balance, determinism, CLI."""

from __future__ import annotations

import functools
import json
import math
import os
import re
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from PIL import Image

from secfed.cli.main import cli
from secfed.data.errors import DataError
from secfed.data.market import load_market1501
from secfed.data.registry import load_dataset
from secfed.data.synth import (
    GENERATOR_VERSION,
    PUBLIC_RANGE,
    SCALE_RANGE,
    SPLIT_DIRS,
    SYNTH_DOMAINS_RANGE,
    UNSEEN_RANGE,
    SynthManifest,
    SynthOptionError,
    cached,
    check_options,
    generate,
)
from secfed.data.synth_camera import Camera, Scene, expose
from secfed.data.synth_domains import MAX_PID, PRESETS, Shot, _valid_queries, pid_offsets, plan_domain
from secfed.data.synth_identity import Identity, sample_identity
from secfed.data.synth_render import Placement, render_person

MARKET_NAME = re.compile(r"^(-1|\d{4})_c(\d)s(\d)_(\d{6})_(\d{2})\.jpg$")
TORCHREID_PATTERN = re.compile(r"([-\d]+)_c(\d)")  # what torchreid's Market-1501 loader searches for

SMALL = dict(domains=4, seed=3, scale=0.25, height=64, width=32)


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, SynthManifest]:
    out = tmp_path_factory.mktemp("synth") / "data"
    return out, generate(out, **SMALL)


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _parse(path: Path) -> tuple[int, int]:
    m = MARKET_NAME.match(path.name)
    assert m is not None, path.name
    return int(m[1]), int(m[2]) - 1


# --- primitives ---------------------------------------------------------------------------------
def test_shot_filename_known_answers() -> None:
    assert Shot("train", "person", 7, 7, 1, 3, 12345, 1, 0).filename == "0007_c2s3_012345_01.jpg"
    assert Shot("gallery", "distractor", 0, 4, 0, 6, 99, 2, 0).filename == "0000_c1s6_000099_02.jpg"
    assert Shot("gallery", "junk", -1, 12, 7, 1, 180000, 3, 0).filename == "-1_c8s1_180000_03.jpg"


def test_query_validity_known_answers() -> None:
    # one image per camera: a query from one camera leaves the other's image as its match ...
    assert _valid_queries({0: 1, 1: 1}, [0])
    # ... but a query from both leaves no gallery at all
    assert not _valid_queries({0: 1, 1: 1}, [0, 1])
    assert _valid_queries({0: 2, 1: 2}, [0, 1])
    assert not _valid_queries({0: 3}, [0])  # same-camera images never count as matches
    assert _valid_queries({0: 1, 1: 1, 2: 1}, [0, 1])


def test_identity_sampling_is_seeded_and_varied() -> None:
    a = sample_identity(np.random.default_rng(1))
    assert a == sample_identity(np.random.default_rng(1))
    people = [sample_identity(np.random.default_rng(i)) for i in range(300)]
    assert len({p.top for p in people}) > 250  # colours are jittered: no two dyes exactly alike
    patterns = {p.top_pattern for p in people}
    assert patterns == {"plain", "stripes", "checks", "print"}
    assert {p.lower for p in people} == {"trousers", "shorts", "skirt"}
    assert 0.2 < np.mean([p.backpack is not None for p in people]) < 0.4
    assert all(0.8 <= p.build <= 1.25 for p in people)


def _person(**overrides) -> Identity:
    base = dict(build=1.0, head=0.13, legs=0.46, skin=(200, 160, 130), hair="short", hair_colour=(30, 20, 10),
                top=(240, 240, 240), top_pattern="plain", top_secondary=(0, 0, 255), pattern_scale=0.05,
                long_sleeves=True, lower="trousers", bottom=(20, 20, 60), shoes=(10, 10, 10), backpack=None,
                bag=None, bag_side=1, hat=None, glasses=False)
    return Identity(**{**base, **overrides})


def _pixels_of(channel: int, view: str, ident: Identity) -> int:
    """How many pixels of the figure are pure red (0) / green (1) / blue (2), whatever the shading."""
    image, alpha = render_person((256, 128), ident, view, 0.0, Placement(64, 12, 236))
    others = np.delete(image, channel, axis=-1)
    return int(((image[..., channel] > 0.35) & (others.max(-1) < 0.12) & (alpha > 0.5)).sum())


def test_accessories_and_prints_depend_on_the_viewpoint() -> None:
    packer = _person(backpack=(255, 0, 0))
    back, front, side = (_pixels_of(0, v, packer) for v in ("back", "front", "left"))
    assert back > 2 * front > 0  # the pack itself from behind, only its straps from the front
    assert 0 < side < back
    printed = _person(top_pattern="print", top_secondary=(0, 0, 255))
    assert _pixels_of(2, "front", printed) > 50 and _pixels_of(2, "back", printed) == 0
    striped = _person(top_pattern="stripes", top_secondary=(0, 0, 255))
    assert all(_pixels_of(2, v, striped) > 100 for v in ("front", "back", "right"))


def test_walking_phase_spreads_the_legs() -> None:
    ident = _person(bottom=(0, 200, 0))

    def trouser_width(phase: float) -> int:
        image, alpha = render_person((256, 128), ident, "left", phase, Placement(64, 12, 236))
        green = (image[..., 1] > 0.35) & (np.delete(image, 1, -1).max(-1) < 0.12) & (alpha > 0.5)
        columns = np.flatnonzero(green.any(axis=0))
        return int(columns[-1] - columns[0])

    assert trouser_width(math.pi / 2) > 1.5 * trouser_width(0.0)  # mid-stride against legs together


def test_exposure_applies_white_balance_and_brightness() -> None:
    scene = Scene("plain", (128, 128, 128), "tiles", (128, 128, 128), 0.7)
    cam = Camera(scene, resolution=1.0, brightness=1.0, gamma=1.0, white_balance=(1.2, 1.0, 0.8), haze=0.0,
                 haze_colour=(0.5, 0.5, 0.5), blur=0.0, noise=0.0, occlusion=0.0, views=(1.0, 0.0, 0.0, 0.0),
                 box_jitter=0.0)
    grey = np.full((32, 16, 3), 0.5, dtype=np.float32)
    out = expose(grey, cam, np.random.default_rng(0), (64, 32))
    assert out.shape == (64, 32, 3) and out.dtype == np.uint8
    assert tuple(out[10, 10]) == (153, 128, 102)  # 0.5 × (1.2, 1.0, 0.8) × 255, rounded
    darker = expose(grey, cam, np.random.default_rng(0), (64, 32), gain=0.5)
    assert tuple(darker[10, 10]) == (77, 64, 51)


# --- domain plans (bookkeeping only: fast at full scale) ------------------------------------------
@functools.lru_cache(maxsize=None)
def _plans(n: int, scale: float = 1.0, seed: int = 0):
    offsets = pid_offsets(PRESETS[:n], scale)
    return tuple(plan_domain(seed, i, p, scale, offsets[i]) for i, p in enumerate(PRESETS[:n]))


def test_default_size_fits_the_training_budget() -> None:
    """The default federation (4 domains): ~1,000 training images, clearly unbalanced."""
    plans = _plans(4)
    train = [p.count("train") for p in plans]
    assert 900 <= sum(train) <= 1200
    shares = np.array(train) / sum(train)
    assert list(shares) == sorted(shares, reverse=True)
    assert shares[0] > 0.38 and shares[-1] < 0.14
    for p in plans:
        assert 2 <= p.preset.cameras <= 8
    # Evaluation splits are large but the gallery is kept small: the default stays a few thousand images.
    assert sum(len(p.shots) for p in plans) <= 6500


DESIGN_EFFECT = 1.7  # person-clustered / binomial variance of rank-1, measured on FedPav models: 1.15-1.7


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("index", range(len(PRESETS)))
def test_every_domain_is_evaluated_on_enough_people_for_a_3_point_standard_error(index: int, seed: int) -> None:
    """One run's rank-1 on a domain: standard error at rank-1 = 50 % of at most 3 points, counting the
    correlation of one person's queries (one query per person: independent queries)."""
    plan = _plans(len(PRESETS), seed=seed)[index]
    queries, people = plan.count("query"), len(plan.test_pids)
    assert people >= 150 and queries >= 300
    design_effect = 1.0 if queries == people else DESIGN_EFFECT
    assert math.sqrt(0.25 * design_effect / queries) <= 0.03
    gallery_people = {s.pid for s in plan.shots if s.split == "gallery"} - {0, -1}
    assert gallery_people == set(plan.test_pids)


@pytest.mark.parametrize("n", range(3, len(PRESETS) + 1))
def test_every_prefix_of_three_or_more_is_unbalanced(n: int) -> None:
    train = [p.count("train") for p in _plans(n)]
    assert max(train) >= 2.5 * min(train)
    assert len({p.preset.cameras for p in _plans(n)}) >= 2


def test_all_nine_domains_differ_tenfold_like_the_benchmark() -> None:
    plans = _plans(len(PRESETS))
    train = [p.count("train") for p in plans]
    assert max(train) >= 10 * min(train)
    assert len({p.preset.name for p in plans}) == 9


def test_plans_follow_the_market_protocol_at_full_scale() -> None:
    seen: set[int] = set()
    for plan in _plans(len(PRESETS), seed=11):
        train, test = set(plan.train_pids), set(plan.test_pids)
        assert not train & test
        assert not (train | test) & seen  # disjoint across domains
        seen |= train | test
        names = [s.filename for s in plan.shots]
        assert len(names) == len(set(names))
        gallery = defaultdict(set)
        for s in plan.shots:
            if s.split == "gallery":
                gallery[s.pid].add(s.camid)
        queries = [s for s in plan.shots if s.split == "query"]
        assert {s.pid for s in queries} == test  # every test id is queried
        for q in queries:
            assert gallery[q.pid] - {q.camid}, f"query {q.filename} has no cross-camera match"
        assert {s.pid for s in plan.shots if s.split == "train"} == train
        assert plan.count("gallery", "distractor") >= 2 and plan.count("gallery", "junk") >= 1


def test_scale_multiplies_ids() -> None:
    small, big = _plans(2, scale=0.5), _plans(2, scale=2.0)
    for s, b in zip(small, big):
        assert len(b.train_pids) == pytest.approx(4 * len(s.train_pids), rel=0.1)


def test_the_scale_help_and_readme_say_what_a_scale_generates() -> None:
    """--synth-scale multiplies train and test ids alike; the test side is larger at every scale, which
    once read as "scales training ids only" (issue 25 item 7). The words give the planned sizes."""
    from secfed.config import KEYS

    first = PRESETS[0]
    sizes = {scale: (len(p.train_pids), len(p.test_pids)) for scale in (1.0, 0.2)
             for p in [plan_domain(0, 0, first, scale, 0)]}
    (train, test), (small_train, small_test) = sizes[1.0], sizes[0.2]
    assert small_train == round(0.2 * train) and small_test == round(0.2 * test)  # both scaled
    sentence = f"{first.name} has {train} train and {test} test ids at 1, {small_train} and {small_test} at 0.2"
    assert "train and test alike" in KEYS["data.synth_scale"].help and sentence in KEYS["data.synth_scale"].help
    assert sentence in CliRunner().invoke(cli, ["data", "synth", "--help"], terminal_width=400).output
    readme = " ".join((Path(__file__).resolve().parents[1] / "README.md").read_text().split())
    assert (f"{first.name} keeps {small_train} of its {train} train ids and {small_test} of its {test} test ids"
            in readme)


# --- generated data --------------------------------------------------------------------------------
def test_layout_names_and_images(small: tuple[Path, SynthManifest]) -> None:
    root, manifest = small
    assert sorted(p.name for p in root.iterdir()) == sorted([*(d.name for d in manifest.domains), "manifest.json"])
    for d in manifest.domains:
        assert sorted(p.name for p in (root / d.name).iterdir()) == sorted(SPLIT_DIRS.values())
        for split_dir in SPLIT_DIRS.values():
            for path in (root / d.name / split_dir).iterdir():
                pid, cam = _parse(path)
                assert TORCHREID_PATTERN.search(path.name)
                assert cam < len(d.cameras)
                if pid <= 0:
                    assert split_dir == "bounding_box_test"  # distractors and junk live in the gallery
        sample = next((root / d.name / "query").iterdir())
        with Image.open(sample) as im:
            assert im.format == "JPEG" and im.mode == "RGB" and im.size == (SMALL["width"], SMALL["height"])


def test_market_loader_reads_every_domain(small: tuple[Path, SynthManifest]) -> None:
    root, manifest = small
    all_pids: list[set[int]] = []
    for d in manifest.domains:
        ds = load_market1501(root / d.name)
        assert ds.skipped.get("junk", 0) == d.junk  # -1 files dropped, and counted
        assert len(ds.train) == d.train_images and len(ds.query) == d.query_images
        assert len(ds.gallery) == d.gallery_images - d.junk
        assert sum(s.pid == 0 for s in ds.gallery) == d.distractors  # 0000 files kept in the gallery
        train_ids, test_ids = {s.pid for s in ds.train}, {s.pid for s in ds.query}
        assert len(train_ids) == d.train_ids and len(test_ids) == d.test_ids
        assert not train_ids & test_ids
        assert {s.pid for s in ds.gallery} - {0} == test_ids
        assert all(d.pids[0] <= p <= d.pids[1] for p in train_ids | test_ids)
        by_pid = defaultdict(set)
        for s in ds.gallery:
            by_pid[s.pid].add(s.camid)
        for q in ds.query:
            assert by_pid[q.pid] - {q.camid}, f"{q.path.name} has no match from another camera"
        all_pids.append(train_ids | test_ids)
    for i, a in enumerate(all_pids):
        for b in all_pids[i + 1:]:
            assert not a & b  # identities are disjoint across domains


def test_generated_sizes_are_unbalanced(small: tuple[Path, SynthManifest]) -> None:
    _, manifest = small
    train = [d.train_images for d in manifest.domains]
    assert train == sorted(train, reverse=True) and train[0] >= 3 * train[-1]
    assert [len(d.cameras) for d in manifest.domains] == [p.cameras for p in PRESETS[:4]]


def test_manifest_contents(small: tuple[Path, SynthManifest]) -> None:
    root, manifest = small
    assert SynthManifest.load(root) == manifest
    assert manifest.version == GENERATOR_VERSION
    assert (manifest.seed, manifest.scale, manifest.height, manifest.width) == (3, 0.25, 64, 32)
    assert [d.name for d in manifest.domains] == [p.name for p in PRESETS[:4]]
    for d in manifest.domains:
        counts = {k: len(list((root / d.name / v).iterdir())) for k, v in SPLIT_DIRS.items()}
        assert counts == {"train": d.train_images, "query": d.query_images, "gallery": d.gallery_images}
        for cam in d.cameras:
            assert sum(cam.views) == pytest.approx(1.0)
            assert 0 < cam.resolution <= 1 and cam.brightness > 0 and 0 <= cam.occlusion < 1
        assert len({c.scene for c in d.cameras}) == len(d.cameras)  # every camera has its own scene
    text = (root / "manifest.json").read_text()
    assert '"generator": "secfed.data.synth"' in text and '"white_balance"' in text


def test_manifest_errors_name_the_file(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="manifest.json: no manifest"):
        SynthManifest.load(tmp_path)
    (tmp_path / "manifest.json").write_text('{"generator": "something else"}')
    with pytest.raises(DataError, match="malformed manifest"):
        SynthManifest.load(tmp_path)


def test_same_seed_same_bytes_and_domains_independent(tmp_path: Path) -> None:
    opts = dict(seed=5, scale=0.12, height=64, width=32)
    generate(tmp_path / "a", domains=2, **opts)
    generate(tmp_path / "b", domains=2, **opts)
    a, b = _files(tmp_path / "a"), _files(tmp_path / "b")
    assert a == b and len(a) > 50
    # The first domain does not depend on how many domains follow it (nor on their draws).
    generate(tmp_path / "c", domains=1, **opts)
    c = _files(tmp_path / "c")
    first = PRESETS[0].name
    first_in_a = {k: v for k, v in a.items() if k.startswith(first + "/")}
    assert first_in_a == {k: v for k, v in c.items() if k != "manifest.json"}


def test_different_seed_different_data(tmp_path: Path) -> None:
    generate(tmp_path / "a", domains=1, seed=1, scale=0.12, height=64, width=32)
    generate(tmp_path / "b", domains=1, seed=2, scale=0.12, height=64, width=32)
    a, b = _files(tmp_path / "a"), _files(tmp_path / "b")
    assert a.keys() != b.keys()
    a_pixels = [np.asarray(Image.open(tmp_path / "a" / k)) for k in sorted(a) if k.endswith(".jpg")][:20]
    b_pixels = [np.asarray(Image.open(tmp_path / "b" / k)) for k in sorted(b) if k.endswith(".jpg")][:20]
    assert all(not np.array_equal(x, y) for x, y in zip(a_pixels, b_pixels))


def test_images_of_one_person_resemble_each_other_more_than_others(small: tuple[Path, SynthManifest]) -> None:
    """Identity is rendered consistently: mean colour of the central body region is closer within an id
    than between ids of the same domain (every labelled person of every domain: ~200 ids)."""
    root, manifest = small
    within, between = [], []
    for domain in manifest.domains:
        ds = load_market1501(root / domain.name)
        feats, pids = [], []
        for s in (s for s in ds.train + ds.query + ds.gallery if s.pid > 0):
            img = np.asarray(Image.open(s.path), dtype=np.float32)
            h, w, _ = img.shape
            body = img[h // 4: 3 * h // 4, w // 3: 2 * w // 3]
            feats.append(np.concatenate([body[: h // 4].mean((0, 1)), body[h // 4:].mean((0, 1))]))
            pids.append(s.pid)
        f, p = np.array(feats), np.array(pids)
        d = np.linalg.norm(f[:, None] - f[None], axis=-1)
        same = (p[:, None] == p[None]) & ~np.eye(len(p), dtype=bool)
        within.append(d[same])
        between.append(d[p[:, None] != p[None]])
    assert np.concatenate(within).mean() < 0.7 * np.concatenate(between).mean()


# --- output handling ---------------------------------------------------------------------------------
def test_refuses_non_empty_out_and_accepts_empty(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    with pytest.raises(FileExistsError, match=re.escape(str(out))):
        generate(out, domains=1, scale=0.05, height=32, width=16)
    assert (out / "keep.txt").read_text() == "mine"
    empty = tmp_path / "empty"
    empty.mkdir()
    manifest = generate(empty, domains=1, scale=0.05, height=32, width=16)
    assert SynthManifest.load(empty) == manifest
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty", "out"]  # no temporary folders left


def test_interrupted_generation_leaves_nothing(tmp_path: Path) -> None:
    out = tmp_path / "out"

    def stop(domain: str, done: int, total: int) -> None:
        if done == 5:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        generate(out, domains=1, scale=0.05, height=32, width=16, progress=stop)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("options", "option"),
    [
        (dict(domains=0), "domains"),
        (dict(domains=10), "domains"),
        (dict(seed=-1), "seed"),
        (dict(scale=0.0), "scale"),
        (dict(scale=float("nan")), "scale"),
        (dict(scale=1000.0), "scale"),  # more ids than four-digit names hold
        (dict(scale=SCALE_RANGE[1] * 1.01), "scale"),
        (dict(scale=0.01), "scale"),
        (dict(height=16), "height"),
        (dict(width=8), "width"),
        (dict(unseen=-1), "unseen"),
        (dict(domains=4, unseen=6), "unseen"),  # 10 presets asked for, 9 exist
        (dict(public=-1), "public"),
        (dict(public=PUBLIC_RANGE[1] + 1), "public"),
        (dict(public=True), "public"),
    ],
)
def test_bad_options_name_the_option(tmp_path: Path, options: dict, option: str) -> None:
    with pytest.raises(SynthOptionError) as err:
        generate(tmp_path / "out", **options)
    assert err.value.option == option and str(err.value).startswith(option)
    assert not (tmp_path / "out").exists()


def test_cache_generates_once_and_keys_on_every_option(tmp_path: Path) -> None:
    options = dict(domains=1, seed=4, scale=0.05, height=32, width=16, unseen=0, public=0)
    path, manifest = cached(tmp_path, **options)
    assert path.parent == tmp_path and f"v{GENERATOR_VERSION}" in path.name and "seed4" in path.name
    stamp = (path / "manifest.json").stat().st_mtime_ns
    again, manifest2 = cached(tmp_path, **options)
    assert (again, manifest2) == (path, manifest)
    assert (path / "manifest.json").stat().st_mtime_ns == stamp
    changed = dict(domains=2, seed=5, scale=0.06, height=48, width=24, unseen=1, public=8)
    names = {path.name} | {cached(tmp_path, **{**options, key: value})[0].name for key, value in changed.items()}
    assert len(names) == 1 + len(changed)
    unseen_path, unseen_manifest = cached(tmp_path, **{**options, "unseen": 1})
    assert [d.name for d in unseen_manifest.unseen] == [PRESETS[1].name]


def test_ranges_hold_every_combination_within_them() -> None:
    """The ranges `secfed data synth` and `secfed train` share: their extremes are valid together."""
    lo, hi = SYNTH_DOMAINS_RANGE
    assert (lo, hi) == (1, len(PRESETS)) and UNSEEN_RANGE == (0, len(PRESETS) - 1)
    for domains, unseen in ((lo, UNSEEN_RANGE[1]), (hi, 0)):
        for scale in SCALE_RANGE:
            check_options(domains=domains, seed=0, scale=scale, height=32, width=16, unseen=unseen,
                          public=PUBLIC_RANGE[1])
    # At the largest scale, every preset's ids and the largest public set still fit four-digit names.
    largest = sum(sum(p.ids(SCALE_RANGE[1])) for p in PRESETS) + math.ceil(PUBLIC_RANGE[1] / 4)
    assert largest <= MAX_PID


# --- unseen domains and the public set ------------------------------------------------------------
@pytest.fixture(scope="module")
def extended(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, SynthManifest]:
    out = tmp_path_factory.mktemp("synth") / "extended"
    return out, generate(out, domains=1, unseen=1, public=30, seed=5, scale=0.12, height=64, width=32)


def test_unseen_domains_are_recorded_apart_and_are_the_next_presets(tmp_path: Path, extended) -> None:
    root, manifest = extended
    assert [d.name for d in manifest.domains] == [PRESETS[0].name]
    assert [d.name for d in manifest.unseen] == [PRESETS[1].name]
    assert SynthManifest.load(root) == manifest
    unseen = load_dataset(root / PRESETS[1].name, "market1501")
    assert len(unseen.query) == manifest.unseen[0].query_images
    # The unseen domain is byte for byte the domain that one more client domain would train on.
    generate(tmp_path / "two", domains=2, seed=5, scale=0.12, height=64, width=32)
    name = PRESETS[1].name
    assert _files(root / name) == _files(tmp_path / "two" / name)


def test_public_set_is_new_people_under_mixed_cameras_and_reads_without_labels(extended) -> None:
    root, manifest = extended
    public = manifest.public
    assert public is not None and public.images == 30 and public.format == "unlabeled"
    ds = load_dataset(root / public.folder, public.format)
    assert len(ds.train) == 30 and ds.query == [] and ds.gallery == []
    assert {s.pid for s in ds.train} == {-1}  # labels unused
    named = [_parse_public(s.path.name) for s in ds.train]
    pids = {pid for pid, _ in named}
    assert len(pids) == public.ids == 8 and (min(pids), max(pids)) == public.pids  # 4 images a person
    domain_pids = set()
    for d in (*manifest.domains, *manifest.unseen):
        domain_pids |= set(range(d.pids[0], d.pids[1] + 1))
    assert not pids & domain_pids and min(pids) > max(domain_pids)
    cameras_of = defaultdict(set)
    for pid, cam in named:
        cameras_of[pid].add(cam)
    assert all(len(c) == 2 for c in cameras_of.values())  # each person seen by a pair of cameras
    assert len(public.cameras) == 10
    assert len({c.scene for c in public.cameras}) == 10
    with Image.open(ds.train[0].path) as im:
        assert im.size == (32, 64)


def test_public_set_does_not_depend_on_the_domains(tmp_path: Path, extended) -> None:
    root, _ = extended
    generate(tmp_path / "other", domains=3, public=30, seed=5, scale=0.12, height=64, width=32)
    assert _files(root / "public") == _files(tmp_path / "other" / "public")


def _parse_public(name: str) -> tuple[int, int]:
    m = re.match(r"^(\d{4})_c(\d+)s\d_\d{6}_\d{2}\.jpg$", name)
    assert m is not None, name
    return int(m[1]), int(m[2])


# --- CLI ----------------------------------------------------------------------------------------------
def test_cli_writes_and_summarises(tmp_path: Path) -> None:
    out = tmp_path / "synth"
    result = CliRunner().invoke(cli, ["data", "synth", str(out), "--domains", "2", "--seed", "1",
                                      "--scale", "0.1", "--height", "64", "--width", "32"])
    assert result.exit_code == 0, result.output
    manifest = SynthManifest.load(out)
    assert [d.name for d in manifest.domains] == [p.name for p in PRESETS[:2]]
    assert manifest.seed == 1 and manifest.height == 64
    for d in manifest.domains:
        assert d.name in result.output
        assert f" {d.train_images} " in result.output.replace("│", " ")
    files = sum(1 for p in out.rglob("*") if p.suffix in (".jpg", ".png", ".bmp"))
    assert f"wrote {files:,} image files: " in result.output  # every file written, junk included (and said so)


@pytest.mark.parametrize(
    ("args", "flag"),
    [
        (["--domains", "0"], "--domains"),
        (["--domains", "12"], "--domains"),
        (["--seed", "-3"], "--seed"),
        (["--seed", str(2**63)], "--seed"),
        (["--scale", "0"], "--scale"),
        (["--scale", "500"], "--scale"),
        (["--scale", "nan"], "--scale"),  # nan passes click's FloatRange
        (["--height", "8"], "--height"),
        (["--width", "abc"], "--width"),
        (["--unseen", "-1"], "--unseen"),
        (["--domains", "5", "--unseen", "5"], "--unseen"),
        (["--public", "-2"], "--public"),
        (["--public", "4001"], "--public"),
    ],
)
def test_cli_bad_flags_name_the_flag(tmp_path: Path, args: list[str], flag: str) -> None:
    result = CliRunner().invoke(cli, ["data", "synth", str(tmp_path / "out"), *args])
    assert result.exit_code == 2
    assert f"'{flag}'" in result.output
    assert not (tmp_path / "out").exists()


def test_cli_names_an_out_that_cannot_be_made(tmp_path: Path) -> None:
    """(found by review: OUT under a file was a FileNotFoundError/NotADirectoryError traceback)"""
    (tmp_path / "afile").write_text("")
    result = CliRunner().invoke(cli, ["data", "synth", str(tmp_path / "afile" / "out"), "--scale", "0.05"])
    assert result.exit_code == 2 and "'OUT'" in result.output and "cannot make" in result.output, result.output


def test_cli_refuses_non_empty_out(tmp_path: Path) -> None:
    (tmp_path / "x").write_text("")
    result = CliRunner().invoke(cli, ["data", "synth", str(tmp_path), "--scale", "0.05"])
    assert result.exit_code == 2
    assert "'OUT'" in result.output and str(tmp_path) in result.output


def test_a_cache_folder_is_read_not_trusted_and_odd_out_folders_are_named(tmp_path: Path, monkeypatch) -> None:
    """(review: a cache folder holding another seed's data — or another domain count's — was trained on
    as named; scales 0.15 and 0.1500001 shared a folder though they make different data; a folder without
    a manifest was a FileExistsError traceback; `data synth .` made everything and then failed on
    rmdir('.'); an OUT named 'sy[/b]' was a rich MarkupError after the data was written)"""
    import shutil

    tiny = dict(domains=1, scale=0.05, height=32, width=16, public=8)
    made, _ = cached(tmp_path, seed=0, **tiny)
    shutil.copytree(made, tmp_path / made.name.replace("seed0", "seed7"))
    with pytest.raises(DataError, match="other options than its folder's name"):
        cached(tmp_path, seed=7, **tiny)
    (tmp_path / made.name.replace("seed0", "seed8")).mkdir()
    (tmp_path / made.name.replace("seed0", "seed8") / "stray").write_text("")
    with pytest.raises(DataError, match="cannot hold the synthetic data"):
        cached(tmp_path, seed=8, **tiny)
    for key, value in (("version", 2), ("public", None)):  # (review of the fix: neither was compared)
        manifest = json.loads((made / "manifest.json").read_text())
        manifest[key] = value if key == "version" else {**manifest["public"], "images": 4}
        stale = tmp_path / "stale" / made.name
        shutil.copytree(made, stale, dirs_exist_ok=True)
        (stale / "manifest.json").write_text(json.dumps(manifest))
        with pytest.raises(DataError, match="other options"):
            cached(tmp_path / "stale", seed=0, **tiny)
    monkeypatch.setattr("secfed.data.synth.generate", lambda path, **_: path.mkdir(parents=True))  # names only
    for scale in (0.15, 0.1500001):
        with pytest.raises(DataError):
            cached(tmp_path / "names", seed=0, **{**tiny, "scale": scale})
    assert sorted(p.name.split("-x")[1] for p in (tmp_path / "names").iterdir()) == ["0.15-32x16", "0.1500001-32x16"]
    monkeypatch.undo()
    empty = tmp_path / "here"
    empty.mkdir()
    monkeypatch.chdir(empty)
    result = CliRunner().invoke(cli, ["data", "synth", ".", "--domains", "1", "--scale", "0.05", "--height", "32",
                                      "--width", "16"])
    assert result.exit_code == 2 and "current directory" in result.output and not any(empty.iterdir())
    (tmp_path / "link").symlink_to(tmp_path)  # the current folder spelled through .. or a link (review of the fix)
    for spelled in ("../here", str(tmp_path / "link" / "here")):
        result = CliRunner().invoke(cli, ["data", "synth", spelled, "--domains", "1", "--scale", "0.05",
                                          "--height", "32", "--width", "16"])
        assert result.exit_code == 2 and "current directory" in result.output and empty.is_dir(), spelled
    result = CliRunner().invoke(cli, ["data", "synth", "sy[/b]", "--domains", "1", "--scale", "0.05", "--height",
                                      "32", "--width", "16"], env={"COLUMNS": "200"})
    assert result.exit_code == 0 and "sy[/b]" in result.output, result.output
    bad = os.fsdecode(b"bad\xff")
    result = CliRunner().invoke(cli, ["data", "synth", bad, "--domains", "1", "--scale", "0.05", "--height", "32",
                                      "--width", "16"])
    assert result.exit_code == 2 and "not valid UTF-8" in result.output and not (empty / bad).exists()


def test_what_a_killed_run_left_is_removed_and_a_live_runs_folder_is_not(tmp_path: Path) -> None:
    """(found by review: a SIGKILLed `data synth` left OUT.tmp-* for good) A killed writer's lock is gone
    with it; a live writer's folder, a folder made otherwise and a look-alike name are left alone."""
    from secfed import locking
    out = tmp_path / "out"
    killed, live, other = (tmp_path / f"out.tmp-{h}" for h in ("0badc0de", "00c0ffee", "12345678"))
    for folder in (killed, live, other, tmp_path / "out.tmp-mine"):
        folder.mkdir()
    os.close(locking.create_held(killed / ".writing"))  # its maker died: the lock went with it
    held = locking.create_held(live / ".writing")
    (tmp_path / "out.tmp-mine" / ".writing").touch()
    try:
        generate(out, domains=1, scale=0.05, height=32, width=16, progress=_stop_at_once)
    except KeyboardInterrupt:
        pass
    finally:
        os.close(held)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.tmp-00c0ffee", "out.tmp-12345678", "out.tmp-mine"]


def _stop_at_once(domain: str, done: int, total: int) -> None:
    raise KeyboardInterrupt
