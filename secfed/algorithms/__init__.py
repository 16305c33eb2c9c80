"""Federated ReID methods: one module each, a client rule plus a server rule."""

from __future__ import annotations

from secfed.algorithms.fedavg import FedAvg
from secfed.algorithms.fedpav import FedPav

ALGORITHMS = {cls.name: cls for cls in (FedPav, FedAvg)}


def get_algorithm(name: str) -> type[FedPav]:
    try:
        return ALGORITHMS[name]
    except KeyError:
        raise ValueError(f"unknown algorithm {name!r}; choose one of {', '.join(ALGORITHMS)}") from None
