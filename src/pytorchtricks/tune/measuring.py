"""What ``tune`` measures with and reports: the interleaved measuring of variants, the result types, the facts
the hooks see, and the time left.

``engine`` runs the phases on top of this; ``memory`` (the memory search) and ``receipt`` read the same types, so
they import this module, not the engine: the engine calls them, nothing calls back.
"""

from __future__ import annotations

import enum
import math
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from pytorchtricks.bench.alloc_events import quiet_peak_memory
from pytorchtricks.clock import Comparison, Deadline, compare, quantiles
from pytorchtricks.tunable import TuneFacts
from pytorchtricks.tune.candidates import Check
from pytorchtricks.tune.diagnose import Diagnosis
from pytorchtricks.tune.runner import Runner
from pytorchtricks.tune.workload import Workload

MARGIN = 0.05  # a win must clear 1.05x at the first quartile: borderline tricks would flip between runs
MEMORY_MARGIN = 0.05
REPORT_RESERVE_S = 8.0
DEFAULT_BUDGET_S = 175.0  # + imports and workload build (~6 s): `make demo` ends within 3 minutes
SCOPES = {"step": "whole step", "compute": "compute step, data staged"}
STEP_BASELINE = "baseline (whole step)"
DROPPED_FOR_TIME = (
    "not tried",
    "checked but not measured",
)  # how the reason of a candidate the budget left out begins (``CandidateResult.dropped_for_time`` marks it)


class Status(enum.StrEnum):
    """What became of a candidate (a ``str``: the receipt's JSON holds its value)."""

    KEPT = "kept"
    REJECTED = "rejected"
    SKIPPED = "skipped"
    FAILED = "failed"
    MEASURING = "measuring"  # checked, in the measuring run (a finished run has none left)


@dataclass
class Measured:
    """One variant of one interleaved comparison."""

    label: str
    tricks: tuple[str, ...]
    median_s: float
    q1_s: float
    q3_s: float
    items_per_s: float
    ratio: float  # vs the baseline of the same comparison (> 1: faster)
    ratio_q1: float
    ratio_q3: float
    rounds: int
    peak_bytes: int | None = None
    peak_method: str | None = None
    scope: str = "step"  # "step": loader included; "compute": batches staged in memory, loader left out


@dataclass
class CandidateResult:
    name: str
    status: Status
    reason: str
    exact: bool
    measured: Measured | None = None
    check: Check | None = None
    # one-time build (a pack, a RAM cache, a loader sweep) of the trick and what it needs, in seconds
    prepare_s: float | None = None
    break_even_epochs: float | None = None
    dropped_for_time: bool = False  # skipped because the time budget left it out (not because it cannot help)


@dataclass
class TuneResult:
    workload: dict[str, Any]
    env: dict[str, Any]
    goal: str
    budget_s: float
    diagnosis: Diagnosis | None = None
    # baseline: the compute step's (model tricks) or, without model tricks, the whole step's;
    # step_baseline: the whole step's (loader settings), measured in the same rounds as ``baseline``
    baseline: Measured | None = None
    step_baseline: Measured | None = None
    candidates: list[CandidateResult] = field(default_factory=list)
    combination: list[dict[str, Any]] = field(default_factory=list)  # the greedy steps
    final: list[Measured] = field(default_factory=list)  # the verification run
    recommended: tuple[str, ...] = ()
    combined: Measured | None = None
    combined_check: Check | None = None
    after_split_s: dict[str, float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    phases_done: list[str] = field(default_factory=list)
    interrupted: bool = False
    elapsed_s: float = 0.0
    memory: Any = None  # the memory search (``tune.memory.MemorySearch``) of --memory-budget / --goal memory
    accuracy: Any = None  # the parity check (``tune.accuracy.AccuracyCheck``) of --accuracy-steps, or None
    # where the seconds went: wall seconds per phase (diagnose, waiting for a quiet machine, checks, measuring,
    # combine, verify, self-check, report)
    phase_s: dict[str, float] = field(default_factory=dict)
    # who used the CPU during each phase (clock.CpuUse.as_dict(): ``busy_share`` is the share of the machine's
    # cores other programs took), with ``busy``: why that phase's figures cannot be trusted, or None
    cpu: dict[str, Any] = field(default_factory=dict)
    # why the run's figures are not to be trusted (a busy machine, a diagnosis that contradicts itself); a run with
    # any never presents "keep the current setup" as a finding
    unreliable: list[str] = field(default_factory=list)
    self_check: dict[str, Any] | None = None  # tune.selfcheck: compute alone in a fresh process

    @property
    def reliable(self) -> bool:
        return not self.unreliable


class Progress:
    """What ``tune`` reports while it runs; the CLI subclasses it with rich progress bars."""

    def phase(self, name: str, total: int | None) -> None: ...

    def advance(self, n: int = 1) -> None: ...

    def log(self, message: str) -> None: ...

    def done(self) -> None: ...


def _measured(
    cmp: Comparison,
    labels: dict[str, tuple[str, ...]],
    items: int,
    mem: dict[str, Any],
    scopes: dict[str, str],
) -> dict[str, Measured]:
    out = {}
    for name, v in cmp.variants.items():
        m = mem.get(name)
        scope = scopes[name]
        out[name] = Measured(
            name,
            labels[name],
            v.stats.median_s,
            v.stats.q1_s,
            v.stats.q3_s,
            items / v.stats.median_s,
            v.ratio,
            v.ratio_q1,
            v.ratio_q3,
            cmp.rounds,
            m.peak_bytes if m is not None else None,
            m.method if m is not None else None,
            scope,
        )
    return out


def paired_ratio(cmp: Comparison, num: str, den: str) -> tuple[float, float, float]:
    """(Q1, median, Q3) of the per-round speed ratio of ``den`` over ``num`` (> 1: ``den`` is faster)."""
    a, b = cmp[num].stats.times_s, cmp[den].stats.times_s
    return quantiles([x / y for x, y in zip(a, b)])


# compare's settle: a variant's steady state reached within 4 more calls (3 were needed on ResNet-18)
SETTLE_CALLS = 4
MIN_BLOCK_S = 0.25  # the shortest timed block worth having (one call of a slow step is always timed anyway)


def plan_blocks(
    steps_s: dict[str, float],
    whole: tuple[str, ...] | set[str],
    budget_s: float,
    memory: bool = True,
    whole_units: int = 1,
) -> tuple[int, float, bool] | None:
    """(rounds, min_run_time_s, measure_memory) that fit the variants (their expected seconds per call in
    ``steps_s``) into ``budget_s``, or None.

    Prefers more rounds (a tighter IQR), then spends what is left on longer timed blocks of the staged variants
    (up to 1 s each); drops the profiled memory step before giving up. Cost model: one warm-up call per variant
    (+ ~3 calls for the profiled peak-memory step of a staged one); per round a staged variant costs the Timer's
    block-size call, its timed block and up to one call past its end; a ``whole``-step variant starts its loader
    workers and runs one untimed step per worker (~one call), then its timed block of whole calls of
    ``whole_units`` steps (one per loader worker, see ``measure_variants``) and up to half a call past its end.
    """
    if not steps_s:
        return None
    t = {n: max(v, 1e-4) * (whole_units if n in whole else 1) for n, v in steps_s.items()}
    staged = [n for n in t if n not in whole]
    warm = sum(t.values()) + (3 * sum(t[n] for n in staged) if memory else 0.0)
    per_round = sum((1.5 if n in whole else 2) * v for n, v in t.items())
    for rounds in (9, 7, 5, 3):
        block = ((budget_s - warm) / rounds - per_round) / len(t)
        if block >= MIN_BLOCK_S:
            return rounds, min(1.0, block), memory
    return plan_blocks(steps_s, whole, budget_s, False, whole_units) if memory and staged else None


def measure_variants(
    w: Workload,
    variants: dict[str, tuple[str, ...]],
    *,
    step_s: float | dict[str, float],
    budget_s: float,
    memory: bool = True,
    on_round: Callable[[int], None] | None = None,
    batches: list[tuple[torch.Tensor, torch.Tensor]] | None = None,
    whole_step: tuple[str, ...] = (),
    min_block_s: float | None = None,
) -> tuple[dict[str, Measured], Comparison]:
    """Build a Runner per variant and time them interleaved (first variant is the reference).

    ``step_s``: the expected seconds per call, of every variant or per variant (what the rounds are planned on);
    ``min_block_s``: the shortest timed block, whatever the plan.
    With ``batches`` every variant cycles over those in-memory batches (the compute step alone), except the
    variants named in ``whole_step``, which read through their loader (the whole step). Memory is measured for
    the staged variants only (a loader's worker processes would fork inside the meter).
    """
    staged = {n for n in variants if batches is not None and n not in whole_step}
    steps = step_s if isinstance(step_s, dict) else {n: step_s for n in variants}
    runners: dict[str, Runner] = {}
    try:
        for name, tricks in variants.items():
            runners[name] = Runner(w, tricks, batches=batches if name in staged else None)
        # a whole step with W loader workers is timed W steps per call: the workers deliver their batches in
        # waves of W (all started together), so a block of any other length would be a part-wave, fast or slow
        # by where it starts; per step the times are the same
        units = {n: max(1, r.num_workers) if n not in staged else 1 for n, r in runners.items()}
        whole = {n for n in variants if n not in staged}
        plan = plan_blocks(steps, whole, budget_s, memory, max([units[n] for n in whole], default=1))
        rounds, min_rt, memory = plan if plan is not None else (3, MIN_BLOCK_S, False)
        min_rt = max(min_rt, min_block_s or 0.0)
        cmp = compare(
            {n: _steps(r, units[n]) for n, r in runners.items()},
            baseline=next(iter(variants)),
            rounds=rounds,
            min_run_time_s=min_rt,
            device=w.device,
            warmup=1,
            settle=SETTLE_CALLS,
            on_round=on_round,
            before_block=lambda n: _only_active(runners, n),
            budget_s=0.9 * budget_s,  # a wrong cost estimate ends the run early (>= 3 rounds), not late
            units_per_call=units,
            single_call=whole,
        )
        mem = {
            n: quiet_peak_memory(r.step, w.device)
            for n, r in runners.items()
            if memory and (n in staged or batches is None)
        }
    finally:
        for r in runners.values():
            r.close()
    scopes = {n: "compute" if n in staged else "step" for n in variants}
    return _measured(cmp, variants, w.batch_size, mem, scopes), cmp


def _steps(r: Runner, n: int) -> Callable[[], Any]:
    if n == 1:
        return r.step

    def run() -> Any:
        for _ in range(n - 1):
            r.step()
        return r.step()

    return run


def _only_active(runners: dict[str, Runner], name: str) -> None:
    """Before ``name``'s timed block: stop every other variant's loader workers, start ``name``'s."""
    for other, r in runners.items():
        if other != name:
            r.deactivate()
    runners[name].activate()


def facts_of(
    w: Workload,
    diag: Diagnosis,
    budget_left_s: float,
    *,
    goal: str = "speed",
    memory_budget_bytes: int | None = None,
) -> TuneFacts:
    """What the hooks' ``applies`` see: the workload and its diagnosis."""
    import psutil

    data_bytes = sum(os.path.getsize(f) for f in w.files) if w.files else None
    convs = [m for m in w.model_factory().modules() if isinstance(m, torch.nn.Conv2d)]
    nhwc = bool(convs) and all(
        m.weight.is_contiguous(memory_format=torch.channels_last) and not m.weight.is_contiguous()
        for m in convs
    )
    return TuneFacts(
        phase=w.for_,
        device=w.device.type,
        verdict=diag.verdict,
        loader_can_help=diag.loader_can_help,
        declared_step_s=w.device_step_s,
        task=w.task,
        data_wait_share=diag.input_share,
        data_kind=w.data_kind,
        data_bytes=data_bytes,
        num_samples=len(w.dataset),
        input_size=w.input_size,
        free_ram_bytes=int(psutil.virtual_memory().available),
        cpu_count=os.cpu_count() or 1,
        budget_left_s=budget_left_s,
        conv_bias_pairs=len(diag.conv_bias_pairs),
        conv_bn_pairs=diag.conv_bn_pairs,
        has_conv2d=diag.has_conv2d,
        native_bf16=diag.bf16_native,
        baseline={"num_workers": w.num_workers, "channels_last": nhwc, "optimizer": w.optimizer[0]},
        batch_size=w.batch_size,
        goal=goal,
        memory_budget_bytes=memory_budget_bytes,
    )


def time_left_s(dl: Deadline) -> float:
    """Seconds left for measuring, after keeping time to write the receipt (plots take a few seconds)."""
    reserve = min(REPORT_RESERVE_S, 2.0 + 0.05 * (dl.budget_s or 0.0))
    return max(0.0, dl.remaining_s - reserve)


def where_measured(phases_done: list[str]) -> str:
    """Which interleaved run the recommended figure comes from (the receipt says it beside the number)."""
    if "memory" in phases_done:
        return (
            "on the compute step (batches staged), in the memory search's interleaved run with the baseline"
        )
    if "verify" in phases_done:
        return "in its own interleaved run with the baseline"
    return "in the candidates' interleaved run with the baseline (no time was left for a separate verify run)"


def speedup_text(m: Measured | None) -> str:
    if m is None or not math.isfinite(m.ratio):
        return "-"
    return f"{m.ratio:.2f}x (IQR {m.ratio_q1:.2f}-{m.ratio_q3:.2f})"
