"""The ClientApp of ``secfed train --flower``: a SuperNode's sites train, mask and evaluate.

Messages from secfed's ServerApp (server_app.py), all carrying the run configuration:

    hello      report the sites this node hosts (sites.py) and the run's census (builder.Census: what
               data.json shows — datasets, per site its image and identity counts, the content
               fingerprint — and the evaluation domains by name): the server builds its federation
               from it and never reads a site's data
    train      run the round for the node's sites in the cohort — ClientSide.step on the broadcast,
               the privacy step, the local-only baselines — and save each site's state. With secure
               aggregation the uploads' summed parts become ONE ring vector for the node (the
               secure channel's layout and quantisers, the node's sites added in the ring). Once
               the server knows the layout (``shape`` in the step: the layout of the last round),
               the train message comes inside the protocol's masked-input phase and the vector
               goes to SecAggMod in the reply (masked there, as Flower's SecAgg+ masks the fit
               reply): no trip of its own. The first round, the server learns the layout first:
               the vector is kept sealed on this machine until the protocol asks for it (fetch).
               Either way the reply carries only what the in-process run shows the server too:
               the layout, the unsummed payloads (DFH's statistics), and the training statistics
               (left out when the run claims an ε). Without secure aggregation the reply carries
               the uploads (the plain channel).
    fetch      inside the secure aggregation's masked-input phase (SecAggMod calls the app): the
               stored ring vector, once, and only for the broadcast it was trained on
    evaluate   score the jobs of federation/evaluate.py for the node's sites on the node's own
               query/gallery; only the scores travel back

hello, train and evaluate need the node's sites (torch, the federation, the images): they run in the
node's site host (site_host.py), a process that keeps the sites open between messages, so a
message after the first imports, builds and decodes nothing; ``secfed-host-idle = 0`` in the node
config runs them in the ClientApp's own process instead. fetch and the protocol phases run here.

The node's protocol client is SecAggMod (mod.py); this module never sees a protocol message.
"""

from __future__ import annotations

import hashlib
import json
import logging
from typing import Any

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Error, Message, RecordDict
from flwr.clientapp import ClientApp
from flwr.clientapp.typing import ClientAppCallable
from flwr.common.constant import ErrorCode

from . import node, site_host
from .encoding import RING_RECORD
from .mod import SecAggMod
from .wire import INSIDE, PERSONAL, SITES, array_bytes, bytes_array

# Only the hello/train/evaluate handlers import torch and the federation (sites.py), in the site
# host: the protocol's phases, answered by SecAggMod in a fresh process each, start without them.

STEP = "secfed.train"  # ConfigRecord: step, config (JSON), token and the step's fields
BROADCAST = "secfed.broadcast"  # ArrayRecord: "common" (codec bytes of the Broadcast), "site-K" (personal)
UPLOADS = "secfed.uploads"  # ArrayRecord: "site-K" → codec bytes of an Upload (its unsummed part under secagg)
CLIP_WORD = 1  # the ring vector ends with one word: how many coordinates the node's sites clipped
DIVERGED = "secfed: a site diverged: "  # then JSON [where, cause]: a node leaving a masked round says why

log = logging.getLogger("secfed.flower")


def said_in_public(msg: Message, context: Context, call_next: ClientAppCallable) -> Message:
    """Flower mod, outermost: what the app raises reaches the server as an error reply that names no
    path of this machine (:func:`node.public_text`; Flower's own reply carries the whole text, which
    named a node's folders — found by review). The SuperNode's log keeps the whole text, and the
    traceback of anything but a setup error."""
    try:
        return call_next(msg, context)
    except node.NodeSetupError as exc:
        log.error("%s: %s", type(exc).__name__, exc)
        failed: Exception = exc
    except Exception as exc:  # noqa: BLE001 — answered, as Flower answers it, but in words fit to send
        log.exception("the ClientApp failed")
        failed = exc
    reason = f"{type(failed).__name__}: {node.public_text(str(failed), node.private_roots(context.node_config))}"
    return Message(Error(ErrorCode.CLIENT_APP_RAISED_EXCEPTION, reason), reply_to=msg)


app = ClientApp(mods=[said_in_public, SecAggMod()])


@app.train()
def train(msg: Message, context: Context) -> Message:
    record = msg.content.config_records.get(STEP)
    if record is None or "step" not in record:
        raise node.NodeSetupError(f"a train message without secfed's {STEP} record (step): not secfed's ServerApp")
    step = str(record["step"])
    if step not in ("hello", "train", "fetch"):
        raise node.NodeSetupError(f"unknown step {step!r} in a train message")
    if step == "fetch":  # the node's stored ring vector: no sites needed
        return Message(_fetch(msg.content.config_records[STEP], msg.content, context), reply_to=msg)
    return Message(_on_sites(step, msg.content, context), reply_to=msg)


@app.evaluate()
def evaluate(msg: Message, context: Context) -> Message:
    return Message(_on_sites("evaluate", msg.content, context), reply_to=msg)


def _on_sites(op: str, content: RecordDict, context: Context) -> RecordDict:
    """Run ``op`` where the node's sites are kept open (site_host.py), or here when the node runs
    no host (``secfed-host-idle = 0``) or none can be started (said in the SuperNode's log)."""
    if site_host.idle_seconds(context.node_config) > 0:
        try:
            return site_host.call(op, content, context)
        except site_host.HostUnavailable as exc:
            log.warning("%s; this message opens the sites itself", exc)
    return handle(op, content, context)


def handle(op: str, content: RecordDict, context: Context) -> RecordDict:
    """One message that needs the node's sites: hello, train or evaluate (in the site host, or here)."""
    handlers = {"hello": _hello, "train": _round, "evaluate": _evaluate}
    return handlers[op](content.config_records[STEP], content, context)


def _evaluate(step: ConfigRecord, content: RecordDict, context: Context) -> RecordDict:
    from secfed.federation import codec
    from secfed.federation.evaluate import run_jobs
    from secfed.federation.runtime import SiteDiverged

    sites = _open(step, context, train=False)
    jobs = _allowed_jobs(sites, json.loads(str(step["jobs"])))
    sites.fed.server.weights = codec.decode_broadcast(array_bytes(content[BROADCAST]["common"], BROADCAST)).weights
    try:
        scores = run_jobs(sites.fed, jobs)  # the node's own query/gallery: only the scores leave
    except SiteDiverged as exc:  # a model whose features are not finite: the server stops the run, as in-process
        # (found by review: the error reply was logged and dropped, and the run trained on from that model)
        return RecordDict({STEP: ConfigRecord({"step": "evaluate", "diverged": json.dumps([exc.where, exc.cause])})})
    return RecordDict({STEP: ConfigRecord({"step": "evaluate", "scores": json.dumps(
        [[*job, value] for job, value in scores.items()])})})


def _allowed_jobs(sites: Any, asked: Any) -> list[tuple[int, str, str]]:
    """The jobs asked of this node's sites, each one evaluate.plan gives them — the node scores nothing
    else: not another site's domain, and under an ε no site's own pre-aggregation model ("local")."""
    from .sites import node_jobs

    allowed = node_jobs(sites.fed, sites.sites)
    if not isinstance(asked, list) or not all(isinstance(j, list) and len(j) == 3 for j in asked):
        raise node.NodeSetupError("evaluate: jobs must be a list of [site, variant, domain]")
    mine = [tuple(j) for j in asked if j[0] in sites.sites]
    refused = [j for j in mine if j not in allowed]
    if refused:
        raise node.NodeSetupError(f"evaluate: {refused[:3]} are not jobs of this node's sites under this run "
                                  "(federation/evaluate.py's plan); nothing was scored")
    return mine  # type: ignore[return-value]


def _open(step: ConfigRecord, context: Context, *, train: bool) -> Any:
    """The node's sites for this run: kept open by the site host between messages, else built."""
    from secfed.config import from_dict

    from .sites import NodeSites

    key = (hashlib.sha256(str(step["config"]).encode()).hexdigest(), str(step["token"]),
           json.dumps(dict(context.node_config), sort_keys=True), "train" if train else "evaluate")
    sites = site_host.kept(key)
    if sites is not None:
        _set_threads(sites.fed.config.run.threads)  # another run's view may have set its own since
        if not train:  # an evaluation view scores the state the sites saved since it was opened
            sites.reload()
        return sites
    cfg = from_dict(json.loads(str(step["config"])))
    _set_threads(cfg.run.threads)
    sites = NodeSites.open(cfg, context.node_config, str(step["token"]), train=train)
    site_host.keep(key, sites)
    return sites


_default_threads: int | None = None  # torch's own count, before a run set one in this process


def _set_threads(threads: int | None) -> None:
    """The run's torch threads, or torch's default where the run names none (a site host serves
    runs one after another: one run's setting must not carry over into the next)."""
    global _default_threads
    if threads is None and _default_threads is None:
        return  # nothing in this process changed torch's default
    import torch

    if _default_threads is None:
        _default_threads = torch.get_num_threads()
    torch.set_num_threads(threads or _default_threads)


def _hello(step: ConfigRecord, content: RecordDict, context: Context) -> RecordDict:
    from secfed.federation.builder import LOCAL_INFO

    sites = _open(step, context, train=False)
    census = sites.fed.census.to_dict()  # less where this machine keeps the data: nobody else's business,
    census["info"] = {k: v for k, v in census["info"].items() if k not in LOCAL_INFO}  # no two nodes' agree (review)
    return RecordDict({STEP: ConfigRecord({"step": "hello", "sites": sites.sites, "census": json.dumps(census)})})


def _round(step: ConfigRecord, content: RecordDict, context: Context) -> RecordDict:
    from secfed.federation import codec
    from secfed.federation.channel import only_shared
    from secfed.federation.runtime import SiteDiverged, private_logs, site_round
    from secfed.federation.secure_channel import ring_shape

    sites = _open(step, context, train=True)
    fed, cfg = sites.fed, sites.fed.config
    t = int(step["round"])
    drawn = content.config_records[SITES]["train"]  # this node's sites in the cohort, and no other's
    cohort = [k for k in sites.sites if k in set(drawn)]
    broadcasts = content[BROADCAST] if cohort else None  # a node without a cohort site trains its baselines only
    common = array_bytes(broadcasts["common"], BROADCAST) if broadcasts is not None else b""
    own = content[PERSONAL] if PERSONAL in content else {}  # Eq. 15: this node's sites' personal broadcasts only
    if own and not (cfg.privacy.dp_beta > 0 and cfg.privacy.dp_beta_mode == "double"):
        # outside the model digest, so honoured only where the run sends them (found by review: a
        # server slipped one node another model, undetected, in an authenticated single-β run)
        raise node.NodeSetupError("personal broadcasts in a run without Eq. 15 noise (privacy.dp_beta_mode double): "
                                  "refused — this node trains on the model every node was sent")

    def receive(k: int) -> Any:
        personal = own.get(f"site-{k}")
        return codec.decode_broadcast(array_bytes(personal, PERSONAL) if personal is not None else common)

    # Inside the masked-input phase (SecAggMod says so, and only it can) the vector goes in the reply
    # to be masked; any other train message keeps it sealed here (found by review: a server that sent
    # a `shape` outside the protocol got a node's vector back unmasked)
    masked = INSIDE in content and "shape" in step
    if own and masked:
        _unbound_only(content)
    secret = sites.round_seed(context.node_config, t)  # once per round; the node's own randomness
    try:  # the local-only baselines train every round, like in-process
        work = site_round(fed, t, cohort, [k for k in sites.sites if k in fed.baselines], receive, secret=secret)
    except SiteDiverged as exc:  # the server stops the run, as in-process
        site_host.forget()  # a diverged site's state is not what its folder holds
        if masked:  # leave the round: a zero vector would make the sum the other nodes' alone (found by review)
            # non-ASCII kept as it is: a \u-escape would split a path the node's words are scrubbed of (review)
            raise node.NodeSetupError(f"{DIVERGED}{json.dumps([exc.where, exc.cause], ensure_ascii=False)}") from None
        return RecordDict({STEP: ConfigRecord({"step": "train", "diverged": json.dumps([exc.where, exc.cause])})})
    uploads, stats, baseline = work.uploads, work.stats, work.baseline
    for k in sites.sites:
        sites.save(k)
    if private_logs(fed):  # a run that claims an ε logs no per-client figures: they do not leave the node
        stats, baseline = {}, {}
    accountants = {k: {"fed": fed.clients[k].dp_sgd.accountant.state_dict() if fed.clients[k].dp_sgd else None,
                       "local": fed.baseline_dp[k].accountant.state_dict() if k in fed.baseline_dp else None}
                   for k in sites.sites}
    reply: dict[str, Any] = {"step": "train", "sites": cohort, "stats": json.dumps(stats),
                             "baseline": json.dumps(baseline), "accountants": json.dumps(accountants)}
    out = RecordDict({UPLOADS: ArrayRecord()})
    if cfg.secagg.enabled and uploads:
        shape = json.dumps(ring_shape(uploads[0]))
        if masked and shape != str(step["shape"]):
            raise node.NodeSetupError("this round's contribution is laid out differently from the last round's "
                                      "(the server masks in the old layout); the round is dropped and relearnt")
        total = _node_vector(fed, t, uploads, shape, secret)
        if masked:
            out[RING_RECORD] = ArrayRecord({"vector": Array(total)})
        else:
            _store(context, t, hashlib.sha256(common).digest(), total, personal=bool(own))
        reply["shape"] = shape
        for upload in uploads:
            if upload.shared:
                out[UPLOADS][f"site-{upload.client_id}"] = bytes_array(codec.encode_upload(only_shared(upload)))
    else:
        for upload in uploads:
            out[UPLOADS][f"site-{upload.client_id}"] = bytes_array(codec.encode_upload(upload))
    out[STEP] = ConfigRecord(reply)
    return out


def _node_vector(fed: Any, t: int, uploads: list[Any], shape: str, secret: int | None) -> np.ndarray:
    """The node's ONE ring vector: its sites' ring vectors added in the ring (the secure channel's
    layout and quantisers, each site's rounding), then how many coordinates they clipped."""
    layout = fed.channel.layout(json.loads(shape))
    total = np.zeros(layout.length + CLIP_WORD, dtype=np.uint32)
    for upload in uploads:
        vector, clipped = layout.ring_vector(upload, fed.channel.rounding(t, upload.client_id, secret))
        total[:-CLIP_WORD] += vector  # wraps mod 2^32: the ring sum of this node's sites
        total[-1] += np.uint32(clipped)
    return total


# ---- the node's masked input, kept sealed between the train message and the protocol ----------------


def _pending(context: Context, round_index: int) -> tuple[bytes, Any, dict]:
    folder = node.state_dir(context.node_config)
    ids = dict(run_id=context.run_id, node_id=context.node_id, purpose=f"secfed-ring/{round_index}")
    return node.sealing_key(folder), folder / "pending" / f"run-{context.run_id}-round-{round_index:04d}.ring", ids


def _store(context: Context, round_index: int, broadcast: bytes, vector: np.ndarray, *, personal: bool) -> None:
    """Seal the node's vector of a round until the protocol fetches it: with the digest of the
    broadcast it was trained on, and whether a personal (Eq. 15) one was."""
    from secfed import atomic_file

    key, path, ids = _pending(context, round_index)
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    data = broadcast + bytes([personal]) + vector.astype(np.uint32).tobytes()
    atomic_file.write_bytes(path, node.seal_state(key, data, **ids))


def _fetch(step: ConfigRecord, content: RecordDict, context: Context) -> RecordDict:
    if INSIDE not in content:  # only SecAggMod's masked-input phase may take the vector: it masks it
        raise node.NodeSetupError("fetch outside the secure aggregation's masked-input phase: the stored vector "
                                  "leaves this node only masked")
    key, path, ids = _pending(context, int(step["round"]))
    try:
        data = node.open_state(key, path.read_bytes(), **ids)
    except FileNotFoundError:
        raise node.NodeSetupError(f"no masked input waits for round {step['round']} (trained elsewhere, or "
                                  "already masked once)") from None
    path.unlink()  # one masked input per training, whatever the server asks later
    if data[:32].hex() != step["broadcast"]:
        raise node.NodeSetupError("the secure aggregation names another broadcast than the one this node trained on")
    if data[32]:
        _unbound_only(content)
    return RecordDict({RING_RECORD: ArrayRecord({"vector": Array(np.frombuffer(data[33:], dtype=np.uint32))})})


def _unbound_only(content: RecordDict) -> None:
    """Refuse to mask a vector trained on a personal broadcast (Eq. 15) in an authenticated session:
    a personal model lies outside the digest that binds every node to one model, so there the server
    could send each node its own — all but one a zero model, and the "sum" is that one node's update
    (found by review). An unauthenticated session trusts the server to be honest anyway."""
    if content[INSIDE].get("authenticated", True):
        raise node.NodeSetupError("a vector trained on a personal broadcast (outside the model digest) would be masked "
                                  "in an authenticated session, which binds every node to one model: refused")

