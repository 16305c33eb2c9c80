"""The client side of a round: receive a Broadcast, run the method's client step on the site's
private data, apply the privacy step, and hand back the Upload — exactly what leaves the client.

Like the server side it speaks only in Broadcasts and Uploads, so it can run in its own process.
"""

from __future__ import annotations

from dataclasses import dataclass

from secfed.algorithms.base import Method, Schedule, Site
from secfed.federation.messages import Broadcast, TrainStats, Upload
from secfed.models.sharing import SharedLayout
from secfed.privacy.dpsgd import ClientDpSgd
from secfed.privacy.round import ClientPrivacy


class LayoutMismatch(ValueError):
    """A broadcast was built for another model layout than this client's."""


@dataclass
class ClientSide:
    site: Site
    method: Method
    layout: SharedLayout
    privacy: ClientPrivacy
    hash_models: bool  # authenticated secure aggregation: report the hash of the model received
    dp_sgd: ClientDpSgd | None = None

    def step(self, broadcast: Broadcast, schedule: Schedule, seed: int) -> tuple[Upload, TrainStats | None]:
        """One round for this site; ``seed`` drives every training-side random draw."""
        if broadcast.layout_id != self.layout.fingerprint():
            raise LayoutMismatch(
                f"client {self.site.name}: broadcast layout {broadcast.layout_id} != own {self.layout.fingerprint()}"
            )
        contribution = self.method.client_step(self.site, broadcast, self.layout, schedule, seed, self.dp_sgd)
        # The client hashes the weights it received itself rather than trusting the server's word.
        digest = broadcast.weights_hash if self.hash_models else None
        upload = self.privacy.upload(contribution, client_id=self.site.id, round_index=broadcast.round, model_hash=digest)
        return upload, contribution.stats
