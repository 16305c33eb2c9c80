"""Typed errors of the secure-aggregation layer.

Every refusal the protocol makes has its own class, so an embedding can tell a hostile or broken
peer (drop it, log it) from a round that cannot finish (``BelowThreshold``) from a local misuse
(``ValueError``/``TypeError``, raised for bad arguments as usual). All protocol refusals derive
from :class:`ProtocolError`.
"""

from __future__ import annotations


class ProtocolError(Exception):
    """Base class: a message or a protocol step was refused."""


class MalformedMessage(ProtocolError):
    """Bytes that do not decode — bad magic, unknown type, bad length, truncated, trailing — or a
    typed message built by hand with fields the decoder would never produce."""


class UnsupportedVersion(MalformedMessage):
    """Wire bytes of a protocol version this build does not speak: refused, never misread."""


class WrongRound(ProtocolError):
    """A message for another session or round (a replay across rounds lands here)."""


class WrongPhase(ProtocolError):
    """A message type the receiver does not expect in its current phase."""


class WrongSender(ProtocolError):
    """The sender or recipient field does not match who may send it, or who receives it."""


class ReplayedMessage(ProtocolError):
    """A second message of the same kind from the same sender in the same phase."""


class UnknownClient(ProtocolError):
    """A message names a client outside the cohort, or a neighbour this party has no state for."""


class ConfigMismatch(ProtocolError):
    """Two parties run the same session with different parameters (session config digests differ)."""


class ModelMismatch(ProtocolError):
    """A neighbour trained on a different global model (model hashes differ): refused before any reveal."""


class SignatureInvalid(ProtocolError):
    """An Ed25519 signature in authenticated mode does not verify, or one is missing."""


class DecryptionFailed(ProtocolError):
    """An encrypted share did not authenticate: tampered ciphertext, wrong key or wrong binding."""


class InconsistentShares(ProtocolError):
    """Secret shares, or a revealed value, do not match the commitment made earlier."""


class InconsistentView(ProtocolError):
    """The server showed this client two different survivor sets (equivocation)."""


class BelowThreshold(ProtocolError):
    """Too few parties remain to finish the round safely; the round is aborted."""


class SeedWithheld(BelowThreshold):
    """A client committed to a graph nonce and the nonce never arrived: a sparse neighbour graph
    cannot be derived without letting whoever withheld it choose among graphs. Round aborted."""


class ForgedInput(ProtocolError):
    """A masked input whose tag does not bind it to its sender, session, round and graph — replayed,
    substituted or spoofed. Detected before any sum is released; the round is aborted."""


class BothSharesRequested(ProtocolError):
    """An unmask request would reveal both masks of one client's input."""


class OverflowRefused(ProtocolError):
    """The configuration could wrap the ring sum; refused before any masking."""


class Aborted(ProtocolError):
    """This party already aborted the round; it accepts nothing more."""
