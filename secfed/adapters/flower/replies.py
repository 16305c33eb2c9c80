"""The SuperNodes' replies to secfed's ServerApp, read as untrusted input.

A node's reply crosses the network from a machine the server does not control: every field is
checked here (types, the sites it speaks for, its uploads' encoding) before the ServerApp uses it.
A reply that fails is a :class:`MalformedReply` naming the node and the field; the ServerApp then
treats that node as dropped for the round (as a node that did not answer), never stops the run on
it, and never lets one node speak for a site another node hosts (its statistics, its uploads, its
DP-SGD accountant).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from flwr.app import RecordDict

from secfed.federation import codec
from secfed.federation.builder import Census
from secfed.federation.messages import Upload

from .client_app import STEP, UPLOADS
from .wire import array_bytes


class MalformedReply(ValueError):
    """A node's reply that does not say what its step's reply must (named in the message)."""


@dataclass
class TrainReply:
    """One node's train reply: the sites it trained (those it hosts in the cohort), their training
    statistics, the accountants it keeps, its uploads and the layout of its ring vector; or only
    where and why a site diverged."""

    sites: list[int] = field(default_factory=list)
    stats: dict[str, Any] = field(default_factory=dict)
    baseline: dict[str, Any] = field(default_factory=dict)
    accountants: dict[int, dict[str, Any]] = field(default_factory=dict)
    uploads: list[Upload] = field(default_factory=list)
    upload_bytes: int = 0
    shape: str | None = None
    diverged: tuple[str, str] | None = None


def _json(out: Any, key: str, kind: type) -> Any:
    value = json.loads(str(out[key]))
    if not isinstance(value, kind):
        raise TypeError(f"{key} must be a JSON {kind.__name__}")
    return value


@contextmanager
def _reading(node: int, step: str) -> Iterator[None]:
    """Every way a field can be missing or of the wrong type, as one MalformedReply naming the node."""
    try:
        yield
    except MalformedReply:
        raise
    except (KeyError, TypeError, ValueError, AttributeError, RecursionError, codec.CodecError) as exc:
        raise MalformedReply(f"SuperNode {node}: malformed {step} reply ({type(exc).__name__}: {exc})") from None


def _only_hosted(node: int, hosted: Iterable[int], sites: Iterable[int], what: str) -> None:
    foreign = sorted(set(sites) - set(hosted))
    if foreign:
        raise MalformedReply(f"SuperNode {node}: its reply speaks for clients {foreign} it does not host ({what})")


def train_reply(node: int, content: RecordDict, hosted: Iterable[int]) -> TrainReply:
    """The train reply of ``node``, which hosts the clients ``hosted``."""
    hosted = list(hosted)
    with _reading(node, "train"):
        out = content.config_records[STEP]
        if "diverged" in out:
            where, cause = _json(out, "diverged", list)
            return TrainReply(diverged=(str(where), str(cause)))
        reply = TrainReply(sites=[int(k) for k in out["sites"]], stats=_json(out, "stats", dict),
                           baseline=_json(out, "baseline", dict),
                           accountants={int(k): v for k, v in _json(out, "accountants", dict).items()},
                           shape=str(out["shape"]) if "shape" in out else None)
        if not all(isinstance(v, dict) for v in reply.accountants.values()):
            raise TypeError("each accountant state must be a JSON object")
        data = [array_bytes(array, UPLOADS) for array in content[UPLOADS].values()] if UPLOADS in content else []
        reply.uploads = [codec.decode_upload(d) for d in data]
        reply.upload_bytes = sum(len(d) for d in data)
    _only_hosted(node, hosted, reply.sites, "trained sites")
    _only_hosted(node, hosted, reply.accountants, "accountants")
    _only_hosted(node, hosted, [u.client_id for u in reply.uploads], "uploads")
    return reply


def hello_reply(node: int, content: RecordDict) -> tuple[list[int], Census]:
    """The sites ``node`` hosts and the census it read."""
    with _reading(node, "hello"):
        out = content.config_records[STEP]
        census = Census.from_dict(_json(out, "census", dict))
        if not isinstance(census.info.get("fingerprint"), str) or not isinstance(census.info.get("clients"), list):
            raise TypeError("the census needs the data's fingerprint and its clients")
        return [int(k) for k in out["sites"]], census


def scores_reply(node: int, content: RecordDict, hosted: Iterable[int]) -> dict[tuple[int, str, str], Any]:
    """The scores ``node`` computed, for the sites it hosts only."""
    with _reading(node, "evaluate"):
        rows = _json(content.config_records[STEP], "scores", list)
        scores = {(int(k), str(variant), str(name)): value for k, variant, name, value in rows}
        if not all(value is None or isinstance(value, dict) for value in scores.values()):
            raise TypeError("each score must be a JSON object")
    _only_hosted(node, hosted, [k for k, _, _ in scores], "scores")
    return scores
