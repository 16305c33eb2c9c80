"""Decoding a dataset's images once, into one uint8 tensor held in memory for training.

ReID images are small (Market-1501: 128×64), so a client's whole shard fits in memory at the
model's input size, and decoding + resizing once beats doing it every epoch. Decoding is
torchvision's (libjpeg-turbo, libpng, libwebp, giflib); BMP (VIPeR, 3DPeS), which torchvision does
not read, goes through Pillow. A file that cannot be read or decoded raises a DataError naming it.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import torch
from PIL import Image, UnidentifiedImageError
from torchvision.io import ImageReadMode, decode_image
from torchvision.transforms.v2 import functional as TF

from secfed.data.errors import DataError
from secfed.data.types import Sample

_BMP_MAGIC = b"BM"
_PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
_PNG_END = b"IEND\xaeB`\x82"  # the IEND chunk's type and CRC: the last 8 bytes of a whole PNG
_PNG_TAIL = 1024  # a few writers append bytes after IEND; look for it near the end, not only at it
# torchvision's decoders by their magic bytes, each with the Pillow readers of the same format
_DECODED = ((b"\xff\xd8\xff", ("JPEG", "MPO")), (_PNG_MAGIC, ("PNG",)), (b"GIF87a", ("GIF",)), (b"GIF89a", ("GIF",)),
            (b"RIFF", ("WEBP",)))
_SOF = re.compile(rb"\xff[\xc0-\xc3\xc5-\xc7\xc9-\xcb\xcd-\xcf]")  # JPEG frame headers (not DHT, JPG, DAC)
_CPP_LOCATION = re.compile(r"^[^,]*, \S+\.cpp:\d+, ")  # "decode_jpeg, /…/decode_jpeg.cpp:167, " prefix
# A pedestrian crop is kilobytes; these bounds refuse, by name, files no ReID set holds before they are
# read or decoded (found by review: a 40 GB sparse file raised MemoryError, and a 875 KB PNG of
# 30000×30000 pixels took 3.35 GB to decode — libpng and libjpeg have no bound of their own here).
MAX_IMAGE_BYTES = 64 * 2**20
MAX_IMAGE_PIXELS = Image.MAX_IMAGE_PIXELS or 89_478_485  # Pillow's decompression-bomb bound


def read_image(path: Path | str) -> torch.Tensor:
    """One image file → uint8 (3, H, W) RGB (grayscale and palette images are expanded)."""
    path = Path(path)
    try:
        size = path.stat().st_size
        if size > MAX_IMAGE_BYTES:
            raise DataError(path, f"{size} bytes: larger than any image a ReID set holds ({MAX_IMAGE_BYTES} at most)")
        data = path.read_bytes()
    except OSError as err:
        raise DataError(path, f"cannot read image: {err.strerror or err}") from None
    if not data:
        raise DataError(path, "empty image file")
    if data.startswith(_BMP_MAGIC):
        return _decode_with_pillow(path)
    _check_pixels(path, data)
    # libpng decodes a PNG cut inside its final IEND chunk without complaint; such a file is
    # still truncated, so it is refused like any other.
    if data.startswith(_PNG_MAGIC) and _PNG_END not in data[-_PNG_TAIL:]:
        raise DataError(path, "truncated PNG (no IEND chunk at the end)")
    try:
        image = decode_image(torch.frombuffer(bytearray(data), dtype=torch.uint8), mode=ImageReadMode.RGB)
    except RuntimeError as err:
        raise DataError(path, f"corrupt or unsupported image: {_CPP_LOCATION.sub('', str(err))}") from None
    except MemoryError:
        raise DataError(path, "too large to decode in this machine's memory") from None
    if image.ndim != 3:
        raise DataError(path, f"decodes to {tuple(image.shape)}, not one picture")
    # a 16-bit PNG decodes to uint16: scaled, not cut to its low byte (found by review: 0x1234 became 0x34)
    return image if image.dtype == torch.uint8 else TF.to_dtype(image, torch.uint8, scale=True)


def _check_pixels(path: Path, data: bytes) -> None:
    """Refuse, before decoding, an image whose header declares more pixels than Pillow's
    decompression-bomb bound, an animated GIF (torchvision decodes every frame), or one whose size no
    header reader finds: Pillow's, else the PNG or JPEG header read here (libpng decodes a PNG with a
    damaged ancillary chunk that Pillow refuses; a camera's JPEG with a preview is one picture to
    torchvision and two frames, MPO, to Pillow — found by review)."""
    import io
    import warnings

    formats = next((names for magic, names in _DECODED if data.startswith(magic)), None)
    if formats is None or (formats == ("WEBP",) and data[8:12] != b"WEBP"):
        raise DataError(path, "corrupt or unsupported image: not a JPEG, PNG, GIF or WebP (what the decoder reads)")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            # the reader of what torchvision will decode, no other: Pillow tried its other readers on a
            # JPEG its own refused, and its PCD reader reported 768×512 for a 12000×12000 JPEG (review)
            with Image.open(io.BytesIO(data), formats=list(formats)) as header:
                (width, height), kind = header.size, header.format
                frames = getattr(header, "n_frames", 1) if kind == "GIF" else 1
    except Image.DecompressionBombError as err:
        raise DataError(path, f"more pixels than any image a ReID set holds ({err})") from None
    except Exception as err:  # noqa: BLE001 - fail closed: a size no reader finds is not checked, so not decoded
        size = _header_size(data)
        if size is None:
            what = "no image format Pillow knows" if isinstance(err, UnidentifiedImageError) else f"{type(err).__name__}: {err}"
            raise DataError(path, f"corrupt or unsupported image: unreadable header ({what}); refused before "
                                  "decoding (libjpeg and libpng read some headers Pillow refuses, unbounded)") from None
        (width, height), frames = size, 1
    if frames != 1:  # an animated GIF decodes every frame: 40 frames of 4000×4000 from 940 bytes (review)
        raise DataError(path, f"{frames} frames: an image of a ReID set is one picture")
    if width * height > MAX_IMAGE_PIXELS:
        raise DataError(path, f"{width}×{height} pixels: more than any image a ReID set holds "
                              f"({MAX_IMAGE_PIXELS} pixels at most)")


def _header_size(data: bytes) -> tuple[int, int] | None:
    """(width, height) from a PNG's IHDR, or the largest a JPEG's frame headers (SOFn) declare anywhere
    in the file; None for anything else. Hand-written, and conservative on purpose: Pillow's reader is
    the one that refused, and a walk over the markers was led past the real frame header by bytes
    libjpeg skips (found by review: a 668-byte JPEG decoded to 12000×12000). A legitimate picture
    reaching this reader with an odd SOF-like run in its metadata is refused, not decoded unbounded."""
    if data.startswith(_PNG_MAGIC):
        return (int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")) \
            if data[12:16] == b"IHDR" and len(data) >= 24 else None
    if not data.startswith(b"\xff\xd8"):
        return None
    sizes = [(int.from_bytes(data[at + 7:at + 9], "big"), int.from_bytes(data[at + 5:at + 7], "big"))
             for at in (m.start() for m in _SOF.finditer(data)) if at + 9 <= len(data)]
    return max(sizes, key=lambda wh: wh[0] * wh[1]) if sizes else None


def _decode_with_pillow(path: Path) -> torch.Tensor:
    """A BMP, its size read from its header and bounded before decoding: Pillow only warns up to twice
    its bound, and a 1,232-byte RLE8 BMP of 9500×9500 decoded to 1.6 GB (found by review)."""
    import warnings

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            with Image.open(path, formats=["BMP"]) as image:
                width, height = image.size
                if width * height > MAX_IMAGE_PIXELS:
                    raise DataError(path, f"{width}×{height} pixels: more than any image a ReID set holds "
                                          f"({MAX_IMAGE_PIXELS} pixels at most)")
                rgb = np.asarray(image.convert("RGB"))  # raises on a truncated file (LOAD_TRUNCATED_IMAGES is off)
    except (OSError, ValueError, Image.DecompressionBombError) as err:
        raise DataError(path, f"corrupt image: {err}") from None
    return torch.from_numpy(rgb.copy()).permute(2, 0, 1).contiguous()


def load_images(
    samples: Sequence[Sample] | Sequence[Path], height: int, width: int, *, threads: int = 2
) -> torch.Tensor:
    """Decode and resize every image to (height, width): uint8 (N, 3, height, width), in input order.

    Resizing is bilinear with antialiasing, done once per batch of same-sized images (ReID sets
    are mostly one size, so this is a few large calls). ``threads`` decode in parallel; the
    decoders release the GIL. The first unreadable image raises a DataError naming its path.
    """
    if height < 1 or width < 1:
        raise ValueError(f"image size must be positive, got {height}x{width}")
    if threads < 1:
        raise ValueError(f"threads must be >= 1, got {threads}")
    paths = [s.path if isinstance(s, Sample) else Path(s) for s in samples]
    out = torch.empty((len(paths), 3, height, width), dtype=torch.uint8)
    # Contiguous chunks, a few per thread: big enough to batch the resize, small enough to balance.
    step = max(1, min(256, -(-len(paths) // (threads * 4))))
    chunks = [range(i, min(i + step, len(paths))) for i in range(0, len(paths), step)]

    def decode_chunk(chunk: range) -> None:
        by_size: dict[tuple[int, int], list[tuple[int, torch.Tensor]]] = defaultdict(list)
        for i in chunk:
            image = read_image(paths[i])
            by_size[image.shape[1], image.shape[2]].append((i, image))
        for (h, w), items in by_size.items():
            batch = torch.stack([image for _, image in items])
            if (h, w) != (height, width):
                batch = TF.resize(batch, [height, width], antialias=True)
            for (i, _), image in zip(items, batch):
                out[i] = image  # a plain copy per row; index_put on uint8 measured 5-10x slower

    if threads == 1:
        for chunk in chunks:
            decode_chunk(chunk)
    else:
        with ThreadPoolExecutor(threads) as pool:
            futures = [pool.submit(decode_chunk, chunk) for chunk in chunks]
            try:
                for future in futures:
                    future.result()
            except BaseException:
                for future in futures:
                    future.cancel()
                raise
    return out
