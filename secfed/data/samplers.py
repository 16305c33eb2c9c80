"""P×K identity batches (Hermans et al. 2017): P identities, K images of each, per batch.

A batch-hard triplet loss needs a positive and a negative for every anchor, which uniformly
shuffled batches of a ReID shard (a few images per identity) rarely give; the identity sampler of
torchreid / fast-reid does. Here, per batch: P identities drawn without replacement (all of them
when the shard has fewer), then K images of each, without replacement when the identity has K
or more; otherwise every image of it once and the rest drawn again (an identity seen once appears K
times; augmentation makes the copies differ). An epoch has as many batches as a shuffled epoch of the same batch size
(``n // (P·K)``, at least one), so the local budget does not change with the sampler.

Written here rather than borrowed: torchreid's ``RandomIdentitySampler`` is a torch ``Sampler``
driven by Python's global ``random`` module, and secfed draws every training-side choice from an
explicit ``torch.Generator`` so that runs and resumes repeat bit for bit.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch


def identity_batches(labels: torch.Tensor, ids_per_batch: int, per_id: int, generator: torch.Generator,
                     *, epochs: int = 1) -> Iterator[torch.Tensor]:
    """Index batches of ``ids_per_batch`` identities × ``per_id`` images over ``labels`` (int64, one
    per image); ``epochs`` epochs of ``max(1, n // (P·K))`` batches, every draw from ``generator``."""
    if ids_per_batch < 1 or per_id < 1:
        raise ValueError(f"a P×K batch needs P ≥ 1 and K ≥ 1, got P = {ids_per_batch}, K = {per_id}")
    labels = labels.detach().cpu()
    if labels.dim() != 1 or len(labels) < 2:
        raise ValueError(f"identity batches need at least 2 labelled images, got {tuple(labels.shape)}")
    classes, inverse = torch.unique(labels, return_inverse=True)
    members = [torch.nonzero(inverse == c).flatten() for c in range(len(classes))]
    p = min(ids_per_batch, len(classes))
    batches = max(1, len(labels) // (ids_per_batch * per_id))
    for _ in range(epochs * batches):
        chosen = torch.randperm(len(classes), generator=generator)[:p]
        parts = []
        for c in chosen.tolist():
            pool = members[c]
            if len(pool) >= per_id:
                pick = torch.randperm(len(pool), generator=generator)[:per_id]
            else:  # every image once, the rest drawn again
                extra = torch.randint(len(pool), (per_id - len(pool),), generator=generator)
                pick = torch.cat([torch.randperm(len(pool), generator=generator), extra])
            parts.append(pool[pick])
        yield torch.cat(parts)
