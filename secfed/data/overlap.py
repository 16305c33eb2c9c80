"""Training pictures two clients share: the same bytes in two clients' training sets (one dataset
folder linked or copied under a second name, a file listed twice).

Client-level DP protects one client's contribution and example-level DP-SGD one picture of one client:
a picture trained on by two clients is protected only over both (group privacy), so a run that asks
for an ε refuses them (found by review: a dataset linked under a second name trained twice under a
printed ε of 4.7; for its people it was 10.7). Files are compared by size first and by the SHA-256 of
their bytes only where two clients hold files of one size.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from pathlib import Path

from secfed.data.splits import ClientShard


def shared_pictures(shards: Sequence[ClientShard]) -> list[tuple[str, str, Path, Path]]:
    """(client, other client, its file, the other's file) for every training picture of one client whose
    bytes another client also trains on."""
    by_size: dict[int, list[tuple[int, Path]]] = {}
    for k, shard in enumerate(shards):
        for path in dict.fromkeys(s.path for s in shard.samples):
            by_size.setdefault(path.stat().st_size, []).append((k, path))
    found = []
    for entries in by_size.values():
        if len({k for k, _ in entries}) < 2:
            continue
        first: dict[bytes, tuple[int, Path]] = {}
        for k, path in entries:
            digest = hashlib.sha256(path.read_bytes()).digest()
            other = first.setdefault(digest, (k, path))
            if other[0] != k:
                found.append((shards[other[0]].name, shards[k].name, other[1], path))
    return found
