"""The memory search of ``ptt tune --memory-budget SIZE`` (and ``--goal memory``): the fastest configuration of the
catalogue's memory tricks whose measured step peak fits, and the speed/memory frontier it was chosen from.

Flow (after the diagnosis; the batch stays the user's: only an accumulation hook changes the micro-batch):
  1. candidates: every hook whose trick gains memory (``TrickInfo.gains``), applied alone and checked the way it
     says (exact: the update of one step equals the untreated step's; approximate: loss parity and SQNR); a hook
     with nothing to change on this model is skipped with its reason;
  2. predict: every configuration (at most one trick per ``group``, e.g. one micro-batch split) is predicted by
     ``ptt.estimate_memory`` on its own treated model - one probe step on a few samples, the batch-dependent part
     scaled to the micro-batch; the estimate's error is measured on the baseline, and a configuration predicted
     above the budget by more than that error (+ ``PREDICT_MARGIN``) is not run (on a GPU: what keeps tune itself
     from running out of memory); nor is one holding a configuration that may fit already where what it adds saves
     memory only (it would not be measured: building it costs its plans);
  3. measure: the configurations that may fit, fewest tricks first (a superset of one that fits is run only when
     its extra trick also gains speed), each's peak (bytes resident between steps + the step's own peak;
     CUDA: ``max_memory_allocated`` after ``reset_peak_memory_stats``, reserved bytes too; an out-of-memory error
     is caught and recorded) and speed (the compute step, batches staged, interleaved with the baseline);
  4. recommend the fastest whose measured peak fits (spreads that overlap tie: the fewest tricks, then the hooks'
     order - of two micro-batch splits the smaller), among those whose update equals the whole batch's when one
     fits (an accumulation with BatchNorm in train mode normalises each micro-batch by its own statistics: it stays
     on the frontier with that caveat, recommended only when nothing exact fits); a checkpoint hook plans its
     regions on the workload's own micro-batch to what the budget leaves the activations
     (``activation_budget``: the budget less the parameters, buffers, gradients, optimizer state and the step's
     input batch), once per run (``TuneSetup.memo``), and its plan is kept with the point (``MemoryPoint.detail``);
     ``--goal memory`` without a budget: the smallest peak within ``SPEED_SLACK`` of the best speed. Its check
     is repeated on the whole batch (the acceptance of an accumulation is the update of *that* batch).

Nothing here names a trick: the hooks say what they change; the search enumerates them.
"""

from __future__ import annotations

import itertools
import math
import warnings
from dataclasses import dataclass, field
from typing import Any

import torch

from pytorchtricks.bench.alloc_events import quiet_peak_memory
from pytorchtricks.clock import Deadline
from pytorchtricks.core import PttError
from pytorchtricks.quiet import filtered_stderr
from pytorchtricks.tunable import TuneSkip
from pytorchtricks.tune.candidates import Check, check, why_not
from pytorchtricks.tune.hooks import all_candidates, by_name
from pytorchtricks.tune.measuring import (
    CandidateResult,
    Measured,
    Progress,
    Status,
    TuneResult,
    facts_of,
    measure_variants,
    plan_blocks,
    time_left_s,
)
from pytorchtricks.tune.runner import Runner, stage_batches
from pytorchtricks.tune.workload import Workload

PREDICT_SAMPLES = 8  # the estimate's probe step runs on this many samples (at most the micro-batch)
PREDICT_MARGIN = 0.10  # run a configuration predicted up to (1 + |measured error| + this) x the budget
SPEED_SLACK = 0.10  # --goal memory without a budget: the smallest peak within 10% of the best speed
MAX_CONFIGS = 40  # configurations predicted (subsets of the memory candidates, at most MAX_TRICKS each)
MAX_TRICKS = 3
CHECK_SAMPLES = 16  # candidates are checked on this many samples; the recommendation on the whole batch


@dataclass
class MemoryPoint:
    """One configuration of the memory search: predicted and measured peak, speed, and what happened to it."""

    tricks: tuple[str, ...]
    predicted_bytes: int | None = None
    peak_bytes: int | None = None
    peak_method: str | None = None
    reserved_bytes: int | None = None
    measured: Measured | None = None
    status: str = "predicted"  # "measured", "not run", "out of memory", "failed"
    reason: str = ""
    fits: bool | None = None
    front: bool = False  # on the Pareto front of the measured points (none both faster and lower)
    detail: str = (
        ""  # what its hooks planned on this workload (e.g. a checkpoint plan: regions, planned peaks)
    )
    caveat: str = ""  # why its update is not the whole batch's (BatchNorm sees micro-batches), "" when it is

    @property
    def label(self) -> str:
        return " + ".join(self.tricks) or "baseline"


@dataclass
class MemorySearch:
    """What the search found (``TuneResult.memory``): the frontier's points, the estimate's error, the choice."""

    budget_bytes: int | None
    baseline_peak_bytes: int | None = None
    estimate_error: float | None = None  # predicted / measured - 1 on the baseline
    points: list[MemoryPoint] = field(default_factory=list)
    recommended: tuple[str, ...] = ()
    message: str = ""
    check: Check | None = None
    activation_budget_bytes: int | None = None


def parse_budget(text: str | int | None) -> tuple[int | None, float | None]:
    """``--memory-budget``: ``(bytes, None)`` for a size (``24GiB``, ``1.5G``, ``300MB``, bytes) or
    ``(None, fraction)`` for a share of the measured baseline peak (``50%``).

    Example:
        >>> parse_budget("1.5G"), parse_budget("50%"), parse_budget(None)
        ((1610612736, None), (None, 0.5), (None, None))
    """
    from pytorchtricks.shards.writer import parse_bytes

    if text is None:
        return None, None
    if isinstance(text, str) and text.strip().endswith("%"):
        try:
            share = float(text.strip()[:-1]) / 100
        except ValueError:
            share = -1.0
        if not 0 < share <= 10:
            raise PttError(f"--memory-budget {text!r}: a share of the baseline's peak is written like 50%.")
        return None, share
    try:
        n = parse_bytes(text)
    except PttError as exc:
        raise PttError(f"--memory-budget: {exc} (or a share of the baseline's peak: 50%)") from exc
    if n <= 0:
        raise PttError(f"--memory-budget must be a positive size, not {text!r}.")
    return n, None


AUTO_MAX_BATCH = 256  # --batch-size auto tries 8, 16, ... up to this


def auto_batch_size(w: Workload, budget_bytes: int) -> tuple[int, str]:
    """``--batch-size auto``: the fastest batch (samples/s) whose step fits ``budget_bytes``
    (``ptt.find_batch_size`` on the user's model and optimizer, random inputs of the workload's shape); returns
    the batch and the receipt's note with every candidate's prediction and speed."""
    from pytorchtricks.analysis.memory import find_batch_size

    r = Runner(w, (), loader=False)
    try:
        shape = tuple(w.input_shape)
        with warnings.catch_warnings(), filtered_stderr():
            warnings.simplefilter("ignore")
            got = find_batch_size(
                r.model, lambda n: torch.randn(n, *shape, device=w.device), r.optimizer,
                budget_bytes=budget_bytes, max_batch=AUTO_MAX_BATCH, device=w.device,
            )  # fmt: skip
    finally:
        r.close()
    rows = ", ".join(
        f"{row['batch_size']}: {row['predicted_bytes'] / 2**20:.0f} MiB"
        + (f" {row['samples_per_s']:.0f}/s" if row.get("samples_per_s") else "")
        for row in got.rows
    )
    return got.batch_size, (
        f"--batch-size auto: ptt.find_batch_size chose {got.batch_size} ({got.samples_per_s:.0f} samples/s), the "
        f"fastest batch whose step fits {_mib(budget_bytes)} (predicted peak, speed: {rows})"
    )


def _mib(n: int | None) -> str:
    if n is None:
        return "-"
    return f"{n / 2**10:.0f} KiB" if n < 2**20 else f"{n / 2**20:.0f} MiB"


# ----------------------------------------------------------------------------------------------- peaks


def step_peak(r: Runner, device: torch.device) -> tuple[int, str, int | None]:
    """(peak bytes, method, reserved bytes) of one steady step of ``r``: what stays allocated between steps plus the
    step's own peak above it. CUDA: ``max_memory_allocated`` after ``reset_peak_memory_stats`` (absolute)."""
    if device.type == "cuda":
        r.optimizer.zero_grad(set_to_none=True)
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        r.step()
        torch.cuda.synchronize(device)
        return (
            int(torch.cuda.max_memory_allocated(device)),
            "cuda_max_allocated",
            int(torch.cuda.max_memory_reserved(device)),
        )
    r.optimizer.zero_grad(set_to_none=True)  # the step's own first act, done before the meter starts: the
    resident = r.resident_bytes()  # previous step's gradients freed, as they are when the step's peak comes
    m = quiet_peak_memory(r.step, device)
    return resident + int(m.peak_bytes), m.method, None


def _is_oom(exc: BaseException) -> bool:
    text = str(exc).lower()  # CUDA: OutOfMemoryError; CPU: "DefaultCPUAllocator: can't allocate memory"
    return (
        isinstance(exc, torch.cuda.OutOfMemoryError)
        or "out of memory" in text
        or "can't allocate memory" in text
    )


def measure_peak(
    w: Workload, tricks: tuple[str, ...], batches: list[Any], notes: list[str] | None = None
) -> tuple[int | None, str | None, int | None, str]:
    """Peak of ``tricks`` on the staged batches after one warm step (optimizer state allocated, plans made);
    returns (peak, method, reserved, error) - an out-of-memory error is recorded, not raised. ``notes`` receives
    what the hooks said they did (a checkpoint plan)."""
    r = None
    try:
        r = Runner(w, tricks, batches=batches)
        if notes is not None:
            notes.extend(r.setup.notes)
        r.step()
        peak, method, reserved = step_peak(r, w.device)
        return peak, method, reserved, ""
    except (RuntimeError, MemoryError) as exc:
        if not _is_oom(exc) and not isinstance(exc, MemoryError):
            raise
        return None, None, None, f"out of memory: {str(exc).splitlines()[0][:160]}"
    finally:
        if r is not None:
            r.close()
        if w.device.type == "cuda":
            torch.cuda.empty_cache()


# ----------------------------------------------------------------------------------------------- predictions


def predict_peak(w: Workload, tricks: tuple[str, ...]) -> int | None:
    """``estimate_memory`` of the configuration on its own treated model: probe steps on a few samples, their
    batch-dependent part (activations, the saved input, the backward's transients) extrapolated to the
    micro-batch, plus the whole batch the step holds before it splits it. None on a detector (each configuration
    is measured).

    Two probes (``PREDICT_SAMPLES`` / 2 and ``PREDICT_SAMPLES`` samples) split that part into what grows with the
    samples and what does not: under autocast, the low-precision copies of the weights are made once per step
    whatever the batch, and one probe scaled by micro-batch / samples multiplied them (ResNet-18 at batch 64:
    mixed precision predicted 662 MiB over the untreated 564 MiB, so it was never run)."""
    from pytorchtricks.analysis.memory import estimate_memory

    if w.task == "detection":  # estimate_memory probes a model of one batch tensor; a detector takes lists
        return None
    r = Runner(w, tricks, loader=False)
    try:
        micro = -(-w.batch_size // r.micro_batches)
        sizes = sorted({max(1, min(micro, PREDICT_SAMPLES // 2)), max(1, min(micro, PREDICT_SAMPLES))})
        parts, est, x = [], None, None
        for n in sizes:
            x = r.prepare(w.example_batch(n)[0])
            quiet = (warnings.catch_warnings(), filtered_stderr())  # its probes start Kineto: USDT lines
            with r.autocast(), quiet[0], quiet[1]:
                warnings.simplefilter("ignore")
                est = estimate_memory(r.model, x, r.optimizer)
            parts.append(est.activation_bytes + est.input_bytes + est.backward_workspace_bytes)
        assert est is not None and x is not None
        if len(sizes) == 2:  # part(n) = fixed + per_sample * n, through both probes
            per_sample = max(0.0, (parts[1] - parts[0]) / (sizes[1] - sizes[0]))
            fixed = max(0.0, parts[1] - per_sample * sizes[1])
            batch_part = fixed + per_sample * micro
        else:  # the micro-batch itself was probed
            batch_part = parts[0] * micro / sizes[0]
        step = max(batch_part, est.optimizer_workspace_bytes)
        whole_input = x.element_size() * x[0].numel() * w.batch_size if r.micro_batches > 1 else 0
        static = est.param_bytes + est.buffer_bytes + est.grad_bytes + est.optimizer_state_bytes
        return int(static + step + whole_input)
    finally:
        r.close()


def configurations(names: list[str]) -> list[tuple[str, ...]]:
    """Every configuration of the memory candidates ``names``: at most one trick per group, at most
    ``MAX_TRICKS`` tricks, fewest tricks first (then the hooks' order); at most ``MAX_CONFIGS``."""
    out: list[tuple[str, ...]] = []
    order = {c.name: i for i, c in enumerate(all_candidates())}
    for k in range(1, min(MAX_TRICKS, len(names)) + 1):
        for combo in itertools.combinations(sorted(names, key=order.__getitem__), k):
            groups = [by_name(n).hook.group for n in combo if by_name(n).hook.group]
            if len(groups) == len(set(groups)):
                out.append(combo)
    return out[:MAX_CONFIGS]


def _covered(tricks: tuple[str, ...], maybe: list[MemoryPoint]) -> MemoryPoint | None:
    """The first of ``maybe`` (configurations that may fit) that is a proper subset of ``tricks`` where what
    ``tricks`` adds to them saves memory only (None: no such subset, or the extra tricks gain speed too)."""
    subsets = [q for q in maybe if set(q.tricks) < set(tricks)]
    extra_speed = all("speed" in by_name(t).gains for q in subsets for t in set(tricks) - set(q.tricks))
    return None if not subsets or extra_speed else subsets[0]


def _to_measure(points: list[MemoryPoint], budget: int | None) -> list[MemoryPoint]:
    """Which predicted points to measure: with a budget, those that may fit and have no proper subset that may
    fit - unless the extra tricks gain speed too (a fused optimizer on top); without one, all (fewest first)."""
    maybe = [p for p in points if p.status == "predicted"]
    if budget is None or any(p.predicted_bytes is None for p in maybe):
        return maybe  # no predictions (a detector): every one may fit, ``_measure`` skips what a measured fit covers
    picked: list[MemoryPoint] = []
    for p in maybe:
        covered = _covered(p.tricks, picked)
        if covered is None:
            picked.append(p)
        else:
            p.status = "not run"
            p.reason = f"{covered.label} may fit already: what this adds to it saves memory, not time"
    return picked


# ----------------------------------------------------------------------------------------------- the search


def _candidates(w: Workload, res: TuneResult, facts: Any, prog: Progress) -> list[str]:
    """The memory candidates that apply and pass their check alone; every hook gets a row in the receipt."""
    rows: list[CandidateResult] = []
    ok: list[str] = []
    cands = all_candidates()
    prog.phase("check memory candidates", len(cands))
    for c in cands:
        reason = why_not(c, facts)
        if reason is None and "memory" not in c.gains:
            reason = "a speed trick: the memory search tries the tricks that lower the step's peak"
        if reason is None and c.scope == "step":
            reason = "a loader setting: the memory search measures the compute step (batches staged)"
        if reason is not None:
            rows.append(CandidateResult(c.name, Status.SKIPPED, reason, c.exact))
            prog.advance()
            continue
        try:
            chk = check(w, (c.name,), samples=CHECK_SAMPLES)
        except TuneSkip as exc:
            rows.append(CandidateResult(c.name, Status.SKIPPED, str(exc), c.exact))
            prog.advance()
            continue
        if chk.passed:
            rows.append(CandidateResult(c.name, Status.MEASURING, "", c.exact, check=chk))
            ok.append(c.name)
        else:
            rows.append(
                CandidateResult(
                    c.name, Status.FAILED, f"correctness check failed: {chk.detail}", c.exact, check=chk
                )
            )
        prog.advance()
    res.candidates = rows
    return ok


def run_memory_search(
    w: Workload,
    res: TuneResult,
    dl: Deadline,
    goal: str,
    budget_bytes: int | None,
    budget_share: float | None,
    prog: Progress,
) -> None:
    """The memory phases of ``run_tune`` (after the diagnosis); fills ``res.memory``, candidates, recommendation."""
    diag = res.diagnosis
    assert diag is not None
    batches = stage_batches(w)
    search = MemorySearch(budget_bytes)
    res.memory = search
    prog.phase("baseline peak and the estimate's error", None)
    base_peak, method, reserved, err = measure_peak(w, (), batches)
    if base_peak is None:
        raise PttError(f"the untreated step does not run here ({err}); lower --batch-size.")
    if budget_share is not None:
        search.budget_bytes = int(base_peak * budget_share)
    budget = search.budget_bytes
    search.baseline_peak_bytes = base_peak
    base = MemoryPoint(
        (), peak_bytes=base_peak, peak_method=method, reserved_bytes=reserved, status="measured"
    )
    search.activation_budget_bytes = None if budget is None else activation_budget(w, budget)
    w.run.activation_budget_bytes = search.activation_budget_bytes  # what every configuration's hooks plan to
    facts = facts_of(
        w, diag, time_left_s(dl), goal="memory" if goal == "speed" else goal, memory_budget_bytes=budget
    )
    names = _candidates(w, res, facts, prog)
    base.predicted_bytes = predict_peak(w, ())
    search.estimate_error = (
        base.predicted_bytes / base_peak - 1 if base_peak and base.predicted_bytes is not None else None
    )
    base.fits = budget is None or base_peak <= budget
    search.points.append(base)
    if budget is not None and base.fits:
        search.message = (
            f"the untreated step already fits: measured peak {_mib(base_peak)} <= budget {_mib(budget)}; keep the "
            "current setup (ptt tune without --memory-budget looks for speed)"
        )
        res.notes.append(search.message)
    configs = [] if (budget is not None and base.fits) else configurations(names)
    prog.phase(f"predict {len(configs)} configurations (estimate_memory)", len(configs))
    tol = 1 + abs(search.estimate_error or 0.0) + PREDICT_MARGIN
    may_fit: list[MemoryPoint] = []  # predicted within the budget (x tol): fewer tricks come first
    for combo in configs:
        p = MemoryPoint(combo)
        covered = _covered(combo, may_fit) if budget is not None else None
        if covered is not None:  # not measured whatever its prediction (``_to_measure``): its plans cost time
            p.status = "not run"
            p.reason = f"{covered.label} may fit already: what this adds to it saves memory, not time"
            search.points.append(p)
            prog.advance()
            continue
        try:
            p.predicted_bytes = predict_peak(w, combo)
        except TuneSkip as exc:  # e.g. a checkpoint plan with nothing to recompute at this micro-batch
            p.status, p.reason = "not run", f"the same as without it: {exc}"
        except Exception as exc:  # a combination that cannot be built (two rewrites that conflict)
            p.status, p.reason = "failed", f"{type(exc).__name__}: {str(exc)[:160]}"
        if p.predicted_bytes is not None and budget is not None and p.predicted_bytes > tol * budget:
            p.status = "not run"
            p.reason = (
                f"predicted {_mib(p.predicted_bytes)} > budget {_mib(budget)} x {tol:.2f} (the estimate's "
                f"error on the baseline {search.estimate_error:+.0%} + {PREDICT_MARGIN:.0%})"
            )
        if p.status == "predicted" and p.predicted_bytes is not None:
            may_fit.append(p)
        search.points.append(p)
        prog.advance()
    _measure(w, res, search, batches, dl, prog)
    for p in frontier(search.points):
        p.front = True
    for p in search.points:
        if p.status == "predicted":  # left over: the measuring stopped first
            p.status, p.reason = "not run", p.reason or "no time left to measure it (raise --time-budget)"
    _choose(w, res, search, goal, dl)


def activation_budget(w: Workload, budget: int) -> int:
    """What the activations of one micro-batch may take in a step whose peak must fit ``budget``: the budget less
    what the step holds beside them at any moment of it. That is the parameters, buffers, gradients and optimizer
    state (``_static_bytes``) and the float input batch the step makes of a staged one, alive until the step ends
    (the whole batch's, split into micro-batches by views). A checkpoint planner measures its activation peak with
    the gradients already allocated and the input already there, so a plan within this budget gives a step within
    ``budget``: at most every gradient, all of the input and the activation peak are held at one time."""
    return max(1, budget - _static_bytes(w) - _input_bytes(w))


def _static_bytes(w: Workload) -> int:
    """Bytes a step holds whatever its batch: parameters, buffers, gradients and the optimizer state (measured on
    the untreated configuration after one step)."""
    r = Runner(w, (), loader=False)
    try:
        x, y = stage_batches(w, 1)[0] if w.task == "detection" else w.example_batch(min(2, w.batch_size))
        r.on_batch(x, y)  # allocates the optimizer state; the gradients are still held
        return r.resident_bytes()
    finally:
        r.close()


def _input_bytes(w: Workload) -> int:
    """Bytes of the float input batch a classification step makes of its staged batch (``Runner.prepare``); 0 for a
    detector (its checkpoint plan is the lowest peak of its whole step, which holds its images)."""
    if w.task == "detection":
        return 0
    r = Runner(w, (), loader=False)
    try:
        x = r.prepare(w.example_batch(1)[0])
        return x.element_size() * x[0].numel() * w.batch_size
    finally:
        r.close()


def _measure(
    w: Workload, res: TuneResult, search: MemorySearch, batches: list[Any], dl: Deadline, prog: Progress
) -> None:
    """Peaks of the configurations that may fit, then their speed in one interleaved run with the baseline."""
    budget = search.budget_bytes
    todo = _to_measure(search.points[1:], budget)
    base_step = res.diagnosis.compute_alone_s or res.diagnosis.step_s  # type: ignore[union-attr]
    prog.phase(f"measure the peak of {len(todo)} configurations", len(todo))
    timed: list[MemoryPoint] = []
    for p in todo:
        fit = [q for q in timed if q.fits and set(q.tricks) < set(p.tricks)]
        if (
            budget is not None
            and fit
            and not all("speed" in by_name(t).gains for t in set(p.tricks) - set(fit[0].tricks))
        ):  # measured to fit already (without predictions - a detector - this is only known now)
            p.status, p.reason = (
                "not run",
                f"{fit[0].label} fits: what this adds to it saves memory, not time",
            )
            prog.advance()
            continue
        # a peak costs ~2 steps (a warm one, the metered one); keep the speed run of what is measured + this one
        after = {"baseline": base_step} | {q.label: 1.3 * base_step for q in [*timed, p]}
        keep = time_left_s(dl) - 2.6 * base_step - _final_check_s(base_step)
        if plan_blocks(after, set(), keep, memory=False) is None:
            p.status, p.reason = (
                "not run",
                f"no time left for its peak and speed ({time_left_s(dl):.0f} s left; raise --time-budget)",
            )
            prog.advance()
            continue
        said: list[str] = []
        p.peak_bytes, p.peak_method, p.reserved_bytes, err = measure_peak(w, p.tricks, batches, said)
        p.detail = "; ".join(said)
        p.caveat = _caveat(res, p.tricks)
        if err:
            p.status, p.reason, p.fits = "out of memory", err, False
        else:
            p.fits = budget is None or (p.peak_bytes or 0) <= budget
            p.status = "measured"
            timed.append(p)
        prog.advance()
    # the speed run: the baseline and every configuration measured, fitting ones first if time is short
    timed.sort(key=lambda p: (not p.fits, len(p.tricks)))
    share = max(0.0, time_left_s(dl) - 4 * base_step - _final_check_s(base_step))
    steps = {"baseline": base_step} | {p.label: base_step * (1.3 if len(p.tricks) else 1) for p in timed}
    while timed and plan_blocks(steps, set(), share, memory=False) is None:
        dropped = timed.pop()
        steps.pop(dropped.label)
        dropped.reason = f"peak measured; speed not measured: {share:.0f} s were left for the speed run (raise --time-budget)"
    if not timed:
        return
    prog.phase(f"measure the speed of {len(timed)} configurations (interleaved)", None)
    meas = speed_run(w, {p.label: p.tricks for p in timed}, batches, base_step, share)
    search.points[0].measured = meas["baseline"]
    for p in timed:
        p.measured = meas[p.label]


def speed_run(
    w: Workload, configs: dict[str, tuple[str, ...]], batches: list[Any], base_step_s: float, budget_s: float
) -> dict[str, Measured]:
    """The speed of ``configs`` and the baseline, interleaved, on the staged batches (the compute step): the one
    measurement both the search and ``apply.py --check`` make, with the same block plan (a configuration's step
    expected at 1.3x the baseline's)."""
    steps = {"baseline": base_step_s} | {k: base_step_s * (1.3 if t else 1) for k, t in configs.items()}
    variants = {"baseline": ()} | configs
    meas, _ = measure_variants(w, variants, step_s=steps, budget_s=budget_s, memory=False, batches=batches)
    return meas


def _final_check_s(step_s: float) -> float:
    """Seconds the recommendation's check on the whole batch takes: two float64 steps (~4x an fp32 step each on a
    CPU), two fp32 steps for BatchNorm's train-mode difference, plus building the runners."""
    return 10 * step_s + 2.0


def _choose(w: Workload, res: TuneResult, search: MemorySearch, goal: str, dl: Deadline) -> None:
    budget = search.budget_bytes
    done = [p for p in search.points if p.measured is not None]
    fitting = [p for p in done if p.tricks and p.fits]
    reached = [p for p in search.points if p.peak_bytes is not None]
    if budget is not None and search.points[0].fits:
        return
    if not fitting:
        low = min(reached, key=lambda p: p.peak_bytes or 0, default=None)
        if budget is not None:
            search.message = (
                f"no configuration fits the budget of {_mib(budget)}: the smallest peak reached is "
                f"{_mib(low.peak_bytes if low else None)} by {low.label if low else '-'} (baseline "
                f"{_mib(search.baseline_peak_bytes)}); raise --memory-budget, or lower --batch-size"
            )
        else:
            search.message = "no memory trick measured lower than the baseline"
        res.notes.append(search.message)
        return
    exact = [p for p in fitting if not p.caveat]
    if exact and len(exact) < len(
        fitting
    ):  # the update of the whole batch first: a caveat only when nothing else fits
        res.notes.append(
            "configurations whose update differs from the whole batch's ("
            + "; ".join(sorted({p.caveat for p in fitting if p.caveat}))
            + ") stay on the frontier; recommended among those whose update equals the whole batch's"
        )
        fitting = exact
    if budget is not None:
        best = max(fitting, key=lambda p: p.measured.ratio)  # type: ignore[union-attr]
        ties = [p for p in fitting if p.measured.ratio_q3 >= best.measured.ratio_q1]  # type: ignore[union-attr]
        # a tie goes to the fewest tricks, then to the hooks' order: noise cannot make two runs differ, and of two
        # micro-batch splits the smaller one wins (larger micro-batches: BatchNorm statistics nearer the batch's)
        order = {c.name: i for i, c in enumerate(all_candidates())}
        pick = min(ties, key=lambda p: (len(p.tricks), sorted(order[t] for t in p.tricks)))
    else:
        fastest = max(p.measured.ratio for p in done)  # type: ignore[union-attr]
        near = [p for p in fitting if p.measured.ratio >= (1 - SPEED_SLACK) * fastest]  # type: ignore[union-attr]
        lower = [p for p in near if (p.peak_bytes or 0) < (search.baseline_peak_bytes or 0)]
        if not lower:
            search.message = f"no configuration within {SPEED_SLACK:.0%} of the best speed has a lower peak"
            res.notes.append(search.message)
            return
        pick = min(lower, key=lambda p: (p.peak_bytes or 0, len(p.tricks), p.label))
    samples = w.batch_size if time_left_s(dl) > _final_check_s(pick.measured.median_s) else CHECK_SAMPLES  # type: ignore[union-attr]
    try:
        search.check = check(w, pick.tricks, samples=samples)
    except TuneSkip as exc:
        search.check = Check("error", False, str(exc), {})
    if not search.check.passed:
        search.message = f"{pick.label} failed its check on the whole batch: {search.check.detail}"
        res.notes.append(search.message)
        return
    search.recommended = pick.tricks
    res.recommended = pick.tricks
    res.combined = pick.measured
    res.combined_check = search.check
    res.baseline = search.points[0].measured
    for c in res.candidates:
        if c.status is Status.MEASURING:
            c.status, c.reason = (
                (Status.KEPT, "part of the recommended configuration") if c.name in pick.tricks
                else (Status.REJECTED, "not in the fastest configuration that fits")
            )  # fmt: skip
    m = pick.measured
    assert m is not None
    search.message = (
        f"{pick.label}: measured peak {_mib(pick.peak_bytes)} (budget {_mib(budget)}, baseline "
        f"{_mib(search.baseline_peak_bytes)}) at {m.ratio:.2f}x the baseline's speed (IQR {m.ratio_q1:.2f}-"
        f"{m.ratio_q3:.2f})"
    )


def _caveat(res: TuneResult, tricks: tuple[str, ...]) -> str:
    """Why the update of ``tricks`` is not the whole batch's, from their candidates' checks: BatchNorm in train
    mode normalising each micro-batch by its own statistics (measured in fp32 beyond the exactness bound)."""
    from pytorchtricks.tune.candidates import UPDATE_REL_TOL

    for c in res.candidates:
        metrics = (c.check.metrics or {}) if c.check is not None else {}
        diff = metrics.get("update_rel_bn_train")
        if c.name in tricks and diff is not None and diff > UPDATE_REL_TOL:
            return (
                f"{c.name}: BatchNorm sees micro-batches, update differs by {diff:.1e} of its largest entry"
            )
        diff = metrics.get("update_rel_detection")
        if c.name in tricks and diff is not None and diff > UPDATE_REL_TOL:
            return (
                f"{c.name}: the detector samples, normalises its losses and pads per micro-batch, update differs "
                f"by {diff:.1e} of its largest entry"
            )
    return ""


def frontier(points: list[MemoryPoint]) -> list[MemoryPoint]:
    """The Pareto front of the measured points: none both faster and lower in peak (ascending peak)."""
    done = sorted(
        (p for p in points if p.measured is not None and p.peak_bytes is not None),
        key=lambda p: (p.peak_bytes, -p.measured.items_per_s),  # type: ignore[union-attr]
    )
    front: list[MemoryPoint] = []
    best = -math.inf
    for p in done:
        if p.measured.items_per_s > best:  # type: ignore[union-attr]
            front.append(p)
            best = p.measured.items_per_s  # type: ignore[union-attr]
    return front
