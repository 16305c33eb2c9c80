"""A SuperNode's sites in ``secfed train --flower``: which clients it hosts, their data, and the
private state each keeps in a folder of its own between rounds.

A node hosts the clients k with ``k mod num-partitions == partition-id`` (Flower's node config),
so the synthetic domains, or any scenario's clients, are spread over the SuperNodes. It rebuilds
the run's federation from the run configuration the server sends (deterministic: the same
splits, initial models and classifier heads as an in-process run) and decodes the training
images of its own sites only. Its data comes from ``secfed-data-root`` (node config), else the
configuration's ``data.root`` (else the synthetic default, generated into this machine's cache).

    STATE_DIR/runs/TOKEN/site-KKKK-NAME/state.pt    one per hosted site (0600), written atomically:
        the model's local tensors (classifier, BN statistics under ``bn_stats=local``) and, after
        local training, its shared tensors too (the "local model" the final evaluation scores),
        the method's site state (FedReID's expert, …), the DP-SGD accountant, and the same for the
        site's local-only baseline. Loaded with ``torch.load(weights_only=True)``.

    STATE_DIR/images/KEY.pt    decoded images (a site's training set, a domain's query or gallery),
        kept between messages so that a message decodes nothing the node decoded before. KEY is a
        SHA-256 over the samples' content fingerprint (relative path, size, identity, camera), each
        file's modification time and the input size; the file (0600) holds the tensor and its
        SHA-256, checked on load (a file that fails the check is decoded again and replaced).

TOKEN is the run's random token (a fresh run never reads another run's state).

The server writes the run configuration, so a node checks it against its own policy before it opens
anything (:func:`check_run`): a run without secure aggregation is refused unless the node config sets
``secfed-allow-plain`` (the uploads would leave the node in the clear), and every path the
configuration names is a path on this machine — data is read only from the node's own
``secfed-data-root`` (the dataset folders and ``data.split_file`` must lie inside it; the node keeps
the run's copy of the split file in its state folder), and the public set of distillation
(``method.kd_public``) only from its own
``secfed-public-root``. With ``secfed-max-epsilon`` set, the updates must carry an ε that holds
against the server (distributed Skellam noise, or DP-SGD at every site — central noise is the
server's own), and every (ε, δ) the run claims for the node's sites, over all rounds at the worst
case — for one example (one training image more or less): the stronger of its guarantees on the
updates plus DFS — added to what earlier runs on this node were charged, must stay within it and
``secfed-max-delta`` (default 1e-3) (:meth:`NodeSites.check_privacy`, ``STATE_DIR/privacy-spent.json``):
the server cannot turn the noise down or off, raise δ, nor reset the budget.

A node trains each round of a run once, in order, within the schedule, under the configuration of
the run's first round (``rounds.json`` in the run's folder; each claim charges the privacy record for
the rounds up to it), with secret randomness of its own (training order, stochastic rounding): a server that
re-ran a round without one node would otherwise subtract the two sums. ``secfed-reproducible=true``
uses the run seed's draws instead — bit for bit an in-process run; ``secfed flower local`` sets it,
its server being the user's own.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import io
import json
import math
import os
import re
import secrets
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from secfed import atomic_file, locking
from secfed.config import RunConfig
from secfed.data.errors import DataError
from secfed.data.images import load_images
from secfed.data.listing import Resolver
from secfed.data.split_file import read_split_file
from secfed.data.types import Sample
from secfed.federation.builder import SPLIT_FILE, Federation, build, make_shards, resolve_data, within
from secfed.federation.runtime import prefixed, split_prefixed
from secfed.privacy.ledger import PrivacyLedger

from . import node
from .mod import ALLOW_SPARSE_KEY

DATA_ROOT_KEY = "secfed-data-root"
ALLOW_PLAIN_KEY = "secfed-allow-plain"
PUBLIC_ROOT_KEY = "secfed-public-root"
IMAGE_CACHE_KEY, DEFAULT_IMAGE_CACHE_GB = "secfed-image-cache-gb", 8.0
LOCK_WAIT = 600.0  # seconds a node's record waits for its lock: a message trains under it at most this long
MAX_SPLIT_FILE = 32 * 2**20  # the largest set's seeded splits take a few MB
MAX_EPSILON_KEY = "secfed-max-epsilon"
MAX_DELTA_KEY = "secfed-max-delta"
DEFAULT_MAX_DELTA = 1e-3  # over the node's lifetime: a hundred runs at secfed's default δ of 1e-5
REPRODUCIBLE_KEY = "secfed-reproducible"
SPENT_FILE = "privacy-spent.json"  # in STATE_DIR: the ε each run claimed for this node's data, by kind
ROUNDS_FILE = "rounds.json"  # in the run's folder: the last round this node trained
SKELLAM, DP_SGD, DFS = "Skellam", "DP-SGD", "DFS"  # what protects one example, by mechanism
UNBOUNDED = "none against the server"  # a run trained with no ε against the server: recorded as [-1, -1]
STATE_FILE = "state.pt"
_TOKEN = re.compile(r"[0-9a-f]{16,64}")


def hosted(node_config: Mapping[str, object], num_clients: int) -> list[int]:
    """The clients this node hosts: k mod num-partitions == partition-id (all of them without those keys)."""
    try:
        part = int(node_config.get("partition-id", 0))  # type: ignore[arg-type]
        parts = int(node_config.get("num-partitions", 1))  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise node.NodeSetupError("node config partition-id and num-partitions must be integers") from None
    if not 0 <= part < parts:
        raise node.NodeSetupError(f"node config partition-id={part} must lie in [0, num-partitions={parts})")
    return [k for k in range(num_clients) if k % parts == part]


def check_run(cfg: RunConfig, node_config: Mapping[str, object]) -> tuple[Path | None, Path | None]:
    """The node's data root and public root, once the server's run configuration passes the node's
    policy (see the module docstring); refused with :class:`node.NodeSetupError` naming the setting
    otherwise."""
    if not cfg.secagg.enabled and not node.yes(node_config.get(ALLOW_PLAIN_KEY, False)):
        raise node.NodeSetupError(f"the run turns secure aggregation off (secagg.enabled = false): this node's "
                                  f"updates would leave it unmasked; set {ALLOW_PLAIN_KEY}=true to allow it")
    public = _public_root(cfg, node_config)
    data_root = node_config.get(DATA_ROOT_KEY)
    if not data_root:
        named = [k for k, v in (("data.root", cfg.data.root), ("data.split_file", cfg.data.split_file)) if v is not None]
        if named:
            raise node.NodeSetupError(f"the run names paths on this machine ({', '.join(named)}); a node reads "
                                      f"data only from its own {DATA_ROOT_KEY} (node config)")
        return None, public
    root = Path(str(data_root)).expanduser().absolute()
    if cfg.data.split_file is not None and not within(root, cfg.data.split_file):
        raise node.NodeSetupError(f"data.split_file = {cfg.data.split_file!r} lies outside this node's "
                                  f"{DATA_ROOT_KEY} ({root})")
    return root, public


def _public_root(cfg: RunConfig, node_config: Mapping[str, object]) -> Path | None:
    """The folder of public images the node lets the run distil on: ``method.kd_public`` must lie in
    the node's own ``secfed-public-root`` — anywhere else, even inside its data root, it could name
    private images the run does not list (found by review: a run listing two domains distilled on the
    third's training folder)."""
    if cfg.method.kd_public is None:
        return None
    public = node_config.get(PUBLIC_ROOT_KEY)
    if not public:
        raise node.NodeSetupError(f"the run distils on method.kd_public = {cfg.method.kd_public!r}; this node names "
                                  f"no public set of its own ({PUBLIC_ROOT_KEY}), and reads public images nowhere else")
    root = Path(str(public)).expanduser().absolute()
    if not within(root, cfg.method.kd_public):
        raise node.NodeSetupError(f"method.kd_public = {cfg.method.kd_public!r} lies outside this node's "
                                  f"{PUBLIC_ROOT_KEY} ({root})")
    return root


def node_jobs(fed: Federation, sites: Sequence[int]) -> set[tuple[int, str, str]]:
    """Every evaluation job evaluate.py's plan may give ``sites`` in this run (its final tables, every
    site in the last cohort) — under an ε, no site's own pre-aggregation model ("local"): a node
    scores these and nothing else."""
    from secfed.federation.evaluate import plan
    from secfed.federation.runtime import private_logs

    cohort = () if private_logs(fed) else sites
    return {job for k, jobs in plan(fed, local_training=True, final=True, cohort=cohort).items() if k in sites
            for job in jobs}


def scored_domains(fed: Federation, sites: Sequence[int]) -> set[str]:
    """The domains whose query/gallery ``sites`` score: the only ones a node decodes — not every
    domain of the run (found by review: each node decoded all of them)."""
    return {name for _, _, name in node_jobs(fed, sites)}


def planned_epsilons(fed: Federation, sites: Sequence[int], rounds: int | None = None
                     ) -> dict[str, tuple[float, float]]:
    """The (ε, δ) the run gives one example of ``sites``' data against the server (add or remove one
    training image) after ``rounds`` of its rounds (all of them by default), at the worst case (every
    round released, each of the sites selected in every one), by mechanism: the distributed Skellam
    noise on the updates, the weakest site's DP-SGD, DFH's noised statistics. The run's own client-level
    Skellam figure is for zero-out neighbours; one example more or less moves a client's update by up
    to twice its bound, so it is accounted at twice the sensitivity (found by review: the zero-out
    figure was charged per example, 2.5–3.9× too low). DFS's figure is for one identity's statistics
    replaced by another's, which covers one image of an identity with others (an identity's only image
    changes its count N_i, which the release does not protect: SECURITY.md). Central noise (β,
    DP-FedAvg) is the server's own and protects nothing from it; reproducible noise nothing at all."""
    plan, schedule = fed.server.privacy.plan, fed.config.schedule
    rounds = schedule.rounds if rounds is None else rounds
    if plan.reproducible_noise:
        return {}
    out: dict[str, tuple[float, float]] = {}
    if plan.claims_epsilon and plan.mechanism == "skellam" and plan.skellam is not None and plan.delta is not None:
        k = plan.skellam
        one_example = dataclasses.replace(k, l2_sensitivity=2 * k.l2_sensitivity, l1_sensitivity=min(
            math.sqrt(k.padded_dim) * 2 * k.l2_sensitivity, 2 * k.l1_sensitivity))
        ledger = PrivacyLedger("skellam", plan.delta, skellam=one_example, colluders=plan.colluders,
                               fewest_shares=plan.fewest_shares)
        for _ in range(rounds):
            ledger.record_lost_release()  # the worst case of a round: the fewest honest noise shares
        out[SKELLAM] = (ledger.epsilon(), plan.delta)
    dp_sgd = [(dp.epsilon_every_round(schedule.batch_size, schedule.local_epochs, rounds), dp.delta)
              for k in sites if (dp := fed.clients[k].dp_sgd) is not None]
    if dp_sgd:  # the weakest site's ε and δ, each (found by review: the tuple's max left a larger δ out)
        out[DP_SGD] = (max(e for e, _ in dp_sgd), max(d for _, d in dp_sgd))
    if plan.dfs is not None and plan.dfs.epsilon is not None:  # replace-one-identity: covers one image of it
        out[DFS] = (dataclasses.replace(plan.dfs, rounds=rounds).epsilon, plan.dfs.delta)
    return out


def run_charge(kinds: Mapping[str, Sequence[float]]) -> tuple[float, float]:
    """One run's (ε, δ) for one example of the node's data: the stronger of its guarantees on the
    updates (Skellam's and DP-SGD's cover the one release), plus DFH's statistics, a release of their
    own. One number per run, summed over runs: each kind checked on its own let a Skellam run and a
    DP-SGD run never add up (found by review)."""
    if UNBOUNDED in kinds:
        return math.inf, 1.0
    update = [(float(kinds[k][0]), float(kinds[k][1])) for k in (SKELLAM, DP_SGD) if k in kinds]
    eps, delta = min(update) if update else (0.0, 0.0)
    if DFS in kinds:
        eps, delta = eps + float(kinds[DFS][0]), delta + float(kinds[DFS][1])
    return eps, delta


def uncovered(fed: Federation, sites: Sequence[int]) -> str | None:
    """Why no ε against the server covers ``sites``' updates (None: one does) — distributed Skellam
    noise, or DP-SGD at every site. (DFH's statistics need no rule here: wherever an update ε is
    claimed, the configuration already refuses statistics shared without noise.)"""
    plan = fed.server.privacy.plan
    if plan.reproducible_noise:
        return "its noise is reproducible from the run seed (privacy.reproducible_noise)"
    if plan.mechanism != "skellam" and any(fed.clients[k].dp_sgd is None for k in sites):
        return ("the updates: no distributed Skellam noise, and a site without DP-SGD (central noise — β, "
                "DP-FedAvg — is the server's own and protects nothing from it)")
    return None


def own_nodes_policy(cfg: RunConfig) -> dict[str, str]:
    """The node config of SuperNodes started for the user's own run (``secfed flower local``): they
    read the run's data root and accept the secure-aggregation setting the user chose — a deployed
    node decides both in its own node config."""
    policy = {REPRODUCIBLE_KEY: "true"} if cfg.secagg.enabled else {REPRODUCIBLE_KEY: "true", ALLOW_PLAIN_KEY: "true"}
    if cfg.secagg.graph == "auto":  # the user's server may choose a sparse graph: the user's own choice
        policy[ALLOW_SPARSE_KEY] = "true"
    if cfg.data.root is not None:
        policy[DATA_ROOT_KEY] = str(Path(cfg.data.root).expanduser().resolve())
    if cfg.method.kd_public is not None:
        policy[PUBLIC_ROOT_KEY] = str(Path(cfg.method.kd_public).expanduser().resolve())
    return policy


def _locked(lock: Path) -> contextlib.AbstractContextManager[None]:
    """An exclusive lock on ``lock`` while the block runs, waited for at most :data:`LOCK_WAIT`: several
    runs, or two messages of one, may reach a node's records at once (found by review: two claims of
    one round both passed)."""
    return locking.exclusive(lock, LOCK_WAIT, lambda: node.NodeSetupError(
        f"{lock} stayed locked for {LOCK_WAIT:.0f} s: another message of this node holds it (or a process "
        "that should not)"))


@contextlib.contextmanager
def _spent_ledger(state: Path) -> Iterator[dict[str, dict[str, list[float]]]]:
    """The node's record of the (ε, δ) each run was charged for its data ({token: {kind: [ε, δ]}}),
    read and written back under a lock."""
    path = state / SPENT_FILE
    state.mkdir(parents=True, exist_ok=True, mode=0o700)
    with _locked(state / (SPENT_FILE + ".lock")):
        try:
            spent = json.loads(path.read_text()) if path.is_file() else {}
            if not (isinstance(spent, dict) and all(isinstance(run, dict) and all(
                    _charge(kind, v) for kind, v in run.items()) for run in spent.values())):
                raise ValueError("not a mapping of runs to [ε, δ] by kind, each finite and ≥ 0")
        except (ValueError, OSError) as exc:
            raise node.NodeSetupError(f"{path}: not this node's privacy record ({exc}); the node cannot tell what "
                                      f"earlier runs spent — restore it, or remove it with the run folders under "
                                      f"{state / 'runs'} to start counting afresh") from None
        yield spent
        atomic_file.write_bytes(path, json.dumps(spent, indent=1, sort_keys=True).encode(), mode=0o600)


def _charge(kind: str, value: Any) -> bool:
    """Whether ``value`` is a charge the node wrote: [ε, δ] finite and ≥ 0, or [-1, -1] for none."""
    if not (isinstance(value, list) and len(value) == 2 and all(
            isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) for x in value)):
        return False
    if kind not in (SKELLAM, DP_SGD, DFS, UNBOUNDED):  # fail closed: a kind this node never writes
        return False
    return value == [-1, -1] if kind == UNBOUNDED else all(x >= 0 for x in value)


def run_folder(node_config: Mapping[str, object], token: str) -> Path:
    if not _TOKEN.fullmatch(token):  # match() let "…\n" through: `$` matches before a final newline (review)
        raise node.NodeSetupError(f"run token {token!r} is not a hex string")
    folder = node.state_dir(node_config) / "runs" / token
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    return folder


@dataclass
class NodeSites:
    """The node's view of the run: the whole federation, its own sites' data and state loaded."""

    fed: Federation
    sites: list[int]
    folder: Path

    @classmethod
    def open(cls, cfg: RunConfig, node_config: Mapping[str, object], token: str, *, train: bool) -> NodeSites:
        """Build the federation and load the state of this node's sites (and, ``train``, their training
        images; otherwise the evaluation domains' query/gallery, which training never reads)."""
        root, public = check_run(cfg, node_config)
        cfg = _under(cfg, root, public, run_folder(node_config, token))
        cache = ImageCache(node.state_dir(node_config) / "images", image_cache_bytes(node_config))
        fed = build(cfg, data_root=root, train_images=False, images=cache,
                    eval_images=False if train else lambda fed: scored_domains(fed, hosted(node_config, len(fed.clients))))
        sites = hosted(node_config, len(fed.clients))
        nodes = cls(fed, sites, run_folder(node_config, token))
        nodes.check_privacy(node_config)
        if train and sites:
            nodes._load_images(root, cache)
        nodes.reload()
        return nodes

    def check_privacy(self, node_config: Mapping[str, object], *, charge: int = 0) -> None:
        """The node's privacy floor (see the module docstring): refused naming what no ε against the
        server covers, or the (ε, δ) the whole run would reach for this node's data together with what
        other runs on this node were charged (basic composition: a server cannot reset the budget by
        starting runs afresh — found by review). ``charge``: the run has claimed this many rounds, and
        is charged their guarantee now (a run cut short is charged for what it trained, not for all
        its rounds; it keeps one configuration, see :meth:`round_seed`)."""
        raw = node_config.get(MAX_EPSILON_KEY)
        missing = uncovered(self.fed, self.sites)
        if raw is None:  # no floor: the run is still charged, so that a floor set later counts it (review)
            if charge:
                with _spent_ledger(node.state_dir(node_config)) as spent:
                    spent[self.folder.name] = self._record_entry(charge, missing)
            return
        most = node.number(raw, MAX_EPSILON_KEY)
        most_delta = node.number(node_config.get(MAX_DELTA_KEY, DEFAULT_MAX_DELTA), MAX_DELTA_KEY)
        if missing:
            raise node.NodeSetupError(f"the run claims no ε against the server for this node's sites — {missing}; "
                                      f"this node requires ε ≤ {most:g} ({MAX_EPSILON_KEY})")
        reached = planned_epsilons(self.fed, self.sites)
        eps, delta = run_charge(reached)
        token = self.folder.name
        state = node.state_dir(node_config)
        with _spent_ledger(state) as spent:
            # a run this node trained that its record does not hold (the record removed, or the run older
            # than it) counts as spent without bound: a deleted record is no fresh budget (found by review)
            unrecorded = [t for t in (f.parent.name for f in (state / "runs").glob(f"*/{ROUNDS_FILE}"))
                          if t not in spent and t != token]
            before = [run_charge(run) for t, run in spent.items() if t != token] + [(math.inf, 1.0)] * len(unrecorded)
            total, total_delta = eps + sum(e for e, _ in before), delta + sum(d for _, d in before)
            if not (total <= most and total_delta <= most_delta):
                kinds = ", ".join(f"{kind} ε = {e:.3g}" for kind, (e, _) in reached.items())
                unbounded = sum(1 for e, _ in before if math.isinf(e))
                earlier = (f" (with {len(before)} earlier runs on this node"
                           + (f", {unbounded} of them with no ε against the server or not in its record "
                              f"{state / SPENT_FILE}: to start counting afresh once you judge them spent, remove "
                              f"that record and the run folders under {state / 'runs'}" if unbounded else "")
                           + ")" if before else "")
                raise node.NodeSetupError(
                    f"the run would reach ε = {eps:.3g}, δ = {delta:.2g} for this node's data over its "
                    f"{self.fed.config.schedule.rounds} rounds ({kinds}): ε = {total:.3g}, δ = {total_delta:.2g} "
                    f"in all{earlier}; this node allows ε ≤ {most:g} ({MAX_EPSILON_KEY}), δ ≤ {most_delta:g} "
                    f"({MAX_DELTA_KEY})")
            if charge:
                spent[token] = self._record_entry(charge, missing)

    def _record_entry(self, rounds: int, missing: str | None) -> dict[str, list[float]]:
        """The record's entry for this run after ``rounds`` of its rounds: nothing for a node hosting none
        of its sites (found by review: its rounds.json alone counted as a run without bound), without
        bound where no ε holds against the server (``missing``), else the (ε, δ) of each mechanism."""
        if not self.sites:
            return {}
        if missing:
            return {UNBOUNDED: [-1.0, -1.0]}
        return {kind: list(value) for kind, value in planned_epsilons(self.fed, self.sites, rounds).items()}

    def round_seed(self, node_config: Mapping[str, object], t: int) -> int | None:
        """Claim round ``t`` (0-based) for this node, once: a round is trained at most once per run, in
        order, within the schedule, and a run keeps the configuration of its first round — a server that
        re-runs a round with one node less subtracts the two sums, and one that changed the configuration
        each round had every change judged as a run of its own (found by review). Each claim charges
        the node's privacy record for the rounds up to it. Returns the seed of the round's training and rounding draws:
        fresh secret randomness, so that not even another run can recompute this node's vector; the run
        seed's (as in-process, bit for bit) only where the node config sets ``secfed-reproducible=true``."""
        config = hashlib.sha256(json.dumps(self.fed.config.to_dict(), sort_keys=True).encode()).hexdigest()
        rounds, path = self.fed.config.schedule.rounds, self.folder / ROUNDS_FILE
        with _locked(self.folder / (ROUNDS_FILE + ".lock")):
            try:  # (a record from before runs kept one configuration has none: it is this one)
                record = json.loads(path.read_text()) if path.is_file() else {"last": -1}
                last, pinned = int(record["last"]), str(record.get("config", config))
            except (ValueError, KeyError, TypeError, OSError):
                raise node.NodeSetupError(f"{path}: not this node's round record; the run's state is damaged") from None
            if pinned != config:
                raise node.NodeSetupError(f"round {t + 1}: the run's configuration changed since its first round on this "
                                          "node; a run keeps one configuration (a new one is a new run)")
            if not last < t < rounds:
                raise node.NodeSetupError(f"round {t + 1}: this node trains rounds after {last + 1} of this run's "
                                          f"{rounds} once each, in order; a round is never trained twice")
            self.check_privacy(node_config, charge=t + 1)  # rounds 0..t, at the worst case
            atomic_file.write_bytes(path, json.dumps({"last": t, "config": config}).encode(), mode=0o600)
        return None if node.yes(node_config.get(REPRODUCIBLE_KEY, False)) else secrets.randbits(63)

    def reload(self) -> None:
        """Load the state each of the node's sites saved (a site that never trained keeps its start)."""
        for k in self.sites:
            self._load(k)

    def _load_images(self, root: Path | None, cache: ImageCache) -> None:
        """This node's sites' training images, from the cache (decoded once per data and size)."""
        cfg = self.fed.config
        shards, _ = make_shards(cfg, resolve_data(cfg, root=root).trained)
        for k in self.sites:
            site = self.fed.clients[k].site
            site.images = cache(shards[k].samples, cfg.data.height, cfg.data.width).to(site.labels.device)
            if k in self.fed.baselines:
                self.fed.baselines[k].images = site.images

    def site_file(self, k: int) -> Path:
        name = re.sub(r"[^A-Za-z0-9_.-]+", "_", self.fed.clients[k].site.name)
        return self.folder / f"site-{k:04d}-{name}" / STATE_FILE

    def _load(self, k: int) -> None:
        path = self.site_file(k)
        if not path.is_file():
            return  # the site's first round: it starts from the run's initial model
        try:
            state = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as exc:  # a truncated or foreign file
            raise node.NodeSetupError(f"{path}: not a readable site state ({exc})") from None
        fed, client = self.fed, self.fed.clients[k]
        _restore(client.site, state["client"], fed)
        if client.dp_sgd is not None:
            client.dp_sgd.accountant.load_state_dict(json.loads(state["dp_sgd"]))
        if k in fed.baselines:
            _restore(fed.baselines[k], state["baseline"], fed, strict=True)
            if k in fed.baseline_dp:
                fed.baseline_dp[k].accountant.load_state_dict(json.loads(state["baseline_dp"]))

    def save(self, k: int) -> None:
        """Write site k's private state (after it trained)."""
        fed, client = self.fed, self.fed.clients[k]
        state: dict[str, Any] = {
            "client": {**client.site.model.state_dict(), **prefixed(fed.method.site_state(client.site))},
            "dp_sgd": json.dumps(client.dp_sgd.accountant.state_dict()) if client.dp_sgd else "",
        }
        if k in fed.baselines:
            alone = fed.baselines[k]
            state["baseline"] = {**alone.model.state_dict(), **prefixed(fed.method.site_state(alone))}
            state["baseline_dp"] = json.dumps(fed.baseline_dp[k].accountant.state_dict()) if k in fed.baseline_dp else ""
        buffer = io.BytesIO()
        torch.save(state, buffer)
        path = self.site_file(k)
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        atomic_file.write_bytes(path, buffer.getvalue())


def _under(cfg: RunConfig, root: Path | None, public: Path | None, folder: Path) -> RunConfig:
    """``cfg`` with its paths resolved against the node's roots (checked by :func:`check_run`): the
    public set against the public root; the split file is read from the data root but kept — drawn
    entries added — in the run's ``folder`` in the node's state: the node never writes into its data
    root (found by review: a server naming `data.split_file = "viper/cam_a/999_0.bmp"` had the node
    write JSON over a site's image)."""
    data = {"split_file": str(_kept_split(root / Path(cfg.data.split_file).expanduser(), folder))} \
        if root is not None and cfg.data.split_file else {}  # expanded as within() read it
    method = {"kd_public": str(public / Path(cfg.method.kd_public).expanduser())} if public is not None else {}
    return cfg.model_copy(update={"data": cfg.data.model_copy(update=data),
                                  "method": cfg.method.model_copy(update=method)})


def _kept_split(named: Path, folder: Path) -> Path:
    """The run's copy of the split file ``named`` in the node's run ``folder`` (copied once, at the
    run's first message; a later message reads and extends the copy)."""
    kept = folder / SPLIT_FILE
    if not kept.exists():
        try:  # read and checked in memory first: only a split file is ever written (found by review: any
            # file of the data root, a 150 MB archive, was copied into the state folder at each new token)
            if not named.is_file() or named.stat().st_size > MAX_SPLIT_FILE:
                raise DataError(named, f"not a file of at most {MAX_SPLIT_FILE >> 20} MiB")
            doc = read_split_file(named)
        except (DataError, OSError) as exc:
            raise node.NodeSetupError(f"data.split_file names {named}, which is not a split file of this node's "
                                      f"data root ({exc}); the node reads one there, and writes none") from None
        atomic_file.write_bytes(kept, json.dumps(doc).encode(), mode=0o600)
    return kept


def image_cache_bytes(node_config: Mapping[str, object]) -> int:
    """The most the node's decoded-image cache may hold (``secfed-image-cache-gb``, default 8 GB)."""
    return int(node.number(node_config.get(IMAGE_CACHE_KEY, DEFAULT_IMAGE_CACHE_GB), IMAGE_CACHE_KEY,
                           unit=" (GB)") * 1e9)


class ImageCache:
    """Decoded images kept in the node's state folder between messages (see the module docstring), at
    most ``limit`` bytes: the files used longest ago go first (found by review: a server asking hello
    at sizes of its choice filled the node's disk, 35 GB per hello at Market-1501 scale)."""

    def __init__(self, folder: Path, limit: int = int(DEFAULT_IMAGE_CACHE_GB * 1e9)) -> None:
        self.folder, self.limit = folder, limit
        self.decoded = 0  # how many images this process decoded (a warm cache: none)

    def key(self, samples: Sequence[Sample], height: int, width: int) -> str:
        # The data fingerprint's fields and each file's modification time: an image rewritten in
        # place (even at the same size) is decoded again, never served from an older decoding.
        h, resolve = hashlib.sha256(f"secfed-images/v2|{height}x{width}\n".encode()), Resolver()
        for s in samples:
            st = s.path.stat()
            h.update(os.fsencode(resolve(s.path)) + f"|{st.st_size}|{st.st_mtime_ns}|{s.pid}|{s.camid}\n".encode())
        return h.hexdigest()

    def __call__(self, samples: Sequence[Sample], height: int, width: int) -> torch.Tensor:
        path = self.folder / f"{self.key(samples, height, width)}.pt"
        if path.is_file():
            try:
                saved = torch.load(path, map_location="cpu", weights_only=True)
                images = saved["images"]
                if hashlib.sha256(images.numpy().tobytes()).hexdigest() == saved["sha256"]:
                    os.utime(path)  # used now: the last to go
                    return images
            except Exception:  # a truncated or foreign file: decode again and replace it
                pass
        images = load_images(samples, height, width)
        self.decoded += len(images)
        buffer = io.BytesIO()
        torch.save({"images": images, "sha256": hashlib.sha256(images.numpy().tobytes()).hexdigest()}, buffer)
        self.folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        atomic_file.write_bytes(path, buffer.getvalue(), mode=0o600)
        self._evict(keep=path)
        return images

    def _evict(self, keep: Path) -> None:
        """Remove the files used longest ago until the cache holds at most ``limit`` bytes (``keep``,
        just written, stays: this message needs it)."""
        files = []
        for path in self.folder.glob("*.pt"):
            try:
                st = path.stat()
            except OSError:  # removed meanwhile by another message's eviction
                continue
            files.append((st.st_mtime_ns, st.st_size, path))
        total = sum(size for _, size, _ in files)
        for _, size, path in sorted(files):
            if total <= self.limit:
                break
            if path != keep:
                path.unlink(missing_ok=True)
                total -= size


def _restore(site: Any, state: dict[str, torch.Tensor], fed: Federation, *, strict: bool = True) -> None:
    own, method = split_prefixed(state)
    site.model.load_state_dict(own, strict=strict)
    fed.method.load_site_state(site, method)
