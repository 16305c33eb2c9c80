"""What a run shared, as the audit reads it from the run directory or re-derives it.

    recorded     RUN/uploads/round-NNNN/, kept by ``--record-uploads`` (read by
                 :func:`secfed.federation.recording.read_round`): exactly what left each client and
                 what it started from
    re-derived   when nothing was recorded: the client's real step — the method's ``client_step`` and
                 the privacy step, through :meth:`secfed.federation.client.ClientSide.step` — on the
                 client's own data, from the checkpoint's global weights and the client's local state.
                 A checkpoint keeps only the state after the last round N, so what is re-derived is the
                 upload of round N + 1: what the client would send if the run went on.

Every result says which of the two it attacked. The gallery the judge searches is built here too:
the client's own images and distractors — the evaluation domains' query and gallery images, people
no client trained on.
"""

from __future__ import annotations

import copy
import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from secfed.algorithms.base import Schedule, TrainingDiverged
from secfed.attacks.judge import Gallery
from secfed.config import RunConfig
from secfed.federation import checkpoint as ckpt
from secfed.federation import codec, recording
from secfed.federation.builder import Federation, build
from secfed.federation.messages import MODEL, Aggregate, Broadcast, Upload
from secfed.federation.runtime import check_data, read_run, restore, schedule_for, train_seed
from secfed.models import pretrain
from secfed.models.sharing import load_shared
from secfed.seeding import numpy_rng


class AuditError(ValueError):
    """A request the run cannot answer (a round not recorded, an unknown client, no DFS). ``option``
    names the flag it concerns."""

    def __init__(self, option: str, message: str) -> None:
        self.option = option
        super().__init__(f"{option}: {message}")


@dataclass
class AuditedRun:
    run_dir: Path | None  # None: a checkpoint kept outside any run — no recorded rounds, no run folder
    checkpoint: Path
    checkpoint_sha256: str
    rounds_done: int
    config: RunConfig
    fed: Federation
    history: list[dict[str, Any]]

    @property
    def max_message_bytes(self) -> int:
        """The most a recorded message of this run may inflate to: a model's worth of tensors for the
        update, as much again for its BatchNorm statistics, twice over for the method's payloads, and
        64 MiB of headroom — a crafted file declaring more is refused before it is inflated."""
        model = self.fed.clients[0].site.model
        return 4 * sum(t.numel() * t.element_size() for t in model.state_dict().values()) + (64 << 20)


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def open_for_audit(path: Path, *, data_root: Path | None = None, device: str | None = None) -> AuditedRun:
    """The run's newest checkpoint loaded into a federation rebuilt with every client's training images."""
    path = Path(path)
    if not path.exists():
        raise AuditError("RUN", f"{path}: no such run directory or checkpoint")
    checkpoint, state, cfg = read_run(path)  # a damaged newest checkpoint: the one before it, with a warning
    if device is not None:
        cfg.run.device = device
    run_dir = ckpt.run_dir_of(checkpoint)
    with pretrain.restoring():  # the checkpoint's models, not the initial backbone
        fed = build(cfg, run_dir=run_dir, data_root=data_root, train_images=True, saved=True)
    check_data(fed, state, data_root)
    history, rounds_done, _ = restore(fed, state, checkpoint)
    # a checkpoint kept outside a run has no recorded rounds: the folder it sits in may be another run's
    # (found by review: a copy in run B's folder was audited against B's recorded uploads)
    return AuditedRun(run_dir, checkpoint, sha256_file(checkpoint), rounds_done, cfg, fed, history)


def client_index(run: AuditedRun, client: str | None) -> int:
    """``--client`` as a name or an id; by default the client with the fewest images (its images are
    spread over the fewest local steps: the most exposed)."""
    clients = run.fed.clients
    if client is None:
        return min(range(len(clients)), key=lambda k: (clients[k].site.num_examples, k))
    for k, c in enumerate(clients):
        if c.site.name == client:
            return k
    if client.isdecimal() and int(client) < len(clients):  # isdigit() admits '²', which int() refuses
        return int(client)
    names = ", ".join(f"{k} ({c.site.name})" for k, c in enumerate(clients))
    raise AuditError("--client", f"no client {client!r}; this run has {names}")


# ---- rounds ----------------------------------------------------------------------------------------


@dataclass
class RoundEvidence:
    """One round as the server (and the audit) sees it."""

    round: int  # 1-based
    source: str  # "recorded" | "re-derived"
    broadcast: Broadcast
    uploads: dict[int, Upload]
    schedule: Schedule
    personal: dict[int, Broadcast] = field(default_factory=dict)

    def start(self, client_id: int) -> torch.Tensor:
        return self.personal.get(client_id, self.broadcast).weights


def audit_name(run: AuditedRun) -> str:
    """What an audit is called: its run's folder name, or a loose checkpoint's file name."""
    return run.run_dir.resolve().name if run.run_dir else run.checkpoint.resolve().stem


def read_recorded(run: AuditedRun, round_number: int, stop: Callable[[], bool] | None = None
                  ) -> RoundEvidence | None:
    """Round ``round_number``'s recorded uploads; None if ``stop()`` said so before every file was read."""
    try:
        recorded = recording.read_round(run.run_dir, round_number, max_bytes=run.max_message_bytes, stop=stop)
    except recording.Stopped:
        return None
    except recording.NoBroadcast as exc:
        raise AuditError("--round", f"round {round_number}'s uploads were recorded without the broadcast they "
                         f"answered ({exc}: a run from before secfed kept it), so the weights they started from "
                         f"are unknown; audit the re-derived next round instead (--round {run.rounds_done + 1})"
                         ) from None
    except recording.RecordingError as exc:
        raise AuditError("--round", str(exc)) from None
    return RoundEvidence(round_number, "recorded", recorded.broadcast, recorded.uploads,
                         schedule_for(run.config, round_number - 1), recorded.personal)


def rederive_next(run: AuditedRun, client_ids: list[int], stop: Callable[[], bool] | None = None
                  ) -> RoundEvidence | None:
    """The uploads of round N + 1 of ``client_ids``: their real client step from the checkpoint; None
    if ``stop()`` said so before a client's step (each is a local epoch: a deadline holds to within one).

    Trains the clients' models in place (the audit's copies of them)."""
    fed, cfg = run.fed, run.config
    t = run.rounds_done
    broadcast = fed.server.broadcast(t)
    schedule = schedule_for(cfg, t)
    uploads, personal = {}, {}
    for k in client_ids:
        if stop is not None and stop():
            return None
        received = fed.server.received(broadcast, k)
        if received is not broadcast:
            personal[k] = received
        wire = codec.encode_broadcast(received)  # as the client would decode it
        try:
            upload, _ = fed.clients[k].step(codec.decode_broadcast(wire), schedule, train_seed(cfg, t, k))
        except TrainingDiverged as exc:  # (found by review: a checkpoint kept after a divergence — a traceback)
            raise AuditError("--round", f"round {t + 1} cannot be re-derived: client {fed.clients[k].site.name}'s "
                             f"step from the checkpoint diverged ({exc}); audit a recorded round, or the global "
                             "model alone (--target weights)") from None
        uploads[k] = upload
    return RoundEvidence(t + 1, "re-derived", broadcast, uploads, schedule, personal)


def next_cohort(run: AuditedRun) -> list[int]:
    """The cohort round N + 1 would have (the run's own selection rule); all clients if that is empty."""
    fed, cfg = run.fed, run.config
    cohort = fed.server.cohort(run.rounds_done, cfg.schedule.clients_per_round, cfg.seed)
    return cohort or list(range(len(fed.clients)))


def float_update(run: AuditedRun, upload: Upload) -> torch.Tensor:
    """The model summand as floats: ring-encoded (distributed DP) uploads are decoded as the server
    would decode a sum of one, noise share included."""
    summand = upload.summed[MODEL]
    if summand.encoding == "float":
        return summand.vector.float()
    one = Aggregate(upload.round, {MODEL: summand.vector}, {MODEL: 1.0}, (upload.client_id,))
    return run.fed.server.privacy.decode(one).sums[MODEL].float()


# ---- what the judge searches --------------------------------------------------------------------


def gallery_for(run: AuditedRun, client_ids: list[int], *, max_distractors: int = 1000, seed: int = 0
                ) -> tuple[Gallery, dict[int, list[int]]]:
    """The clients' own images (identity ``client/label``) and up to ``max_distractors`` evaluation
    images of people no client trained on, from the clients' own domains (same cameras: a
    reconstruction that only looks like the domain is then no closer to the victims than to
    anyone). Returns the gallery and, per client, its images' indices."""
    images, ids, own = [], [], []
    where: dict[int, list[int]] = {}
    for k in client_ids:
        site = run.fed.clients[k].site
        start = len(ids)
        images.append(site.images.cpu())
        ids += [f"{site.name}/{int(label)}" for label in site.labels.tolist()]
        own += [True] * site.num_examples
        where[k] = list(range(start, len(ids)))
    domains = [d for d in run.fed.domains if set(d.client_ids) & set(client_ids)] or run.fed.domains
    pool_images, pool_ids = [], []
    for d in domains:
        for part, pids in ((d.query, d.query_pids), (d.gallery, d.gallery_pids)):
            pool_images.append(part)
            # pid 0 marks Market-style distractor images: each is nobody in particular
            pool_ids += [f"{d.name}:test/{int(p)}" if p > 0 else f"{d.name}:junk/{len(pool_ids) + i}"
                         for i, p in enumerate(pids.tolist())]
    if pool_ids:
        pool = torch.cat(pool_images)
        rng = numpy_rng(seed, "audit/distractors")
        chosen = np.sort(rng.choice(len(pool_ids), size=min(max_distractors, len(pool_ids)), replace=False))
        images.append(pool[torch.from_numpy(chosen)])
        ids += [pool_ids[i] for i in chosen]
        own += [False] * len(chosen)
    return Gallery(torch.cat(images), ids, np.array(own, dtype=bool)), where


def model_with(run: AuditedRun, client_id: int, weights: torch.Tensor) -> torch.nn.Module:
    """A private copy of the client's model (its local tensors) holding ``weights`` as the shared part."""
    model = copy.deepcopy(run.fed.clients[client_id].site.model)
    load_shared(model, run.fed.layout, weights.to(next(model.parameters()).device))
    model.eval()
    return model


def run_facts(run: AuditedRun) -> dict[str, Any]:
    return {"run_dir": str(run.run_dir) if run.run_dir else None, "name": audit_name(run),
            "checkpoint": str(run.checkpoint), "checkpoint_sha256": run.checkpoint_sha256,
            "rounds_done": run.rounds_done, "algorithm": run.fed.method.describe(),
            "channel": run.fed.channel.name, "clients": [{"id": c.site.id, "name": c.site.name,
                                                         "images": c.site.num_examples} for c in run.fed.clients],
            "config": json.loads(run.config.to_json())}
