"""The nine synthetic domains and the plan of one domain: which person is seen by which camera, when.

Each preset echoes one of FedReIDBench's nine datasets: many cameras and many ids (MSMT17, Duke,
Market), two cameras and few images per id (VIPeR, PRID, CUHK01, iLIDS-VID, 3DPeS). The order of
:data:`PRESETS` puts a large domain and a small one in every prefix of three or more, so
``--domains N`` always gives the unbalanced federation the benchmark studies.

A plan is pure bookkeeping, no pixels: it follows Market-1501's protocol (train ids disjoint from
test ids; per test id one query per camera from some cameras, the rest in the gallery, every query
with a match from another camera), adds gallery distractors (pid 0) and junk (pid -1), and gives
every image a unique ``PPPP_cCsS_FFFFFF_NN.jpg`` name.

Train and test sides are sized for different jobs. The train sides keep the benchmark's imbalance
(at scale 1: about 475 images for the largest default domain, 100 for the smallest). The test sides
are sized so that one run's rank-1 can be trusted: 190-300 test persons and 300-510 queries per
domain. The queries of one person succeed or fail together more often than chance: on FedPav
models of the default domains the person-clustered variance of rank-1 was 1.15-1.7 times the
binomial one, so domains with two or more queries per person get 480 queries or more, a standard
error of at most 3.0 points at rank-1 = 50 % with a design effect of 1.7; ``street`` (one query per
person, like PRID2011) gets 300 independent queries, 2.9 points. Test persons pass each camera in
shorter passes than train persons (2-3 images): the standard error depends on how many people are
queried, not on how many gallery images each has, and a smaller gallery keeps generation and
evaluation cheap.

:func:`plan_public` plans the unlabelled public set for knowledge distillation: new people, each
seen by one pair of ten cameras drawn in the styles of all nine domains, two images per camera,
like CUHK02.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

import numpy as np

from secfed.data.synth_camera import CameraStyle
from secfed.seeding import numpy_rng

Split = Literal["train", "query", "gallery"]
Kind = Literal["person", "distractor", "junk"]
MAX_PID = 9999  # Market-1501 names hold four digits


@dataclass(frozen=True)
class DomainPreset:
    """The shape of one domain at ``--scale 1``."""

    name: str
    like: str  # the benchmark dataset it echoes
    cameras: int
    train_ids: int
    test_ids: int
    cameras_per_id: tuple[int, int]  # how many cameras see one person (inclusive range)
    shots_per_camera: tuple[int, int]  # images per train person per camera (one pass, consecutive frames)
    test_shots_per_camera: tuple[int, int]  # the same for a test person (shorter: see above)
    query_cameras: int  # at most this many queries per test id
    style: CameraStyle

    def ids(self, scale: float) -> tuple[int, int]:
        """(train ids, test ids) at ``scale``; at least two of each, so both splits make sense."""
        return max(2, round(self.train_ids * scale)), max(2, round(self.test_ids * scale))


_INDOOR_SHARP = CameraStyle(indoor=0.7, resolution=(0.55, 1.0), blur=(0.0, 0.8), noise=(0.005, 0.025),
                            occlusion=(0.05, 0.2), brightness=(0.75, 1.2), cast=0.08, along=(0.2, 0.8))
_OUTDOOR = CameraStyle(indoor=0.1, resolution=(0.5, 0.9), blur=(0.2, 1.0), noise=(0.01, 0.03),
                       occlusion=(0.05, 0.2), brightness=(0.8, 1.3), cast=0.1, along=(0.2, 0.8))

PRESETS: tuple[DomainPreset, ...] = (
    DomainPreset("campus", "MSMT17", 8, 34, 190, (2, 4), (3, 6), (2, 3), 3,
                 CameraStyle(indoor=0.45, resolution=(0.45, 1.0), blur=(0.0, 1.2), noise=(0.005, 0.035),
                             occlusion=(0.05, 0.25), brightness=(0.65, 1.3), cast=0.12, along=(0.1, 0.9))),
    DomainPreset("plaza", "Market-1501", 6, 24, 190, (2, 4), (3, 6), (2, 3), 3, _OUTDOOR),
    DomainPreset("corridor", "VIPeR", 2, 40, 240, (2, 2), (2, 2), (2, 2), 2,
                 CameraStyle(indoor=0.5, resolution=(0.5, 0.75), blur=(0.3, 1.0), noise=(0.01, 0.03),
                             occlusion=(0.0, 0.1), brightness=(0.7, 1.25), cast=0.14, along=(0.5, 0.5),
                             alternate_views=True)),
    DomainPreset("gate", "iLIDS-VID", 2, 16, 240, (2, 2), (2, 4), (2, 3), 2,
                 CameraStyle(indoor=1.0, resolution=(0.4, 0.6), blur=(0.5, 1.2), noise=(0.015, 0.035),
                             occlusion=(0.25, 0.4), brightness=(0.7, 1.1), cast=0.12, along=(0.5, 0.9))),
    DomainPreset("crossing", "DukeMTMC-reID", 7, 30, 190, (2, 4), (3, 6), (2, 3), 3,
                 CameraStyle(indoor=0.0, resolution=(0.7, 1.0), blur=(0.0, 0.6), noise=(0.005, 0.02),
                             occlusion=(0.1, 0.3), brightness=(0.8, 1.3), cast=0.08, along=(0.1, 0.9))),
    DomainPreset("lobby", "CUHK03-NP", 3, 24, 240, (2, 2), (3, 6), (2, 3), 2, _INDOOR_SHARP),
    DomainPreset("street", "PRID2011", 2, 26, 300, (2, 2), (2, 3), (2, 3), 1,
                 CameraStyle(indoor=0.0, resolution=(0.5, 0.8), blur=(0.3, 1.0), noise=(0.01, 0.03),
                             occlusion=(0.0, 0.15), brightness=(0.7, 1.3), cast=0.2, along=(0.1, 0.9))),
    DomainPreset("hall", "CUHK01", 2, 20, 240, (2, 2), (2, 2), (2, 2), 2,
                 CameraStyle(indoor=1.0, resolution=(0.6, 0.9), blur=(0.0, 0.6), noise=(0.005, 0.02),
                             occlusion=(0.0, 0.1), brightness=(0.8, 1.2), cast=0.1, along=(0.5, 0.5),
                             alternate_views=True)),
    DomainPreset("atrium", "3DPeS", 3, 8, 240, (2, 2), (2, 2), (2, 2), 2, _INDOOR_SHARP),
)


@dataclass(frozen=True)
class Shot:
    """One image to render and write."""

    split: Split
    kind: Kind
    pid: int  # Market label: person id (≥ 1), 0 for a distractor, -1 for junk
    identity: int  # whose appearance: the global person id, or a passer-by's number (distractors)
    camid: int  # 0-based
    seq: int  # Market's sequence number (1-based)
    frame: int
    box: int  # Market's bounding-box index within the frame
    pass_index: int  # position within this person's pass in front of this camera

    @property
    def filename(self) -> str:
        pid = "-1" if self.pid < 0 else f"{self.pid:04d}"
        return f"{pid}_c{self.camid + 1}s{self.seq}_{self.frame:06d}_{self.box:02d}.jpg"


@dataclass(frozen=True)
class DomainPlan:
    """One domain, planned: its train and test person ids and every image to render."""

    preset: DomainPreset
    train_pids: tuple[int, ...]
    test_pids: tuple[int, ...]
    shots: tuple[Shot, ...]

    def count(self, split: Split, kind: Kind | None = None) -> int:
        return sum(1 for s in self.shots if s.split == split and (kind is None or s.kind == kind))


def pid_offsets(presets: tuple[DomainPreset, ...], scale: float) -> list[int]:
    """First pid - 1 of each domain: pids are unique across domains, so identities are disjoint."""
    offsets, total = [], 0
    for p in presets:
        offsets.append(total)
        total += sum(p.ids(scale))
    return offsets


def _valid_queries(per_cam: dict[int, int], queries: list[int]) -> bool:
    """After taking one query image from each camera in ``queries``, does each keep a cross-camera match?"""
    left = {c: n - queries.count(c) for c, n in per_cam.items()}
    return all(any(n > 0 for c, n in left.items() if c != q) for q in queries)


def plan_domain(seed: int, index: int, preset: DomainPreset, scale: float, first_pid: int) -> DomainPlan:
    """Who passes which camera, how often, and which images become train / query / gallery.

    Each person's passes are drawn from their own seed of (domain, pid), not from one stream, so a
    person's images do not depend on how many numbers were drawn for the people before them.
    """
    n_train, n_test = preset.ids(scale)
    pids = np.arange(first_pid + 1, first_pid + 1 + n_train + n_test)
    is_test = np.zeros(len(pids), dtype=bool)
    layout = numpy_rng(seed, "synth/plan/layout", index)
    is_test[layout.choice(len(pids), n_test, replace=False)] = True  # interleaved, as in Market-1501
    traffic = layout.dirichlet(np.full(preset.cameras, 4.0))  # some cameras see more people
    used: set[str] = set()
    shots: list[Shot] = []

    def place(rng: np.random.Generator, split: Split, kind: Kind, pid: int, identity: int, cam: int,
              count: int) -> list[Shot]:
        """A pass of ``count`` consecutive frames; frames are bumped until every name is new."""
        seq = int(rng.integers(1, 7))
        frame = int(rng.integers(0, 180_000))
        step = int(rng.integers(4, 30))
        out = []
        for k in range(count):
            shot = Shot(split, kind, pid, identity, cam, seq, frame + k * step, int(rng.integers(1, 4)), k)
            while shot.filename in used:
                shot = Shot(split, kind, pid, identity, cam, seq, shot.frame + 1, shot.box, k)
            used.add(shot.filename)
            out.append(shot)
        return out

    for pid, test in zip(pids.tolist(), is_test.tolist()):
        rng = numpy_rng(seed, "synth/plan/person", index, pid)
        lo, hi = preset.cameras_per_id
        k = int(rng.integers(lo, min(hi, preset.cameras) + 1))
        cams = sorted(rng.choice(preset.cameras, k, replace=False, p=traffic).tolist())
        lo, hi = preset.test_shots_per_camera if test else preset.shots_per_camera
        counts = {c: int(rng.integers(lo, hi + 1)) for c in cams}
        passes = {c: place(rng, "train" if not test else "gallery", "person", pid, pid, c, n)
                  for c, n in counts.items()}
        if not test:
            for c in cams:
                shots.extend(passes[c])
            continue
        queries: list[int] = []
        for c in rng.permutation(cams).tolist():
            if len(queries) < preset.query_cameras and _valid_queries(counts, queries + [c]):
                queries.append(c)
        for c in cams:
            group = passes[c]
            if c in queries:
                q = int(rng.integers(len(group)))
                group = [*group[:q], *group[q + 1:]]
                shots.append(replace(passes[c][q], split="query"))
            shots.extend(group)

    extras = numpy_rng(seed, "synth/plan/extras", index)
    gallery = sum(1 for s in shots if s.split == "gallery")
    n_distractors = max(2, round(0.06 * gallery))
    n_junk = max(1, round(0.03 * gallery))
    for j in range(n_distractors):  # passers-by nobody labelled, and false detections
        shots.extend(place(extras, "gallery", "distractor", 0, j, int(extras.integers(preset.cameras)), 1))
    test_list = pids[is_test].tolist()
    for j in range(n_junk):  # fragments of test people: too partial to count either way
        who = int(extras.choice(test_list))
        # pass_index j keeps two fragments of one person at one camera from being the same picture
        fragment = place(extras, "gallery", "junk", -1, who, int(extras.integers(preset.cameras)), 1)
        shots.extend(replace(s, pass_index=j) for s in fragment)
    return DomainPlan(preset, tuple(pids[~is_test].tolist()), tuple(test_list), tuple(shots))


PUBLIC_CAMERAS = 10  # five camera pairs, as CUHK02 (MM'20's public set)
PUBLIC_SHOTS = 2  # images per person per camera, as CUHK02


def plan_public(seed: int, images: int, first_pid: int) -> tuple[Shot, ...]:
    """``images`` train shots of new people (pids from ``first_pid + 1``), each seen by one random
    pair of the public cameras, two images per camera (the last person may get fewer, split
    between the pair)."""
    rng = numpy_rng(seed, "synth/plan/public")
    shots: list[Shot] = []
    used: set[str] = set()
    pid = first_pid
    while len(shots) < images:
        pid += 1
        pair = int(rng.integers(PUBLIC_CAMERAS // 2))
        left = min(2 * PUBLIC_SHOTS, images - len(shots))
        for cam, count in ((2 * pair, (left + 1) // 2), (2 * pair + 1, left // 2)):
            seq, frame, step = int(rng.integers(1, 7)), int(rng.integers(0, 180_000)), int(rng.integers(4, 30))
            for k in range(count):
                shot = Shot("train", "person", pid, pid, cam, seq, frame + k * step, int(rng.integers(1, 4)), k)
                while shot.filename in used:
                    shot = replace(shot, frame=shot.frame + 1)
                used.add(shot.filename)
                shots.append(shot)
    return tuple(shots)
