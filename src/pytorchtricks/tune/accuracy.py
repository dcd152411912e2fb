"""Learns the same? ``ptt tune --accuracy-steps N``: train the baseline and the recommended pipeline from one
initialisation, a few seeds each, and say whether the recommended loss trajectory stays inside the baseline's
seed-to-seed band.

The runs: every run is a ``Runner`` of the workload (tune's own configuration of the user's step, loader included),
built from the workload's one initial state (``model_factory`` copies the same weights on every call), and trained
``steps`` steps; the loss each step returns is recorded. Seed ``s`` (``0 .. seeds-1``) drives the data order and the
augmentation of both pipelines (the loaders' generators, the per-sample RNG); the initial weights never change.

The rule, from what the numbers are (``judge``; every figure it uses is in the receipt):

1. Smooth: a step's loss depends on which samples its batch holds; each trajectory is a trailing mean over
   ``W = clip(steps // 10, 1, 10)`` steps (10% of the run follows the trend and averages the batch noise).
2. Band: at each step the baseline's [min, max] over its seeds. With K seeds that range underestimates the spread:
   a further baseline seed lands outside the range of K others with probability 2 / (K + 1) at each step (its rank
   among K + 1 exchangeable runs is uniform) - one in two for K = 3. So the band is widened on each side by
   ``WIDEN`` times its width, the width pooled over the centred window of 2W + 1 steps (one step's range of 3 runs
   is itself a noisy figure), and by at least ``FLOOR`` of the band's level (where the seeds change nothing - one
   batch, no augmentation - the band has no width, and float rounding must not read as a difference).
3. Verdict: the recommended trajectory is its seeds' mean (smoothed). It is *inside* when it lies in the widened
   band at ``MIN_SHARE`` of the steps or more and at the last step (the mean of the final window): a pipeline that
   drifts away at the end has not learned the same, however long it agreed. A loss that is not finite is outside.

Calibration (``tests/tune/test_accuracy_check.py`` simulates it and holds the rule to it): with 3 seeds and 50
steps, a recommended pipeline drawn from the same distribution as the baseline (independent seeds: the worst case;
tune pairs the seeds, which keeps an exact trick on the baseline's own trajectory) is judged inside in >= 90% of
simulated checks, and one whose loss sits one per-step seed-to-seed standard deviation away in <= 10%. With 2
seeds the same pipeline would fail about as often as it passes: fewer than ``MIN_SEEDS`` are refused.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import torch

from pytorchtricks.core import Option, PttError, Spelt
from pytorchtricks.tune.hooks import by_name
from pytorchtricks.tune.measuring import Progress
from pytorchtricks.tune.runner import Runner
from pytorchtricks.tune.workload import Workload

WIDEN = 1.0  # the band is widened on each side by its own (pooled) width: [min - w, max + w]
FLOOR = 0.01  # ... and by at least 1% of its level (a band of no width: the seeds changed nothing)
MIN_SHARE = 0.9  # the recommended mean inside at >= 90% of the steps, and at the last one
MAX_WINDOW = 10  # the smoothing window: steps // 10, between 1 and 10 steps
MIN_SEEDS = 3
MIN_STEPS = 2
PHASE = "accuracy check"  # the phase name in the receipt's seconds (``TuneResult.phase_s``)

INSIDE, OUTSIDE, NOT_COMPARED = "inside", "outside", "not compared"


@dataclasses.dataclass
class AccuracyCheck:
    """The parity check's record, as the receipt stores it: the answer, the rule's settings and every figure.

    ``baseline_losses`` / ``recommended_losses``: per seed, the loss of every step (raw). ``band_min`` /
    ``band_max``: the baseline's smoothed per-step min and max over its seeds; ``lower`` / ``upper``: the band
    widened by the rule; ``recommended_mean``: the recommended runs' smoothed seed mean. ``answer`` is ``inside``,
    ``outside`` or ``not compared`` (``reason`` says why, in one sentence).
    """

    answer: str
    reason: str
    steps: int
    seeds: int
    recommended: list[str] = dataclasses.field(default_factory=list)
    window: int = 1
    widen: float = WIDEN
    floor: float = FLOOR
    min_share: float = MIN_SHARE
    share_inside: float | None = None
    final_inside: bool | None = None
    baseline_losses: list[list[float]] = dataclasses.field(default_factory=list)
    recommended_losses: list[list[float]] = dataclasses.field(default_factory=list)
    band_min: list[float] = dataclasses.field(default_factory=list)
    band_max: list[float] = dataclasses.field(default_factory=list)
    lower: list[float] = dataclasses.field(default_factory=list)
    upper: list[float] = dataclasses.field(default_factory=list)
    recommended_mean: list[float] = dataclasses.field(default_factory=list)
    approximate: list[str] = dataclasses.field(default_factory=list)  # the recommended tricks not exact
    micro_batches: int = 1  # > 1: a recommended step's loss is that of its last micro-batch

    @property
    def rule(self) -> str:
        """The rule in one sentence, with this run's settings."""
        return (
            f"each loss trajectory smoothed by a trailing mean over {self.window} step(s); the baseline's per-step "
            f"[min, max] over its {self.seeds} seeds widened on each side by {self.widen:g}x its width (pooled over "
            f"{2 * self.window + 1} steps) and by at least {self.floor:.0%} of its level; inside when the "
            f"recommended runs' seed mean lies in it at >= {self.min_share:.0%} of the steps and at the last one"
        )


def check_options(steps: int, seeds: int) -> None:
    """Refuse an ``accuracy_steps`` / ``accuracy_seeds`` pair the check cannot use, before anything runs."""
    if steps != 0 and steps < MIN_STEPS:
        raise PttError(
            Spelt(
                "{o} must be 0 (no check) or at least {n} steps: a trajectory of one step is the initial loss, "
                "the same for every pipeline on the same weights.",
                o=Option("accuracy_steps", steps),
                n=MIN_STEPS,
            )
        )
    if seeds < MIN_SEEDS:
        raise PttError(
            Spelt(
                "{o} gives no usable band: the range of {k} run(s) is too narrow an estimate of the seed-to-seed "
                "spread (an identical pipeline would often fall outside it); pass {fix} or more.",
                o=Option("accuracy_seeds", seeds),
                k=seeds,
                fix=Option("accuracy_seeds", MIN_SEEDS),
            )
        )


def nothing_to_compare(w: Workload, recommended: tuple[str, ...]) -> str | None:
    """Why the check cannot compare two pipelines on this run (None: it can)."""
    if w.for_ != "train":
        return "nothing trains in an inference tune (--for inference): there is no loss trajectory to compare"
    if w.device_step_s is not None:
        return (
            "the step is declared (--device-step-ms): no model trains on this machine, so there is no loss to "
            "compare"
        )
    if not recommended:
        return "tune recommends the baseline itself (no trick): there is nothing to compare it with"
    return None


def losses(
    w: Workload, tricks: tuple[str, ...], seed: int, steps: int, prog: Progress
) -> tuple[list[float], int]:
    """The loss of each of ``steps`` training steps of ``Runner(w, tricks, seed=seed)`` (its own loader, the
    workload's initial weights), and its micro-batches per step. A loss that turns non-finite ends the run there
    (``nan`` for the rest): a diverged run has nothing more to say."""
    runner = Runner(w, tricks, seed=seed)
    # the hooks may have drawn from the global RNG while the runner was built (an example batch): seeded again,
    # both pipelines' augmentations drawn in this process (and their workers' seeds) are the seed's own
    torch.manual_seed(seed)
    out: list[float] = []
    try:
        for _ in range(steps):
            if out and not math.isfinite(out[-1]):
                out.append(math.nan)
            else:
                loss = runner.step()
                out.append(
                    float(loss.detach().float())
                )  # host sync: once per step, the check needs each loss
            prog.advance()
        return out, runner.micro_batches
    finally:
        runner.close()


def run_check(
    w: Workload, recommended: tuple[str, ...], steps: int, seeds: int, prog: Progress | None = None
) -> AccuracyCheck:
    """Train ``steps`` steps of the baseline and of ``recommended`` for seeds ``0 .. seeds-1`` each, from the
    workload's one initial state, and judge the trajectories (``judge``). The global RNG is left as it was."""
    check_options(steps, seeds)
    prog = prog or Progress()
    why = nothing_to_compare(w, recommended)
    if why is not None:
        return AccuracyCheck(NOT_COMPARED, why, steps, seeds, list(recommended))
    prog.phase(
        f"learns the same? {steps} steps x {seeds} seeds, baseline and {' + '.join(recommended)}",
        2 * steps * seeds,
    )
    base: list[list[float]] = []
    rec: list[list[float]] = []
    micro = 1
    with torch.random.fork_rng(devices=[]):
        for seed in range(seeds):  # interleaved by seed: a run cut short still holds pairs
            base.append(losses(w, (), seed, steps, prog)[0])
            got, micro = losses(w, recommended, seed, steps, prog)
            rec.append(got)
    approx = [n for n in recommended if not by_name(n).exact]
    chk = judge(base, rec, tricks=recommended, approximate=approx, micro_batches=micro)
    if micro > 1:
        chk.reason += (
            f" (a recommended step's loss is that of its last of {micro} micro-batches: a noisier figure than the "
            "baseline's, which its seed mean and the smoothing average)"
        )
    return chk


def smooth(x: np.ndarray, window: int) -> np.ndarray:
    """Trailing mean over ``window`` steps along the last axis (the first steps: over the steps so far).

    Example:
        >>> smooth(np.array([1.0, 3.0, 5.0, 7.0]), 2).tolist()
        [1.0, 2.0, 4.0, 6.0]
    """
    c = np.cumsum(x, axis=-1)
    out = c.copy()
    out[..., window:] = c[..., window:] - c[..., :-window]
    return out / np.minimum(np.arange(1, x.shape[-1] + 1), window)


def _pooled(width: np.ndarray, half: int) -> np.ndarray:
    """The mean of ``width`` over the centred window of ``2 * half + 1`` steps (cut at the ends)."""
    c = np.concatenate([[0.0], np.cumsum(width)])
    n = len(width)
    lo = np.clip(np.arange(n) - half, 0, n)
    hi = np.clip(np.arange(n) + half + 1, 0, n)
    return np.asarray((c[hi] - c[lo]) / (hi - lo))


def window_for(steps: int) -> int:
    """The smoothing window of a run of ``steps`` steps: a tenth of it, between 1 and ``MAX_WINDOW``."""
    return max(1, min(MAX_WINDOW, steps // 10))


def judge(
    baseline: list[list[float]],
    recommended: list[list[float]],
    *,
    tricks: tuple[str, ...] = (),
    approximate: list[str] | None = None,
    micro_batches: int = 1,
) -> AccuracyCheck:
    """Apply the rule (module docstring) to per-seed, per-step losses: ``baseline[seed][step]`` and
    ``recommended[seed][step]`` (the same number of steps).

    Example:
        >>> b = [[2.3, 2.0, 1.8, 1.7], [2.4, 2.1, 1.9, 1.7], [2.2, 2.0, 1.7, 1.6]]
        >>> judge(b, [[2.3, 2.0, 1.8, 1.7]] * 3).answer, judge(b, [[2.3, 2.6, 2.9, 3.2]] * 3).answer
        ('inside', 'outside')
    """
    b, r = np.asarray(baseline, dtype=float), np.asarray(recommended, dtype=float)
    k, steps = b.shape
    win = window_for(steps)
    out = AccuracyCheck(
        "", "", steps, k, list(tricks), window=win, approximate=list(approximate or []),
        baseline_losses=b.tolist(), recommended_losses=r.tolist(), micro_batches=micro_batches,
    )  # fmt: skip
    bad_b = _first_bad(b)
    if bad_b is not None:
        out.answer, out.reason = (
            NOT_COMPARED,
            (
                f"the baseline's own loss became non-finite at step {bad_b[1] + 1} (seed {bad_b[0]}): its band is "
                "undefined; lower the learning rate of your loop (--optimizer) or check the data"
            ),
        )
        return out
    sb = smooth(b, win)
    with np.errstate(invalid="ignore"):  # a diverged run: inf - inf in the running sums, read as not finite
        sr = smooth(np.where(np.isfinite(r), r, np.inf), win)
    lo, hi = sb.min(axis=0), sb.max(axis=0)
    margin = np.maximum(WIDEN * _pooled(hi - lo, win), FLOOR * np.abs((lo + hi) / 2))
    lower, upper, mean = lo - margin, hi + margin, sr.mean(axis=0)
    inside = (mean >= lower) & (mean <= upper)
    out.band_min, out.band_max = lo.tolist(), hi.tolist()
    out.lower, out.upper = lower.tolist(), upper.tolist()
    out.recommended_mean = [float(v) if math.isfinite(v) else math.inf for v in mean]
    out.share_inside, out.final_inside = float(inside.mean()), bool(inside[-1])
    bad_r = _first_bad(r)
    if bad_r is not None:
        out.answer, out.reason = (
            OUTSIDE,
            (
                f"the recommended pipeline's loss became non-finite at step {bad_r[1] + 1} (seed {bad_r[0]}) while "
                "the baseline's stayed finite: it diverged"
            ),
        )
        return out
    end = f"{mean[-1]:.4g} at the last step, band [{lower[-1]:.4g}, {upper[-1]:.4g}]"
    if out.share_inside >= MIN_SHARE and out.final_inside:
        out.answer = INSIDE
        out.reason = (
            f"the recommended loss (seed mean) stayed inside the baseline's widened band at "
            f"{out.share_inside:.0%} of the {steps} steps (>= {MIN_SHARE:.0%} needed) and at the end ({end})"
        )
        return out
    side = "above" if mean[-1] > upper[-1] else "below" if mean[-1] < lower[-1] else "inside"
    out.answer = OUTSIDE
    out.reason = (
        f"the recommended loss (seed mean) was inside the baseline's widened band at only {out.share_inside:.0%} "
        f"of the {steps} steps (>= {MIN_SHARE:.0%} needed), and {side} it at the end ({end})"
    )
    return out


def _first_bad(x: np.ndarray) -> tuple[int, int] | None:
    """(seed, step) of the first non-finite loss (by step, then seed), or None."""
    bad = np.argwhere(~np.isfinite(x))
    if not len(bad):
        return None
    seed, step = min(bad.tolist(), key=lambda sb: (sb[1], sb[0]))
    return int(seed), int(step)


def what_to_try(chk: AccuracyCheck) -> str:
    """After an ``outside``: which of the recommended tricks to leave out first."""
    if chk.approximate:
        return (
            f"try the recommendation without its approximate trick(s) {', '.join(chk.approximate)} (leave their "
            f"lines out of apply.py) and check again with --accuracy-steps {chk.steps}"
        )
    return (
        "every recommended trick is exact on one step, so the difference comes from what the runs see (a loader "
        "trick's sample order or augmentation) or from a bug: apply the tricks one at a time and check each with "
        f"--accuracy-steps {chk.steps}"
    )


def headline(chk: AccuracyCheck) -> str:
    """The check's answer in one line (the console's and the receipt's)."""
    if chk.answer == INSIDE:
        return f"learns the same: {chk.reason}"
    if chk.answer == OUTSIDE:
        return (
            f"LEARNS DIFFERENTLY: {chk.reason}. Do not take the recommendation as it is: {what_to_try(chk)}"
        )
    return f"learns the same? not compared: {chk.reason}"
