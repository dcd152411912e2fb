"""``tune``: diagnose a workload, A/B-measure every applicable trick, combine the winners, write the receipt.

Flow (each phase gets a share of the time budget, ``clock.Deadline``):
  1. diagnose - step-time split, findings (lint), memory, data-pipeline stages;
  2. candidates - skip what cannot help (with the reason), check correctness, then measure baseline and every
     candidate *interleaved* (paired per-round ratios, median and IQR): model tricks on the compute step with a
     few batches staged in memory (an input-bound loader's time and jitter would otherwise swamp a 1.3x compute
     gain and make the verdict flip between runs), loader settings on the whole step. Both baselines (compute
     step and whole step) and all candidates run in the *same* rounds: two baselines timed in separate runs
     drift apart on a shared machine (a compute step measured 12% slower than the whole step it is part of);
     in one run the part and the whole see the same machine, and their paired ratio is checked;
  3. combine - add the winners greedily, best first; each addition is re-measured against the combination without
     it and dropped when its gain vanished (median under 1 + ``MARGIN`` or first quartile under 1), or when the
     combination fails its correctness check (a conflict);
  4. verify - one last interleaved run of baseline, the combination and each single winner: the combined speedup
     in the receipt comes from this run, never from multiplying single ratios.

Decision rule (robust to run-to-run noise, so two runs recommend the same tricks): a trick wins when its check
passes and the first quartile of its paired speed ratio clears 1 + ``MARGIN``. An exact trick that fixes a
diagnosed problem (e.g. a conv bias before BN) is also kept when it is not measurably slower (third quartile of
the ratio >= 1 - ``MARGIN``): it is free and removes the problem. With ``goal="memory"`` a trick wins by lowering
the measured step peak by ``MEMORY_MARGIN``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from typing import Any

import torch

from pytorchtricks.analysis.verdict import machine_busy
from pytorchtricks.clock import Comparison, CpuMeter, CpuUse, Deadline, environment
from pytorchtricks.core import PttError, config_first, options_of
from pytorchtricks.quiet import import_cpp_extension_quietly
from pytorchtricks.shards.remote import is_url, scrub_url
from pytorchtricks.tunable import TuneSkip
from pytorchtricks.tune.accuracy import NOT_COMPARED, AccuracyCheck, check_options, headline, run_check
from pytorchtricks.tune.accuracy import PHASE as ACCURACY_PHASE
from pytorchtricks.tune.candidates import check, why_not
from pytorchtricks.tune.config import TuneConfig
from pytorchtricks.tune.diagnose import Diagnosis, diagnose, step_split
from pytorchtricks.tune.hooks import all_candidates, by_name, with_requirements
from pytorchtricks.tune.measuring import (
    DEFAULT_BUDGET_S,
    DROPPED_FOR_TIME,
    MARGIN,
    MEMORY_MARGIN,
    MIN_BLOCK_S,
    STEP_BASELINE,
    CandidateResult,
    Measured,
    Progress,
    Status,
    TuneResult,
    facts_of,
    measure_variants,
    paired_ratio,
    plan_blocks,
    time_left_s,
)
from pytorchtricks.tune.runner import Runner, prepare_all, prepare_key, stage_batches
from pytorchtricks.tune.workload import RunState, Workload, build_workload


def _payback(w: Workload, cr: CandidateResult, m: Measured, ref: Measured) -> str:
    """The one-time cost of a trick that builds something (pack, cache, sweep) and the epochs it takes to pay."""
    cost = sum(w.run.prepare_s.get(n, 0.0) for n in with_requirements((cr.name,)))
    if cost <= 0:
        return ""
    cr.prepare_s = cost
    if cost < 0.5:  # the build was found from an earlier run (an arena or a pack is reused by its key)
        return f"; its one-time build was reused from an earlier run ({cost:.1f} s now)"
    n = len(w.dataset)
    saved = n / ref.items_per_s - n / m.items_per_s  # seconds per epoch over the data tune saw
    if saved <= 0:
        return f"; one-time build {cost:.1f} s, no time saved per epoch"
    cr.break_even_epochs = cost / saved
    return (
        f"; one-time build {cost:.1f} s, saves {saved:.1f} s per epoch of these {n} images: pays back after "
        f"{cr.break_even_epochs:.1f} epoch(s) (the same ratio on the whole dataset: build time and savings "
        "both scale with its size)"
    )


def _wins(m: Measured, base: Measured, name: str, goal: str, exact: bool) -> tuple[bool, str]:
    speed_win = m.ratio_q1 > 1 + MARGIN
    mem_win = (
        m.peak_bytes is not None
        and base.peak_bytes is not None
        and m.peak_bytes < (1 - MEMORY_MARGIN) * base.peak_bytes
    )
    spread = f"{m.ratio:.2f}x (IQR {m.ratio_q1:.2f}-{m.ratio_q3:.2f})"
    if goal in ("speed", "both") and speed_win:
        return True, f"faster: {spread}"
    if (goal == "memory" or (goal == "both" and m.ratio_q3 >= 1 - MARGIN)) and mem_win:
        return True, f"step peak {m.peak_bytes / base.peak_bytes:.0%} of baseline"  # type: ignore[operator]
    if exact and by_name(name).hook.fixes and m.ratio_q3 >= 1 - MARGIN:
        return True, f"exact fix of a diagnosed problem; not measurably slower: {spread}"
    if goal == "memory":
        share = f"{m.peak_bytes / base.peak_bytes:.0%}" if m.peak_bytes and base.peak_bytes else "unmeasured"
        return False, f"step peak {share} of baseline: not {MEMORY_MARGIN:.0%} lower (speed {spread})"
    if m.ratio_q3 < 1 - MARGIN:
        return False, f"slower: {spread}"
    return False, f"gain not significant: {spread} does not clear {1 + MARGIN:.2f}"


def _priority(diag: Diagnosis) -> list[str]:
    """Candidate order: tricks that fix a diagnosed finding first, then (input-bound) the loader tricks, then
    the hooks' order."""
    ids = {f.id for f in diag.findings}
    cands = all_candidates()
    first = [c.name for c in cands if c.hook.fixes and c.hook.fixes in ids]
    if diag.loader_can_help:
        first += [c.name for c in cands if c.scope == "step" and c.name not in first]
    return first + [c.name for c in cands if c.name not in first]


def _phase_candidates(w: Workload, res: TuneResult, dl: Deadline, goal: str, prog: Progress) -> list[str]:
    diag = res.diagnosis
    assert diag is not None
    t = diag.step_s
    cands = all_candidates()
    rows, to_measure = _check_candidates(w, res, dl, goal, prog, cands)
    res.candidates = [rows[c.name] for c in cands]  # the receipt lists candidates in the hooks' order
    t_compute = compute_step_s(diag)
    est = {n: whole_step_estimate(rows[n], w, t_compute, t) for n in to_measure}
    mem = goal != "speed"  # the peak-memory step of every staged variant only when memory is a goal
    units = max(1, w.num_workers)  # steps per timed call of a whole-step variant (one per loader worker)
    share, kept, forced = measuring_share(
        to_measure,
        time_left_s(dl),
        lambda names, b: _one_run(names, t, t_compute, b, est, mem, units) is not None,
    )
    left_out = to_measure[kept:]
    to_measure = to_measure[:kept]
    for name in left_out:  # the numbers the plan was made on
        rows[name].status, rows[name].dropped_for_time = Status.SKIPPED, True
        rows[name].reason = (
            f"{DROPPED_FOR_TIME[1]}: {share:.0f} s of the budget were left for measuring, enough for "
            f"{len(to_measure)} candidate(s) in >= 3 interleaved rounds at {t:.2f} s per whole step "
            f"({t_compute:.2f} s per compute step) (raise --time-budget)"
        )
    if not to_measure:
        if any(r.dropped_for_time for r in rows.values()):
            res.notes.append(
                f"the time budget is too short for an interleaved A/B at {t:.2f} s per step: even its minimum "
                f"(3 rounds of baseline and one candidate) needs over twice the {time_left_s(dl):.0f} s left"
            )
        return []
    if forced:
        res.notes.append(
            f"the {share:.0f} s left fit no interleaved A/B of 3 full rounds at {t:.2f} s per step: "
            f"{to_measure[0]} was measured in the minimum run anyway (the run may end past its budget)"
        )
    run = _one_run(to_measure, t, t_compute, share, est, mem, units) or _minimum_run(
        to_measure, t, t_compute, est, units
    )
    (rounds, _, _), variants, whole, steps = run
    prog.phase(f"measure {len(to_measure)} candidates ({rounds} interleaved rounds)", rounds)
    staged = len(whole) < len(variants)
    batches = stage_batches(w) if staged else None
    with _metered(res, "measure"):
        got, cmp = measure_variants(
            w,
            variants,
            step_s=steps,
            budget_s=share,
            memory=staged and mem,
            on_round=lambda _r: prog.advance(),
            batches=batches,
            whole_step=whole,
        )
    if whole and staged:  # loader settings: paired against the whole-step baseline of the same rounds
        for name in whole:
            m = got[name]
            m.ratio_q1, m.ratio, m.ratio_q3 = paired_ratio(cmp, STEP_BASELINE, name)
        _check_part_and_whole(cmp, res)
    meas = _judge_measured(w, res, got, rows, goal, staged)
    res.phases_done.append("candidates")
    winners = [n for n in to_measure if rows[n].status is Status.KEPT]
    # best first: biggest measured speed ratio (ties by name, so the order is deterministic); a trick that
    # tunes what the others built (a loader sweep) comes after all of them
    ranked = sorted(winners, key=lambda n: (by_name(n).hook.last, -round(meas[n].ratio, 2), n))
    return _group_ties_first(ranked, meas)


def _check_candidates(
    w: Workload, res: TuneResult, dl: Deadline, goal: str, prog: Progress, cands: tuple[Any, ...]
) -> tuple[dict[str, CandidateResult], list[str]]:
    """Each candidate in priority order: why it does not apply, its one-time builds, its correctness check; the
    rows of all, and the names that passed (to measure). Checks get 30% of the time left."""
    diag = res.diagnosis
    assert diag is not None
    to_measure: list[str] = []
    rows: dict[str, CandidateResult] = {}
    prog.phase("check candidates", len(cands))
    checks_until = dl.elapsed_s + 0.3 * time_left_s(
        dl
    )  # correctness checks and one-time builds: 30% of what is left
    facts = facts_of(w, diag, time_left_s(dl), goal=goal)  # once: it reads the model and every file's size
    with _metered(res, "check candidates"):
        for name in _priority(diag):
            c = by_name(name)
            facts.budget_left_s = time_left_s(dl)
            reason = why_not(c, facts)
            dropped = reason is None and dl.elapsed_s > checks_until
            if dropped:
                reason = f"{DROPPED_FOR_TIME[0]}: the time budget was spent on higher-priority candidates (raise --time-budget)"
            if reason is not None:
                rows[name] = CandidateResult(
                    c.name, Status.SKIPPED, reason, c.exact, dropped_for_time=dropped
                )
            else:
                try:  # the one-time builds first: a cache that does not fit is a skip with its numbers
                    prepare_all(w, (c.name,))
                except TuneSkip as exc:
                    rows[name] = CandidateResult(c.name, Status.SKIPPED, str(exc), c.exact)
                    prog.advance()
                    continue
                try:
                    chk = check(w, (c.name,))
                except TuneSkip as exc:  # the hook found nothing to change on this model
                    rows[name] = CandidateResult(c.name, Status.SKIPPED, str(exc), c.exact)
                    prog.advance()
                    continue
                if chk.passed:
                    rows[name] = CandidateResult(c.name, Status.MEASURING, "", c.exact, check=chk)
                    to_measure.append(c.name)
                else:
                    rows[name] = CandidateResult(
                        c.name, Status.FAILED, f"correctness check failed: {chk.detail}", c.exact, check=chk
                    )
            prog.advance()
    return rows, to_measure


def _judge_measured(
    w: Workload,
    res: TuneResult,
    got: dict[str, Measured],
    rows: dict[str, CandidateResult],
    goal: str,
    staged: bool,
) -> dict[str, Measured]:
    """Each measured candidate against its baseline (the step's for a step-scope variant): kept or rejected, with
    why and its payback; the baselines into ``res``."""
    base = got.pop("baseline") if staged else got.pop(STEP_BASELINE)
    res.baseline = base
    res.step_baseline = got.pop(STEP_BASELINE, None) if staged else base
    meas: dict[str, Measured] = {}
    for name, m in got.items():
        cr = rows[name]
        cr.measured = meas[name] = m
        ref = res.step_baseline if m.scope == "step" else base
        assert ref is not None
        ok, why = _wins(m, ref, cr.name, goal, cr.exact)
        if m.scope == "compute":
            why += " on the compute step (batches staged in memory)"
        why += _payback(w, cr, m, ref)
        cr.status, cr.reason = (Status.KEPT, why) if ok else (Status.REJECTED, why)
    return meas


def measuring_share(names: list[str], left_s: float, fits: Any) -> tuple[float, int, bool]:
    """How much of the ``left_s`` seconds the candidates' run takes, and how many of ``names`` (in priority
    order) it measures: (seconds, how many, forced). ``fits(names, seconds)`` says whether a run fits.

    Half of what is left, keeping the other half to combine and verify the winners; the longest prefix of
    ``names`` that fits. When not even one fits in half, one candidate may take nearly all of it (nothing is left
    to combine, and its run is the receipt's figure); when even that is short, the top candidate is measured in
    the minimum run (``forced``) as long as that needs at most twice the time left - a run never stops at half
    its budget saying the budget was too short."""
    for share in (0.5 * left_s, 0.95 * left_s):
        n = len(names)
        while n and not fits(names[:n], share):
            n -= 1
        if n:
            return share, n, False
    if names and fits(names[:1], 2 * left_s):
        return 0.95 * left_s, 1, True
    return 0.95 * left_s, 0, False


def _minimum_run(
    names: list[str], t: float, t_compute: float, est: dict[str, float], units: int
) -> tuple[tuple[int, float, bool], dict[str, tuple[str, ...]], tuple[str, ...], dict[str, float]]:
    """The smallest interleaved run of ``names`` (3 rounds, the shortest blocks, no memory step): what a forced
    measurement runs when no plan fits the time left."""
    run = _one_run(names, t, t_compute, float("inf"), est, False, units)
    assert run is not None
    (_, _, _), variants, whole, steps = run
    return (3, MIN_BLOCK_S, False), variants, whole, steps


def _group_ties_first(ranked: list[str], meas: dict[str, Measured]) -> list[str]:
    """Within a group of exclusive tricks (e.g. the dataset: a RAM cache or a pack) the combination takes the
    first. When the best is not clearly better than another member (its first quartile not above their third:
    the spreads overlap), they tie, and the one of lower hook ``order`` goes first: noise then cannot make two runs
    pick different tricks."""
    out = list(ranked)
    for name in ranked:
        group = by_name(name).hook.group
        members = [n for n in out if group and by_name(n).hook.group == group]
        if not members or members[0] != name:
            continue
        ties = [n for n in members if meas[name].ratio_q1 <= meas[n].ratio_q3]
        pick = min(ties, key=lambda n: (by_name(n).hook.order, n))
        if pick != name:
            out.remove(pick)
            out.insert(out.index(name), pick)
    return out


def compute_step_s(diag: Diagnosis) -> float:
    """Seconds of a step without its loader (what the model tricks act on): the step with its batches staged in
    memory as the diagnosis measured it, else the step less its data wait (which still holds the cores the
    decoding workers took from the training threads)."""
    if diag.compute_alone_s:
        return max(diag.compute_alone_s, 1e-4)
    return max(diag.step_s - diag.split_s.get("data wait", 0.0), 0.05 * diag.step_s, 1e-4)


def _one_run(
    names: list[str],
    step_s: float,
    compute_s: float,
    budget_s: float,
    est_s: dict[str, float] | None = None,
    memory: bool = True,
    units: int = 1,
) -> tuple[tuple[int, float, bool], dict[str, tuple[str, ...]], tuple[str, ...], dict[str, float]] | None:
    """How to measure ``names`` in one interleaved run within ``budget_s``: model tricks on the compute step
    against ``baseline`` (batches staged), loader settings on the whole step against ``STEP_BASELINE``, all in
    the same rounds. ``est_s[name]``: the expected whole step of a loader setting (default: the baseline's).
    Returns (plan, variants, the whole-step variants, expected seconds per call of each), or None."""
    model = [n for n in names if by_name(n).scope != "step"]
    data = [n for n in names if by_name(n).scope == "step"]
    variants: dict[str, tuple[str, ...]] = {}
    if model:
        variants |= {"baseline": ()} | {n: (n,) for n in model}
    whole: tuple[str, ...] = (STEP_BASELINE, *data) if data else ()
    variants |= {n: (() if n == STEP_BASELINE else (n,)) for n in whole}
    est = est_s or {}
    steps = {
        n: compute_s if n not in whole else (step_s if n == STEP_BASELINE else est.get(n, step_s))
        for n in variants
    }
    plan = plan_blocks(steps, whole, budget_s, memory=memory and bool(model), whole_units=units)
    return None if plan is None else (plan, variants, whole, steps)


def whole_step_estimate(c: CandidateResult, w: Workload, compute_s: float, step_s: float) -> float:
    """A loader setting's whole step before it is timed, from its loader alone (timed by the data check) and
    the compute step: on a CPU both take the same cores, so their sum (+20%); on a GPU the loader overlaps the
    step, so the longer of the two (+20%). Never above the baseline's step."""
    per = c.check.metrics.get("loader_sample_s") if c.check is not None else None
    if per is None:
        return step_s
    loader_s = per * w.batch_size
    both = compute_s + loader_s if w.device.type == "cpu" else max(compute_s, loader_s)
    return min(step_s, 1.2 * both)


def _check_part_and_whole(cmp: Comparison, res: TuneResult) -> None:
    """The compute step is part of the whole step: in the same rounds it must not be slower. When it is (a
    machine too busy for stable timings), say so - the ratios are then less certain than their IQR suggests."""
    q1, med, q3 = paired_ratio(cmp, STEP_BASELINE, "baseline")  # > 1: the compute step is faster
    if q3 < 1.0:
        res.notes.append(
            f"in the same rounds the compute step alone ran {1 / med:.2f}x slower than the whole step it is part "
            f"of (IQR {q1:.2f}-{q3:.2f}): the machine's speed varied during the run (other processes?); rerun on "
            "a quieter machine to trust small ratios"
        )


PREPARE_ALLOWANCE_S = (
    10.0  # a one-time build met in the combination (a loader sweep: 6 s + its workers' starts)
)


def _verify_need_s(w: Workload, res: TuneResult, combo: tuple[str, ...]) -> float:
    """Seconds the verify run of ``combo`` needs: baseline and combination, 3 rounds of the shortest blocks, the
    check of the combination and the after-split (the cost model of ``plan_blocks``)."""
    units = max(1, w.num_workers)
    steps = {"baseline": _step_estimate(res, ()), "combined": _step_estimate(res, combo)}
    calls = [v * units for v in steps.values()]
    rounds = 3
    return sum(calls) + rounds * (1.5 * sum(calls) + len(calls) * MIN_BLOCK_S) + 6 * steps["combined"] + 3.0


def _needs_build(w: Workload, tricks: tuple[str, ...]) -> bool:
    """Whether a configuration needs a one-time build not made yet (a prepare under a key not yet built)."""
    done: tuple[str, ...] = ()
    for name in with_requirements(tricks):
        if by_name(name).hook.prepare is not None and prepare_key(name, done) not in w.run.prepared:
            return True
        done = (*done, name)
    return False


def _step_estimate(res: TuneResult, tricks: tuple[str, ...]) -> float:
    """Seconds of the whole step with ``tricks``, before it is timed: the fastest of its tricks as measured alone
    on the whole step (adding tricks seldom slows a step), else the baseline's."""
    assert res.diagnosis is not None
    alone = [
        c.measured.median_s
        for c in res.candidates
        if c.name in tricks and c.measured is not None and c.measured.scope == "step"
    ]
    return min([res.diagnosis.step_s, *alone])


def _to_try(current: tuple[str, ...], rest: list[str]) -> int:
    """How many of ``rest`` the combination will measure: not those it already holds (a requirement) nor those
    whose group a trick before them fills (the first of a group is assumed kept)."""
    groups = {by_name(n).hook.group for n in current}
    n = 0
    for name in rest:
        g = by_name(name).hook.group
        if name in with_requirements(current) or (g and g in groups):
            continue
        groups.add(g)
        n += 1
    return n


def _phase_combine(
    w: Workload, res: TuneResult, winners: list[str], dl: Deadline, goal: str, prog: Progress
) -> tuple[str, ...]:
    """Greedy: add winners best first; keep one only when the combination is still correct and still gains."""
    current: tuple[str, ...] = (winners[0],)
    prog.phase("combine winners greedily", len(winners) - 1)
    for i, name in enumerate(winners[1:]):
        step = _addition(w, res, current, name, winners[i + 2 :], dl, goal)
        res.combination.append(step)
        if step["kept"] and name not in with_requirements(current):
            current = (*current, name)
        prog.advance()
    res.phases_done.append("combine")
    return current


def _addition(
    w: Workload,
    res: TuneResult,
    current: tuple[str, ...],
    name: str,
    rest: list[str],
    dl: Deadline,
    goal: str,
) -> dict[str, Any]:
    """The combination's record of adding ``name`` to ``current`` (``kept``, ``reason``, the measured gain)."""
    said: dict[str, Any] = {"with": list(current), "add": name}
    group = by_name(name).hook.group
    taken = [n for n in current if group and by_name(n).hook.group == group]
    if name in with_requirements(current):  # e.g. make_loader, which the RAM cache already reads through
        return said | {"kept": True, "reason": f"already part of {' + '.join(current)} (a requirement)"}
    if taken:  # both replace the same thing (e.g. the dataset): the better one, already in, stays
        return said | {"kept": False, "reason": f"exclusive with {taken[0]}: both replace the {group}"}
    trial = (*current, name)
    # the verify run of the larger combination comes first; a one-time build this addition needs (e.g. the
    # loader sweep over the chosen dataset) is paid before its measurement
    build = PREPARE_ALLOWANCE_S if _needs_build(w, trial) else 0.0
    share = (time_left_s(dl) - _verify_need_s(w, res, trial) - build) / max(1, 1 + _to_try(trial, rest))
    pair = {"without": _step_estimate(res, current), "with": _step_estimate(res, trial)}
    if plan_blocks(pair, set(pair), share, memory=False, whole_units=max(1, w.num_workers)) is None:
        # no time to test the addition: it stays out (an untested addition can cost what the others won,
        # e.g. loader settings swept without the step beside them)
        reason = "not tried: no time left to test the addition and verify it (raise --time-budget)"
        return said | {"kept": False, "reason": reason}
    chk = check(w, trial)
    said |= {"check": chk.detail, "check_passed": chk.passed}
    if not chk.passed:
        return said | {"kept": False, "reason": f"conflict: the combination fails its check ({chk.detail})"}
    _, cmp = measure_variants(
        w, {"without": current, "with": trial}, step_s=pair, budget_s=share, memory=False
    )
    q1, med, q3 = paired_ratio(cmp, "without", "with")
    fix = bool(by_name(name).hook.fixes) and by_name(name).exact
    # a real gain on the whole step: the median clears the margin and the first quartile clears 1 (a trick on
    # the candidate bar whose gain the whole step dilutes is dropped in every run, not in some)
    keep = (q1 > 1.0 and med >= 1 + MARGIN) or (fix and q3 >= 1 - MARGIN) or goal == "memory"
    spread = f"{med:.2f}x (IQR {q1:.2f}-{q3:.2f})"
    return said | {
        "gain": med,
        "gain_q1": q1,
        "gain_q3": q3,
        "kept": keep,
        "reason": f"adds {spread} on top" if keep else f"gain vanished in the combination: {spread}",
    }


def _phase_verify(
    w: Workload, res: TuneResult, combo: tuple[str, ...], singles: list[str], dl: Deadline, prog: Progress
) -> None:
    """One interleaved run of baseline, the combination and its single tricks: the receipt's headline numbers."""
    diag = res.diagnosis
    assert diag is not None
    t = diag.step_s
    res.combined_check = check(w, combo) if len(combo) > 1 else None
    if res.combined_check is not None and not res.combined_check.passed:
        res.notes.append(
            f"the combination {' + '.join(combo)} failed its check; recommending the best single trick"
        )
        combo, singles = combo[:1], []
    variants: dict[str, tuple[str, ...]] = {"baseline": ()}
    if len(combo) > 1:
        variants["combined"] = combo
    for s in singles if len(combo) > 1 else combo:
        variants[s] = (s,)
    share = max(0.0, time_left_s(dl) - 4 * _step_estimate(res, combo))  # keep time for the after-split

    def plan() -> tuple[dict[str, float], tuple[int, float, bool] | None]:
        steps = {n: _step_estimate(res, v) for n, v in variants.items()}
        return steps, plan_blocks(steps, set(steps), share, whole_units=max(1, w.num_workers))

    while len(variants) > 2 and plan()[1] is None:
        variants.popitem()  # drop single tricks from the verify run (they were measured in the candidate run)
    steps, planned = plan()
    if planned is None:
        res.notes.append(
            "no time left to re-measure the combination; the receipt recommends the best single trick"
        )
        res.recommended = (combo[0],)
        res.combined = next((c.measured for c in res.candidates if c.name == combo[0]), None)
        return
    prog.phase(f"verify: baseline vs combined vs singles ({planned[0]} rounds)", planned[0])
    meas, cmp = measure_variants(
        w, variants, step_s=steps, budget_s=share, on_round=lambda _r: prog.advance()
    )
    res.final = list(meas.values())
    res.recommended = combo
    res.combined = meas["combined"] if len(combo) > 1 else meas[combo[0]]
    if (
        len(combo) > 1
    ):  # the combination must beat its best single trick in the same rounds, or the single wins
        best = max(
            (n for n in variants if n not in ("baseline", "combined")),
            key=lambda n: meas[n].ratio,
            default=None,
        )
        # the single wins only when the combination is clearly slower in the same rounds (third quartile of the
        # paired ratio below 1): on a tie, noise would otherwise pick the combination in one run, the single in
        # the next (the combine phase already kept each addition for a measured gain)
        if best is not None and paired_ratio(cmp, best, "combined")[2] < 1.0:
            res.notes.append(
                f"the combination was not faster than {best} alone in the verify run; recommending {best}"
            )
            res.recommended, res.combined = (best,), meas[best]
    res.phases_done.append("verify")
    if dl.remaining_s > 4 * t:
        runner = Runner(w, res.recommended)
        try:
            res.after_split_s, _ = step_split(runner, 2, warmup=1)
        finally:
            runner.close()


def run_tune(
    w: Workload,
    *,
    goal: str = "speed",
    time_budget_s: float | None = None,
    progress: Progress | None = None,
    deadline: Deadline | None = None,
    memory_budget: str | int | None = None,
    accuracy_steps: int = 0,
    accuracy_seeds: int = 3,
) -> TuneResult:
    """Diagnose ``w``, measure the applicable tricks, combine the winners; returns the evidence (not written).

    With ``memory_budget`` (``"24GiB"``, ``"1.5G"``, bytes, or ``"50%"`` of the baseline's measured peak) or
    ``goal="memory"`` it searches the catalogue's memory tricks instead (``tune.memory``): the fastest
    configuration whose measured step peak fits. KeyboardInterrupt stops the run and returns what was measured so
    far (``interrupted=True``). ``w`` is not changed: the run writes into a fresh ``RunState`` of its own.
    ``accuracy_steps`` > 0: then the parity check of the recommendation (``tune.accuracy``, ``res.accuracy``),
    in time of its own after the budget's.
    """
    from pytorchtricks.tune.memory import parse_budget, run_memory_search

    check_options(accuracy_steps, accuracy_seeds)

    if goal not in ("speed", "memory", "both"):
        raise PttError(f"--goal must be speed, memory or both, not {goal!r}.")
    budget_bytes, budget_share = parse_budget(memory_budget)
    memory_mode = budget_bytes is not None or budget_share is not None or goal == "memory"
    if memory_mode and w.for_ != "train":
        raise PttError(
            "--memory-budget / --goal memory search training configurations (accumulation, checkpointing, "
            "in-place layers); for inference memory see ptt optimize (int8, pruning)."
        )
    budget = DEFAULT_BUDGET_S if time_budget_s is None else float(time_budget_s)
    if budget <= 0:
        raise PttError(f"--time-budget must be positive seconds, not {budget}.")
    prog = progress or Progress()
    dl = deadline or Deadline(budget)
    # this run's builds, notes and staged batches: its own, never shared with another run on the same workload
    w = dataclasses.replace(w, run=RunState())
    import_cpp_extension_quietly()  # torch.utils.benchmark's import warns about CUDA_HOME on a driverless box
    res = TuneResult(workload=describe(w), env=environment(w.device), goal=goal, budget_s=budget)
    res.notes.extend(w.notes)
    inner = Deadline(max(1.0, dl.remaining_s - _self_check_reserve_s(budget)))  # the self-check runs after
    winners: list[str] = []
    try:
        with _seeded(0):
            prog.phase("diagnose", None)
            with _metered(res, "diagnose"):
                res.diagnosis = diagnose(w, budget_s=0.09 * time_left_s(inner))
            if res.diagnosis.busy:
                _remeasure_when_quiet(w, res, inner, prog)
            res.notes.extend(res.diagnosis.notes)
            res.phases_done.append("diagnose")
            if memory_mode:
                run_memory_search(w, res, inner, goal, budget_bytes, budget_share, prog)
                res.phases_done.append("memory")
            else:
                winners = _phase_candidates(w, res, inner, goal, prog)
                if winners:
                    combo: tuple[str, ...] = (winners[0],)
                    if len(winners) > 1:
                        with _metered(res, "combine"):
                            combo = _phase_combine(w, res, winners, inner, goal, prog)
                    singles = [n for n in winners if n in combo] if len(combo) > 1 else []
                    with _metered(res, "verify"):
                        _phase_verify(w, res, combo, singles, inner, prog)
        _self_check(w, res, dl, prog)
        if accuracy_steps:
            _accuracy_check(w, res, accuracy_steps, accuracy_seeds, prog)
    except KeyboardInterrupt:
        res.interrupted = True
        for c in res.candidates:
            if c.status is Status.MEASURING:
                c.status, c.reason = Status.SKIPPED, "interrupted (Ctrl-C) before it was measured"
        res.notes.append("interrupted (Ctrl-C): the receipt holds what was measured before that")
    finally:
        prog.done()
    _judge_reliability(res)
    if not memory_mode and not res.recommended and not res.interrupted:
        res.notes.append(no_recommendation(res))
    # what the one-time builds said while the run went on (an arena left in /dev/shm, a pack left on disk: where,
    # how big, how to remove it)
    res.notes.extend(n for n in dict.fromkeys(w.run.notes) if n not in res.notes)
    res.elapsed_s = dl.elapsed_s
    over = dl.elapsed_s - res.phase_s.get(ACCURACY_PHASE, 0.0) - budget  # the check's time is its own
    if over > 0:
        res.notes.append(f"ran {over:.0f} s over the {budget:.0f} s budget (a loaded machine?)")
    return res


def _accuracy_check(w: Workload, res: TuneResult, steps: int, seeds: int, prog: Progress) -> None:
    """The parity check of the recommendation (``tune.accuracy``): its record in ``res.accuracy``. An answer of
    ``outside`` leaves the recommendation in place, flagged where it is said (console, report.html, apply.py) with
    what to try."""
    if res.interrupted:
        return
    try:
        with _metered(res, ACCURACY_PHASE):
            res.accuracy = run_check(w, res.recommended, steps, seeds, prog)
    except KeyboardInterrupt:  # the receipt says the check did not finish (run_tune records the interrupt)
        why = "interrupted (Ctrl-C) before the check finished"
        res.accuracy = AccuracyCheck(NOT_COMPARED, why, steps, seeds, list(res.recommended))
        raise
    prog.log(headline(res.accuracy))


# ---------------------------------------------------------------------------------------------------------------
# a busy machine, figures that check themselves, where the seconds went

QUIET_WINDOW_S = 2.0  # one look at the machine's load while waiting for it to drop
MEASURING_PHASES = ("diagnose", "measure", "combine", "verify")  # phases whose timings decide something


@contextlib.contextmanager
def _metered(res: TuneResult, phase: str) -> Any:
    """Account a phase: its wall seconds (``res.phase_s``) and who used the CPU meanwhile (``res.cpu``, with
    ``busy``: ``analysis.verdict.machine_busy``)."""
    cm = CpuMeter()
    try:
        with cm:
            yield
    finally:
        if cm.result is not None:
            _record(res, phase, cm.result)


def _record(res: TuneResult, phase: str, use: CpuUse) -> None:
    res.phase_s[phase] = res.phase_s.get(phase, 0.0) + use.wall_s
    prev = res.cpu.get(phase)
    if prev is not None:  # a phase run twice (the diagnosis measured again): the figures of both, added
        use = CpuUse.added([CpuUse(**{k: prev[k] for k in _CPU_FIELDS}), use]) or use
    d = use.as_dict()
    # a phase shorter than one look at the load is too short to call busy (one burst of a neighbour would)
    d["busy"] = machine_busy(use, torch.get_num_threads()) if use.wall_s >= QUIET_WINDOW_S else None
    res.cpu[phase] = d


_CPU_FIELDS = (
    "wall_s", "cores", "machine_cores", "main_cpu_s", "workers_cpu_s", "others_cpu_s", "steal_s", "run_queue",
    "top_others", "workers",
)  # fmt: skip


def wait_for_quiet(max_s: float, threads: int, look: Any = None) -> tuple[bool, float]:
    """Watch the machine in ``QUIET_WINDOW_S`` windows for up to ``max_s``: (whether a window was quiet enough
    for the step's ``threads``, seconds waited). ``look()`` returns one window's ``CpuUse`` (tests inject it)."""
    import threading

    def window() -> CpuUse:
        with CpuMeter() as cm:
            threading.Event().wait(QUIET_WINDOW_S)
        assert cm.result is not None
        return cm.result

    look = look or window
    dl = Deadline(max_s)
    for _ in range(max(1, int(max_s // QUIET_WINDOW_S))):
        if machine_busy(look(), threads) is None:
            return True, dl.elapsed_s
    return False, dl.elapsed_s


def _remeasure_when_quiet(w: Workload, res: TuneResult, dl: Deadline, prog: Progress) -> None:
    """The diagnosis ran on a busy machine: wait (up to 15% of what is left) for the load to drop and measure it
    once more; when it does not drop, the run goes on with its figures marked unreliable."""
    diag = res.diagnosis
    assert diag is not None
    max_wait = min(60.0, 0.15 * time_left_s(dl))
    prog.phase(f"machine busy: waiting up to {max_wait:.0f} s for the load to drop", None)
    prog.log(f"the machine is busy: {diag.busy}")
    with _metered(res, "wait for a quiet machine"):
        quiet, waited = wait_for_quiet(max_wait, torch.get_num_threads())
    if not quiet:
        res.notes.append(
            f"the machine was busy during the diagnosis and stayed busy for the {waited:.0f} s tune waited: "
            f"{diag.busy}"
        )
        return
    prog.phase("diagnose again (the load dropped)", None)
    with _metered(res, "diagnose"):
        again = diagnose(w, budget_s=0.09 * time_left_s(dl))
    again.remeasured.insert(0, f"the machine was busy ({diag.busy}); measured again after {waited:.0f} s")
    res.diagnosis = again


SELF_CHECK_START_S = (
    8.0  # a fresh interpreter imports torch and torchvision and builds the model (seen: 4-6 s)
)


def _self_check_reserve_s(budget: float) -> float:
    """Seconds kept at the end of the budget for the self-check: its start plus a few of a fast step's seconds."""
    return min(20.0, max(SELF_CHECK_START_S + 4.0, 0.08 * budget))


def _self_check(w: Workload, res: TuneResult, dl: Deadline, prog: Progress) -> None:
    """The compute step alone in a fresh process beside tune's own figure (``tune.selfcheck``)."""
    from pytorchtricks.tune.selfcheck import compare_figures, request, run_fresh

    diag = res.diagnosis
    if diag is None or res.interrupted:
        return
    if w.device_step_s is not None:
        res.self_check = {
            "skipped": "the step is declared (--device-step-ms): there is no step of this machine's to check"
        }
        return
    builtin = str(res.workload.get("data", "")).startswith("built-in")
    req = request(res.workload, torch.get_num_threads(), data=None if builtin else w.source)
    if req is None:
        res.self_check = {
            "skipped": "the model is an object of the user's process: a fresh one cannot rebuild it"
        }
        return
    step = diag.compute_alone_s or diag.step_s
    # a fresh interpreter imports torch and builds the model (~5-10 s), then one warm-up and the timed steps
    steps = max(1, min(5, int(0.5 * _self_check_reserve_s(res.budget_s) / max(step, 1e-6))))
    need = SELF_CHECK_START_S + (2 + steps) * step + 0.5  # two warm-up steps, the timed ones (>= 0.5 s)
    if need > dl.remaining_s + _self_check_reserve_s(res.budget_s):
        res.self_check = {
            "skipped": f"a fresh process needs ~{need:.0f} s for a {step:.1f} s step, more than the "
            f"{max(0.0, dl.remaining_s):.0f} s left (raise --time-budget)"
        }
        return
    req["steps"] = steps
    prog.phase("self-check: the compute step in a fresh process", None)
    with _metered(res, "self-check"):
        fresh = run_fresh(req, timeout_s=max(90.0, 3 * need))
    res.self_check = compare_figures(diag.compute_alone_s, fresh)


def _judge_reliability(res: TuneResult) -> None:
    """Collect why the run's figures cannot be trusted: the diagnosis's own doubts, a busy machine in any phase
    that timed something, a self-check that disagrees with tune's figure."""
    out = list(res.diagnosis.unreliable) if res.diagnosis is not None else []
    for phase in MEASURING_PHASES:
        busy = (res.cpu.get(phase) or {}).get("busy")
        if busy and phase != "diagnose":  # the diagnosis's own figure is in its unreliable list already
            out.append(f"the machine was busy while tune measured ({phase}): {busy}")
    sc = res.self_check or {}
    if sc.get("agrees") is False:
        out.append(
            f"self-check: the compute step took {sc['min_s']:.3f} s in a fresh process and "
            f"{sc['tune_compute_alone_s']:.3f} s in tune's diagnosis ({sc['ratio']:.2f}x apart)"
        )
    res.unreliable = list(dict.fromkeys(out))


def no_recommendation(res: TuneResult) -> str:
    """What a run that recommends nothing says: a measured finding only when its figures are reliable."""
    if res.unreliable:
        return (
            "no recommendation: the measurements are unreliable (" + "; ".join(res.unreliable) + "). A trick "
            "that did not clear the margin here may still win: rerun `ptt tune` on a quiet machine"
        )
    return "no trick beat the baseline by the margin: keep the current setup"


@contextlib.contextmanager
def _seeded(seed: int) -> Any:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        yield


def describe(w: Workload) -> dict[str, Any]:
    try:
        load: float | None = round(os.getloadavg()[0], 2)
    except OSError:
        load = None
    return {
        "loadavg_1m_at_start": load,
        "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
        "model": w.model_spec,
        "data": w.data_desc,
        "batch_size": w.batch_size,
        "input_size": w.input_size,
        "input_shape": list(w.input_shape),  # one sample's C, H, W
        "num_workers": w.num_workers,  # the loader workers the user's loop already uses (the baseline's)
        "optimizer": list(
            w.optimizer
        ),  # the loop's optimizer and hyper-parameters (kept; only its kernels change)
        "for": w.for_,
        "device": str(w.device),
        "num_outputs": w.num_outputs,
        "task": w.task,
        "max_size": w.max_size,  # detection: the long side's cap of the model's resize
        # the data tune read (a folder, a pack, a detection root or COCO JSON; None: synthetic), no credentials
        "source": scrub_url(w.source) if w.source and is_url(w.source) else w.source,
        "split": w.split,  # the split of a detection root tune read (None: the root has one)
        # the accelerator's step, declared (--device-step-ms): the figures are a projection for it
        "device_step_ms": None if w.device_step_s is None else w.device_step_s * 1e3,
        "params": sum(p.numel() for p in w.model_factory().parameters()),
    }


@options_of(TuneConfig)
def tune_model(
    model: str | torch.nn.Module | TuneConfig | None = None,
    data: str | None = None,
    *,
    progress: Progress | None = None,
    **options: Any,
) -> TuneResult:
    """Tune a model on its data and (with ``out``) write the receipt: report.html, results.jsonl, apply.py.

    Takes a ``TuneConfig``, or its fields as keywords (``tune_model("torchvision:resnet18", "photos/",
    batch_size=64)``, a thin convenience over the config). Bad input raises ``PttError`` before anything is
    written; ``progress`` receives the phases as they run.
    """
    if isinstance(model, TuneConfig):  # config first: the config alone, or its fields as keywords
        cfg = config_first(model, TuneConfig, {**options, **({"data": data} if data is not None else {})})
    else:
        cfg = config_first(None, TuneConfig, {"model": model, "data": data, **options})
    return _tune(cfg, progress)


def _tune(cfg: TuneConfig, progress: Progress | None) -> TuneResult:
    model, data, batch_size, goal, for_, time_budget_s, out = (
        cfg.model, cfg.data, cfg.batch_size, cfg.goal, cfg.for_, cfg.time_budget_s, cfg.out,
    )  # fmt: skip
    memory_budget, script, device_step_ms, split = (
        cfg.memory_budget,
        cfg.script,
        cfg.device_step_ms,
        cfg.split,
    )
    from pytorchtricks.tune.memory import auto_batch_size, parse_budget

    budget_bytes, _ = parse_budget(memory_budget)  # a bad size is said before the workload is built
    check_options(cfg.accuracy_steps, cfg.accuracy_seeds)
    dl = Deadline(DEFAULT_BUDGET_S if time_budget_s is None else float(time_budget_s))
    auto_note = None
    if batch_size == "auto":
        if budget_bytes is None:
            raise PttError(
                "--batch-size auto picks the fastest batch that fits --memory-budget SIZE; give the budget in bytes "
                "(24GiB, 1.5G, 300MB) - a share of the baseline's peak needs a batch to measure it at."
            )
        if for_ != "train":
            raise PttError("--batch-size auto searches training steps; pass --batch-size N for inference.")
        probe = build_workload(config=dataclasses.replace(cfg, batch_size=None, for_="train"))
        batch_size, auto_note = auto_batch_size(probe, budget_bytes)
        cfg = dataclasses.replace(cfg, batch_size=batch_size)
    elif batch_size is not None and not isinstance(batch_size, int):
        raise PttError(f"--batch-size must be a positive integer or auto, not {batch_size!r}.")
    w = build_workload(config=cfg)  # the config whole: the workload reads its own fields
    if auto_note:
        w = dataclasses.replace(w, notes=(*w.notes, auto_note))
    res = run_tune(
        w, goal=goal, time_budget_s=time_budget_s, progress=progress, deadline=dl, memory_budget=memory_budget,
        accuracy_steps=cfg.accuracy_steps, accuracy_seeds=cfg.accuracy_seeds,
    )  # fmt: skip
    # how to build this workload again: `python apply.py --check` re-measures the recommendation on it
    res.workload["rebuild"] = {
        "model": model if not isinstance(model, torch.nn.Module) else None, "data": data, "batch_size": w.batch_size, "input_shape": list(w.input_shape),
        "model_object": isinstance(model, torch.nn.Module),  # a script's own model: nothing here rebuilds it
        "num_workers": w.num_workers, "for": w.for_, "device": str(w.device), "memory_budget": memory_budget,
        "optimizer": list(w.optimizer), "device_step_ms": device_step_ms, "task": w.task, "split": w.split or split,
    }  # fmt: skip
    if script is not None:
        res.workload["script"] = script
    if out is not None:
        from pytorchtricks.tune.receipt import write_receipt

        write_receipt(res, out)
    return res
