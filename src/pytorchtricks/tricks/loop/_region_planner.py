"""The region planner: which regions of a module tree to recompute, and how, from measured per-region costs.

A *region* is a submodule or a run of consecutive sibling submodules whose outputs feed only the next one (the
stem of a ResNet: conv1 -> bn1 -> relu -> maxpool). Each region can be left alone or checkpointed in one of three
modes: ``full`` (keep the region's inputs, recompute everything in backward), ``selective`` (keep the inputs and
the outputs of convolutions and matmuls, recompute the cheap ops between them) or, for a convolution on an input
that needs no gradient followed by per-channel modules (a stem on the image), ``channels`` (a full checkpoint
whose backward walks the channels in slices, so the region's activations never come back whole) or, for a
module with runs of children inside it (a residual block's convolution -> BatchNorm pairs), ``nested`` (a full
checkpoint whose recomputation checkpoints those runs again, so that what comes back at once is one run's
activations, not the block's: one more forward of the runs for less memory). Every region
comes with measured costs for each mode: the bytes it frees from what forward keeps for backward, the bytes its recomputation brings
back during its backward (``transient``), and the seconds its recomputation takes.

Cost model (activation bytes of a training step): ``peak = saved - freed(plan) + max transient(plan) + excess``,
where ``saved`` is what the untreated forward keeps, ``excess`` the measured backward workspace above it. A module
planned inside a larger step (a detector's backbone under its heads) adds a ``headroom``: the peak the rest of the
step reaches on top of what the module keeps, so ``peak = saved - freed + max(transient + excess, headroom)``. Regions
of a plan are disjoint (no region inside a checkpointed one: it is recomputed anyway). For each cap on the
transient the plan is a knapsack over the tree - free at least what the budget asks at the least recompute time -
solved exactly on a grid of ``GRID`` byte steps (a freed amount is rounded down: the plan never claims more than
it frees); the cheapest cap wins.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

GRID = 240  # byte steps of the knapsack's freed-bytes axis
MAX_CAPS = 16  # transient caps tried (evenly spread over the distinct measured transients)
INF = float("inf")


def _mib(n: int | None) -> str:
    return "?" if n is None else f"{n / 2**20:.1f} MiB"


@dataclass
class Option:
    """One way to checkpoint a region, with its measured costs."""

    mode: str  # "full", "selective", "channels" or "nested"
    freed_bytes: int
    transient_bytes: int
    recompute_s: float
    inner: tuple[tuple[str, ...], ...] = ()  # nested: the runs checkpointed again inside the recomputation


@dataclass
class Region:
    """A candidate region: a module (``members == (path,)``) or a run of consecutive siblings of ``parent``."""

    name: str
    parent: str | None  # None: the root module
    members: tuple[str, ...]
    saved_bytes: int = 0  # what forward keeps for backward inside it, untreated
    options: list[Option] = field(default_factory=list)
    reason: str = ""  # why it cannot be checkpointed (empty: it can)

    @property
    def is_run(self) -> bool:
        return len(self.members) > 1


@dataclass
class Tree:
    """The module tree the planner works on: children in call order, sibling chains, regions by name."""

    children: dict[str, list[str]]  # module path -> child paths ("" is the root)
    chains: dict[str, list[list[str]]]  # module path -> maximal chains of children (call order)
    regions: dict[str, Region]  # by name; a module region is named by its path ("<model>" for the root)
    runs: dict[tuple[str, ...], Region]  # run regions by members

    @functools.cached_property
    def by_name(self) -> dict[str, Region]:
        """Every region by name: modules (their path, "<model>" for the root) and runs ("conv1..maxpool")."""
        return {**self.regions, **{r.name: r for r in self.runs.values()}}

    def option(self, name: str, mode: str) -> Option:
        """The region ``name``'s option in ``mode``."""
        return next(o for o in self.by_name[name].options if o.mode == mode)


@dataclass
class _Table:
    """min recompute seconds to free at least ``f`` grid steps, and how to get there."""

    vals: np.ndarray
    pick: Callable[[int], list[tuple[str, str]]]


def _zero() -> _Table:
    v = np.full(GRID + 1, INF)
    v[0] = 0.0
    return _Table(v, lambda f: [])


def _combine(a: _Table, b: _Table) -> _Table:
    """Two independent parts: h[f] = min over split of a[i] + b[f - i]."""
    h = np.full(GRID + 1, INF)
    arg = np.zeros(GRID + 1, dtype=np.int64)
    finite = np.flatnonzero(np.isfinite(a.vals))
    f = np.arange(GRID + 1)
    for i in finite:
        cand = a.vals[i] + b.vals[np.maximum(f - i, 0)]
        better = cand < h
        h[better] = cand[better]
        arg[better] = i

    def pick(k: int) -> list[tuple[str, str]]:
        if not np.isfinite(h[k]):
            return []
        i = int(arg[k])
        return a.pick(i) + b.pick(max(k - i, 0))

    return _Table(h, pick)


def _best(tables: list[tuple[_Table, str]]) -> _Table:
    """The cheaper of alternatives, entry by entry."""
    stack = np.stack([t.vals for t, _ in tables])
    which = np.argmin(stack, axis=0)
    h = stack[which, np.arange(GRID + 1)]

    def pick(k: int) -> list[tuple[str, str]]:
        return tables[int(which[k])][0].pick(k)

    return _Table(h, pick)


def _region_table(region: Region, opt: Option, quantum: float) -> _Table:
    d = min(GRID, int(opt.freed_bytes // quantum))
    v = np.full(GRID + 1, INF)
    v[: d + 1] = opt.recompute_s
    return _Table(v, lambda f: [(region.name, opt.mode)])


def _shift(base: _Table, region: Region, opt: Option, quantum: float) -> _Table:
    """``base`` plus one more region: h[f] = base[f - d] + t."""
    d = min(GRID, int(opt.freed_bytes // quantum))
    f = np.arange(GRID + 1)
    h = base.vals[np.maximum(f - d, 0)] + opt.recompute_s

    def pick(k: int) -> list[tuple[str, str]]:
        return [*base.pick(max(k - d, 0)), (region.name, opt.mode)]

    return _Table(h, pick)


def _options(region: Region | None, cap: int) -> list[Option]:
    if region is None or region.reason:
        return []
    return [o for o in region.options if o.transient_bytes <= cap and o.freed_bytes > 0]


def _solve(tree: Tree, path: str, cap: int, quantum: float) -> _Table:
    """The table of the subtree at ``path``: itself as one region, or the best of its children's plans."""
    in_chain = {c for ch in tree.chains.get(path, []) for c in ch}
    inner = _zero()
    for chain in tree.chains.get(path, []):
        inner = _combine(inner, _solve_chain(tree, chain, cap, quantum))
    for c in tree.children.get(path, []):
        if c not in in_chain:
            inner = _combine(inner, _solve(tree, c, cap, quantum))
    alts = [(inner, "children")]
    region = tree.regions.get(path or "<model>")
    for opt in _options(region, cap):
        assert region is not None
        alts.append((_region_table(region, opt, quantum), opt.mode))
    return _best(alts) if len(alts) > 1 else inner


def _solve_chain(tree: Tree, chain: list[str], cap: int, quantum: float) -> _Table:
    """Interval DP over a chain of siblings: each child alone (its subtree's table) or a run region of several."""
    tables = [_zero()]
    for i in range(1, len(chain) + 1):
        alts = [(_combine(tables[i - 1], _solve(tree, chain[i - 1], cap, quantum)), "child")]
        for j in range(0, i - 1):
            run = tree.runs.get(tuple(chain[j:i]))
            for opt in _options(run, cap):
                assert run is not None
                alts.append((_shift(tables[j], run, opt, quantum), opt.mode))
        tables.append(_best(alts))
    return tables[-1]


@dataclass
class Choice:
    """The planner's answer: regions and modes, what it frees, its modeled peak and recompute time."""

    regions: list[tuple[str, str]]
    freed_bytes: int
    transient_bytes: int
    recompute_s: float
    modeled_peak_bytes: int


def plan_regions(
    tree: Tree, saved_bytes: int, excess_bytes: int, budget_bytes: int | None, headroom_bytes: int = 0
) -> Choice | None:
    """Least recompute time whose modeled activation peak fits ``budget_bytes`` (None: the lowest modeled peak);
    None when no plan fits. ``headroom_bytes``: what the rest of an enclosing step adds on top of what this module
    keeps for backward, at that step's peak (a detector's heads above its backbone): the peak is then
    ``saved - freed + max(transient + excess, headroom)``, so recomputation up to the headroom costs no memory."""
    plans = plan_choices(tree, saved_bytes, excess_bytes, budget_bytes, headroom_bytes)
    return plans[0] if plans else None


def plan_choices(
    tree: Tree, saved_bytes: int, excess_bytes: int, budget_bytes: int | None, headroom_bytes: int = 0
) -> list[Choice]:
    """The best plan under each cap on the largest recomputation, best first (distinct plans only)."""
    quantum = max(1.0, saved_bytes / GRID)
    caps = sorted({o.transient_bytes for r in tree.regions.values() for o in _options(r, 2**62)})
    caps = sorted({o.transient_bytes for r in tree.runs.values() for o in _options(r, 2**62)} | set(caps))
    if len(caps) > MAX_CAPS:
        idx = np.linspace(0, len(caps) - 1, MAX_CAPS).round().astype(int)
        under = [c for c in caps if c + excess_bytes <= headroom_bytes]  # the largest free recomputation
        caps = sorted({caps[i] for i in idx.tolist()} | set(under[-1:]))
    found: dict[tuple[tuple[str, str], ...], Choice] = {}
    for cap in caps:
        table = _solve(tree, "", cap, quantum)
        reach = np.flatnonzero(np.isfinite(table.vals))
        if budget_bytes is None:
            k = int(reach.max())
        else:
            need = saved_bytes + max(cap + excess_bytes, headroom_bytes) - budget_bytes
            k = max(0, int(np.ceil(need / quantum)))
            if k > GRID or not np.isfinite(table.vals[k]):
                continue
        picked = table.pick(k)
        choice = choice_of(tree, picked, saved_bytes, excess_bytes, headroom_bytes)
        found.setdefault(tuple(sorted(choice.regions)), choice)
    return sorted(found.values(), key=lambda c: _key(c, budget_bytes))


def _key(c: Choice, budget: int | None) -> tuple[float, float]:
    if budget is None:
        return (c.modeled_peak_bytes, c.recompute_s)
    return (c.recompute_s, c.modeled_peak_bytes)


def choice_of(
    tree: Tree, picked: list[tuple[str, str]], saved: int, excess: int, headroom: int = 0
) -> Choice:
    freed = transient = 0
    secs = 0.0
    for name, mode in picked:
        opt = tree.option(name, mode)
        freed += opt.freed_bytes
        transient = max(transient, opt.transient_bytes)
        secs += opt.recompute_s
    return Choice(picked, freed, transient, secs, saved - freed + max(transient + excess, headroom))


@dataclass
class RegionPlan:
    """What ``checkpoint_activations_(model, budget=...)`` decided for a module tree and what it measured.

    ``regions`` lists ``(name, mode, freed bytes, recompute seconds)`` of the checkpointed regions; the peaks
    are activation peaks of one forward + backward (bytes above what was live before it), planned and measured.
    """

    method: str
    budget_bytes: int | None
    budget_share: float | None = None  # the budget as a share of the untreated activation peak
    regions: list[tuple[str, str, int, float]] = field(default_factory=list)
    candidates: int = 0
    saved_bytes: int | None = None  # kept for backward by the untreated forward
    untreated_peak_bytes: int | None = None
    planned_peak_bytes: int | None = None
    measured_peak_bytes: int | None = None
    untreated_forward_s: float | None = None  # sum of the measured op times of one forward
    recompute_s: float | None = None  # planned: the sum over the regions
    peak_method: str | None = None
    skipped: list[tuple[str, str]] = field(default_factory=list)  # (region, why it cannot be checkpointed)
    attempts: int = 0
    scope: str = ""  # whose peak the peaks are when not the module's own (a detector's whole step)
    # what is wrapped, by module name: ``(members, mode)`` as ``_regions.apply`` takes them (nested blocks as full
    # checkpoints of their runs inside a full one), so another copy of the model can take the same plan
    applied: list[tuple[tuple[str, ...], str]] = field(default_factory=list)

    @property
    def pending(self) -> bool:
        return self.planned_peak_bytes is None

    @property
    def checkpointed_segments(self) -> int:
        return len(self.regions)

    def table(self) -> str:
        """One line per checkpointed region: mode, bytes freed, recompute time."""
        lines = [f"{'region':<40} {'mode':<10} {'freed MiB':>10} {'recompute ms':>13}"]
        for name, mode, freed, secs in self.regions:
            lines.append(f"{name[:40]:<40} {mode:<10} {freed / 2**20:>10.2f} {secs * 1e3:>13.1f}")
        return "\n".join(lines)

    def __str__(self) -> str:
        if self.pending:
            return "checkpoint plan (module tree): pending until the first training forward"
        share = ""
        if self.recompute_s is not None and self.untreated_forward_s:
            share = f", recompute {self.recompute_s / self.untreated_forward_s:.0%} of a forward"
        return (
            f"module tree: {len(self.regions)} checkpointed region(s) of {self.candidates} candidates "
            f"({self.method}{share}); activation peak{self.scope and ' of ' + self.scope} planned "
            f"{_mib(self.planned_peak_bytes)} / measured "
            f"{_mib(self.measured_peak_bytes)} ({self.peak_method}); untreated {_mib(self.untreated_peak_bytes)}"
        )
