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
import math
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from flwr.app import RecordDict

from secfed.errors import printable
from secfed.federation import codec
from secfed.federation.builder import Census
from secfed.federation.evaluate import SCORE_KEYS
from secfed.federation.messages import Upload
from secfed.protocols import ProtocolError

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


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text} is not a finite number")
    return value


def _bounded(text: str) -> int:
    value = int(text)
    if abs(value) >= 2**63:  # 10**400 passed, then overflowed the round's record after it was applied
        raise ValueError(f"{text[:20]}… is not a 64-bit integer")
    return value


def _not_a_number(name: str) -> Any:
    raise ValueError(f"{name} is not a number")


def _json(out: Any, key: str, kind: type) -> Any:
    """``out[key]`` as JSON of ``kind``, every number finite and within 64 bits (found by review: NaN
    scores, an infinite noise multiplier and a 400-digit loss passed, and stopped the ServerApp later)."""
    value = json.loads(str(out[key]), parse_float=_finite, parse_int=_bounded, parse_constant=_not_a_number)
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
    except (KeyError, TypeError, ValueError, AttributeError, RecursionError, OverflowError, codec.CodecError,
            ProtocolError) as exc:
        raise MalformedReply(f"SuperNode {node}: malformed {step} reply ({type(exc).__name__}: {exc})") from None


def _only_hosted(node: int, hosted: Iterable[int], sites: Iterable[int], what: str) -> None:
    foreign = sorted(set(sites) - set(hosted))
    if foreign:
        raise MalformedReply(f"SuperNode {node}: its reply speaks for clients {foreign} it does not host ({what})")


@dataclass(frozen=True)
class Expected:
    """What a node's train reply may speak for: the clients it hosts, those of them in the round's
    cohort (exactly the sites it trains), and the names their statistics are logged under."""

    hosted: tuple[int, ...]
    trains: tuple[int, ...]
    names: frozenset[str] = frozenset()  # the trained sites' names (training statistics)
    baselines: frozenset[str] = frozenset()  # the hosted sites' local-only baselines' names

    def may_diverge(self, where: str) -> bool:
        """Whether a divergence at ``where`` (runtime.SiteDiverged's) is one this node can report: of a
        site it trains or of a baseline it keeps — never of a site another node hosts, which would stop
        everyone's run on one node's word (found by review)."""
        return where in self.names or where in {f"{b} (local-only baseline)" for b in self.baselines}


def train_reply(node: int, content: RecordDict, expected: Expected) -> TrainReply:
    """The train reply of ``node``, checked against what it may speak for (:class:`Expected`)."""
    with _reading(node, "train"):
        out = content.config_records[STEP]
        if "diverged" in out:
            where, cause = _json(out, "diverged", list)
            if not expected.may_diverge(str(where)):
                raise MalformedReply(f"SuperNode {node}: says {str(where)[:80]!r} diverged, a site it does not train")
            return TrainReply(diverged=(str(where), printable(str(cause))[:200]))  # a node's text, shown to the user
        reply = TrainReply(sites=[int(k) for k in out["sites"]], stats=_figures(_json(out, "stats", dict)),
                           baseline=_figures(_json(out, "baseline", dict)),
                           accountants={int(k): _accountants(v) for k, v in _json(out, "accountants", dict).items()},
                           shape=_shape(out["shape"]) if "shape" in out else None)
        data = [array_bytes(array, UPLOADS) for array in content[UPLOADS].values()] if UPLOADS in content else []
        reply.uploads = [codec.decode_upload(d) for d in data]
        reply.upload_bytes = sum(len(d) for d in data)
    if sorted(reply.sites) != sorted(expected.trains):
        raise MalformedReply(f"SuperNode {node}: says it trained clients {sorted(reply.sites)}, the round's cohort "
                             f"holds {sorted(expected.trains)} of its clients")
    _only_hosted(node, expected.hosted, reply.accountants, "accountants")
    _only_hosted(node, expected.trains, [u.client_id for u in reply.uploads], "uploads")
    for what, names, allowed in (("training statistics", reply.stats, expected.names),
                                 ("baseline statistics", reply.baseline, expected.baselines)):
        foreign = sorted(set(names) - allowed)
        if foreign:
            raise MalformedReply(f"SuperNode {node}: its reply speaks for sites {foreign} it does not train ({what})")
    return reply


def _figures(stats: dict[str, Any]) -> dict[str, dict[str, float]]:
    """Per site, its training figures: numbers, a loss at least."""
    for name, figures in stats.items():
        if not isinstance(figures, dict) or "loss" not in figures or not all(
                isinstance(v, (int, float)) and not isinstance(v, bool) for v in figures.values()):
            raise TypeError(f"statistics of {name!r} must be an object of numbers with a loss")
    return stats


def _accountants(states: Any) -> dict[str, Any]:
    """A site's DP-SGD accountant states (federated and local-only), each loadable or absent."""
    from secfed.privacy.accountant import SampledGaussianAccountant

    if not isinstance(states, dict) or set(states) - {"fed", "local"}:
        raise TypeError("an accountant entry must be an object of 'fed' and 'local'")
    for state in states.values():
        if state is not None:
            SampledGaussianAccountant().load_state_dict(state)  # ValueError naming what is wrong
    return states


def _shape(raw: Any) -> str:
    """The ring layout a node reports (secure_channel.ring_shape as JSON: per summand its name, length,
    encoding, bound and statistics runs), checked entry by entry, as sent."""
    def count(x: Any) -> bool:
        return isinstance(x, int) and not isinstance(x, bool) and x >= 0

    entries = json.loads(str(raw))
    if not isinstance(entries, list) or not all(
            isinstance(e, list) and len(e) in (4, 5) and isinstance(e[0], str) and count(e[1])
            and isinstance(e[2], str) and (e[3] is None or (isinstance(e[3], (int, float)) and not isinstance(e[3], bool)))
            and (len(e) == 4 or (isinstance(e[4], list) and all(
                isinstance(r, list) and len(r) == 2 and all(count(x) for x in r) for r in e[4])))
            for e in entries):
        raise TypeError("shape must be a list of [name, length, encoding, bound, runs] entries")
    return str(raw)


def hello_reply(node: int, content: RecordDict) -> tuple[list[int], Census]:
    """The sites ``node`` hosts and the census it read."""
    with _reading(node, "hello"):
        out = content.config_records[STEP]
        census = Census.from_dict(_json(out, "census", dict))
        if not isinstance(census.info.get("fingerprint"), str) or not isinstance(census.info.get("clients"), list):
            raise TypeError("the census needs the data's fingerprint and its clients")
        _check_counts(census)
        return [int(k) for k in out["sites"]], census


CENSUS_MAX_CLASSES = 1_000_000  # identities the server's heads may hold: 2 GB of classifier at a 512-wide neck


def _check_counts(census: Census) -> None:
    """The counts the server sizes its models by (found by review: a negative identity count raised in
    torch, and 10^12 asked the SuperLink for 128 TB — every node must send the same census, so all of
    them colluding, or one in unauthenticated mode)."""
    classes = 0
    for i, c in enumerate(census.info["clients"]):
        counts = [c.get(k) if isinstance(c, dict) else None for k in ("images", "classes")]
        if not (isinstance(c, dict) and isinstance(c.get("name"), str) and all(
                isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in counts) and counts[1] <= counts[0]):
            raise TypeError(f"client {i} of the census needs its name and its image and identity counts "
                            "(1 ≤ identities ≤ images)")
        classes += counts[1]
    if not 1 <= census.global_classes <= CENSUS_MAX_CLASSES or classes > CENSUS_MAX_CLASSES:
        raise ValueError(f"the census counts {max(classes, census.global_classes):,} identities (at most "
                         f"{CENSUS_MAX_CLASSES:,} are sized for)")


def scores_reply(node: int, content: RecordDict, hosted: Iterable[int],
                 names: Iterable[str] = ()) -> dict[tuple[int, str, str], Any] | tuple[str, str]:
    """The scores ``node`` computed, for the sites it hosts only; or (where, why) when a site it hosts
    (named in ``names``) found the model's features not finite."""
    with _reading(node, "evaluate"):
        if "diverged" in content.config_records[STEP]:
            where, cause = _json(content.config_records[STEP], "diverged", list)
            if str(where) not in set(names):
                raise MalformedReply(f"SuperNode {node}: says {str(where)[:80]!r} diverged, a site it does not host")
            return str(where), printable(str(cause))[:200]  # a node's text, shown to the user
        rows = _json(content.config_records[STEP], "scores", list)
        scores = {(int(k), str(variant), str(name)): value for k, variant, name, value in rows}
        if not all(value is None or (isinstance(value, dict) and all(
                isinstance(value.get(k), (int, float)) and not isinstance(value.get(k), bool) for k in SCORE_KEYS))
                for value in scores.values()):
            raise TypeError(f"each score must be a JSON object of numbers ({', '.join(SCORE_KEYS)})")
    _only_hosted(node, hosted, [k for k, _, _ in scores], "scores")
    return scores
