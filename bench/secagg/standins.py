"""Stand-in survivors: clients whose input nobody reads, so that a bench can give a server the
traffic of thousands of survivors without masking for each.

A stand-in is a real :class:`~secfed.protocols.SecAggClient` built with other
:class:`~secfed.protocols.ClientPrimitives`: it uploads a uniform vector (what a masked input looks
like) instead of masking — its digest, and so its tag and signature, genuine —; it splits nothing
(the server never rebuilds a survivor's seeds: it reveals its own self-mask seed and its key seed is
never needed, so its shares only travel, unused); it does not re-verify the consistency quorum's
signatures (the representative client does: every honest client's cost, printed apart). The server
cannot tell and does the same work; the sum is then not checked.
"""

from __future__ import annotations

import numpy as np

from secfed.protocols import ClientPrimitives
from secfed.protocols.crypto import vector_digest
from secfed.protocols.shamir import SHARE_BYTES, Share


def stand_in_primitives(rng: np.random.Generator) -> ClientPrimitives:
    """The primitives of one stand-in survivor (``rng``: its uniform vector's source)."""

    def fill(out: np.ndarray, source: np.ndarray, streams, *, bits: int, bound: int | None) -> bytes:
        out[:] = np.frombuffer(rng.bytes(4 * out.size), dtype="<u4") & ((1 << bits) - 1)
        return vector_digest(out)

    def split(secret: bytes, threshold: int, count: int) -> list[Share]:
        return [Share(i, bytes(SHARE_BYTES)) for i in range(1, count + 1)]

    def trust(items, payload: bytes, *, who) -> None:
        return None

    return ClientPrimitives(mask_into=fill, split=split, verify_all=trust)
