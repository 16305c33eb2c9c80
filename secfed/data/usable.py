"""Whether a train/query/gallery split can be trained on and evaluated at all.

A loader that returned an empty query, or queries that no gallery image matches, would not fail:
the evaluation would skip the domain and the results would silently miss it. Every loader of a
set with a test split asks :func:`unusable_reason` and raises a DataError naming the folder (or
the split file) instead.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

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
