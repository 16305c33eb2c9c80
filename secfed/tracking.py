"""Experiment tracking: every round's figures to TensorBoard and/or MLflow (``--log-to``).

A tracker hears exactly what ``metrics.jsonl`` holds — the round records the run driver writes — so
it logs nothing a run does not already keep: under a claimed ε the records carry no per-client
figure, and neither does the tracker. Each numeric leaf of a record becomes one scalar named by its
path (``eval/campus/rank1``, ``seconds/round``, ``privacy/epsilon``), plus the seen- and
unseen-domain means of rank-1 and mAP; the configuration goes in as hyper-parameters, and at the end
the summary's figures and ``history.png``.

:class:`TrackingReporter` wraps any :class:`~secfed.federation.runtime.Reporter` (the CLI's progress
display, a notebook's) without knowing what is inside, the way a Flower mod wraps a handler.

TensorBoard comes through ``torch.utils.tensorboard`` (``pip install 'secfed[tensorboard]'``), MLflow
through its own client (``pip install 'secfed[mlflow]'``): to ``MLFLOW_TRACKING_URI`` when set, else to
a SQLite store in the run directory (``RUN/mlflow.db``, artifacts in ``RUN/mlartifacts``). A resumed run continues the same TensorBoard folder (events after
the resumed round are dropped) and the same MLflow run.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import warnings
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from secfed.config import ConfigError

TRACKERS = ("tensorboard", "mlflow")
MLFLOW_RUN_FILE = "mlflow-run-id"


class TrackerFailed(UserWarning):
    """A tracker failed mid-run: it is dropped, the run trains on (metrics.jsonl keeps every round)."""


class Tracker(Protocol):
    def start(self, config: Mapping[str, Any], start_round: int) -> None: ...
    def label(self, labels: Mapping[str, str]) -> None: ...
    def log_round(self, round_number: int, scalars: Mapping[str, float]) -> None: ...
    def finish(self, final: Mapping[str, float], summary: Mapping[str, Any], history_png: Path | None) -> None: ...


# ---- what a record becomes -----------------------------------------------------------------------------

_NOT_LOGGED = ("round", "final")  # the step itself; "final" repeats the last round's "eval" by domain


def scalars(record: Mapping[str, Any], unseen: Sequence[str] = ()) -> dict[str, float]:
    """The numeric leaves of a round record by path, and the mean rank-1/mAP of seen and unseen domains."""
    out = {path: value for path, value in _leaves(record, ()) if path.split("/")[0] not in _NOT_LOGGED}
    evaluated = record.get("eval") or {}
    for label, names in (("seen", [d for d in evaluated if d not in unseen]), ("unseen", [d for d in evaluated if d in unseen])):
        for metric in ("rank1", "mAP"):
            values = [evaluated[d][metric] for d in names if metric in evaluated[d]]
            if values:
                out[f"mean/{label}/{metric}"] = sum(values) / len(values)
    return out


def _leaves(value: Any, path: tuple[str, ...]) -> Iterator[tuple[str, float]]:
    if isinstance(value, Mapping):
        for key, item in value.items():
            yield from _leaves(item, (*path, str(key)))
    elif isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        yield "/".join(path), float(value)


def flat_config(config: Mapping[str, Any]) -> dict[str, str | int | float | bool]:
    """``{"schedule.lr": 0.02, ...}``: hyper-parameters as both trackers take them (lists as text)."""
    out: dict[str, str | int | float | bool] = {}
    for section, values in config.items():
        if not isinstance(values, Mapping):
            out[section] = values if isinstance(values, (int, float, bool, str)) else json.dumps(values)
            continue
        for key, value in values.items():
            out[f"{section}.{key}"] = value if isinstance(value, (int, float, bool, str)) else json.dumps(value)
    return out


def final_scalars(summary: Mapping[str, Any]) -> dict[str, float]:
    """The summary's per-domain scores (``final/campus/rank1``) and their seen/unseen means."""
    out: dict[str, float] = {}
    for label, domains in (("seen", summary.get("domains", [])), ("unseen", summary.get("unseen", []))):
        for d in domains:
            for metric in ("rank1", "mAP", "local_rank1", "local_mAP"):
                if isinstance(d.get(metric), (int, float)):
                    out[f"final/{d['name']}/{metric}"] = float(d[metric])
        for metric in ("rank1", "mAP"):
            values = [d[metric] for d in domains if isinstance(d.get(metric), (int, float))]
            if values:
                out[f"final/mean/{label}/{metric}"] = sum(values) / len(values)
    if isinstance(summary.get("privacy", {}).get("epsilon"), (int, float)):
        out["final/epsilon"] = float(summary["privacy"]["epsilon"])
    return out


# ---- the trackers ------------------------------------------------------------------------------------


class TensorBoardTracker:
    """Event files under ``RUN/tensorboard/`` (open with ``tensorboard --logdir RUN``)."""

    def __init__(self, run_dir: Path) -> None:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as exc:  # torch imports tensorboard lazily: its absence shows here
            raise ConfigError("run.log_to", "TensorBoard is not installed: pip install 'secfed[tensorboard]'") from exc
        self._writer_class = SummaryWriter
        self.log_dir = Path(run_dir) / "tensorboard"
        self.writer: Any = None
        self.config: dict[str, Any] = {}
        self.start_round = 0

    def start(self, config: Mapping[str, Any], start_round: int) -> None:
        # purge_step: events written after the checkpoint we resume from are dropped, not duplicated
        self.writer = self._writer_class(str(self.log_dir), purge_step=start_round + 1 if start_round else None)
        self.config = flat_config(config)
        self.start_round = start_round
        if not start_round:
            self.writer.add_text("config", "```json\n" + json.dumps(config, indent=2) + "\n```", 0)

    def label(self, labels: Mapping[str, str]) -> None:
        # at the step the run (re)started from: a resume's labels stand beside the first run's
        self.writer.add_text("privacy", "\n\n".join(f"**{k}**: {v}" for k, v in labels.items()), self.start_round)

    def log_round(self, round_number: int, scalars: Mapping[str, float]) -> None:
        for name, value in scalars.items():
            self.writer.add_scalar(name, value, round_number)
        self.writer.flush()

    def finish(self, final: Mapping[str, float], summary: Mapping[str, Any], history_png: Path | None) -> None:
        # hparams with the run's final figures as their metrics: TensorBoard's HParams tab compares runs
        self.writer.add_hparams(self.config, dict(final), run_name=".")
        if history_png is not None and history_png.exists():
            import numpy as np
            from PIL import Image

            image = np.asarray(Image.open(history_png).convert("RGB"))
            self.writer.add_image("history", image, summary.get("rounds", 0), dataformats="HWC")
        self.writer.close()


class MLflowTracker:
    """One MLflow run per secfed run: to ``MLFLOW_TRACKING_URI``, else a SQLite store in the run directory."""

    def __init__(self, run_dir: Path) -> None:
        try:
            import mlflow
        except ImportError as exc:
            raise ConfigError("run.log_to", "MLflow is not installed: pip install 'secfed[mlflow]'") from exc
        self.mlflow = mlflow
        self.run_dir = Path(run_dir)
        self.client: Any = None
        self.run_id: str | None = None
        self.artifacts = True  # False: the store's artifact folder is not this run directory's

    def start(self, config: Mapping[str, Any], start_round: int) -> None:
        import logging

        from mlflow.tracking import MlflowClient

        # its INFO lines (database set-up) are not ours, nor its ERROR tracebacks: a failure is said once, by
        # TrackingReporter (found by review: ~90 lines of SQLAlchemy traceback before secfed's one warning)
        logging.getLogger("mlflow").setLevel(logging.CRITICAL)
        # MLflow's file store is in maintenance mode (refused by default): a SQLite store in the run
        # directory, its artifacts beside it, unless the user points MLflow elsewhere.
        local = self.run_dir.resolve()
        remote = os.environ.get("MLFLOW_TRACKING_URI")
        self.client = MlflowClient(tracking_uri=remote or f"sqlite:///{local / 'mlflow.db'}")
        id_file = self.run_dir / MLFLOW_RUN_FILE
        if start_round and id_file.exists():  # a resumed run continues its MLflow run
            self.run_id = id_file.read_text().strip()
            with _quick_http():
                self.client.update_run(self.run_id, status="RUNNING")
            if not remote:
                self._keep_artifacts_home(self.client.get_run(self.run_id).info.artifact_uri or "", local)
            return
        with _quick_http():  # an unreachable server is said in seconds, not after MLflow's minutes of retries
            experiment = self.client.get_experiment_by_name("secfed")
        experiment_id = experiment.experiment_id if experiment else self.client.create_experiment(
            "secfed", artifact_location=None if remote else (local / "mlartifacts").as_uri())
        if experiment and not remote:  # a run killed before its first round, then moved (review 94)
            self._keep_artifacts_home(experiment.artifact_location or "", local)
        run = self.client.create_run(experiment_id, run_name=self.run_dir.name, tags={"secfed.run_dir": str(self.run_dir)})
        self.run_id = run.info.run_id
        id_file.write_text(self.run_id + "\n")
        from mlflow.entities import Param

        params = [Param(k, str(v)) for k, v in flat_config(config).items()]
        for i in range(0, len(params), 100):  # MLflow takes at most 100 parameters per batch
            self.client.log_batch(self.run_id, params=params[i : i + 100])

    def _keep_artifacts_home(self, stored: str, local: Path) -> None:
        """The in-run store keeps the absolute folder the run was created in (found by review: a copied
        run wrote its artifacts into the original's folder; a moved one failed at its end): where that is
        not this run directory, no artifact is written."""
        if not stored.startswith((local / "mlartifacts").as_uri()):
            self.artifacts = False
            warnings.warn(TrackerFailed(f"{self.run_dir}: MLflow's artifacts of this run live in {stored}, "
                                        "another folder (the run was moved or copied): summary.json and "
                                        "history.png stay in the run directory only"), stacklevel=3)

    def label(self, labels: Mapping[str, str]) -> None:
        for key, value in labels.items():
            self.client.set_tag(self.run_id, key, value[:5000])  # MLflow's tag values are bounded

    def log_round(self, round_number: int, scalars: Mapping[str, float]) -> None:
        from mlflow.entities import Metric

        now = _millis()
        metrics = [Metric(_mlflow_name(k), v, now, round_number) for k, v in scalars.items()]
        for i in range(0, len(metrics), 1000):
            self.client.log_batch(self.run_id, metrics=metrics[i : i + 1000])

    def finish(self, final: Mapping[str, float], summary: Mapping[str, Any], history_png: Path | None) -> None:
        from mlflow.entities import Metric

        now = _millis()
        step = int(summary.get("rounds", 0))
        self.client.log_batch(self.run_id, metrics=[Metric(_mlflow_name(k), v, now, step) for k, v in final.items()])
        if self.artifacts:
            self.client.log_dict(self.run_id, dict(summary), "summary.json")
            if history_png is not None and history_png.exists():
                self.client.log_artifact(self.run_id, str(history_png))
        self.client.set_terminated(self.run_id)


@contextlib.contextmanager
def _quick_http() -> Iterator[None]:
    """MLflow's HTTP requests inside: one retry, 10-s timeout (its defaults: 7 retries with backoff and
    120 s, minutes before an unreachable MLFLOW_TRACKING_URI is said — found by review: 4 min 14 s);
    values the user set are kept."""
    quick = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "1", "MLFLOW_HTTP_REQUEST_TIMEOUT": "10"}
    added = [k for k in quick if k not in os.environ]
    os.environ.update({k: quick[k] for k in added})
    try:
        yield
    finally:
        for k in added:
            os.environ.pop(k, None)


def _millis() -> int:
    import time

    return int(time.time() * 1000)


def _mlflow_name(name: str) -> str:
    """MLflow metric names allow letters, digits and ``_ - . / space``; domain names may hold others."""
    return "".join(c if c.isalnum() or c in "_-./ " else "_" for c in name)


def privacy_labels(fed: Any) -> dict[str, str]:
    """What every output of a run that states an ε must carry beside its numbers (found by review: the
    trackers kept the scalars only, NOT PRIVATE and the figures outside the ε dropped): the noise,
    whom each ε holds against, the plan's statements and, under an ε, what is logged outside it."""
    from secfed.federation.runtime import OUTSIDE_EPSILON, dfs_noised, private_logs
    from secfed.privacy.adversary import NOT_PRIVATE, RELEASED_MODELS

    plan = fed.plan
    noised = plan.mechanism != "none" or plan.dp_sgd is not None or dfs_noised(fed)
    labels = {"privacy.noise": NOT_PRIVATE if plan.reproducible_noise else
              "cryptographically secure" if noised else "no noise",
              "privacy.statements": " ".join(plan.statements) or "no privacy mechanism"}
    if plan.claims_epsilon:
        labels["privacy.epsilon"] = (f"privacy/epsilon (client-level) holds against {RELEASED_MODELS}; against the "
                                     "server see summary.json privacy.epsilon_against")
    if plan.dp_sgd is not None:
        labels["privacy.dp_sgd"] = "dp_sgd_epsilon/<site> (example-level) holds against the server too"
    if dfs_noised(fed):
        labels["privacy.dfs"] = (f"DFH's statistics: identity-level ε = {plan.dfs.epsilon:.3g} per client "
                                 f"(δ = {plan.dfs.delta:.2g})")
    if private_logs(fed):
        labels["privacy.outside_epsilon"] = ("logged outside the ε, aggregate figures: " + ", ".join(OUTSIDE_EPSILON))
    return labels


def attach(reporter: Any, names: Sequence[str], run_dir: Path) -> TrackingReporter:
    """``reporter`` with the trackers ``run.log_to`` names, each checked installed before training
    starts (a missing package is a :class:`~secfed.config.ConfigError` naming ``run.log_to``)."""
    makers = {"tensorboard": TensorBoardTracker, "mlflow": MLflowTracker}
    return TrackingReporter(reporter, [makers[name](run_dir) for name in dict.fromkeys(names)])


class TrackingReporter:
    """A Reporter that passes everything to ``inner`` and, besides, each round's record to the trackers."""

    def __init__(self, inner: Any, trackers: Sequence[Tracker]) -> None:
        self.inner = inner
        self.trackers = list(trackers)
        self.unseen: tuple[str, ...] = ()

    def run_started(self, fed: Any, start_round: int) -> None:
        self.unseen = tuple(d.name for d in fed.domains if d.unseen)
        for tracker in self.trackers:
            try:
                tracker.start(fed.config.to_dict(), start_round)
                # a resume labels again: its plan may count redone rounds (found by review: the DFS ε before them)
                tracker.label(privacy_labels(fed))
            except Exception as exc:  # noqa: BLE001 - a tracker's own errors (found by review: a bad
                # MLFLOW_TRACKING_URI stopped the run with MLflow's traceback); nothing trained yet, --resume goes on
                check = (" check MLFLOW_TRACKING_URI (or, if unset, delete RUN/mlflow.db — a kill while MLflow "
                         "set it up leaves it half made — to start the run's MLflow record afresh), or"
                         if isinstance(tracker, MLflowTracker) else "")
                raise ConfigError("run.log_to", f"{type(tracker).__name__} cannot start ({type(exc).__name__}: "
                                  f"{_first_line(exc)});{check} drop it from --log-to (a resume may: "
                                  "--log-to '')") from None
        self.inner.run_started(fed, start_round)

    def round_done(self, record: dict[str, Any]) -> None:
        values = scalars(record, self.unseen)
        for tracker in list(self.trackers):
            self._guarded(tracker, lambda: tracker.log_round(int(record["round"]), values))
        self.inner.round_done(record)

    def finish(self, summary: Mapping[str, Any], run_dir: Path) -> None:
        final = final_scalars(summary)
        for tracker in list(self.trackers):
            self._guarded(tracker, lambda: tracker.finish(final, summary, Path(run_dir) / "history.png"))

    def _guarded(self, tracker: Tracker, call: Any) -> None:
        """``call()``; a tracker that fails mid-run is dropped with a warning and the run trains on (found
        by review: a failing MLflow store stopped training with its traceback — nothing a tracker does is
        worth a run, and metrics.jsonl keeps every round)."""
        try:
            call()
        except Exception as exc:  # noqa: BLE001 - the tracker's own library's errors, whatever they are
            self.trackers.remove(tracker)
            warnings.warn(TrackerFailed(f"{type(tracker).__name__} failed ({type(exc).__name__}: {_first_line(exc)}) "
                                        "and is no longer logged to; the run goes on, metrics.jsonl keeps every round"),
                          stacklevel=2)

    def __getattr__(self, name: str) -> Any:
        # Every other hook goes to the inner reporter as it is: a hook added to Reporter is never
        # swallowed here (the wrapper only listens to run_started and round_done).
        return getattr(self.inner, name)


def _first_line(exc: BaseException) -> str:
    """An exception's first line, bounded (SQLAlchemy's run to pages of SQL and parameters: review 94)."""
    return (str(exc).splitlines() or [""])[0][:300]
