"""Decoding images into the in-memory uint8 store; bad files raise a DataError naming them."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from secfed.data.errors import DataError
from secfed.data.images import load_images, read_image
from secfed.data.types import Sample


def _noise(path, height, width, seed=0, mode="RGB"):
    rng = np.random.default_rng(seed)
    shape = (height, width, 3) if mode == "RGB" else (height, width)
    pixels = rng.integers(0, 256, shape, dtype=np.uint8)
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(pixels, mode).save(path)
    return pixels


@pytest.mark.parametrize("suffix", [".png", ".bmp"])
def test_lossless_images_decode_exactly(tmp_path, suffix):
    pixels = _noise(tmp_path / f"a{suffix}", 12, 6)
    image = read_image(tmp_path / f"a{suffix}")
    assert image.dtype == torch.uint8 and image.shape == (3, 12, 6)
    assert np.array_equal(image.permute(1, 2, 0).numpy(), pixels)


def test_grayscale_becomes_three_equal_channels(tmp_path):
    pixels = _noise(tmp_path / "g.png", 6, 4, mode="L")
    image = read_image(tmp_path / "g.png")
    assert image.shape == (3, 6, 4)
    assert all(np.array_equal(image[c].numpy(), pixels) for c in range(3))


def test_load_images_resizes_keeps_order_and_samples_or_paths(tmp_path, layouts):
    # Mixed source sizes; each image one flat colour, which survives any resize exactly.
    colours = [(10, 20, 30), (200, 100, 0), (0, 255, 128), (90, 90, 90), (1, 2, 3)]
    sizes = [(16, 8), (32, 16), (16, 8), (7, 5), (64, 32)]
    paths = [layouts.image(tmp_path / f"{i}.jpg" if i % 2 else tmp_path / f"{i}.png", size, colour)
             for i, (size, colour) in enumerate(zip(sizes, colours))]
    samples = [Sample(p, i, 0) for i, p in enumerate(paths)]
    out = load_images(samples, 16, 8, threads=2)
    assert out.dtype == torch.uint8 and out.shape == (5, 3, 16, 8)
    for i, colour in enumerate(colours):
        mean = out[i].float().mean(dim=(1, 2))
        assert torch.allclose(mean, torch.tensor(colour, dtype=torch.float32), atol=2.5), i  # JPEG: within 2 levels
    assert torch.equal(load_images(paths, 16, 8, threads=1), out)


def test_load_images_same_size_is_exact(tmp_path):
    pixels = [_noise(tmp_path / f"{i}.png", 8, 4, seed=i) for i in range(3)]
    out = load_images([tmp_path / f"{i}.png" for i in range(3)], 8, 4)
    for i in range(3):
        assert np.array_equal(out[i].permute(1, 2, 0).numpy(), pixels[i])


def test_load_images_downscale_matches_torchvision_antialiased_resize(tmp_path):
    from torchvision.transforms.v2 import functional as TF

    _noise(tmp_path / "big.png", 64, 32)
    expected = TF.resize(read_image(tmp_path / "big.png")[None], [16, 8], antialias=True)
    assert torch.equal(load_images([tmp_path / "big.png"], 16, 8), expected)


def test_empty_list():
    assert load_images([], 8, 4).shape == (0, 3, 8, 4)


@pytest.mark.parametrize(
    ("name", "cut"),
    [("t.jpg", -2), ("t.jpg", -200), ("t.png", -3), ("t.png", -300), ("t.bmp", -100)],
)
def test_truncated_images_raise_naming_the_path(tmp_path, name, cut):
    path = tmp_path / name
    _noise(path, 64, 32)
    path.write_bytes(path.read_bytes()[:cut])  # cut inside the last bytes (JPEG EOI, PNG IEND) or deeper
    with pytest.raises(DataError) as err:
        read_image(path)
    assert err.value.path == path
    _noise(tmp_path / "ok.png", 8, 4)
    with pytest.raises(DataError) as err:
        load_images([tmp_path / "ok.png", path], 8, 4)
    assert err.value.path == path


def test_corrupt_empty_and_missing_files_raise_naming_the_path(tmp_path):
    (tmp_path / "junk.jpg").write_bytes(b"this is not an image at all")
    (tmp_path / "empty.png").write_bytes(b"")
    for path, words in ((tmp_path / "junk.jpg", "corrupt"), (tmp_path / "empty.png", "empty"),
                        (tmp_path / "gone.jpg", "cannot read")):
        with pytest.raises(DataError) as err:
            load_images([path], 8, 4, threads=2)
        assert err.value.path == path and words in err.value.reason
        assert ".cpp" not in err.value.reason  # torchvision's source location is stripped


def test_bad_arguments():
    with pytest.raises(ValueError, match="threads"):
        load_images([], 8, 4, threads=0)
    with pytest.raises(ValueError, match="size"):
        load_images([], 0, 4)
