"""What a training run shows on stderr: a bar while data is made and clients train, a bar with an ETA
for every other wait of a round (scoring the domains, KD fine-tuning, the local-only baselines, a
checkpoint write: :mod:`secfed.progress`), and one line per round. The bars are transient and drawn on
a terminal only: plain logs get the lines, and nothing of this reaches the run directory."""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.progress import TaskID

from secfed.cli.common import eta_bars
from secfed.federation.builder import Federation
from secfed.progress import listening


class RichReporter:
    def __init__(self, console: Console) -> None:
        self.console = console
        self.progress = eta_bars(console)
        self._data_task: int | None = None
        self._clients: int | None = None
        self._rounds = 0
        self._unseen: frozenset[str] = frozenset()
        self._round: int | None = None
        self._private = False  # the run claims an ε (run_started says)
        self._steps: dict[str, TaskID] = {}  # the waits under way, by activity
        self._listening: AbstractContextManager[None] = nullcontext()

    def __enter__(self) -> RichReporter:
        self.progress.start()
        self._listening = listening(self.step)  # the library's waits, while the bars are up
        self._listening.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._listening.__exit__(*exc)
        self.progress.stop()

    def data_progress(self, what: str, done: int, total: int) -> None:
        if self._data_task is None:
            self._data_task = self.progress.add_task("synthesising", total=total, info=what)
        self.progress.update(self._data_task, completed=done, total=total, info=what)

    def run_started(self, fed: Federation, start_round: int) -> None:
        if self._data_task is not None:
            self.progress.remove_task(self._data_task)
            self._data_task = None
        from secfed.federation.runtime import private_logs

        cfg = fed.config
        self._rounds = cfg.schedule.rounds
        # under an ε the bars name no client and count no cohort: a terminal is kept and shared as a log
        # is (found by review: the bar showed each round's secret Poisson cohort, site by site)
        self._private = private_logs(fed)
        self._unseen = frozenset(d.name for d in fed.domains if d.unseen)
        unseen = len(self._unseen)
        self.console.print(
            f"[bold]secfed[/] {fed.method.describe()} · {cfg.data.scenario} · {len(fed.clients)} clients"
            + (f" · {unseen} unseen domains" if unseen else "")
            + f" · {cfg.model.backbone} {cfg.data.height}×{cfg.data.width} · shared {fed.layout.size:,} values · "
            f"channel {fed.channel.name}" + (f" · resuming after round {start_round}" if start_round else "")
        )
        self._clients = self.progress.add_task("clients", total=1, info="")

    def round_started(self, round_number: int, cohort: list[str]) -> None:
        self._round = round_number
        total = 1 if self._private else max(1, len(cohort))
        self.progress.update(self._clients, total=total, completed=0, info=f"round {round_number}")

    def client_done(self, round_number: int, client: str) -> None:
        if self._private:
            self.progress.update(self._clients, info=f"round {round_number}: training")
            return
        self.progress.update(self._clients, advance=1, info=f"round {round_number}: {escape(client)}")

    def step(self, activity: str, done: int, total: int, detail: str = "") -> None:
        """A :mod:`secfed.progress` listener: a bar per wait under way, with what it does now and its
        ETA, removed when the wait ends (done == total)."""
        task = self._steps.get(activity)
        if done >= total:
            if task is not None:
                self.progress.remove_task(self._steps.pop(activity))
            return
        info = "" if self._private else escape(detail)  # site names (not under an ε), as text, not markup
        if task is None:
            where = f"round {self._round}: " if self._round is not None else ""
            self._steps[activity] = self.progress.add_task(escape(where + activity), total=total, completed=done,
                                                           info=info)
        else:
            self.progress.update(task, completed=done, total=total, info=info)

    def round_done(self, record: dict[str, Any]) -> None:
        """One line: round, clients, loss, seconds, ε so far, and when evaluated the mean rank-1 of the
        domains clients trained on and, apart, of the unseen ones."""
        parts = [f"round {record['round']:>3}/{self._rounds}", f"{record['contributors']} clients"]
        parts.append(f"loss {record['loss']:.3f}" if "loss" in record else "loss –")
        parts.append(f"{record['seconds']['round']:.1f} s")
        if "privacy" in record:
            server = record["privacy"].get("epsilon_server")
            colluding = record["privacy"].get("colluders")  # distributed DP: the collusion bound the ε holds for
            parts.append(f"ε {record['privacy']['epsilon']:.3g} vs released models, "
                         + (f"{server:.3g}" if server is not None else "none") + " vs server"
                         + (f" (≤ {colluding} colluders)" if colluding is not None else ""))
        if "noise" in record:
            parts.append(record["noise"])
        if "eval" in record:
            for label, unseen in (("seen", False), ("unseen", True)):
                scores = [v["rank1"] for name, v in record["eval"].items() if (name in self._unseen) == unseen]
                if scores:
                    parts.append(f"{label}-domain rank-1 {100 * sum(scores) / len(scores):.1f}% (mean)")
        if record.get("dropped"):
            parts.append(f"{len(record['dropped'])} dropped")
        self.console.print(" · ".join(parts))
        if record.get("secagg_clipped"):
            by_vector = {k: v for k, v in record.get("secagg_clipped_by_vector", {}).items() if v}
            where = ", ".join(f"{k} {v:,}" for k, v in sorted(by_vector.items()))
            flags = sorted({"--secagg-stats-clip" if k.endswith("/statistics") else "--secagg-clip" for k in by_vector})
            self.console.print(
                f"[yellow]round {record['round']}: {record['secagg_clipped']:,} summed values exceeded their range "
                f"and were clipped before secure aggregation{f' ({where})' if where else ''}; the sum is altered — "
                f"raise {' or '.join(flags) or '--secagg-clip'}[/]"
            )
