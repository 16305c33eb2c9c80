"""Whether a train/query/gallery split can be trained on and evaluated at all.

A loader that returned an empty query, or queries that no gallery image matches, would not fail:
the evaluation would skip the domain and the results would silently miss it. Every loader of a
set with a test split asks :func:`unusable_reason` and raises a DataError naming the folder (or
the split file) instead.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

from secfed.data.types import Sample


def matched_queries(query: Sequence[Sample], gallery: Sequence[Sample]) -> int:
    """How many queries have a gallery image of the same person from another camera."""
    cameras: dict[int, set[int]] = defaultdict(set)
    for sample in gallery:
        cameras[sample.pid].add(sample.camid)
    return sum(1 for q in query if cameras.get(q.pid, set()) - {q.camid})


def unusable_reason(train: Sequence[Sample], query: Sequence[Sample], gallery: Sequence[Sample]) -> str | None:
    """Why this split cannot be trained on and evaluated, or None if it can."""
    for name, part in (("train", train), ("query", query), ("gallery", gallery)):
        if not part:
            return f"no {name} images"
    if not matched_queries(query, gallery):
        return "no query image has a gallery image of the same person from another camera: nothing to evaluate"
    return None


def overlap_reason(train: Sequence[Sample], query: Sequence[Sample], gallery: Sequence[Sample], *,
                   identities: bool = True) -> str | None:
    """Why these parts overlap, or None: an image listed twice (a query that is also in the gallery, a
    test image trained on, a list line doubled) or, with ``identities``, a test identity trained on —
    either scores retrieval of what the model saw (found by review: a hand-edited split gave rank-1
    100 % without a word; then an edited MSMT17 list and a Market train folder holding test people)."""
    seen: set[Path] = set()
    for name, part in (("train", train), ("query", query), ("gallery", gallery)):
        for sample in part:
            if sample.path in seen:
                return f"{sample.path} is listed twice (the second time in {name}); each image belongs to one part"
            seen.add(sample.path)
    if not identities:
        return None
    tested = sorted({s.pid for s in (*query, *gallery)} & {s.pid for s in train})
    return f"identities {tested[:5]} are in the training part and in the test part" if tested else None
