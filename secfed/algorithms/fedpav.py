"""FedPav (Zhuang et al., ACM MM 2020, Alg. 1): share backbone + neck, keep the identity classifier.

Each selected client loads the global backbone beside its own classifier from its previous round,
trains E epochs with SGD, and uploads the backbone; the server averages with weights n_k/n.
"""

from __future__ import annotations

from secfed.algorithms.base import train_supervised, weighted_mean_step


class FedPav:
    name = "fedpav"
    shares_classifier = False  # see secfed.models.sharing
    uses_global_labels = False  # each client's classifier covers its own identities only

    client_rule = staticmethod(train_supervised)
    server_rule = staticmethod(weighted_mean_step)

    @staticmethod
    def aggregation_weight(num_examples: int) -> float:
        return float(num_examples)

