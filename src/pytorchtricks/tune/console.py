"""Terminal output of ``ptt tune``: a rich progress bar per phase and the final receipt table."""

from __future__ import annotations

from typing import Any

from pytorchtricks.tune.measuring import SCOPES, Progress, TuneResult, speedup_text, where_measured
from pytorchtricks.tune.receipt import shape_text


class RichProgress(Progress):
    """One rich progress task per phase; the previous phase is marked done when the next begins."""

    def __init__(self, console: Any) -> None:
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            SpinnerColumn,
            TextColumn,
            TimeElapsedColumn,
        )

        self.console = console
        self.bar = Progress(
            SpinnerColumn(),
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=console,
            transient=False,
        )
        self.task: Any = None
        self.bar.start()

    def phase(self, name: str, total: int | None) -> None:
        self._finish()
        self.task = self.bar.add_task(name, total=total)

    def advance(self, n: int = 1) -> None:
        if self.task is not None:
            self.bar.advance(self.task, n)

    def log(self, message: str) -> None:
        self.bar.console.print(message)

    def _finish(self) -> None:
        if self.task is not None:
            t = self.bar.tasks[self.task]
            self.bar.update(self.task, total=t.total or 1, completed=t.total or 1)

    def done(self) -> None:
        self._finish()
        self.bar.stop()


def receipt_table(res: TuneResult) -> Any:
    from rich.markup import escape
    from rich.table import Table

    w = res.workload
    table = Table(
        title=f"ptt tune: {w['model']} ({w['for']}, batch {w['batch_size']}, input {shape_text(w)})"
    )
    for col in ("trick", "status", "speed vs baseline", "images/s", "check", "why"):
        table.add_column(col, overflow="fold")
    style = {"kept": "green", "rejected": "red", "failed": "red", "skipped": "dim"}
    two = res.step_baseline is not None and res.step_baseline is not res.baseline
    for b in [res.baseline, res.step_baseline if two else None]:
        if b is None:
            continue
        label = f"baseline ({SCOPES[b.scope]})" if two else "baseline"
        table.add_row(label, "", "1.00x", f"{b.items_per_s:.1f}", "", "reference")
    for c in res.candidates:
        m = c.measured
        table.add_row(
            escape(c.name),  # pack[resize] is not rich markup
            f"[{style[c.status]}]{c.status}[/]" if c.status in style else c.status,
            speedup_text(m) + (f" ({SCOPES[m.scope]})" if m is not None and m.scope != "step" else ""),
            f"{m.items_per_s:.1f}" if m else "-",
            ("ok" if c.check.passed else "FAILED") if c.check else "-",
            c.reason,
        )
    if res.combined is not None and len(res.recommended) > 1:
        table.add_row(
            "combined",
            "[green]measured[/]",
            speedup_text(res.combined),
            f"{res.combined.items_per_s:.1f}",
            ("ok" if res.combined_check and res.combined_check.passed else "-"),
            " + ".join(res.recommended),
        )
    return table


def memory_table(res: TuneResult) -> Any:
    """The memory search's configurations: predicted and measured peak, fits, speed, what happened (None without
    a memory search)."""
    from rich.markup import escape
    from rich.table import Table

    mem = res.memory
    if mem is None:
        return None
    budget = "-" if mem.budget_bytes is None else f"{mem.budget_bytes / 2**20:.0f} MiB"
    table = Table(title=f"memory search: budget {budget}, every configuration (peaks: held + the step's own)")
    for col in ("configuration", "predicted", "measured peak", "fits", "speed vs baseline", "status / why"):
        table.add_column(col, overflow="fold")
    rec = set(mem.recommended)

    def mib(n: int | None) -> str:
        return "-" if n is None else f"{n / 2**20:.0f} MiB"

    hidden = 0
    for p in mem.points:
        if (p.status == "not run" and p.predicted_bytes is None) or "may fit already" in p.reason:
            hidden += 1  # the same as a smaller configuration: in report.html and results.jsonl
            continue
        fits = {True: "[green]yes[/]", False: "[red]no[/]"}.get(p.fits, "-")
        mark = " [green](recommended)[/]" if rec and set(p.tricks) == rec else ""
        table.add_row(
            escape(p.label) + mark, mib(p.predicted_bytes), mib(p.peak_bytes), fits,
            speedup_text(p.measured) if p.measured else "-", escape(p.status + (f": {p.reason}" if p.reason else "")),
        )  # fmt: skip
    if hidden:
        table.caption = f"{hidden} more not run (a smaller configuration already fits, or the same as one): see report.html"
    return table


def _learns_differently(res: TuneResult) -> bool:
    from pytorchtricks.tune.accuracy import OUTSIDE

    return res.accuracy is not None and res.accuracy.answer == OUTSIDE


def accuracy_line(chk: Any) -> str:
    """The parity check's answer (``tune.accuracy.AccuracyCheck``) as one console line: red when the recommended
    pipeline learns differently."""
    from rich.markup import escape

    from pytorchtricks.tune.accuracy import INSIDE, OUTSIDE, headline

    style = {INSIDE: "green", OUTSIDE: "bold red"}.get(chk.answer)
    word, _, rest = headline(chk).partition(": ")
    return f"[{style}]{escape(word)}[/]: {escape(rest)}" if style else f"{escape(word)}: {escape(rest)}"


def summary_lines(res: TuneResult, out: str | None) -> list[str]:
    from rich.markup import escape

    env = res.env
    lines = []
    d = res.diagnosis
    if d is not None and d.verdict:  # what bounds the step, with the seconds and CPU-seconds that say so
        lines.append(f"verdict: [bold]{escape(d.verdict)}[/] - {escape(d.evidence)}" if d.evidence else
                     f"verdict: [bold]{escape(d.verdict)}[/]")  # fmt: skip
    if res.memory is not None and res.memory.message:
        lines.append(f"memory: {escape(res.memory.message)}")
    if res.recommended:
        lines.append(
            f"recommended: {escape(', '.join(res.recommended))} -> {speedup_text(res.combined)} images/s vs baseline "
            f"(measured {where_measured(res.phases_done)})"
            + (" [bold red]- but it learns differently (see below)[/]" if _learns_differently(res) else "")
        )
        if res.workload.get("device_step_ms"):
            lines.append(
                f"(a projection for a {res.workload['device_step_ms']:g} ms accelerator step declared with "
                "--device-step-ms: each loader fed a stand-in step that held the training process that long)"
            )
    elif res.unreliable:
        lines.append(
            "[bold red]no recommendation: the measurements are unreliable[/] - nothing below is a finding about "
            "your setup; rerun on a quiet machine"
        )
    else:
        lines.append("recommended: nothing beat the baseline by the margin; keep the current setup")
    if res.accuracy is not None:  # the parity check (--accuracy-steps), in one line
        lines.append(accuracy_line(res.accuracy))
    for why in res.unreliable:
        lines.append(f"[red]unreliable:[/] {escape(why)}")
    busy = [
        f"{phase} {d['busy_share']:.0%}"
        for phase, d in res.cpu.items()
        if isinstance(d, dict) and "busy_share" in d
    ]
    if busy:
        lines.append("CPU taken by other processes, per phase: " + ", ".join(busy))
    sc = res.self_check or {}
    if sc.get("min_s") and sc.get("tune_compute_alone_s"):
        lines.append(
            f"self-check: compute step {sc['min_s']:.3f} s in a fresh process vs {sc['tune_compute_alone_s']:.3f} s "
            f"in tune ({sc['ratio']:.2f}x{'' if sc.get('agrees') else ', DISAGREE'})"
        )
    elif sc:
        lines.append(f"self-check: {escape(str(sc.get('skipped') or sc.get('error')))}")
    for name, r in (res.diagnosis.loader_rates if res.diagnosis else {}).items():
        lines.append(
            f"loader alone: {escape(name)}: {r['images_per_s']:.1f} images/s, {r['cpu_s_per_image']:.3f} CPU-s per image"
        )
    if res.phase_s:
        lines.append("where the seconds went: " + ", ".join(f"{k} {v:.0f} s" for k, v in res.phase_s.items()))
    lines.append(
        f"{env.get('device_name')}, {env.get('threads')} threads, torch {env.get('torch')}; "
        f"{res.elapsed_s:.0f} s of a {res.budget_s:.0f} s budget. Ratios: medians of paired per-round ratios."
    )
    lines += [f"note: {n}" for n in res.notes]
    if out:
        lines.append(f"receipt: {out}/report.html, {out}/results.jsonl, {out}/apply.py")
    return lines
