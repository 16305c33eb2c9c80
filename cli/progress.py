"""What a training run shows on stderr: a bar while data is made and clients train, one line per round."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from secfed.federation.builder import Federation


class RichReporter:
    def __init__(self, console: Console) -> None:
        self.console = console
        self.progress = Progress(
            TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
            TextColumn("{task.fields[info]}"), console=console, transient=True,
        )
        self._data_task: int | None = None
        self._clients: int | None = None
        self._rounds = 0
        self._unseen: frozenset[str] = frozenset()

    def __enter__(self) -> RichReporter:
        self.progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.progress.stop()

    def data_progress(self, what: str, done: int, total: int) -> None:
        if self._data_task is None:
            self._data_task = self.progress.add_task("synthesising", total=total, info=what)
        self.progress.update(self._data_task, completed=done, total=total, info=what)

    def run_started(self, fed: Federation, start_round: int) -> None:
        if self._data_task is not None:
            self.progress.remove_task(self._data_task)
            self._data_task = None
        cfg = fed.config
        self._rounds = cfg.schedule.rounds
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
        self.progress.update(self._clients, total=max(1, len(cohort)), completed=0, info=f"round {round_number}")

    def client_done(self, round_number: int, client: str) -> None:
        self.progress.update(self._clients, advance=1, info=f"round {round_number}: {escape(client)}")

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
