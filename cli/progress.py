"""Rich progress for a training run: rounds, and the clients of the current round (on stderr)."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from secfed.federation.builder import Federation


class RichReporter:
    def __init__(self, console: Console) -> None:
        self.console = console
        self.progress = Progress(
            TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
            TimeElapsedColumn(), TimeRemainingColumn(), TextColumn("{task.fields[info]}"),
            console=console, transient=False,
        )
        self._data_task: int | None = None
        self._rounds: int | None = None
        self._clients: int | None = None

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
        cfg = fed.config
        self.console.print(
            f"[bold]secfed[/] {cfg.train.algorithm} · {cfg.data.scenario} · {len(fed.clients)} clients · "
            f"{cfg.model.backbone} {cfg.data.height}×{cfg.data.width} · shared {fed.layout.size:,} values · "
            f"channel {fed.channel.name}"
        )
        for line in fed.privacy.plan.statements:
            self.console.print(f"[yellow]privacy:[/] {line}")
        self._rounds = self.progress.add_task("rounds", total=cfg.train.rounds, completed=start_round, info="")
        self._clients = self.progress.add_task("clients", total=1, info="")

    def round_started(self, round_number: int, cohort: list[str]) -> None:
        self.progress.update(self._clients, total=len(cohort), completed=0, info=f"round {round_number}")

    def client_done(self, round_number: int, client: str) -> None:
        self.progress.update(self._clients, advance=1, info=f"round {round_number}: {client}")

    def round_done(self, record: dict[str, Any]) -> None:
        info = f"loss {record['loss']:.3f}"
        if "eval" in record:
            r1 = [v["rank1"] for v in record["eval"].values()]
            info += f" · mean rank-1 {100 * sum(r1) / len(r1):.1f}%"
        if record.get("dropped"):
            info += f" · {len(record['dropped'])} dropped"
        if record.get("secagg_clipped"):
            self.console.print(
                f"[yellow]round {record['round']}: {record['secagg_clipped']:,} uploaded values exceeded "
                "--secagg-clip and were clipped before secure aggregation; raise --secagg-clip[/]"
            )
        if "privacy" in record:
            info += f" · ε {record['privacy']['epsilon']:.3g}"
        self.progress.update(self._rounds, advance=1, info=info)
