"""The small sets of FedReIDBench, read from their original layouts, with seeded splits.

None of these ships a train/test split, so one is drawn per seed, in memory or kept in a split file
the caller names, never in the dataset folder (:mod:`secfed.data.split_file`). A folder without
images, or a set too small for a train and a test part, is a DataError naming it. The common
protocol, as torchreid's: the identities are halved at random (train gets ``n // 2``); each test
identity seen by two or more cameras goes to the query from one camera and to the gallery from the
other (single-camera test ids are gallery-only distractors). Per set:

- ``prid2011``  ``prid_2011/single_shot/cam_{a,b}/person_NNNN.png`` (+ optional ``multi_shot/``).
  The published single-shot protocol: only person_0001-0200 are the same people in both cameras
  (cam a holds 385 persons, cam b 749); a higher number names a different person in each camera,
  so cam b's person N > 200 gets pid 10000 + N. The 200 shared persons are halved (100 train, 100
  test, as torchreid); the cam-a-only persons join train and the cam-b-only persons join the
  gallery as distractors, as in FedReIDBench (285 train ids, 100 queries, 649 gallery images).
  Train images are up to 10 seeded frames per camera from ``multi_shot`` when present, else the
  single-shot image; query (cam a) and gallery (cam b) are single-shot.
- ``cuhk01``    ``campus/PPPPIII.png``: 4-digit id, 3-digit image; images 1-2 are camera 0, 3-4
  camera 1. Query camera 0, gallery camera 1.
- ``viper``     ``VIPeR/cam_{a,b}/PPP_ANGLE.bmp``. Query cam a, gallery cam b.
- ``3dpes``     ``RGB/PID_CAM[_x]_FRAME_N_RGB.bmp`` with real camera numbers (1..8). For each test
  id, a seeded half of its cameras gives the query and the rest the gallery.
- ``ilids``     QMUL i-LIDS, ``i-LIDS_Pedestrian/Persons/PPPPIII.jpg`` (119 ids, 476 images): no
  camera labels, so each person's images are split at random into two pseudo-views (camid 0/1),
  as FedReIDBench's preprocessing did. FedReIDBench's Table 1 row "iLIDS-VID" (59 + 60 ids,
  476 images) has this set's counts.
- ``ilidsvid``  iLIDS-VID, ``i-LIDS-VID/sequences/cam{1,2}/personNNN/*.png`` (300 ids). Image
  protocol: train takes 10 evenly spaced frames per sequence; query is the middle frame of the
  cam-1 sequence, gallery the middle frame of the cam-2 sequence (one image per id and camera,
  like the still-image version of the set).
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from collections.abc import Iterable
from pathlib import Path

import numpy as np

from secfed.data.errors import DataError
from secfed.data.listing import find_base, list_images, list_subdirs, require_dir, require_some
from secfed.data.split_file import Draw, Subsets, seeded_split
from secfed.data.types import ReidDataset, Sample

FRAMES_PER_SEQUENCE = 10  # train frames taken from each multi-shot sequence (FedReIDBench: 10)
UNKNOWN_CAMERA = -1  # pool entry whose view the split assigns (i-LIDS)


def halve_ids(pids: Iterable[int], rng: np.random.Generator) -> tuple[list[int], list[int]]:
    """Distinct ``pids`` split at random into train (``n // 2``) and test (the rest), each sorted."""
    ids = sorted(set(pids))
    order = rng.permutation(len(ids))
    cut = len(ids) // 2
    return sorted(ids[i] for i in order[:cut]), sorted(ids[i] for i in order[cut:])


def query_gallery(
    samples: Iterable[Sample], rng: np.random.Generator, query_camera: int | None
) -> tuple[list[Sample], list[Sample]]:
    """Test images into query and gallery so that each query id is matched from another camera.

    ``query_camera`` fixes the query camera (two-camera sets); ``None`` draws half of each id's
    cameras. Ids seen by one camera only go to the gallery (distractors for everyone else).
    """
    by_pid: dict[int, list[Sample]] = defaultdict(list)
    for sample in samples:
        by_pid[sample.pid].append(sample)
    query, gallery = [], []
    for pid in sorted(by_pid):
        cams = sorted({s.camid for s in by_pid[pid]})
        if len(cams) < 2:
            gallery += by_pid[pid]
            continue
        chosen = {query_camera} if query_camera is not None else set(rng.permutation(cams)[: len(cams) // 2].tolist())
        query += [s for s in by_pid[pid] if s.camid in chosen]
        gallery += [s for s in by_pid[pid] if s.camid not in chosen]
    return query, gallery


def _halves(pool: list[Sample], query_camera: int | None) -> Draw:
    """The common protocol over ``pool``: ids halved, test ids into query/gallery by camera."""

    def draw(rng: np.random.Generator) -> Subsets:
        train_ids, _ = halve_ids((s.pid for s in pool), rng)
        train_set = set(train_ids)
        query, gallery = query_gallery((s for s in pool if s.pid not in train_set), rng, query_camera)
        return [s for s in pool if s.pid in train_set], query, gallery

    return draw


def _parse(path: Path, pattern: re.Pattern[str], example: str) -> re.Match[str]:
    match = pattern.match(path.name)
    if match is None:
        raise DataError(path, f"unexpected file name (expected e.g. {example})")
    return match


def _split(fmt: str, name: str, root: Path, protocol: str, pool: list[Sample], draw: Draw, seed: int,
           split_path: Path | None, skipped: Counter[str]) -> ReidDataset:
    train, query, gallery = seeded_split(root, fmt, protocol, pool, draw, seed=seed, split_path=split_path,
                                         name=name, skipped=skipped)
    return ReidDataset(name, train, query, gallery, dict(skipped))


# --- CUHK01, VIPeR: two cameras, every id in both ---------------------------------------------

_CUHK01_NAME = re.compile(r"^(\d{4})(\d{3})\.png$", re.IGNORECASE | re.ASCII)


def load_cuhk01(root: Path, *, seed: int = 0, split_path: Path | None = None, name: str = "cuhk01") -> ReidDataset:
    base = find_base(root, ("campus",), ("CUHK01",), "ROOT/campus/PPPPIII.png (4-digit id, 3-digit image)")
    skipped: Counter[str] = Counter()
    pool = []
    for path in require_some(list_images(base / "campus", skipped), base / "campus"):
        pid, index = map(int, _parse(path, _CUHK01_NAME, "0001001.png").groups())
        if not 1 <= index <= 4:
            raise DataError(path, f"image number {index} out of range 1..4")
        pool.append(Sample(path, pid, (index - 1) // 2))
    protocol = "ids halved at random; query camera 0 (images 1-2), gallery camera 1 (images 3-4)"
    return _split("cuhk01", name, root, protocol, pool, _halves(pool, 0), seed, split_path, skipped)


_VIPER_NAME = re.compile(r"^(\d+)_", re.ASCII)


def load_viper(root: Path, *, seed: int = 0, split_path: Path | None = None, name: str = "viper") -> ReidDataset:
    base = find_base(root, ("cam_a", "cam_b"), ("VIPeR",), "ROOT/VIPeR/{cam_a,cam_b}/PPP_ANGLE.bmp")
    skipped: Counter[str] = Counter()
    pool = [Sample(path, int(_parse(path, _VIPER_NAME, "000_45.bmp")[1]), cam)
            for cam, folder in enumerate(("cam_a", "cam_b"))
            for path in require_some(list_images(base / folder, skipped), base / folder)]
    protocol = "ids halved at random; query cam_a, gallery cam_b"
    return _split("viper", name, root, protocol, pool, _halves(pool, 0), seed, split_path, skipped)


# --- PRID2011: single shot for test, multi-shot frames for train -------------------------------

_PRID_NAME = re.compile(r"^person_(\d+)(\.png)?$", re.IGNORECASE | re.ASCII)
PRID_SHARED_IDS = 200  # person_0001..0200 are the same people in cam_a and cam_b; higher numbers are not
PRID_CAM_B_ONLY = 10_000  # cam_b's person N > 200 is pid 10000 + N: not cam_a's person N


def _prid_pid(number: int, cam: int) -> int:
    return number if cam == 0 or number <= PRID_SHARED_IDS else PRID_CAM_B_ONLY + number


def load_prid2011(root: Path, *, seed: int = 0, split_path: Path | None = None, name: str = "prid2011") -> ReidDataset:
    layout = "ROOT/prid_2011/single_shot/{cam_a,cam_b}/person_NNNN.png (+ multi_shot/{cam_a,cam_b}/person_NNNN/*.png)"
    base = find_base(root, ("single_shot",), ("prid_2011",), layout)
    skipped: Counter[str] = Counter()
    single: dict[tuple[int, int], Sample] = {}
    frames: dict[tuple[int, int], list[Sample]] = {}
    for cam, folder in enumerate(("cam_a", "cam_b")):
        cam_dir = require_dir(base / "single_shot" / folder, layout)
        for path in require_some(list_images(cam_dir, skipped), cam_dir):
            pid = _prid_pid(int(_parse(path, _PRID_NAME, "person_0001.png")[1]), cam)
            single[pid, cam] = Sample(path, pid, cam)
        multi = base / "multi_shot" / folder
        if multi.is_dir():
            for person in list_subdirs(multi, skipped):
                pid = _prid_pid(int(_parse(person, _PRID_NAME, "person_0001/")[1]), cam)
                frames[pid, cam] = [Sample(path, pid, cam) for path in list_images(person, skipped)]
    for pid in range(1, PRID_SHARED_IDS + 1):
        for cam, folder in enumerate(("cam_a", "cam_b")):
            if (pid, cam) not in single:
                raise DataError(base / "single_shot" / folder / f"person_{pid:04d}.png",
                                f"missing; persons 1-{PRID_SHARED_IDS} are in both cameras in PRID2011")
    pool = list(single.values()) + [s for seq in frames.values() for s in seq]
    a_only = sorted(pid for pid, cam in single if cam == 0 and pid > PRID_SHARED_IDS)
    b_only = sorted(pid for pid, cam in single if cam == 1 and pid > PRID_SHARED_IDS)

    def draw(rng: np.random.Generator) -> Subsets:
        train_ids, test_ids = halve_ids(range(1, PRID_SHARED_IDS + 1), rng)
        train = []
        for pid in train_ids + a_only:
            for cam in (0, 1):
                if seq := frames.get((pid, cam)):
                    picks = np.sort(rng.choice(len(seq), size=min(FRAMES_PER_SEQUENCE, len(seq)), replace=False))
                    train += [seq[i] for i in picks]
                elif (pid, cam) in single:
                    train.append(single[pid, cam])
        query = [single[pid, 0] for pid in test_ids]
        gallery = [single[pid, 1] for pid in test_ids + b_only]
        return train, query, gallery

    protocol = (f"persons 1-{PRID_SHARED_IDS} (in both cameras) halved at random; cam_a-only persons join train, "
                f"cam_b-only persons (pid {PRID_CAM_B_ONLY} + N) join the gallery; train uses up to "
                f"{FRAMES_PER_SEQUENCE} random multi_shot frames per camera (single shot if none); query cam_a, "
                "gallery cam_b single shot")
    return _split("prid2011", name, root, protocol, pool, draw, seed, split_path, skipped)


# --- 3DPeS: eight real cameras ------------------------------------------------------------------

_3DPES_NAME = re.compile(r"^(\d+)_(\d+)\w*?_FRAME_\d+_RGB\.\w+$", re.IGNORECASE | re.ASCII)


def load_3dpes(root: Path, *, seed: int = 0, split_path: Path | None = None, name: str = "3dpes") -> ReidDataset:
    base = find_base(root, ("RGB",), ("3DPeS",), "ROOT/RGB/PID_CAM_FRAME_N_RGB.bmp")
    skipped: Counter[str] = Counter()
    pool = []
    for path in require_some(list_images(base / "RGB", skipped), base / "RGB"):
        pid, cam = map(int, _parse(path, _3DPES_NAME, "100_1_FRAME_26_RGB.bmp").groups())
        if cam < 1:
            raise DataError(path, "camera numbers start at 1")
        pool.append(Sample(path, pid, cam - 1))
    protocol = "ids halved at random; for each test id a random half of its cameras is the query, the rest the gallery"
    return _split("3dpes", name, root, protocol, pool, _halves(pool, None), seed, split_path, skipped)


# --- i-LIDS (QMUL) and iLIDS-VID ------------------------------------------------------------------

_ILIDS_NAME = re.compile(r"^(\d{4})(\d{3})\.jpg$", re.IGNORECASE | re.ASCII)


def load_ilids(root: Path, *, seed: int = 0, split_path: Path | None = None, name: str = "ilids") -> ReidDataset:
    base = find_base(root, ("Persons",), ("i-LIDS_Pedestrian",), "ROOT/i-LIDS_Pedestrian/Persons/PPPPIII.jpg")
    skipped: Counter[str] = Counter()
    pool = [Sample(path, int(_parse(path, _ILIDS_NAME, "0001001.jpg")[1]), UNKNOWN_CAMERA)
            for path in require_some(list_images(base / "Persons", skipped), base / "Persons")]

    def draw(rng: np.random.Generator) -> Subsets:
        by_pid: dict[int, list[Sample]] = defaultdict(list)
        for sample in pool:
            by_pid[sample.pid].append(sample)
        viewed = []
        for pid in sorted(by_pid):  # a random half of each person's images is pseudo-view 0
            order = rng.permutation(len(by_pid[pid]))
            half = len(order) // 2
            viewed += [by_pid[pid][i]._replace(camid=int(rank >= half)) for rank, i in enumerate(order)]
        return _halves(viewed, 0)(rng)

    protocol = ("each person's images split at random into pseudo-views 0/1; ids halved at random; "
                "query view 0, gallery view 1")
    return _split("ilids", name, root, protocol, pool, draw, seed, split_path, skipped)


_ILIDSVID_PERSON = re.compile(r"^person(\d+)$", re.ASCII)


def load_ilidsvid(root: Path, *, seed: int = 0, split_path: Path | None = None, name: str = "ilidsvid") -> ReidDataset:
    layout = "ROOT/i-LIDS-VID/sequences/{cam1,cam2}/personNNN/camC_personNNN_FFFFF.png"
    base = find_base(root, ("sequences",), ("i-LIDS-VID",), layout)
    skipped: Counter[str] = Counter()
    sequences: dict[tuple[int, int], list[Sample]] = {}
    for cam, folder in enumerate(("cam1", "cam2")):
        cam_dir = require_dir(base / "sequences" / folder, layout)
        for person in list_subdirs(cam_dir, skipped):
            pid = int(_parse(person, _ILIDSVID_PERSON, "person001/")[1])
            if seq := [Sample(path, pid, cam) for path in list_images(person, skipped)]:
                sequences[pid, cam] = seq
            else:  # a person folder without frames: counted, not left out without a word (found by review)
                skipped["empty_folder"] += 1
        require_some([key for key in sequences if key[1] == cam], cam_dir, "images in its person folders")
    pool = [s for seq in sequences.values() for s in seq]

    def draw(rng: np.random.Generator) -> Subsets:
        train_ids, test_ids = halve_ids((pid for pid, _ in sequences), rng)
        train = []
        for pid in train_ids:
            for cam in (0, 1):
                seq = sequences.get((pid, cam), [])
                picks = np.unique(np.linspace(0, len(seq) - 1, min(FRAMES_PER_SEQUENCE, len(seq))).round().astype(int))
                train += [seq[i] for i in picks]
        stills = (sequences[pid, cam][len(sequences[pid, cam]) // 2]
                  for pid in test_ids for cam in (0, 1) if (pid, cam) in sequences)
        query, gallery = query_gallery(stills, rng, 0)
        return train, query, gallery

    protocol = (f"ids halved at random; train: {FRAMES_PER_SEQUENCE} evenly spaced frames per sequence; "
                "query: middle frame of the cam1 sequence, gallery: middle frame of the cam2 sequence")
    return _split("ilidsvid", name, root, protocol, pool, draw, seed, split_path, skipped)
