"""FedAvg (McMahan et al. 2017; MM'20 Alg. 4) as FedReIDBench runs it: the whole model is shared,
so the identity classifier spans the union of every client's identities (global labels)."""

from __future__ import annotations

from secfed.algorithms.base import Method


class FedAvg(Method):
    name = "fedavg"
    shared_prefixes = ("backbone.", "neck.", "classifier.")
    uses_global_labels = True
