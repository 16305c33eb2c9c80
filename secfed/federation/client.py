"""A federated client: private images, a model whose local tensors never leave, and one upload per round."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from secfed.algorithms.base import Schedule, TrainStats
from secfed.federation.messages import Broadcast, Upload
from secfed.models.reid import ReIDModel
from secfed.models.sharing import SharedLayout, load_shared, model_hash
from secfed.privacy.dpsgd import ClientDpSgd
from secfed.privacy.round import RoundPrivacy


class LayoutMismatch(ValueError):
    """A broadcast was built for another model layout than this client's."""


@dataclass
class Client:
    """One site. ``model`` persists across rounds and carries the site's local tensors
    (its classifier, and its BatchNorm statistics when those stay local)."""

    id: int
    name: str
    images: torch.Tensor  # uint8 (N, 3, H, W) at the model's input size, held in memory on the model's device
    labels: torch.Tensor  # int64 labels for this site's classifier
    model: ReIDModel
    layout: SharedLayout
    algorithm: type

    def receive(self, broadcast: Broadcast) -> None:
        if broadcast.layout_id != self.layout.fingerprint():
            raise LayoutMismatch(
                f"client {self.name}: broadcast layout {broadcast.layout_id} != own {self.layout.fingerprint()}"
            )
        load_shared(self.model, self.layout, broadcast.weights)

    def train(
        self, schedule: Schedule, seed: int, model: ReIDModel | None = None, dp: ClientDpSgd | None = None
    ) -> TrainStats:
        """The method's client rule on this site's data, every random draw (order, augmentation,
        dropout, DP-SGD noise) from ``seed``. ``model`` defaults to the federated model; the
        local-training baseline passes its own, trained the same way and never aggregated."""
        torch.manual_seed(seed)
        generator = torch.Generator().manual_seed(seed)
        model = self.model if model is None else model
        return self.algorithm.client_rule(model, self.images, self.labels, schedule, generator, dp)

    def upload(self, broadcast: Broadcast, privacy: RoundPrivacy, weight: float, *, with_hash: bool) -> Upload:
        """Δ of the shared tensors since the broadcast, after the privacy step (clipping), with its
        aggregation weight (:meth:`Server.weight_of`, a public function of the enrolment). With
        ``with_hash`` (authenticated secure aggregation) the client hashes the weights it received
        itself, rather than trusting the server's word for which model it trained on."""
        trained = self.layout.flatten(self.model.state_dict()).cpu()  # the channel works on the CPU
        update = privacy.client_update(trained - broadcast.weights)
        digest = model_hash(broadcast.weights) if with_hash else None
        return Upload(self.id, broadcast.round, update, weight, digest)

