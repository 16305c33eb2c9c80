"""Leave-one-domain-out: the FedDG protocol (Yang et al., Table 1) as one command.

Every training domain in turn is held out (`data.leave_out = [NAME]`), the others train, and the
held-out one is scored as an unseen target. Each of those trainings is an ordinary run directory
(``RUN/leave-out-NAME``: checkpoints, metrics, summary, resumable on its own); ``RUN/sweep.json``
names the sweep and its configuration so ``--resume RUN`` continues it, and
``RUN/leave-one-out.json`` holds the per-target scores and their mean.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from secfed import atomic_file
from secfed.config import ConfigError, RunConfig
from secfed.federation import checkpoint as ckpt
from secfed.federation.builder import resolve_data
from secfed.validation import check
from secfed.federation.runtime import Reporter, new_run_dir, run

SWEEP_FILE = "sweep.json"
RESULT_FILE = "leave-one-out.json"


@dataclass
class SweepResult:
    run_dir: Path
    targets: list[dict[str, Any]]  # per held-out domain: name, rank1, mAP, run (its run directory)
    mean: dict[str, float]

    def to_dict(self) -> dict[str, Any]:
        return {"protocol": "leave-one-domain-out", "targets": self.targets, "mean": self.mean}


def training_domains(cfg: RunConfig) -> list[str]:
    """The domains a run of ``cfg`` would train on, were none left out."""
    whole = cfg.model_copy(deep=True)
    whole.data.leave_out = []
    return [d.name for d in resolve_data(whole).trained]


def is_sweep(run_dir: Path) -> bool:
    return (Path(run_dir) / SWEEP_FILE).is_file()


def leave_one_out(cfg: RunConfig, run_dir: Path, *, resume: bool = False, reporter: Reporter | None = None,
                  data_root: Path | None = None) -> SweepResult:
    """Train once per held-out training domain and score each on its held-out domain.

    ``cfg.data.leave_out`` must be empty (the sweep sets it); at least three training domains are
    needed, so that every training keeps two clients for the secure sum.
    """
    if cfg.data.leave_out:
        raise ConfigError("data.leave_out", "cannot be combined with a leave-one-out sweep, which holds out each "
                          "training domain in turn")
    check(cfg)
    names = training_domains(cfg)
    if len(names) < 3:
        raise ConfigError("data.datasets", f"leave-one-out needs at least three training domains (got "
                          f"{', '.join(names)}): two keep training while one is held out")
    run_dir = Path(run_dir)
    with new_run_dir(run_dir):  # a refusal before any target started leaves nothing behind
        if not resume or not is_sweep(run_dir):
            atomic_file.write_text(run_dir / SWEEP_FILE, json.dumps(
                {"protocol": "leave-one-domain-out", "targets": names, "config": json.loads(cfg.to_json())}, indent=2))
        targets = _targets(cfg, run_dir, names, resume=resume, reporter=reporter, data_root=data_root)
    mean = {key: statistics.fmean(t[key] for t in targets) for key in ("rank1", "mAP")}
    result = SweepResult(run_dir, targets, mean)
    atomic_file.write_text(run_dir / RESULT_FILE, json.dumps(result.to_dict(), indent=2))
    return result


def _targets(cfg: RunConfig, run_dir: Path, names: list[str], *, resume: bool, reporter: Reporter | None,
             data_root: Path | None) -> list[dict[str, Any]]:
    """Each held-out domain's run (resumed or read back when it already finished) and its scores."""
    targets = []
    for name in names:
        sub_dir = run_dir / f"leave-out-{name}"
        summary_file = sub_dir / "summary.json"
        if resume and summary_file.is_file():
            summary = json.loads(summary_file.read_text())
        else:
            sub = cfg.model_copy(deep=True)
            sub.data.leave_out = [name]
            again = resume and (sub_dir / "config.json").is_file() and bool(ckpt.list_checkpoints(sub_dir))
            summary = run(sub, sub_dir, resume=again, reporter=reporter, data_root=data_root).summary
        scores = next(d for d in summary["unseen"] if d["name"] == name)
        targets.append({"name": name, "rank1": scores["rank1"], "mAP": scores["mAP"], "run": sub_dir.name})
    return targets
