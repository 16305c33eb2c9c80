"""The channel: how a cohort's uploads become one aggregate.

:class:`PlainChannel` adds the uploads in the clear (for comparisons, and for stacks that secure the
transport themselves). :class:`SecureChannel` runs the secure-aggregation protocol of
:mod:`secfed.protocols` so the server sees only the sum. Both take the same inputs and return the
same :class:`~secfed.federation.messages.Aggregate`.
"""

from __future__ import annotations

from typing import Mapping, Protocol, Sequence

import torch

from secfed.federation.messages import Aggregate, Broadcast, Upload

BROADCAST_HEADER_BYTES = 64  # round, layout id, model hash, weight scale


def broadcast_bytes(broadcast: Broadcast) -> int:
    return broadcast.weights.numel() * 4 + BROADCAST_HEADER_BYTES


class Channel(Protocol):
    name: str
    phases: tuple[str, ...]  # where a client can vanish; a dropout schedule draws from these
    needs_model_hash: bool  # uploads must carry the hash of the model they were trained from

    def aggregate(
        self, broadcast: Broadcast, uploads: Sequence[Upload], dropouts: Mapping[int, str]
    ) -> Aggregate:
        """Sum ``weight·update`` and ``weight`` over the uploads of clients that did not drop out.

        ``dropouts`` maps a client id to the protocol phase at which it vanished. A channel decides
        what that means for it (the plain channel: the client never uploaded).
        """
        ...


class PlainChannel:
    """Uploads are summed in the clear, in client-id order (a fixed order: reproducible sums)."""

    name = "plain"
    phases = ("upload",)  # one step: a client that vanishes never uploads
    needs_model_hash = False

    def aggregate(
        self, broadcast: Broadcast, uploads: Sequence[Upload], dropouts: Mapping[int, str]
    ) -> Aggregate:
        arrived = sorted((u for u in uploads if u.client_id not in dropouts), key=lambda u: u.client_id)
        total = torch.zeros(broadcast.weights.numel(), dtype=torch.float32)
        weight = 0.0
        for upload in arrived:
            total.add_(upload.update, alpha=upload.weight)
            weight += upload.weight
        per_upload = broadcast.weights.numel() * 4 + 8  # float32 update + float64 weight
        return Aggregate(
            round=broadcast.round,
            total=total,
            weight=weight,
            contributors=tuple(u.client_id for u in arrived),
            bytes_up=per_upload * len(arrived),
            bytes_down=broadcast_bytes(broadcast) * len(uploads),
        )
