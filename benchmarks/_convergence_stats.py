"""The convergence benchmark's arithmetic, apart from torch and the clock so a test can check it on known inputs:
time to a target mAP along a run's checkpoints, and Welch's unequal-variance t-test (scipy is not a dependency:
the t distribution's tail is the regularised incomplete beta function, by Lentz's continued fraction)."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence


def time_to(points: Sequence[tuple[float, float]], target: float) -> float | None:
    """The training time at which a run's metric first reaches ``target``, linearly interpolated between the
    checkpoint before and the first at or above it; ``points`` are ``(time, metric)`` in time order, and the run
    starts at ``(0, 0)``. None: the run never reached it.

    Example:
        >>> time_to([(10.0, 0.2), (20.0, 0.4)], 0.3)
        15.0
    """
    prev_t, prev_m = 0.0, 0.0
    for t, m in points:
        if m >= target:
            if m == prev_m:
                return t
            return prev_t + (t - prev_t) * (target - prev_m) / (m - prev_m) if target > prev_m else prev_t
        prev_t, prev_m = t, m
    return None


def _betacf(a: float, b: float, x: float) -> float:
    """The continued fraction of the incomplete beta function (modified Lentz; Numerical Recipes' betacf)."""
    tiny, eps = 1e-300, 1e-15
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 500):
        m2 = 2 * m
        aa = m * (b - m) * x / ((qam + m2) * (a + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        h *= d * c
        aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < eps:
            break
    return h


def betainc(a: float, b: float, x: float) -> float:
    """The regularised incomplete beta function I_x(a, b)."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    lbeta = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b)
    front = math.exp(lbeta + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _betacf(a, b, x) / a
    return 1.0 - front * _betacf(b, a, 1.0 - x) / b


def welch(xs: Sequence[float], ys: Sequence[float]) -> dict[str, float]:
    """Welch's t-test of mean(xs) == mean(ys): t, its Welch-Satterthwaite degrees of freedom, the two-sided p,
    the difference of means and Cohen's d (pooled standard deviation). Needs >= 2 values on each side.

    Example:
        >>> r = welch([1.0, 2.0, 3.0], [1.0, 2.0, 3.0])
        >>> r["t"], r["p"]
        (0.0, 1.0)
    """
    if len(xs) < 2 or len(ys) < 2:
        raise ValueError("welch needs at least 2 values on each side (run >= 2 seeds).")
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    vx, vy = statistics.variance(xs), statistics.variance(ys)
    nx, ny = len(xs), len(ys)
    se2 = vx / nx + vy / ny
    diff = mx - my
    pooled = math.sqrt(((nx - 1) * vx + (ny - 1) * vy) / (nx + ny - 2))
    d = diff / pooled if pooled > 0 else (0.0 if diff == 0 else math.copysign(math.inf, diff))
    if se2 == 0.0:
        return {"t": 0.0 if diff == 0 else math.copysign(math.inf, diff), "df": float(nx + ny - 2),
                "p": 1.0 if diff == 0 else 0.0, "diff": diff, "cohen_d": d}  # fmt: skip
    t = diff / math.sqrt(se2)
    df = se2**2 / ((vx / nx) ** 2 / (nx - 1) + (vy / ny) ** 2 / (ny - 1))
    p = betainc(df / 2.0, 0.5, df / (df + t * t))
    return {"t": t, "df": df, "p": min(1.0, p), "diff": diff, "cohen_d": d}
