"""The checkpoint planner: which segments of a chain of blocks to recompute, from measured per-block bytes.

Cost model (activation bytes, per training step) for a chain split into segments, some checkpointed:
- forward keeps the input of every checkpointed segment and everything the unchecked blocks save;
- backward of a checkpointed segment recomputes it and holds its blocks' saved tensors at once.
  peak = kept + max over checkpointed segments of (sum of its blocks' saved bytes).
For N equal blocks saving s bytes with b-byte inputs, uniform segments of length L give N*b/L + L*s, minimal at
L = sqrt(N*b/s): Chen et al.'s sqrt(N) rule when s == b. We search all uniform lengths with the measured bytes.
"""

from __future__ import annotations

from dataclasses import dataclass, field


def _mib(n: int | None) -> str:
    return "?" if n is None else f"{n / 2**20:.2f} MiB"


@dataclass
class CheckpointPlan:
    """What ``checkpoint_activations_`` decided and, once measured, what it saw.

    ``runs`` lists ``(start, end, checkpointed)`` block ranges covering the chain in order.
    """

    chain: str
    n_blocks: int
    method: str
    runs: list[tuple[int, int, bool]] = field(default_factory=list)
    budget_bytes: int | None = None
    block_saved_bytes: list[int] = field(default_factory=list)
    block_input_bytes: list[int] = field(default_factory=list)
    planned_saved_bytes: int | None = None
    planned_peak_bytes: int | None = None
    unchecked_peak_bytes: int | None = None
    measured_saved_bytes: int | None = None
    measured_peak_bytes: int | None = None
    peak_method: str | None = None

    @property
    def pending(self) -> bool:
        return not self.runs

    @property
    def checkpointed_segments(self) -> int:
        return sum(1 for r in self.runs if r[2])

    def __str__(self) -> str:
        if self.pending:
            return f"checkpoint plan for {self.chain!r} ({self.n_blocks} blocks): pending until the first training forward"
        seg = (
            f"{self.checkpointed_segments} checkpointed segment(s) of {self.n_blocks} blocks ({self.method})"
        )
        if self.planned_peak_bytes is None:
            return f"{self.chain}: {seg}"
        return (
            f"{self.chain}: {seg}; saved for backward planned {_mib(self.planned_saved_bytes)} / measured "
            f"{_mib(self.measured_saved_bytes)}; activation peak planned {_mib(self.planned_peak_bytes)} / measured "
            f"{_mib(self.measured_peak_bytes)} ({self.peak_method}); without checkpointing planned "
            f"{_mib(self.unchecked_peak_bytes)}"
        )


def uniform_runs(n: int, segments: int) -> list[tuple[int, int]]:
    """Split ``n`` blocks into ``segments`` contiguous runs whose lengths differ by at most one.

    Example:
        >>> uniform_runs(5, 2)
        [(0, 3), (3, 5)]
    """
    segments = max(1, min(segments, n))
    base, extra = divmod(n, segments)
    out, start = [], 0
    for i in range(segments):
        end = start + base + (1 if i < extra else 0)
        out.append((start, end))
        start = end
    return out


def cost(runs: list[tuple[int, int, bool]], saved: list[int], inputs: list[int]) -> tuple[int, int]:
    """(kept bytes after forward, modeled activation peak) of a plan under the cost model above."""
    kept = 0
    recompute = 0
    for s, e, ck in runs:
        if ck:
            kept += inputs[s]
            recompute = max(recompute, sum(saved[s:e]))
        else:
            kept += sum(saved[s:e])
    return kept, kept + recompute


def _with_last_unchecked(segs: list[tuple[int, int]]) -> list[tuple[int, int, bool]]:
    # the last segment is recomputed first thing in backward: storing it costs the same peak, minus the recompute
    return [(s, e, i < len(segs) - 1) for i, (s, e) in enumerate(segs)]


def plan_default(saved: list[int], inputs: list[int]) -> list[tuple[int, int, bool]]:
    """Uniform segmentation with the lowest modeled peak (generalised sqrt(N) rule), last segment unchecked."""
    n = len(saved)
    best: tuple[int, int, list[tuple[int, int, bool]]] | None = None
    for k in range(1, n + 1):
        runs = _with_last_unchecked(uniform_runs(n, k)) if k > 1 else [(0, n, True)]
        peak = cost(runs, saved, inputs)[1]
        if best is None or peak < best[0] or (peak == best[0] and k < best[1]):
            best = (peak, k, runs)
    assert best is not None
    return best[2]


def plan_budget(saved: list[int], inputs: list[int], budget: int) -> list[tuple[int, int, bool]] | None:
    """Least recomputation (bytes of checkpointed blocks) whose modeled peak fits ``budget``; None if none fits."""
    n = len(saved)
    best: tuple[int, int, list[tuple[int, int, bool]]] | None = None
    for k in range(1, n + 1):
        segs = uniform_runs(n, k)
        for c in range(0, len(segs) + 1):  # checkpoint the first c segments
            runs = [(s, e, i < c) for i, (s, e) in enumerate(segs)]
            peak = cost(runs, saved, inputs)[1]
            if peak > budget:
                continue
            work = sum(sum(saved[s:e]) for s, e, ck in runs if ck)
            if best is None or (work, peak) < (best[0], best[1]):
                best = (work, peak, runs)
    return None if best is None else best[2]


def min_peak(saved: list[int], inputs: list[int]) -> int:
    """The lowest modeled peak any uniform plan reaches (for the 'budget too small' error)."""
    return cost(plan_default(saved, inputs), saved, inputs)[1]
