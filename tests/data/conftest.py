"""Tiny datasets in each real on-disk layout, written by the tests themselves (a few pixels each)."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from PIL import Image


def write_image(path: Path, size: tuple[int, int] = (8, 4), colour: tuple[int, int, int] = (180, 40, 20)) -> Path:
    """An RGB image of ``size`` (height, width); the format follows the suffix."""
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", (size[1], size[0]), colour).save(path)
    return path


class Layouts:
    """Writers for each layout; each returns the dataset root."""

    image = staticmethod(write_image)

    @staticmethod
    def market(
        root: Path, *, cameras: int = 6, ids: tuple[int, ...] = (2, 7, 9), test_ids: tuple[int, ...] = (3, 5)
    ) -> Path:
        """Market-1501: train ids in two cameras each; test ids in query (c1) and gallery (c2),
        plus one junk (-1) and two distractor (0000) gallery images and a Thumbs.db."""
        for pid in ids:
            for cam in (1, cameras):
                write_image(root / "bounding_box_train" / f"{pid:04d}_c{cam}s1_000151_01.jpg")
        for pid in test_ids:
            write_image(root / "query" / f"{pid:04d}_c1s1_000451_01.jpg")
            write_image(root / "bounding_box_test" / f"{pid:04d}_c2s1_000476_02.jpg")
        write_image(root / "bounding_box_test" / "-1_c1s1_000401_03.jpg")
        write_image(root / "bounding_box_test" / "0000_c1s1_000551_01.jpg")
        write_image(root / "bounding_box_test" / f"0000_c{cameras}s2_000601_02.jpg")
        (root / "bounding_box_test" / "Thumbs.db").write_bytes(b"\0" * 16)
        return root

    @staticmethod
    def msmt17(root: Path, *, v2: bool = False) -> Path:
        """MSMT17: list files, pid folders, two-digit cameras 01..15."""
        train_dir, test_dir = ("mask_train_v2", "mask_test_v2") if v2 else ("train", "test")
        lists = {"train": [], "val": [], "query": [], "gallery": []}
        for pid, cams in ((0, (1, 15)), (1, (3, 12))):
            for cam in cams:
                rel = f"{pid:04d}/{pid:04d}_{cam:03d}_{cam:02d}_0303morning_0015_0.jpg"
                write_image(root / train_dir / rel)
                lists["train" if cam < 10 else "val"].append(f"{rel} {pid}")
        for pid in (0, 1):
            for subset, cam in (("query", 7), ("gallery", 14)):
                rel = f"{pid:04d}/{pid:04d}_{cam:03d}_{cam:02d}_0113noon_0001_1.jpg"
                write_image(root / test_dir / rel)
                lists[subset].append(f"{rel} {pid}")
        for name, lines in lists.items():
            (root / f"list_{name}.txt").write_text("\n".join(lines) + "\n")
        return root

    @staticmethod
    def viper(root: Path, ids: int = 8) -> Path:
        for pid in range(ids):
            write_image(root / "VIPeR" / "cam_a" / f"{pid:03d}_45.bmp")
            write_image(root / "VIPeR" / "cam_b" / f"{pid:03d}_90.bmp")
        return root

    @staticmethod
    def cuhk01(root: Path, ids: int = 8) -> Path:
        for pid in range(1, ids + 1):
            for index in range(1, 5):
                write_image(root / "campus" / f"{pid:04d}{index:03d}.png")
        return root

    @staticmethod
    def prid2011(root: Path, *, a_only: int = 4, b_only: int = 6, frames: int = 3) -> Path:
        """PRID2011 with the real numbering: person_0001..0200 in both cameras, then persons 201..
        in cam_a only and persons 201.. in cam_b only, who are different people sharing numbers
        (the real set: 185 and 549 of them); a multi-shot sequence of ``frames`` frames for every
        person and camera. Images are copies of one tiny PNG (1,000s of files in milliseconds)."""
        png = io.BytesIO()
        Image.new("RGB", (4, 8), (180, 40, 20)).save(png, "PNG")
        base = root / "prid_2011"
        for cam, last in (("cam_a", 200 + a_only), ("cam_b", 200 + b_only)):
            (base / "single_shot" / cam).mkdir(parents=True)
            for pid in range(1, last + 1):
                (base / "single_shot" / cam / f"person_{pid:04d}.png").write_bytes(png.getvalue())
                if frames:
                    sequence = base / "multi_shot" / cam / f"person_{pid:04d}"
                    sequence.mkdir(parents=True)
                    for frame in range(1, frames + 1):
                        (sequence / f"{frame:04d}.png").write_bytes(png.getvalue())
        return root

    @staticmethod
    def pes3d(root: Path, ids: int = 8) -> Path:
        """3DPeS: every id in three of eight cameras, two frames each (one camera with a _B suffix)."""
        for pid in range(1, ids + 1):
            for k, cam in enumerate(((pid % 8) + 1, ((pid + 3) % 8) + 1, ((pid + 5) % 8) + 1)):
                suffix = "_B" if k == 2 else ""
                for frame in (10, 20):
                    write_image(root / "RGB" / f"{pid}_{cam}{suffix}_FRAME_{frame}_RGB.bmp")
        return root

    @staticmethod
    def ilids(root: Path, ids: int = 8, per_id: int = 4) -> Path:
        for pid in range(1, ids + 1):
            for index in range(1, per_id + 1):
                write_image(root / "i-LIDS_Pedestrian" / "Persons" / f"{pid:04d}{index:03d}.jpg")
        return root

    @staticmethod
    def ilidsvid(root: Path, ids: int = 6, frames: int = 25) -> Path:
        for cam in ("cam1", "cam2"):
            for pid in range(1, ids + 1):
                for frame in range(frames):
                    name = f"{cam}_person{pid:03d}_{frame:05d}.png"
                    write_image(root / "i-LIDS-VID" / "sequences" / cam / f"person{pid:03d}" / name)
        return root

    @staticmethod
    def cuhk02(root: Path, ids_per_pair: int = 2) -> Path:
        for pair in ("P1", "P2", "P3", "P4", "P5"):
            for cam in ("cam1", "cam2"):
                for pid in range(1, ids_per_pair + 1):
                    for shot in (1, 2):
                        write_image(root / "Dataset" / pair / cam / f"{pid:03d}_{shot}.png")
        return root


@pytest.fixture
def layouts() -> type[Layouts]:
    return Layouts
