"""The audit's outputs: ``audit.json`` (everything), ``audit.md`` (verdict table first), a rich table,
and — only with ``--save-images`` — image grids (victim | reconstruction | nearest gallery match)
under the output folder. Reconstructions are as sensitive as the images: nothing else writes them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from PIL import Image
from rich.table import Table

from secfed import atomic_file
from secfed.attacks.audit import AuditReport, TargetReport
from secfed.attacks.verdict import AttackResult, Verdict

STYLE = {Verdict.LEAK: "bold red", Verdict.INCONCLUSIVE: "yellow", Verdict.NO_LEAK: "green"}


def write_report(report: AuditReport, out: Path, *, save_images: bool = False) -> dict[str, Path]:
    """Write audit.json and audit.md (and image grids when asked) into ``out``; returns their paths."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    grids = save_grids(report, out / "images") if save_images else {}
    data = report.to_dict()
    data["images"] = {key: str(path.relative_to(out)) for key, path in grids.items()}
    atomic_file.write_text(out / "audit.json", json.dumps(data, indent=2, default=_plain))
    atomic_file.write_text(out / "audit.md", markdown(report, {k: p.relative_to(out) for k, p in grids.items()}))
    return {"json": out / "audit.json", "markdown": out / "audit.md", **{f"image:{k}": p for k, p in grids.items()}}


def _plain(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.tolist()
    if hasattr(value, "item"):
        return value.item()
    return str(value)


def _cell(value: Any, digits: int = 3) -> str:
    if value is None:
        return "—"
    if isinstance(value, float):
        return f"{value:.{digits}g}"
    return str(value)


def _reid(result: AttackResult, name: str) -> str:
    test = result.tests.get(name)
    if test is None:
        hits = [r.get(f"{name.split('-')[1]}_hit") for r in result.per_image]
        hits = [h for h in hits if h is not None]
        return f"({sum(hits)}/{len(hits)}, not counted)" if hits else "—"
    if not test.measurable:
        return "no power" if test.statistic.startswith("no power") else "not measurable"
    return f"{test.hits}/{test.trials} (chance {test.chance:.2g}, p {test.p_value:.2g})"


def verdict_rows(report: AuditReport) -> list[tuple[str, str, str, str]]:
    rows = []
    for t in report.targets:
        verdict = "n/a" if t.verdict is None else str(t.verdict)
        exposed = t.exposure if t.exposed else f"(not exposed) {t.exposure}"
        rows.append((t.target, verdict, exposed, t.reason))
    return rows


def markdown(report: AuditReport, grids: dict[str, Path]) -> str:
    run = report.run
    lines = [f"# secfed audit — {run['name']}", ""]
    lines += ["| target | verdict | exposed | why |", "|---|---|---|---|"]
    for target, verdict, exposed, why in verdict_rows(report):
        lines.append(f"| {target} | **{verdict}** | {exposed} | {why.replace('|', '/')} |")
    lines.append("")
    for s in report.statements:
        lines.append(f"> {s}")
    if report.statements:
        lines.append("")
    b = report.budget
    lines.append(f"Run `{run['run_dir'] or 'none: a checkpoint kept outside any run'}` · "
                 f"checkpoint `{Path(run['checkpoint']).name}` (sha256 "
                 f"`{run['checkpoint_sha256'][:16]}…`) after round {run['rounds_done']} · {run['algorithm']} · "
                 f"channel {run['channel']}.  ")
    if report.round is not None:
        c = report.client
        lines.append(f"Round {report.round} ({report.source}) · client {c['name']} ({c['images']} images, "
                     f"{c['identities']} identities) · cohort {c['cohort']}.  ")
    lines.append(f"Budget {b.name} ({b.seconds:g} s): {report.wall_seconds:.0f} s wall, {report.cpu_seconds:.0f} s CPU.")
    lines.append("")
    for t in report.targets:
        lines += _target_section(t, grids)
    return "\n".join(lines) + "\n"


def _target_section(t: TargetReport, grids: dict[str, Path]) -> list[str]:
    verdict = "n/a" if t.verdict is None else str(t.verdict)
    lines = [f"## {t.target} — {verdict}", "", f"{t.exposure}. {t.reason}", ""]
    if t.findings:
        lines += ["| check | status | detail |", "|---|---|---|"]
        lines += [f"| {f.check} | {f.status} | {f.detail} |" for f in t.findings]
        lines.append("")
    if t.results:
        lines += ["| attack | verdict | residual (fit ≤) | iterations × restarts | CPU s | re-id by embedding | "
                  "re-id by pixels | PSNR | SSIM |", "|---|---|---|---|---|---|---|---|---|"]
        for r in t.results:
            membership = r.tests.get("membership")
            emb = _reid(r, "reid-embedding") if membership is None else (
                f"AUC {r.metrics['auc']:.2f}, TPR@1%FPR {r.metrics['tpr_at_1pct_fpr']:.2f} "
                f"({r.metrics['identities_in_client']} identities, p {membership.p_value:.2g})")
            lines.append(
                f"| {r.attack} | {r.verdict} | {_cell(r.residual)} ({_cell(r.fit_threshold)}) | "
                f"{r.iterations} × {r.restarts} | {r.cpu_seconds:.0f} | {emb} | {_reid(r, 'reid-pixels')} | "
                f"{_cell(r.metrics.get('psnr_mean'))} | {_cell(r.metrics.get('ssim_mean'))} |")
        lines.append("")
        for r in t.results:
            lines.append(f"- **{r.attack}**: {r.reason}. Residual: {r.residual_kind}.")
            for note in r.notes:
                lines.append(f"  - {note}")
            shown = ", ".join(f"{k}: {_short(v)}" for k, v in r.assumptions.items())
            lines.append(f"  - assumptions — {shown}")
            key = _grid_key(t.target, r.attack)
            if key in grids:
                lines.append(f"  - ![{r.attack}: victim, reconstruction, nearest gallery image]({grids[key].as_posix()})")
        lines.append("")
    for note in t.notes:
        lines.append(f"- {note}")
    if t.notes:
        lines.append("")
    return lines


def _short(value: Any) -> str:
    text = json.dumps(value, default=_plain, ensure_ascii=False) if not isinstance(value, str) else value
    return text if len(text) <= 160 else text[:157] + "…"


def _grid_key(target: str, attack: str) -> str:
    return f"{target}-" + "".join(ch if ch.isalnum() else "-" for ch in attack).strip("-")


def save_grids(report: AuditReport, folder: Path, upscale: int = 2) -> dict[str, Path]:
    """One PNG per attack with images: rows of victim | reconstruction | nearest gallery match."""
    paths = {}
    for t in report.targets:
        for r in t.results:
            if not r.images:
                continue
            columns = [r.images[k] for k in ("victim", "reconstruction", "nearest") if k in r.images]
            rows = torch.cat([torch.cat(list(col_row), dim=2) for col_row in zip(*columns)], dim=1)
            picture = Image.fromarray(rows.permute(1, 2, 0).numpy())
            picture = picture.resize((picture.width * upscale, picture.height * upscale), Image.NEAREST)
            folder.mkdir(parents=True, exist_ok=True)
            key = _grid_key(t.target, r.attack)
            path = folder / f"{key}.png"
            picture.save(path)
            paths[key] = path
    return paths


def verdict_table(report: AuditReport) -> Table:
    table = Table(title="secfed audit", show_lines=False)
    for name in ("target", "verdict", "best residual", "exposed", "why"):
        table.add_column(name, overflow="fold")
    for t in report.targets:
        residuals = [r.residual for r in t.results if r.residual is not None]
        verdict = "n/a" if t.verdict is None else str(t.verdict)
        style = STYLE.get(t.verdict, "") if t.verdict is not None else "dim"
        table.add_row(t.target, f"[{style}]{verdict}[/]" if style else verdict,
                      _cell(min(residuals)) if residuals else "—", "yes" if t.exposed else "no", t.reason)
    return table
