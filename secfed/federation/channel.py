"""The channel: how a cohort's uploads become one aggregate.

:class:`PlainChannel` adds the uploads in the clear (for comparisons, and for stacks that secure the
transport themselves), counting each at its size in the wire format of :mod:`secfed.federation.codec`.
:class:`~secfed.federation.secure_channel.SecureChannel` runs secure aggregation over the summed
part so the server sees only sums. Both take the same inputs and return the same
:class:`~secfed.federation.messages.Aggregate`: per summed name Σ w_k·x_k and Σ w_k, plus each
client's shared (not summed) payloads.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

import torch

from secfed.federation import codec
from secfed.federation.messages import Aggregate, Broadcast, Upload


class Channel(Protocol):
    name: str
    phases: tuple[str, ...]  # where a client can vanish; a dropout schedule draws from these
    needs_model_hash: bool  # uploads must carry the hash of the model they were trained from
    # the newest round whose sum exists (unmasked, or in the clear at the server): an interrupt after it does
    # not withdraw the round's privacy note (runtime.drive_round; a channel without it never withdraws)
    summed_round: int | None

    def aggregate(self, broadcast: Broadcast, uploads: Sequence[Upload], dropouts: Mapping[int, str],
                  *, broadcast_bytes: int) -> Aggregate:
        """Sum ``w·x`` and ``w`` per name over the uploads of clients that did not drop out.

        ``dropouts`` maps a client id to the protocol phase at which it vanished; a channel decides
        what that means for it (the plain channel: the client never uploaded). ``broadcast_bytes``:
        the encoded size of the broadcast each client received.
        """
        ...


def check_uploads(uploads: Sequence[Upload]) -> tuple[tuple[str, int, str], ...]:
    """The summed names, lengths and encodings every upload of a round must agree on."""
    if not uploads:
        return ()
    first = uploads[0]
    shape = tuple((name, s.vector.numel(), s.encoding) for name, s in sorted(first.summed.items()))
    for upload in uploads[1:]:
        other = tuple((name, s.vector.numel(), s.encoding) for name, s in sorted(upload.summed.items()))
        if other != shape:
            raise ValueError(f"client {upload.client_id} sums {other}, client {first.client_id} sums {shape}: "
                             "every client of a round must contribute the same named vectors")
    return shape


def weighted_sums(arrived: Sequence[Upload]) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
    """Σ w·x and Σ w per summed name, in client-id order (a fixed order: reproducible float sums)."""
    sums: dict[str, torch.Tensor] = {}
    weights: dict[str, float] = {}
    for upload in sorted(arrived, key=lambda u: u.client_id):
        for name, s in upload.summed.items():
            total = sums.setdefault(name, torch.zeros(s.vector.numel(), dtype=s.vector.dtype))
            total.add_(s.vector, alpha=s.weight)
            weights[name] = weights.get(name, 0.0) + s.weight
    return sums, weights


class PlainChannel:
    """Uploads are summed in the clear, in memory; each is counted at the size the codec gives it
    on the wire (:func:`secfed.federation.codec.upload_size`). Serialising an in-process upload
    only to read it back would cost two full copies of it and prove nothing that the codec's own
    tests and the Flower transport (which does cross the codec) do not."""

    name = "plain"
    phases = ("upload",)  # one step: a client that vanishes never uploads
    needs_model_hash = False
    summed_round: int | None = None  # the newest round whose uploads reached the server (runtime.drive_round)

    def aggregate(self, broadcast: Broadcast, uploads: Sequence[Upload], dropouts: Mapping[int, str],
                  *, broadcast_bytes: int) -> Aggregate:
        check_uploads(uploads)
        self.summed_round = broadcast.round  # in the clear, the server holds every upload from here
        arrived = [upload for upload in uploads if upload.client_id not in dropouts]
        bytes_up = sum(codec.upload_size(upload) for upload in arrived)
        sums, weights = weighted_sums(arrived)
        return Aggregate(
            round=broadcast.round,
            sums=sums,
            weights=weights,
            contributors=tuple(sorted(u.client_id for u in arrived)),
            shared={u.client_id: dict(u.shared) for u in arrived},
            bytes_up=bytes_up,
            bytes_down=broadcast_bytes * len(uploads),
        )


def only_shared(upload: Upload) -> Upload:
    """The part of an upload that travels in the clear beside a secure sum."""
    return Upload(upload.client_id, upload.round, {}, upload.shared, upload.model_hash)


def zero_sums(uploads: Sequence[Upload]) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
    """Sums of nothing, shaped like the round's summands (an aborted or one-client round)."""
    if not uploads:
        return {}, {}
    return ({name: torch.zeros(s.vector.numel(), dtype=s.vector.dtype) for name, s in uploads[0].summed.items()},
            {name: 0.0 for name in uploads[0].summed})
