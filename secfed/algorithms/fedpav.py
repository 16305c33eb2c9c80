"""FedPav (Zhuang et al., ACM MM 2020, Alg. 1): share backbone + neck, keep the identity classifier.

Each selected client loads the global backbone beside its own classifier from its previous round,
trains E epochs with SGD, and uploads the change of the backbone; the server averages with weights
n_k/n. Everything is :class:`~secfed.algorithms.base.Method`'s default answer.
"""

from __future__ import annotations

from secfed.algorithms.base import Method


class FedPav(Method):
    name = "fedpav"
