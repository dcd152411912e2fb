"""``checkpoint_activations_(model, budget=...)`` on any module tree: measure, plan, apply, verify.

Planning runs one warm forward, one probed forward (``_regions.probe``) and the untreated forward + backward under
the allocator meter; the plan the knapsack picks is applied and its forward + backward measured the same way. A
plan whose measured peak exceeds the budget is taken back and planned again for a budget lowered by the overshoot
(at most ``ATTEMPTS`` plans): the model of the peak is a model, the meter decides. Every pass runs with the RNG
forked and the buffers restored, and parameter gradients as they were.
"""

from __future__ import annotations

import types
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.utils._pytree import tree_flatten

from pytorchtricks.clock import peak_memory
from pytorchtricks.core import PttError
from pytorchtricks.quiet import filtered_stderr
from pytorchtricks.tricks.loop._region_planner import (
    Choice,
    RegionPlan,
    Tree,
    choice_of,
    plan_choices,
    plan_regions,
)
from pytorchtricks.tricks.loop._regions import apply, build_tree, probe, side_effect_free, unapply

ATTEMPTS = 4
MARGIN = 0.02  # a re-plan aims this share of the budget below it (the meter's run-to-run spread is smaller)


def _loss(out: Any) -> torch.Tensor:
    outs = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor) and t.requires_grad]
    outs = [t for t in outs if t.is_floating_point()]
    if not outs:
        raise PttError(
            "checkpoint_activations_: the model's output holds no floating tensor that requires grad, so there "
            "is no backward to plan for; plan it in training mode with parameters that require grad."
        )
    return sum(t.float().mean() for t in outs)  # type: ignore[return-value]


def fwd_bwd_peak(
    model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], grads_in_step: bool = False
) -> tuple[int, str]:
    """Measured peak bytes of one forward + backward above what was live before it, gradients allocated first
    (as in every step but the first) and put back as they were. ``grads_in_step``: the gradients start at None
    (as ``zero_grad()`` leaves them) and are part of the peak, as in a whole training step."""
    params = [p for p in model.parameters() if p.requires_grad]
    old = [p.grad for p in params]
    for p in params:
        p.grad = None if grads_in_step else torch.zeros_like(p) if p.grad is None else p.grad.clone()
    device = next((p.device for p in params), torch.device("cpu"))

    def step() -> None:
        _loss(model(*args, **kwargs)).backward()

    try:
        with filtered_stderr():  # the CPU meter starts Kineto, which prints USDT markers
            mem = peak_memory(step, device)
    finally:
        for p, g in zip(params, old):
            p.grad = g
    return mem.peak_bytes, mem.method


def _first_tensor(args: Any) -> torch.Tensor:
    return next((t for t in tree_flatten(args)[0] if isinstance(t, torch.Tensor)), torch.empty(0))


def make_plan(
    model: nn.Module,
    plan: RegionPlan,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    outer: Callable[[], int] | None = None,
) -> None:
    """Measure ``model`` on ``args``, choose the regions, apply them and measure the result (fills ``plan``).

    ``outer``: ``model`` is part of a larger training step (a detector's backbone): a callable that measures that
    step's activation peak. Budgets and peaks are then the step's; the rest of the step's peak above what ``model``
    keeps is the planner's headroom (recomputing up to it is free), and each plan is judged by the step it gives."""
    with side_effect_free(model, _first_tensor((args, kwargs))), torch.enable_grad():
        _loss(model(*args, **kwargs))  # warm: first-call allocations and kernel choices stay out of the probe
        rec = probe(model, args, kwargs)
        again = probe(model, args, kwargs)  # op times: the lower of two forwards (a shared machine is noisy)
        for times, other in ((rec.time_s, again.time_s), (rec.cheap_s, again.cheap_s)):
            for k, v in other.items():
                times[k] = min(times[k], v)
        rec.total_s = min(rec.total_s, again.total_s)
        base_peak, method = fwd_bwd_peak(model, args, kwargs)
        saved = sum(rec.nbytes.values())
        excess = max(0, base_peak - saved)
        headroom = 0
        measure: Callable[[], int] = outer or (lambda: fwd_bwd_peak(model, args, kwargs)[0])
        if outer is not None:  # the enclosing step's peak: the heads' part of it is headroom
            base_peak = outer()
            headroom = max(0, base_peak - saved)
        tree = build_tree(model, rec)
        budget = plan.budget_bytes
        if isinstance(plan.budget_share, float):
            budget = plan.budget_bytes = int(plan.budget_share * base_peak)
        plan.saved_bytes, plan.untreated_peak_bytes, plan.peak_method = saved, base_peak, method
        plan.untreated_forward_s = rec.total_s
        usable = [r for r in [*tree.regions.values(), *tree.runs.values()] if not r.reason and r.options]
        plan.candidates = len(usable)
        plan.skipped = [(r.name, r.reason) for r in tree.regions.values() if r.reason][:20]
        if not any(o.freed_bytes > 0 for r in usable for o in r.options):
            why = (
                "; ".join(f"{n}: {w}" for n, w in plan.skipped[:5])
                or "no submodule saves tensors for backward"
            )
            raise PttError(
                f"checkpoint_activations_: no region of this model frees memory when checkpointed ({why}). "
                "Checkpointing needs submodules whose forward saves tensors for backward."
            )
        target = budget
        for attempt in range(1, ATTEMPTS + 1):
            choice = plan_regions(tree, saved, excess, target, headroom)
            lowest = choice is None or budget is None
            if lowest:  # the lowest peak, or a budget out of reach by the model: measure before saying so
                choice, peak = _lowest_measured(model, tree, saved, excess, headroom, measure, budget)
            else:
                assert choice is not None
                _apply(model, tree, choice)
                peak = measure()
            plan.attempts = attempt
            _record(plan, tree, choice, peak)
            if budget is None:
                return
            if peak <= budget:
                if not lowest and peak < (1 - 2 * MARGIN) * budget:
                    _spend_slack(model, plan, tree, (saved, excess, headroom), budget, choice, peak, measure)
                return
            unapply(model)
            if lowest:
                raise PttError(
                    f"checkpoint_activations_: no plan fits budget={budget} bytes of activation peak (untreated "
                    f"{base_peak}; the lowest-peak plan modeled {choice.modeled_peak_bytes}, measured {peak}); "
                    "raise the budget or shrink the batch."
                )
            # the model missed by (peak - modeled): plan again for the budget less that error
            target = budget - (peak - choice.modeled_peak_bytes) - int(MARGIN * budget)
        raise PttError(
            f"checkpoint_activations_: no plan fits budget={budget} bytes of activation peak after {ATTEMPTS} "
            f"measured plans (the last measured {plan.measured_peak_bytes}); raise the budget or shrink the batch."
        )


def _spend_slack(
    model: nn.Module,
    plan: RegionPlan,
    tree: Tree,
    sizes: tuple[int, int, int],
    budget: int,
    choice: Choice,
    peak: int,
    measure: Callable[[], int],
) -> None:
    """The plan fits with room to spare (the model over-estimated its peak): plan once more for the budget plus
    that error - less recomputation - and keep it if its measured peak fits too, else the fitting one."""
    target = budget + (choice.modeled_peak_bytes - peak) - int(MARGIN * budget)
    cheaper = plan_regions(tree, *sizes[:2], target, sizes[2])
    if cheaper is None or cheaper.recompute_s >= choice.recompute_s:
        return
    unapply(model)
    _apply(model, tree, cheaper)
    got = measure()
    plan.attempts += 1
    if got <= budget:
        _record(plan, tree, cheaper, got)
        return
    unapply(model)
    _apply(model, tree, choice)


def _record(plan: RegionPlan, tree: Tree, choice: Choice, peak: int) -> None:
    plan.applied = _wrappers(tree, choice)
    plan.regions = [
        (n, mode, tree.option(n, mode).freed_bytes, tree.option(n, mode).recompute_s)
        for n, mode in choice.regions
    ]
    plan.planned_peak_bytes, plan.measured_peak_bytes = choice.modeled_peak_bytes, peak
    plan.recompute_s = choice.recompute_s


LOWEST_TRIES = 3  # plans measured when the lowest peak is asked for (the model of the peak ranks them)
LOWEST_MAX = 8  # ... and more, one at a time, while the best measured is above its model by more than MARGIN


def _wrappers(tree: Tree, choice: Choice) -> list[tuple[tuple[str, ...], str]]:
    """What ``_regions.apply`` wraps for ``choice``: ``(members, mode)`` by module name, so the same plan can be put
    on another copy of the model (``apply_recorded``)."""
    plan: list[tuple[tuple[str, ...], str]] = []
    for n, mode in choice.regions:
        if mode == "nested":  # a full checkpoint around full checkpoints of its runs
            plan += [(members, "full") for members in tree.option(n, mode).inner]
            mode = "full"
        plan.append((tree.by_name[n].members, mode))
    return plan


def _apply(model: nn.Module, tree: Tree, choice: Choice) -> None:
    apply(model, _wrappers(tree, choice))


def apply_recorded(model: nn.Module, plan: RegionPlan) -> None:
    """Put a plan ``make_plan`` made (on another copy of the same model) on ``model``, without measuring again:
    the same regions in the same modes, and ``plan`` as the model's ``checkpoint_plan``."""
    if plan.pending:
        raise PttError("checkpoint_activations_: a pending plan has no regions to put on another model yet.")
    if getattr(model, "_ptt_checkpoint_plan", None) is not None:
        raise PttError("model is already checkpointed; build the model again to change the plan.")
    apply(model, plan.applied)
    model.__dict__["_ptt_checkpoint_plan"] = plan


def _lowest_measured(
    model: nn.Module,
    tree: Tree,
    saved: int,
    excess: int,
    headroom: int,
    measure: Callable[[], int],
    budget: int | None = None,
) -> tuple[Choice, int]:
    """Of the ``LOWEST_TRIES`` plans with the lowest modeled peaks, the one with the lowest measured peak; then a
    finer version of it (``_finer``: blocks nested) if that measures lower, and lighter ones (``_lighter``: less
    recomputation within the peak, or within ``budget`` when one is given). Applied; every plan measured."""
    pool = plan_choices(tree, saved, excess, None, headroom)
    plans = pool[:LOWEST_TRIES]
    if (
        headroom
    ):  # and the module's own lowest-peak plans, judged by the step too: never worse than without it
        alone = plan_choices(tree, saved, excess, None)[:LOWEST_TRIES]
        plans += [c for c in alone if all(c.regions != p.regions for p in plans)]
    if not plans:
        raise PttError("checkpoint_activations_: the planner found no plan at all (no region to checkpoint).")
    measured = []
    for c in plans:
        _apply(model, tree, c)
        measured.append(measure())
        unapply(model)
    # plans of equal modeled peak are ranked by measured seconds, so which ones come first moves from run to run;
    # where the model under-estimated them all (a selective region that keeps more than modeled: 23 MB measured
    # for 16.8 MB modeled, above the untreated 20 MB), measure the next ones too
    more = iter(pool[LOWEST_TRIES:LOWEST_MAX])
    while True:
        best = min(range(len(plans)), key=measured.__getitem__)
        if measured[best] <= (1 + MARGIN) * plans[best].modeled_peak_bytes:
            break
        nxt = next(more, None)
        if nxt is None:
            break
        if any(p.regions == nxt.regions for p in plans):
            continue
        _apply(model, tree, nxt)
        plans.append(nxt)
        measured.append(measure())
        unapply(model)
    aim = headroom
    for _ in range(
        ATTEMPTS if headroom else 0
    ):  # judged by an enclosing step: what the model missed there is
        best = min(range(len(plans)), key=measured.__getitem__)  # the recomputation's own workspace and the
        aim -= (
            measured[best] - plans[best].modeled_peak_bytes
        )  # gradients grown by then - aim that much lower
        nxt = plan_regions(tree, saved, excess, None, aim) if 0 < aim < headroom else None
        if nxt is None or any(p.regions == nxt.regions for p in plans):
            break
        _apply(model, tree, nxt)
        plans.append(nxt)
        measured.append(measure())
        unapply(model)
    for _ in range(FINER_TRIES):  # the model ranks by the peak of the whole plan; measure finer regions too
        best = min(range(len(plans)), key=measured.__getitem__)
        picked = _finer(tree, plans[best].regions)
        if picked is None or any(sorted(p.regions) == sorted(picked) for p in plans):
            break
        nxt = choice_of(tree, picked, saved, excess, headroom)
        _apply(model, tree, nxt)
        plans.append(nxt)
        measured.append(measure())
        unapply(model)
    i = min(range(len(plans)), key=measured.__getitem__)
    best_plan, best_peak = _lighter(
        model, tree, plans[i], measured[i], (saved, excess, headroom), budget, measure
    )
    _apply(model, tree, best_plan)
    return best_plan, best_peak


FINER_TRIES = 2  # finer versions of the lowest measured plan, measured one after another
# lighter versions of the lowest plan measured (a nested region made full, a full one left alone)
LIGHTER_TRIES = 8


def _finer(tree: Tree, regions: list[tuple[str, str]]) -> list[tuple[str, str]] | None:
    """``regions`` with less recomputed at once: the full regions that are, or hold, blocks with a ``nested``
    option have those blocks nested - the blocks whose full recomputation is at least half the largest one's (the
    other blocks of such a region checkpointed full, its other parts left alone). The cost model adds every
    region's kept bytes to the largest recomputation, wherever in the backward it happens, so it cannot see that
    a block's recomputation early in the forward runs beside little else; the measurement can. None: nothing
    finer."""

    def full(name: str) -> int:
        return tree.option(name, "full").transient_bytes

    def blocks(path: str) -> list[str]:
        if any(o.mode == "nested" for o in tree.regions[path or "<model>"].options):
            return [path]
        return [b for c in tree.children.get(path, []) for b in blocks(c)]

    inside = {
        n: [b for m in tree.by_name[n].members for b in blocks(m)] for n, mode in regions if mode == "full"
    }
    sizes = [full(b) for bs in inside.values() for b in bs]
    if not sizes:
        return None
    big = max(sizes) / 2
    out: list[tuple[str, str]] = []
    for name, mode in regions:
        bs = inside.get(name, [])
        if any(full(b) >= big for b in bs):
            out += [(b, "nested" if full(b) >= big else "full") for b in bs]
        else:
            out.append((name, mode))
    return out


def _lighter(
    model: nn.Module,
    tree: Tree,
    plan: Choice,
    peak: int,
    sizes: tuple[int, int, int],
    budget: int | None,
    measure: Callable[[], int],
) -> tuple[Choice, int]:
    """Less recomputation for the same measured peak (or, with a budget, any peak within it): one region at a
    time, a nested one made full or a full one left alone - the step that saves the most seconds per byte the
    model says it adds first - each measured and kept where the peak stays at or under the target. Regions late
    in the forward cost little at the peak: their backward runs first, beside little else."""
    target = peak if budget is None else max(peak, budget)
    tried: set[tuple[str, str]] = set()
    for _ in range(LIGHTER_TRIES):
        steps = []
        for k, (name, mode) in enumerate(plan.regions):
            if (name, mode) in tried or mode not in ("nested", "full"):
                continue
            o = tree.option(name, mode)
            if mode == "nested":
                plain = tree.option(name, "full")
                saves, adds = o.recompute_s - plain.recompute_s, plain.transient_bytes - o.transient_bytes
                regions = [*plan.regions[:k], (name, "full"), *plan.regions[k + 1 :]]
            else:
                saves, adds = o.recompute_s, o.freed_bytes
                regions = [*plan.regions[:k], *plan.regions[k + 1 :]]
            steps.append((saves / max(adds, 2**20), name, mode, regions))
        if not steps:
            break
        _, name, mode, regions = max(steps, key=lambda s: s[0])
        tried.add((name, mode))
        nxt = choice_of(tree, regions, *sizes)
        _apply(model, tree, nxt)
        got = measure()
        unapply(model)
        if got <= target:
            plan, peak = nxt, got
    return plan, peak


def _pending_forward(self: nn.Module, *args: Any, **kwargs: Any) -> Any:
    """The model's forward until the first training forward: plan there (side effects undone), then run."""
    original = self.__dict__.pop("_ptt_pending_forward")
    if original is None:
        self.__dict__.pop("forward", None)
    else:
        self.__dict__["forward"] = original
    if torch.is_grad_enabled():
        make_plan(self, self.__dict__["_ptt_checkpoint_plan"], args, kwargs)
    else:  # not a training forward: plan at the next one
        self.__dict__["_ptt_pending_forward"] = original
        self.__dict__["forward"] = types.MethodType(_pending_forward, self)
        return (original or type(self).forward.__get__(self))(*args, **kwargs)
    return self.forward(*args, **kwargs)


def plan_at_first_forward(model: nn.Module) -> None:
    model.__dict__["_ptt_pending_forward"] = model.__dict__.get("forward")
    model.forward = types.MethodType(_pending_forward, model)  # type: ignore[method-assign]
