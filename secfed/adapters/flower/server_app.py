"""The ServerApp of ``secfed train --flower``: the Flower transport of secfed's round driver.

The round is :func:`secfed.federation.runtime.drive`'s, once for both transports; this module only
says how its messages reach the sites (the SuperNodes) and writes the run directory on the machine
that runs the ServerApp (the SuperLink's) through the same runtime code. It never lists or decodes
a site's data: the nodes' hello replies carry the run's census (builder.Census) and the server
builds its federation from that alone::

    runtime.drive_round                     this transport
    cohort, broadcast
    train + aggregate ───────────────────▶  train → nodes hosting the cohort (client_app.py: client
                                            steps, privacy step, baselines); SecAggWorkflow sums
                                            the nodes' ring vectors, bound to the broadcast; decode
    apply, account, record
    evaluate ────────────────────────────▶  federation/evaluate.py's jobs on the nodes' own
                                            query/gallery (raw-pixel floor too); only scores return
    checkpoint, one metrics line

What differs from an in-process run: each node adds its sites' quantised vectors before masking,
so the server learns sums over nodes (a node hosting one site: over sites, as in-process);
each site's stochastic rounding draws from the run seed as in-process, so the ring sums and the new
global model are an in-process run's bit for bit; dropouts are real (``secagg.dropout_rate`` is refused) and a round
whose protocol aborts releases nothing (in-process, the round is retried among the survivors);
the checkpoint holds the server's state — the sites' own state stays in their folders on the
SuperNodes, so ``--resume`` is refused and ``secfed evaluate`` scores a site's local parts as
they were at the start.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MessageType, RecordDict
from flwr.serverapp import Grid, ServerApp

from secfed.config import ConfigError, ConfigIssue, RunConfig, from_dict
from secfed.data.errors import DataError
from secfed.errors import printable
from secfed.evaluation.plots import plot_history
from secfed.federation import codec
from secfed.federation import evaluate as evaluation
from secfed.federation.builder import BACKBONE_KEY, Census, Federation, build_from_census, server_public
from secfed.federation.evaluate import Scores
from secfed.federation.messages import Aggregate, Broadcast, Upload
from secfed.federation.runtime import (
    Reporter,
    RunDiverged,
    SilentReporter,
    SiteDiverged,
    Trained,
    claimed_run_dir,
    drive,
    run_title,
    start_run_dir,
)
from secfed.protocols import ProtocolError

from . import pulls
from .client_app import BROADCAST, CLIP_WORD, DIVERGED, STEP
from .encoding import RING, Encoding
from .mod import POLICY_REFUSAL
from .node import Cohort, NodeSetupError
from .replies import Expected, MalformedReply, TrainReply, hello_reply, scores_reply, train_reply
from .wire import CONTROL, PERSONAL, SITES, bytes_array
from .workflow import IdentityClash, NextRound, SecAggWorkflow, collect, exchange, send

log = logging.getLogger("secfed.flower")
app = ServerApp()


@dataclass(frozen=True)
class Settings:
    """What ``secfed train --flower`` tells its ServerApp (Flower run config ``secfed-*``)."""

    config: RunConfig
    run_dir: Path
    token: str
    cohort: Cohort | Path | None  # the run config carries the keys (Cohort); a path is read here (embedding)
    start_timeout: float = 300.0
    train_timeout: float = 3600.0
    phase_timeout: float = 120.0
    poll: float = 0.2
    public_root: Path | None = None  # where the server reads a relative `method.kd_public` (connection file)
    # stop at a SuperNode's first refusal of hello instead of waiting start_timeout for it to change its mind:
    # `secfed flower local` starts its nodes itself, so their refusal (policy, data) is final
    stop_on_refusal: bool = False

    @classmethod
    def from_run_config(cls, rc: Mapping[str, Any]) -> Settings:
        cohort, public = str(rc.get("secfed-cohort-toml", "")), str(rc.get("secfed-public-root", ""))
        return cls(from_dict(json.loads(str(rc["secfed-config"]))), Path(str(rc["secfed-run-dir"])),
                   str(rc["secfed-token"]), Cohort.loads(cohort, "the run's cohort") if cohort else None,
                   float(rc.get("secfed-start-timeout", 300.0)), float(rc.get("secfed-train-timeout", 3600.0)),
                   float(rc.get("secfed-phase-timeout", 120.0)), float(rc.get("secfed-poll", 0.2)),
                   Path(public) if public else None, rc.get("secfed-stop-on-refusal", False) is True)


def refusals(cfg: RunConfig) -> list[tuple[str, str]]:
    """Settings an in-process run has that a Flower run cannot honour: (key, why)."""
    out = []
    if cfg.secagg.dropout_rate > 0:
        out.append(("secagg.dropout_rate", "simulates dropouts in-process; on Flower they are real (a SuperNode "
                                           "that does not answer in time)"))
    if cfg.run.record_uploads:
        out.append(("run.record_uploads", "keeps uploads in the run directory; on Flower the summed parts never "
                                          "leave the SuperNodes unmasked"))
    return out


def _cohort(given: Cohort | Path | None) -> Cohort:
    if given is None:
        raise DeploymentError("authenticated secure aggregation needs the cohort (`cohort` in the connection file)")
    return given if isinstance(given, Cohort) else Cohort.load(given)


class DeploymentError(RuntimeError):
    """The SuperNodes cannot run this run as they are (which nodes host which sites, who answers)."""


@app.main()
def main(grid: Grid, context: Context) -> None:
    try:
        settings = Settings.from_run_config(context.run_config)
        if settings.poll > 0:  # replies' payloads: looked for again at the poll, not after Flower's 1 s, 2 s, …
            pulls.quicken(pulls.SERVERAPP, settings.poll)
        FlowerRun(grid, settings).run()
    except (ConfigError, DataError, DeploymentError, IdentityClash, NodeSetupError, RunDiverged) as exc:  # said
        _say(f"secfed: the run stopped: {exc}")  # (Flower logs an exception's stack): `secfed train --flower` relays it


class FlowerRun:
    """One secfed run over a Grid (see the module docstring)."""

    def __init__(self, grid: Grid, settings: Settings) -> None:
        self.grid, self.settings, self.cfg = grid, settings, settings.config
        refused = refusals(self.cfg)
        if refused:
            raise ConfigError([ConfigIssue(key, why) for key, why in refused])
        self.flow: SecAggWorkflow | None = None
        if self.cfg.secagg.enabled:
            authenticated = self.cfg.secagg.authenticated
            self.flow = SecAggWorkflow(
                cohort=_cohort(settings.cohort) if authenticated else None, authenticated=authenticated,
                dropout_rate=max(0.1, self.cfg.secagg.dropout_rate), complete=self.cfg.secagg.graph == "complete",
                phase_timeout=settings.phase_timeout, input_timeout=settings.phase_timeout,
                poll_interval=settings.poll, on_phase=self._phase)
        self._shape: str | None = None  # the nodes' ring layout (JSON), learnt from the first round's replies
        self._trained_at: float | None = None  # when a masked round's training phase ended
        self._gone: set[int] = set()  # hosting SuperNodes the SuperLink does not list now (said once each)
        self._since = time.perf_counter()
        self._phase_now: str | None = None  # the step under way, and how long each took last time
        self._took: dict[str, float] = {}

    def _phase(self, phase: str, nodes: Any) -> None:
        now = time.perf_counter()
        if phase in ("consistency_check", "unmask") and self._trained_at is None:
            self._trained_at = now  # a masked round: training ended with the masked-input phase
        since = now - self._since
        _say(f"  secure aggregation: {phase} ({len(nodes)} nodes{self._begin(phase, now)}; "
             f"{since:.1f} s since the previous step)")

    def _begin(self, step: str, now: float) -> str:
        """``step`` starts at ``now`` (the step under way ends); what it took last round, for its line."""
        self._done(now)
        self._since, self._phase_now = now, step
        return f"; ≈ {self._took[step]:.0f} s last round" if step in self._took else ""

    def _done(self, now: float) -> None:
        """Remember how long the step under way took (each step's line then says what to expect)."""
        if self._phase_now is not None:
            self._took[self._phase_now] = now - self._since
            self._phase_now = None

    def _step(self, step: str, **fields: Any) -> ConfigRecord:
        return ConfigRecord({"step": step, "config": json.dumps(self.cfg.to_dict()), "token": self.settings.token,
                             **fields})

    # ---- the run ----------------------------------------------------------------------------------

    def run(self) -> dict[str, Any]:
        # a refusal found while enrolling or building leaves nothing behind; one process at a time
        with claimed_run_dir(self.settings.run_dir, fresh=True):
            return self._run_held()

    def _run_held(self) -> dict[str, Any]:
        cfg, run_dir = self.cfg, self.settings.run_dir
        public = server_public(cfg, self.settings.public_root)  # its own; refused before asking the nodes
        hosts, census = self.hello()
        fed = build_from_census(cfg, census, public)  # the server's view: what the nodes enrolled, no site data
        fed.server.privacy.plan.check_layout([len(sites) for sites in hosts.values()])  # the sum runs among nodes
        start_run_dir(fed, run_dir, deployment="flower")
        _say(f"secfed on Flower: {fed.method.describe()} · {len(fed.clients)} clients on {len(hosts)} SuperNodes · "
             f"channel {fed.channel.name}" + (" (authenticated)" if cfg.secagg.enabled and cfg.secagg.authenticated else ""))
        history: list[dict[str, Any]] = []
        summary = drive(fed, _Transport(self, hosts), run_dir, _Lines(cfg.schedule.rounds), history=history,
                        extra_state={"deployment": "flower"})
        plot_history(history, run_dir / "history.png", title=run_title(cfg, run_dir))
        _say(f"run directory: {run_dir}")
        return summary

    def hello(self) -> tuple[dict[int, list[int]], Census]:
        """node id → the sites it hosts, once every site is hosted by exactly one node and (authenticated)
        every identity of the cohort has enrolled; and the run's census (the data's description the
        nodes agree on)."""
        step = self._step("hello")
        hosts: dict[int, list[int]] = {}
        censuses: dict[str, list[tuple[int, Census]]] = {}  # one spelling of the census → its nodes
        refusals: dict[int, str] = {}  # why a node answered hello with an error (its policy, its data)
        refused: set[int] = set()  # of those, the nodes whose own code refused (not "unavailable")
        started = said = time.monotonic()
        while True:
            listed = list(self.grid.get_node_ids())  # asked of the SuperLink once per pass
            new = [n for n in listed if n not in hosts]
            challenges = self.flow.challenges(new) if self.flow is not None else {}  # enrolment rides along
            contents = {n: RecordDict({STEP: step, **({CONTROL: challenges[n]} if n in challenges else {})})
                        for n in new}
            replies = collect(self.grid, send(self.grid, contents, timeout=self.settings.phase_timeout),
                              poll=self.settings.poll, errors=refusals, refused=refused)
            if challenges:
                self.flow.accept(replies, challenges)
            self._forget_gone(hosts, censuses, set(listed))
            for n in [m for m in refusals if m in replies or m not in listed]:  # answered since, or gone (review)
                del refusals[n]
                refused.discard(n)
            for n, reply in replies.items():
                self._read_hello(n, reply, hosts, censuses)
            _same_census(censuses)
            census, missing = self._complete(hosts, censuses)
            # every identity of the cohort heard first: else one enrolled node claiming every site, before the
            # others answered, would speak for them all run long (found by review)
            unheard = self._unenrolled()
            if census is not None and not missing and not unheard:
                return {n: s for n, s in hosts.items() if s}, census
            # before any census the client count is unknown (found by review: "clients [0]" of four unhosted)
            waiting = "no SuperNode hosts any client yet" if census is None else \
                f"no SuperNode hosts clients {missing}" if missing else \
                f"{', '.join(unheard)} of the cohort did not enrol"
            why = "".join(f"; SuperNode {n} refused: {printable(r)[:300]}" for n, r in sorted(refusals.items()))
            now = time.monotonic()
            if refused and self.settings.stop_on_refusal:
                raise DeploymentError(f"{waiting}{why}")
            if now - started > self.settings.start_timeout:
                raise DeploymentError(f"{waiting} after {self.settings.start_timeout:.0f} s{why}")
            if now - said > 10:  # a wait for the slowest site says so (found by review: 300 s of silence)
                _say(f"  waiting: {waiting} yet ({self.settings.start_timeout - (now - started):.0f} s left){why}")
                said = now
            time.sleep(1.0)

    def _read_hello(self, n: int, reply: Message, hosts: dict[int, list[int]],
                    censuses: dict[str, list[tuple[int, Census]]]) -> None:
        """Node ``n``'s hello reply into ``hosts`` and ``censuses``; a node not enrolled (authenticated)
        or a malformed reply is left out."""
        try:
            if self.flow is not None and self.flow.authenticated and n not in self.flow.identities:
                raise MalformedReply(f"SuperNode {n}: not enrolled (no identity of the cohort proven), so it "
                                     "hosts no site")  # else any node could claim every site (review)
            hosts[n], census = hello_reply(n, reply.content)
        except MalformedReply as exc:  # that node is left out; the others go on
            _refused(exc)
            return
        censuses.setdefault(_canonical(census), []).append((n, census))

    def _forget_gone(self, hosts: dict[int, list[int]], censuses: dict[str, list[tuple[int, Census]]],
                     live: set[int]) -> None:
        """Drop the claims of nodes gone: no longer listed, or (authenticated) whose identity a restarted
        SuperNode proved since under a new node id — else its new claim met its own old one and the run
        stopped (found by review). ``live``: the nodes the SuperLink lists now."""
        authenticated = self.flow is not None and self.flow.authenticated
        gone = {n for n in hosts if n not in live or (authenticated and n not in self.flow.identities)}
        for n in gone:
            del hosts[n]
        for key in list(censuses):
            censuses[key] = [(n, c) for n, c in censuses[key] if n not in gone]
            if not censuses[key]:
                del censuses[key]

    def _complete(self, hosts: dict[int, list[int]], censuses: dict[str, list[tuple[int, Census]]]
                  ) -> tuple[Census | None, list[int]]:
        """The census the nodes agree on (None before any) and the clients no node hosts yet; two nodes
        claiming one client stop the run, naming both."""
        owners: dict[int, list[int]] = {}
        for n, sites in hosts.items():
            for k in sites:
                owners.setdefault(k, []).append(n)
        twice = {k: v for k, v in owners.items() if len(v) > 1}
        if twice:
            claims = "; ".join(f"client {k}: {', '.join(self._who(n) for n in v)}" for k, v in sorted(twice.items()))
            raise DeploymentError(f"clients {sorted(twice)} are claimed by more than one SuperNode ({claims}): give "
                                  "each SuperNode its own partition-id (and the same num-partitions)")
        census = next(iter(censuses.values()))[0][1] if censuses else None
        clients = len(census.info["clients"]) if census is not None else 1
        return census, [k for k in range(clients) if k not in owners]

    def _unenrolled(self) -> list[str]:
        """The cohort's sites (names) no node has proven to be yet; none without authentication."""
        if self.flow is None or not self.flow.authenticated:
            return []
        proven = set(self.flow.identities.values())
        return sorted(name for name, key in self.flow.cohort.sites.items() if key not in proven)

    def _who(self, node: int) -> str:
        """``node`` and, once it enrolled, the cohort name of its identity."""
        key = self.flow.identities.get(node) if self.flow is not None else None
        name = self.flow.cohort.name_of(key) if key is not None else None
        return f"SuperNode {node}" + (f" ({name})" if name else "")

    # ---- one round's messages (the driver, federation/runtime.py, does the rest) -----------------------

    def train(self, fed: Federation, hosts: dict[int, list[int]], t: int, cohort: list[int],
              broadcast: Broadcast) -> Trained:
        """Round ``t``'s train messages to the nodes hosting the cohort, then the secure sum of their
        replies: the Aggregate, the sites' statistics and the dropouts (a site whose node dropped).
        Once the layout of the nodes' ring vectors is known (from the last round), the train
        messages ride in the protocol's masked-input phase, the vectors masked in the replies."""
        t0 = time.perf_counter()
        wire = codec.encode_broadcast(broadcast)
        arrays = {"common": bytes_array(wire)}
        personal = {}  # Eq. 15: a personal, noised broadcast per client ("double" β), sent to its own node only
        for k in cohort:
            received = fed.server.received(broadcast, k)
            if received is not broadcast:
                personal[f"site-{k}"] = bytes_array(codec.encode_broadcast(received))
        masked = self.flow is not None and self._shape is not None
        _say(f"  training: {len(cohort)} clients" + (" in the masked-input phase" if masked else self._begin("train", t0)))
        step = self._step("train", round=t, **({"shape": self._shape} if masked else {}))
        drawn = {n: [k for k in sites if k in cohort] for n, sites in hosts.items()}  # each node its own only
        targets = {n: RecordDict({STEP: step, SITES: ConfigRecord({"train": drawn[n]}), BROADCAST: ArrayRecord(arrays),
                                  **({PERSONAL: ArrayRecord({f"site-{k}": personal[f"site-{k}"] for k in drawn[n]})}
                                     if personal else {})})
                   for n in hosts if drawn[n]}
        # The local-only baselines train every round, as in-process: the nodes without a cohort site
        # get a train message of their own (no broadcast: they train no federated site), answered
        # beside the cohort's (found by review: their baselines trained only in rounds they were in)
        idle = send(self.grid, {n: RecordDict({STEP: step, SITES: ConfigRecord({"train": []})})
                                for n in hosts if n not in targets} if fed.baselines else {},
                    timeout=self.settings.train_timeout, group=str(t + 1))
        if masked:
            aggregate, replies, t_train = self.train_masked(fed, hosts, targets, wire, t, drawn)
            trained, client_stats, baseline_stats = self._read(fed, replies)
            _say(f"  trained and summed: {len(aggregate.contributors)} clients on {len(trained)} SuperNodes "
                 f"({time.perf_counter() - t0:.1f} s)")
        else:
            answers = exchange(self.grid, targets, timeout=self.settings.train_timeout, poll=self.settings.poll,
                               group=str(t + 1))
            replies = self._checked(fed, hosts, drawn, {n: reply.content for n, reply in answers.items()})
            trained, client_stats, baseline_stats = self._read(fed, replies)
            t_train = time.perf_counter()
            self._done(t_train)
            self._since = t_train
            _say(f"  trained: {sum(len(v) for v in trained.values())} clients on {len(trained)} SuperNodes "
                 f"({t_train - t0:.1f} s)")
            aggregate = self.aggregate(fed, hosts, broadcast, wire, replies, trained, t)
        # A node that only trains its baselines holds up no round: it answers by the time the cohort's
        # work is done, with a grace of half that time, or sits the round out (said in the log)
        grace = max(10.0, 0.5 * (time.perf_counter() - t0))
        idle.deadline = min(idle.deadline, time.monotonic() + grace)
        answered = collect(self.grid, idle, poll=self.settings.poll)
        baseline_stats.update(self._read(fed, self._checked(fed, hosts, drawn, {n: r.content for n, r in answered.items()}))[2])
        dropped = {fed.clients[k].site.name: "flower" for k in cohort if k not in aggregate.contributors}
        return Trained(aggregate, client_stats, baseline_stats, dropped, t_train)

    def live_hosts(self, fed: Federation, hosts: Mapping[int, list[int]]) -> dict[int, list[int]]:
        """``hosts`` the SuperLink lists now: a SuperNode it does not list (its heartbeats lapsed, or it
        is gone) is not waited for — its sites sit the round out as dropped — and takes part again once
        listed (a SuperNode restarted under a new node id does not: this server enrols nodes at its start
        only). Each change is said once (found by review: the run waited out every round's timeout for a
        killed node, and ended with no scores for its domains in silence). With no hosting SuperNode
        listed for ``phase_timeout`` the run stops."""
        hosting, live = set(hosts), set(self.grid.get_node_ids())
        if hosting and not live & hosting:  # said, not a silent wait (review 89)
            _say(f"  no SuperNode hosting a site is listed: waiting up to {self.settings.phase_timeout:.0f} s for one")
            deadline = time.monotonic() + self.settings.phase_timeout
            while not live & hosting and time.monotonic() < deadline:
                time.sleep(self.settings.poll)
                live = set(self.grid.get_node_ids())
            if not live & hosting:
                raise DeploymentError(f"no SuperNode hosting a site is left: the SuperLink has listed none of "
                                      f"{sorted(hosting)} for {self.settings.phase_timeout:.0f} s")
        names = lambda n: ", ".join(fed.clients[k].site.name for k in hosts[n])  # noqa: E731
        for n in sorted(hosting - live - self._gone):
            _say(f"  SuperNode {n} is gone: its sites ({names(n)}) sit out the rounds while the SuperLink does not "
                 "list it (a SuperNode restarted under a new node id does not rejoin a running deployment)")
        for n in sorted(self._gone & live):
            _say(f"  SuperNode {n} is back: its sites ({names(n)}) take part again")
        self._gone = hosting - live
        return {n: sites for n, sites in hosts.items() if n in live}

    @staticmethod
    def _checked(fed: Federation, hosts: Mapping[int, list[int]], drawn: Mapping[int, list[int]],
                 contents: Mapping[int, RecordDict]) -> dict[int, TrainReply]:
        """The nodes' train replies, read (replies.py) against what each may speak for (``drawn``: its
        sites in the cohort); a malformed one drops its node for the round."""
        out = {}
        for n, content in contents.items():
            try:
                out[n] = train_reply(n, content, _expected(fed, hosts, drawn, n))
            except MalformedReply as exc:
                _refused(exc)
        return out

    @staticmethod
    def _read(fed: Federation, replies: Mapping[int, TrainReply]) -> tuple[dict[int, list[int]], dict, dict]:
        """The sites each node trained and their statistics, from the nodes' train replies (the DP-SGD
        accountants they keep are loaded); a site that diverged stops the run, as in-process."""
        client_stats: dict[str, Any] = {}
        baseline_stats: dict[str, Any] = {}
        trained: dict[int, list[int]] = {}
        for n, reply in replies.items():
            if reply.diverged is not None:
                raise SiteDiverged(*reply.diverged)
            trained[n] = reply.sites
            client_stats.update(reply.stats)
            baseline_stats.update(reply.baseline)
            _load_accountants(fed, reply.accountants)
        return trained, client_stats, baseline_stats

    def train_masked(self, fed: Federation, hosts: dict[int, list[int]], targets: Mapping[int, RecordDict],
                     wire: bytes, t: int, drawn: Mapping[int, list[int]]
                     ) -> tuple[Aggregate, dict[int, TrainReply], float]:
        """Train and sum in one secure aggregation: the train messages are the masked-input phase's
        content (bound into every node's keys, so a node sent another model is caught), the replies
        carry the masked vectors and, in the clear, what the train reply carries. A node whose
        masked input is not in the sum is not heard from this round (its accountant, which it
        keeps, arrives with its next reply). An aborted round releases nothing and the next one
        relearns the layout."""
        layout = fed.channel.layout([tuple(x) for x in json.loads(self._shape)])
        self.flow.input_timeout = self.settings.train_timeout  # the nodes train inside this phase
        self._trained_at = None
        messages = [Message(c, dst_node_id=n, message_type=MessageType.TRAIN) for n, c in targets.items()]
        down = len(wire) * len(targets)
        try:
            encoding = Encoding(RING, length=layout.length + CLIP_WORD)
            result = self.flow.aggregate(self.grid, messages, encoding, round=t,
                                         next_round=self._next_round(fed, hosts, t, encoding))
            self._done(time.perf_counter())  # the last phase (unmask) ends here
        except ProtocolError as exc:
            self._shape = None
            self._stop_if_diverged(fed, hosts, drawn)
            self._stop_if_refused()
            return self._aborted(t, exc, 0, down), {}, self._trained_at or time.perf_counter()
        self._stop_if_diverged(fed, hosts, drawn)
        replies = self._checked(fed, hosts, drawn, result.clear)
        for n, r in replies.items():  # every vector was masked at the length the layout sent gives: a node
            if r.diverged is None and r.shape != self._shape:  # saying otherwise is wrong about itself only
                log.warning("round %d: SuperNode %d reports another layout than the one it masked in", t + 1, n)
        # A surviving node's vector is in the sum: its sites are the cohort's it hosts, whatever its
        # clear part says (a malformed one is not read at all).
        contributors = [k for n in result.survivors for k in drawn.get(n, ())]
        uploads, bytes_up = _uploads(replies)
        aggregate = _summed(t, layout, result, contributors, uploads, bytes_up, down)
        return aggregate, replies, self._trained_at or time.perf_counter()

    def _stop_if_refused(self) -> None:
        """A node whose policy refuses the session refuses every session the server writes the same way:
        the run stops naming it (found by review: 22 nodes refusing the sparse graph `--secagg-graph auto`
        chose aborted every round, and the run "finished" having released nothing)."""
        for n, reason in sorted(self.flow.errors.items()):
            if reason.startswith(POLICY_REFUSAL):  # a node's own refusal, as its mod words it (not any text)
                raise DeploymentError(f"SuperNode {n} refuses the secure aggregation session by its policy: "
                                      f"{printable(reason[len(POLICY_REFUSAL):][:500])}")

    def _stop_if_diverged(self, fed: Federation, hosts: Mapping[int, list[int]],
                          drawn: Mapping[int, list[int]]) -> None:
        """A node whose site diverged inside the masked-input phase left the round (its zero vector
        would have made the sum the others' alone) and said why: the run stops, as in-process — on a
        node's word about its own sites only (another's would stop everyone's run: found by review)."""
        for n, reason in self.flow.errors.items():
            if DIVERGED in reason:
                start = reason.index(DIVERGED) + len(DIVERGED)
                try:  # the JSON [where, cause] after the marker, whatever Flower wrapped around it; a node's
                    # free text, so bounded and parsed as untrusted (found by review: 100,000 '[' recursed)
                    where, cause = json.JSONDecoder().raw_decode(reason[start:start + 4096])[0]
                except (ValueError, TypeError, RecursionError):
                    where, cause = None, reason[:4096]
                if not _expected(fed, hosts, drawn, n).may_diverge(str(where)):
                    _refused(MalformedReply(f"SuperNode {n}: left the round saying {str(where)[:80]!r} diverged, "
                                            "a site it does not train"))
                    continue
                raise SiteDiverged(printable(str(where))[:200], printable(str(cause))[:200])  # a node's text

    def aggregate(self, fed: Federation, hosts: dict[int, list[int]], broadcast: Any, wire: bytes,
                  replies: Mapping[int, TrainReply], trained: Mapping[int, list[int]], t: int) -> Aggregate:
        """The round's Aggregate from the nodes' train replies and (secagg) the secure sum."""
        uploads, bytes_up = _uploads(replies)
        down = len(wire) * len(replies)
        if not self.cfg.secagg.enabled:
            summed = fed.channel.aggregate(broadcast, [u for u in uploads if u.summed], {}, broadcast_bytes=len(wire))
            return Aggregate(t, summed.sums, summed.weights, summed.contributors, summed.shared, summed.bytes_up, down)
        nodes = [n for n, sites in trained.items() if sites and replies[n].shape is not None]
        if not nodes:
            return _empty(t, bytes_up, down)
        # The layout more than half the nodes report (every honest node computes the same one); a node
        # reporting another is left out of the sum rather than stopping the run, and without such a
        # majority the round releases nothing (found by review: a tie went to the first reply)
        shape, votes = Counter(replies[n].shape for n in nodes).most_common(1)[0]
        if 2 * votes <= len(nodes):
            return self._aborted(t, ProtocolError(f"no layout is reported by more than half of {len(nodes)} "
                                                  "SuperNodes"), bytes_up, down)
        for n in [n for n in nodes if replies[n].shape != shape]:
            _refused(MalformedReply(f"SuperNode {n}: reports a layout other than the other nodes'"))
        nodes = [n for n in nodes if replies[n].shape == shape]
        self._shape = str(shape)  # the layout every node used: the next round masks in it directly
        layout = fed.channel.layout([tuple(x) for x in json.loads(self._shape)])
        length = layout.length + CLIP_WORD
        # Every node is asked for the input it computed from THIS broadcast; the request is the
        # same for all and bound into their keys, so a node that was sent another model is caught.
        fetch = RecordDict({STEP: self._step("fetch", round=t, broadcast=hashlib.sha256(wire).hexdigest())})
        messages = [Message(fetch, dst_node_id=n, message_type=MessageType.TRAIN) for n in nodes]
        self.flow.input_timeout = self.settings.phase_timeout  # the nodes only fetch what they stored
        try:
            encoding = Encoding(RING, length=length)
            result = self.flow.aggregate(self.grid, messages, encoding, round=t,
                                         next_round=self._next_round(fed, hosts, t, encoding))
            self._done(time.perf_counter())  # the last phase (unmask) ends here
        except ProtocolError as exc:
            self._stop_if_refused()
            return self._aborted(t, exc, bytes_up, down)
        contributors = [k for n in result.survivors for k in trained[n]]
        return _summed(t, layout, result, contributors, uploads, bytes_up, down)

    def _next_round(self, fed: Federation, hosts: dict[int, list[int]], t: int, encoding: Encoding) -> NextRound | None:
        """Round t+1's secure sum as far as it is known at round t's unmask, so its key advertisements
        ride there (one round trip fewer): the nodes hosting its cohort, the layout of this round.
        None after the last round, and under Poisson sampling — its cohort is drawn from the CSPRNG
        when the round starts and must not exist earlier (privacy/round.py)."""
        cfg = self.cfg
        if t + 1 >= cfg.schedule.rounds or fed.server.privacy.plan.sampling == "poisson":
            return None
        cohort = set(fed.server.cohort(t + 1, cfg.schedule.clients_per_round, cfg.seed))
        return NextRound(tuple(sorted(n for n, sites in hosts.items() if cohort & set(sites))), encoding, t + 1)

    @staticmethod
    def _aborted(t: int, exc: ProtocolError, bytes_up: int, down: int) -> Aggregate:
        log.warning("round %d: secure aggregation aborted, nothing released: %s: %s", t + 1, type(exc).__name__, exc)
        _say(f"round {t + 1}: secure aggregation aborted ({type(exc).__name__}); nothing is released")
        return _empty(t, bytes_up, down)

    def evaluate(self, fed: Federation, hosts: dict[int, list[int]], *, final: bool,
                 cohort: tuple[int, ...]) -> Scores:
        jobs = evaluation.plan(fed, local_training=bool(fed.baselines), final=final, cohort=cohort)
        wire = codec.encode_broadcast(fed.server.broadcast(0))  # the global weights after this round
        contents = {}
        for n, sites in hosts.items():
            mine = [list(job) for k in sites for job in jobs.get(k, [])]
            if mine:
                contents[n] = RecordDict({STEP: self._step("evaluate", jobs=json.dumps(mine)),
                                          BROADCAST: ArrayRecord({"common": bytes_array(wire)})})
        what = "final scoring" if final else "scoring"
        expect = self._begin(what, time.perf_counter())
        _say(f"  {what}: {sum(len(c) for c in jobs.values())} jobs on {len(contents)} SuperNodes{expect}")
        replies = exchange(self.grid, contents, timeout=self.settings.train_timeout, poll=self.settings.poll,
                           message_type=MessageType.EVALUATE)
        self._done(time.perf_counter())
        scores = {}
        for n, reply in replies.items():
            try:
                hosted = hosts.get(n, ())
                got = scores_reply(n, reply.content, hosted, [fed.clients[k].site.name for k in hosted])
            except MalformedReply as exc:  # its jobs go unscored, as a node that did not answer
                _refused(exc)
                continue
            if isinstance(got, tuple):
                raise SiteDiverged(*got)  # the round driver stops the run, as in-process
            scores.update(got)
        return scores


@dataclass
class _Transport:
    """The Flower transport the round driver sends through (runtime.Transport)."""

    run: FlowerRun
    hosts: dict[int, list[int]]
    resumable = False  # a Flower run directory is never resumed (runtime.refuse_a_deployment)

    def train(self, fed: Federation, t: int, cohort: list[int], broadcast: Broadcast,
              reporter: Reporter) -> Trained:
        return self.run.train(fed, self.run.live_hosts(fed, self.hosts), t, cohort, broadcast)

    def evaluate(self, fed: Federation, *, final: bool, cohort: tuple[int, ...]) -> Scores:
        return self.run.evaluate(fed, self.run.live_hosts(fed, self.hosts), final=final, cohort=cohort)


class _Lines(SilentReporter):
    """The ServerApp's progress: one line per round (flwr's log stream carries it to the CLI)."""

    def __init__(self, rounds: int) -> None:
        self.rounds = rounds

    def round_done(self, record: dict[str, Any]) -> None:
        _say(f"round {record['round']}/{self.rounds}: {record['contributors']} contributors, "
             f"{record['seconds']['round']:.1f} s" + (f", loss {record['loss']:.3f}" if "loss" in record else ""))


def _load_accountants(fed: Federation, states: Mapping[int, Mapping[str, Any]]) -> None:
    """The DP-SGD accountants the nodes keep (their ε is what the run reports, as in-process)."""
    for k, state in states.items():
        if state.get("fed") and fed.clients[k].dp_sgd is not None:
            fed.clients[k].dp_sgd.accountant.load_state_dict(state["fed"])
        if state.get("local") and k in fed.baseline_dp:
            fed.baseline_dp[k].accountant.load_state_dict(state["local"])


def _uploads(replies: Mapping[int, TrainReply]) -> tuple[list[Upload], int]:
    """The uploads in the nodes' train replies (under secure aggregation only their unsummed parts,
    e.g. DFH's statistics), and their bytes."""
    return [u for r in replies.values() for u in r.uploads], sum(r.upload_bytes for r in replies.values())


def _summed(t: int, layout: Any, result: Any, contributors: list[int], uploads: list[Upload], bytes_up: int,
            down: int) -> Aggregate:
    """Round ``t``'s Aggregate from a finished secure sum of the nodes' ring vectors: the decoded sums
    over ``contributors`` (the sites of the surviving nodes) and their unsummed payloads."""
    contributors = sorted(contributors)
    sums, weights = layout.decode(result.total[:-CLIP_WORD], len(contributors))
    shared = {u.client_id: dict(u.shared) for u in uploads if u.client_id in contributors and u.shared}
    return Aggregate(t, sums, weights, tuple(contributors), shared, bytes_up + result.bytes_up,
                     down + result.bytes_down, int(result.total[-1]))


def _empty(t: int, bytes_up: int, bytes_down: int) -> Aggregate:
    return Aggregate(t, {}, {}, (), {}, bytes_up, bytes_down)


def _canonical(census: Census) -> str:
    """One spelling of a census (every node must describe the data the same way, not only its
    fingerprint) — less what each machine's folders hold beside the data: the files each skipped
    (a Thumbs.db in one node's copy refused honest nodes: found by review)."""
    raw = census.to_dict()
    info = dict(raw["info"])
    for part in ("datasets", "unseen"):
        if isinstance(info.get(part), list):
            info[part] = [{k: v for k, v in d.items() if k != "skipped"} if isinstance(d, dict) else d
                          for d in info[part]]
    return hashlib.sha256(json.dumps({**raw, "info": info}, sort_keys=True).encode()).hexdigest()


def _same_census(censuses: Mapping[str, list[tuple[int, Census]]]) -> None:
    """Refuse, naming the nodes, SuperNodes that describe the run's data differently: the server builds
    its federation (privacy plan, model head, sites) from one census, so one node's word must not
    differ from another's (found by review: the last node's census was taken, whatever the others said)."""
    if len(censuses) < 2:
        return
    groups = [(sorted(n for n, _ in nodes), nodes[0][1].info) for nodes in censuses.values()]
    named = "; ".join(f"SuperNodes {nodes}" for nodes, _ in groups)
    if len({str(info.get("fingerprint")) for _, info in groups}) > 1:
        raise ConfigError("data.root", f"the SuperNodes read different data (content fingerprints differ: {named}); "
                          "point every node's secfed-data-root at the run's data")
    if len({str(info.get(BACKBONE_KEY, "")) for _, info in groups}) > 1:  # (found by review: never compared)
        raise ConfigError("model.pretrained", f"the SuperNodes start from different synthetic backbones ({named}); "
                          "copy the server's cached file (`secfed pretrain` prints where) into every node's cache")
    if len({str(info.get("public_fingerprint", "")) for _, info in groups}) > 1:
        raise ConfigError("method.kd_public", f"the SuperNodes hold different public sets for distillation "
                          f"({named}); every node's secfed-public-root must hold the server's images")
    raise ConfigError("data.root", f"the SuperNodes describe the same data differently ({named}: their censuses "
                      "differ beyond the content fingerprint); run the same secfed on every node")


def _expected(fed: Federation, hosts: Mapping[int, list[int]], drawn: Mapping[int, list[int]], n: int) -> Expected:
    """What node ``n``'s train reply may speak for: the sites it hosts, those of them drawn, and names."""
    hosted = hosts.get(n, [])
    return Expected(tuple(hosted), tuple(drawn.get(n, ())), frozenset(fed.clients[k].site.name for k in drawn.get(n, ())),
                    frozenset(fed.baselines[k].name for k in hosted if k in fed.baselines))


def _refused(exc: MalformedReply) -> None:
    log.warning("%s; that node is left out", exc)
    _say(f"  {exc}; that node is left out")


def _say(line: str) -> None:
    print(line, flush=True)  # the ServerApp's output reaches `secfed train --flower` through flwr's log stream
