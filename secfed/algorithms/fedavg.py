"""FedAvg (McMahan et al. 2017; MM'20 Alg. 4) as FedReIDBench runs it: the whole model is shared,
so the identity classifier spans the union of every client's identities (global labels)."""

from __future__ import annotations

from secfed.algorithms.fedpav import FedPav


class FedAvg(FedPav):
    name = "fedavg"
    shares_classifier = True
    uses_global_labels = True
