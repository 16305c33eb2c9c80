"""Recorded uploads (``--record-uploads``): every upload of a round and the broadcast it answered, kept
in the run directory for the audit (an update means nothing without the weights it started from).
Written and read here only::

    RUN/uploads/round-NNNN/broadcast.bin          what every client received
                          client-KKKK.broadcast    what client KKKK received instead (Eq. 15 noise)
                          client-KKKK.upload       what client KKKK sent

Each file holds the wire format's bytes (:mod:`secfed.federation.codec`), stored compressed
(:func:`codec.compress`: lossless, about half the size of a trained model's update); a file from
before secfed compressed them holds the plain bytes and reads the same.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import cast

import torch

from secfed import atomic_file
from secfed.federation import codec
from secfed.federation.messages import Broadcast, Upload

FOLDER = "uploads"
_UPLOAD = re.compile(r"client-(\d{4,})\.upload$")
_PERSONAL = re.compile(r"client-(\d{4,})\.broadcast$")
_ROUND = re.compile(r"round-(\d{4,})$")


class RecordingError(ValueError):
    """A recorded round that cannot be read; the message names the file and what is wrong."""


class NoBroadcast(RecordingError):
    """Uploads recorded without the broadcast they answered (a run from before secfed kept it)."""


class Stopped(Exception):
    """A read given up because its caller's ``stop()`` said so (a deadline); nothing was returned."""


@dataclass
class RecordedRound:
    """One recorded round: what every client received, what each client sent, and the broadcasts of
    the clients that received their own."""

    broadcast: Broadcast
    uploads: dict[int, Upload]
    personal: dict[int, Broadcast]


def round_folder(run_dir: Path, round_number: int) -> Path:
    return Path(run_dir) / FOLDER / f"round-{round_number:04d}"


def _workers() -> int:
    """Files compressed or read side by side: the run's threads (zlib lets go of the GIL), at most four
    (each holds a model's bytes two or three times over)."""
    return max(1, min(4, torch.get_num_threads()))


def write_round(run_dir: Path, round_number: int, uploads: list[Upload], broadcast: Broadcast,
                personal: Mapping[int, Broadcast] | None = None) -> None:
    """Keep round ``round_number``'s broadcast, the clients' own broadcasts (``personal``) and their
    uploads, each file compressed and written atomically."""
    folder = round_folder(run_dir, round_number)
    folder.mkdir(parents=True, exist_ok=True)
    files: list[tuple[str, Broadcast | Upload]] = [("broadcast.bin", broadcast)]
    files += [(f"client-{k:04d}.broadcast", b) for k, b in (personal or {}).items()]
    files += [(f"client-{u.client_id:04d}.upload", u) for u in uploads]

    def store(file: tuple[str, Broadcast | Upload]) -> None:
        name, message = file
        wire = codec.encode_upload(message) if isinstance(message, Upload) else codec.encode_broadcast(message)
        atomic_file.write_bytes(folder / name, codec.compress(wire))

    with ThreadPoolExecutor(max_workers=_workers()) as pool:
        list(pool.map(store, files))  # list(): the first error is raised here


def recorded_rounds(run_dir: Path | None) -> list[int]:
    """The rounds whose uploads the run recorded (1-based), in order (none without a run directory)."""
    if run_dir is None:
        return []
    folder = Path(run_dir) / FOLDER
    if not folder.is_dir():
        return []
    return sorted(int(m.group(1)) for p in folder.iterdir() if (m := _ROUND.search(p.name)) and p.is_dir())


def _read(path: Path, max_bytes: int | None = None) -> Broadcast | Upload:
    """A recorded file as a Broadcast or Upload. Its bytes are decompressed (to at most ``max_bytes``),
    or taken as they are in a file written before secfed compressed them. :class:`RecordingError`
    naming the file if unreadable."""
    data = path.read_bytes()
    try:
        message = data if data[:4] == codec.MAGIC else codec.decompress(data, limit=max_bytes)
        return codec.decode_upload(message) if _UPLOAD.search(path.name) else codec.decode_broadcast(message)
    except codec.CodecError as exc:
        raise RecordingError(f"{path}: {exc}") from None


def read_round(run_dir: Path, round_number: int, *, max_bytes: int | None = None,
               stop: Callable[[], bool] | None = None) -> RecordedRound:
    """Round ``round_number`` as recorded, its files read side by side, none inflated beyond
    ``max_bytes`` (what a message of the run can hold). :class:`NoBroadcast` when its broadcast was
    not kept; :class:`RecordingError` naming the file for anything unreadable, or the folder for a
    round without uploads; :class:`Stopped` when ``stop()`` is true before a file is begun (a round
    of many uploads takes seconds to inflate: a caller's deadline then holds to within one file)."""
    folder = round_folder(run_dir, round_number)
    if not (folder / "broadcast.bin").is_file():
        raise NoBroadcast(f"{folder / 'broadcast.bin'} is missing")
    paths = sorted(p for p in folder.iterdir() if _UPLOAD.search(p.name) or _PERSONAL.search(p.name))

    def read(path: Path) -> Broadcast | Upload:
        if stop is not None and stop():
            raise Stopped(f"stopped before {path}")
        return _read(path, max_bytes)

    with ThreadPoolExecutor(max_workers=_workers()) as pool:
        broadcast, *messages = pool.map(read, [folder / "broadcast.bin", *paths])
    uploads = {m.client_id: m for m in messages if isinstance(m, Upload)}
    personal = {int(m.group(1)): b for p, b in zip(paths, messages)
                if (m := _PERSONAL.search(p.name)) and isinstance(b, Broadcast)}
    if not uploads:
        raise RecordingError(f"{folder} holds no upload")
    return RecordedRound(cast(Broadcast, broadcast), uploads, personal)


def model_hashes(run_dir: Path, round_number: int) -> dict[int, bytes | None]:
    """Client id → the model hash its recorded upload of ``round_number`` carries, read from each
    file's header alone (nothing is inflated). :class:`RecordingError` naming a file that is unreadable."""
    hashes: dict[int, bytes | None] = {}
    for path in sorted(round_folder(run_dir, round_number).iterdir()):
        if _UPLOAD.search(path.name):
            try:
                client_id, digest = codec.upload_identity(path.read_bytes())
            except codec.CodecError as exc:
                raise RecordingError(f"{path}: {exc}") from None
            hashes[client_id] = digest
    return hashes
