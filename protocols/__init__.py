"""secfed.protocols — dropout-robust secure aggregation (SecAgg / SecAgg+), numpy + cryptography only.

The front door::

    from secfed import protocols as sp

    q = sp.Quantizer.for_cohort(n_clients=10, clip=1.0)          # finest scale that cannot overflow
    out = sp.simulate(updates, quantizer=q, rng=rng, dropouts={3: "masked_input"})
    out.total                                                     # Σ of the survivors' updates

For a real deployment drive the state machines yourself — :class:`SecAggClient` and
:class:`SecAggServer` take and return typed messages; :func:`encode` / :func:`decode` move them
as bytes over whatever transport you have (:func:`drive` runs a whole round's phases over any
:class:`Transport`, timing each step for an ``on_step`` hook). Authenticated mode (Ed25519 identities from the
deployment's PKI) is the default; ``authenticated=False`` is private only against an
honest-but-curious server. Bulk work — keystreams, hashing, signature batches — runs on every core
in threads (:func:`parallel.set_workers` to change how many). This package never imports torch.
"""

from . import errors, parallel
from .errors import (
    Aborted,
    BelowThreshold,
    BothSharesRequested,
    ConfigMismatch,
    DecryptionFailed,
    ForgedInput,
    InconsistentShares,
    InconsistentView,
    MalformedMessage,
    ModelMismatch,
    OverflowRefused,
    ProtocolError,
    ReplayedMessage,
    SeedWithheld,
    SignatureInvalid,
    UnknownClient,
    UnsupportedVersion,
    WrongPhase,
    WrongRound,
    WrongSender,
)
from .quantize import Quantizer, largest_cohort, ring_bits
from .driver import Phases, Session, StepTime, Transport, WireTransport, drive
from .secagg.client import ClientPrimitives, ClientState, SecAggClient
from .secagg.graph import GraphParams, NeighbourGraph, choose_params, withstands
from .secagg.keys import model_digest
from .secagg.messages import decode, encode, encoded_size, validate
from .secagg.server import AggregateResult, SecAggServer
from .secagg.session import Phase, ServerKey, SessionConfig, new_session_id
from .simulate import SimulationResult, random_dropouts, simulate

__all__ = [
    "Aborted",
    "AggregateResult",
    "BelowThreshold",
    "BothSharesRequested",
    "ClientPrimitives",
    "ClientState",
    "ConfigMismatch",
    "DecryptionFailed",
    "ForgedInput",
    "GraphParams",
    "InconsistentShares",
    "InconsistentView",
    "MalformedMessage",
    "ModelMismatch",
    "NeighbourGraph",
    "OverflowRefused",
    "Phase",
    "Phases",
    "ProtocolError",
    "Quantizer",
    "ReplayedMessage",
    "SecAggClient",
    "SecAggServer",
    "SeedWithheld",
    "ServerKey",
    "Session",
    "SessionConfig",
    "SignatureInvalid",
    "SimulationResult",
    "StepTime",
    "Transport",
    "UnknownClient",
    "UnsupportedVersion",
    "WireTransport",
    "WrongPhase",
    "WrongRound",
    "WrongSender",
    "choose_params",
    "withstands",
    "decode",
    "drive",
    "encode",
    "encoded_size",
    "errors",
    "largest_cohort",
    "model_digest",
    "new_session_id",
    "parallel",
    "random_dropouts",
    "ring_bits",
    "simulate",
    "validate",
]
