"""Activation checkpointing of any module tree (or a chain of blocks), planned from measured bytes, exact with BN and dropout.

Why: a training step keeps every activation autograd saves until backward; recomputing parts of the network during
backward instead keeps only their inputs (Chen et al. 2016: O(sqrt N) memory for one extra forward). With
``budget=`` (bytes of forward + backward activation peak, a share of the untreated peak, or "min") this plans over
the whole module tree: submodules and runs of consecutive siblings (a ResNet's stem, from an fx trace of each
parent), each recomputed fully or selectively (SAC policy: keep convolution/matmul/attention outputs, recompute
BatchNorm, activations, elementwise ops, pooling) or, for a stem (a convolution on the image, then BatchNorm,
ReLU-like activations, pooling), channel slice by channel slice, or, for a residual block, nested (its
convolution -> BatchNorm runs checkpointed again inside its recomputation); costs measured on the batch
(saved-tensor hooks, per-op times), the least recompute time that fits (a knapsack over the tree), the plan's peak measured and re-planned if above.
Without it, the chain planner: segments of the longest ``nn.Sequential`` from measured per-block bytes (Chen's
sqrt(N) rule generalised, or ``budget_bytes`` with the least recomputation). ``checkpoint_plan(model)`` reports
planned vs measured bytes.
When: models whose activations, not weights, exhaust memory (deep nets, large batches or resolutions).
Caveats: costs up to ~one extra forward of what is recomputed. Always ``use_reentrant=False``; RNG state is
preserved so dropout masks match; BatchNorm layers inside a checkpoint run with batch statistics but do NOT update
running stats or ``num_batches_tracked`` during recomputation (the plain recompute would update them twice). A
module that modifies its own input in place is not a region. The floor is the backward of the largest layer (a
CNN's stem: its weight gradient needs the output's whole gradient). Planning happens at the first training forward (a few forwards and forward+backwards, buffers and
RNG restored) unless ``example_inputs`` is given. A ModuleList chain is checkpointed block by block.
See also: to_inplace_abn_, accumulate_gradients, estimate_memory, memory_breakdown, 节省显存 / 梯度检查点.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import types
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from pytorchtricks.clock import SavedTensorMeter, peak_memory
from pytorchtricks.core import BenchCase, NoEffectWarning, PttError, TrickInfo
from pytorchtricks.quiet import filtered_stderr
from pytorchtricks.tricks._cases import train_step_case
from pytorchtricks.tricks.loop._checkpoint_planner import (
    CheckpointPlan,
    cost,
    min_peak,
    plan_budget,
    plan_default,
    uniform_runs,
)
from pytorchtricks.tricks.loop._region_planner import RegionPlan
from pytorchtricks.tricks.loop._regions import no_stat_update, side_effect_free
from pytorchtricks.tricks.loop._tree_checkpoint import (
    apply_recorded,
    fwd_bwd_peak,
    make_plan,
    plan_at_first_forward,
)
from pytorchtricks.tunable import TuneHook, TuneSetup, TuneSkip, applied_or_skip

__all__ = ["checkpoint_activations_", "checkpoint_plan"]

TRICK = TrickInfo(gains=("memory",), phase=("train",), exact=True)


def _tune_apply(setup: TuneSetup, state: object) -> None:
    """Checkpoint the model's regions for the memory search (the module-tree planner): planned on the workload's
    own micro-batch so that its activations fit what the budget leaves them (``setup.activation_budget_bytes``),
    else the plan with the lowest measured peak - what ``checkpoint_activations_(model, budget=...)`` does at the
    user's first training forward."""
    with filtered_stderr():  # the planner's probes meter memory with Kineto, which prints USDT markers
        _tune_plan(setup)


def _tune_plan(setup: TuneSetup) -> None:
    if setup.task == "detection":
        _tune_plan_detector(setup)
        return
    n = setup.micro_batch_size
    # the micro-batch itself: the planner's peaks are measured, and a plan made on a few samples and scaled does not
    # hold at the batch (what is not per sample - the stem's floor, the kernels' workspaces - does not scale)
    x = setup.batch_of(n) if setup.batch_of is not None else setup.example
    budget: int | str = "min"
    if setup.activation_budget_bytes is not None:  # scaled where x has fewer samples than the micro-batch
        budget = max(1, int(setup.activation_budget_bytes * len(x) / max(1, n)))
    # one plan per model (as the hooks before this one left it), batch and budget, made once in the run: every
    # configuration's Runner builds a fresh copy of the model, and measuring the plan again on each costs the
    # planner's probes (tens of seconds at a batch of 64) to reach the same regions
    key = ("checkpoint_activations", repr(setup.model), x.shape, x.stride(), x.dtype, str(x.device), budget)
    made = setup.memo.get(key)
    if made is None:
        try:
            made = _tune_plan_now(setup.model, budget, x)
        except TuneSkip as exc:
            made = exc
        setup.memo[key] = made
    elif isinstance(made, RegionPlan):
        apply_recorded(setup.model, made)
    if isinstance(made, TuneSkip):
        raise TuneSkip(str(made))
    what = "the batch" if n == setup.batch_size else "one micro-batch"
    setup.notes.append(f"checkpoint plan (on {len(x)} samples, {what}): {made}")


def _tune_plan_now(model: nn.Module, budget: int | str, x: torch.Tensor) -> RegionPlan:
    """Plan ``model`` on ``x`` to ``budget`` (else to the lowest peak) and return the plan; ``TuneSkip`` when it
    recomputes nothing (the budget is met without checkpointing: the configuration is the one without it)."""
    try:
        applied_or_skip(checkpoint_activations_, model, budget=budget, example_inputs=(x,))
    except TuneSkip as exc:
        if budget == "min" or "no plan fits" not in str(exc):
            raise
        # unreachable at this micro-batch: the lowest peak there is (the search measures whether it fits)
        applied_or_skip(checkpoint_activations_, model, budget="min", example_inputs=(x,))
    plan = checkpoint_plan(model)
    assert isinstance(plan, RegionPlan)
    if not plan.regions:
        raise TuneSkip(
            f"checkpoint_activations_: the activations of {len(x)} samples fit the budget of {budget} bytes "
            f"without checkpointing (measured {plan.measured_peak_bytes}): nothing is recomputed"
        )
    return plan


def _tune_plan_detector(setup: TuneSetup) -> None:
    """A torchvision detector: its backbone + FPN planned to the lowest peak of the detector's whole step, on the
    micro-batch of a staged batch (``setup.example``: the detector's images and targets), else at its first
    training forward (``checkpoint_activations_`` on a detector)."""
    if not _is_detector(setup.model):
        raise TuneSkip("the detector has no .backbone and .transform (a torchvision detector's) to plan over")
    if setup.example is None:
        applied_or_skip(checkpoint_activations_, setup.model, budget="min")
        setup.notes.append("checkpoint plan of the backbone: made at the detector's first training forward")
        return
    images, targets = setup.example
    m = max(1, min(len(images), setup.micro_batch_size))
    applied_or_skip(
        checkpoint_activations_, setup.model, budget="min", example_inputs=(images[:m], targets[:m])
    )
    setup.notes.append(
        f"checkpoint plan of the backbone (on {m} images, judged by the detector's whole step): "
        f"{checkpoint_plan(setup.model)}"
    )


TUNE = TuneHook(
    changes="model",
    check="exact",
    tasks=("classification", "detection"),  # a detector: its backbone + FPN, planned to their lowest peak
    receipt='ptt.checkpoint_activations_(model, budget={activation_budget} or "min")  # the module-tree planner, '
    "planned at the first training forward for its batch (bytes of activation peak; min: the lowest peak)",
    detection_receipt='ptt.checkpoint_activations_(model, budget="min")  # a torchvision detector: its backbone + FPN, '
    "planned at its first training forward to the lowest peak of the whole step",
    apply=_tune_apply,
    order=35,
    bound="outputs, gradients and the update equal the untreated step's (recomputation, same kernels)",
)


_no_stat_update = no_stat_update
_side_effect_free = side_effect_free


def _run(blocks: Sequence[nn.Module], x: Any) -> Any:
    for blk in blocks:
        x = blk(x)
    return x


def _contexts(part: Sequence[nn.Module]) -> tuple[Any, Any]:
    return contextlib.nullcontext(), _no_stat_update(part)  # (forward, recomputation) contexts


def _run_plan(
    blocks: Sequence[nn.Module],
    runs: list[tuple[int, int, bool]],
    x: Any,
    on_checkpoint: Callable[[Any], None] | None = None,
) -> Any:
    for s, e, ck in runs:
        part = blocks[s:e]
        if ck:
            if on_checkpoint is not None:
                on_checkpoint(x)  # the segment input: what a checkpoint keeps alive for backward
            x = checkpoint(
                _run,
                part,
                x,
                use_reentrant=False,
                preserve_rng_state=True,
                context_fn=functools.partial(_contexts, part),
            )
        else:
            x = _run(part, x)
    return x


def _measure_blocks(blocks: Sequence[nn.Module], x: torch.Tensor) -> tuple[list[int], list[int]]:
    """Bytes each block saves for backward and bytes of its input, one block's graph alive at a time."""
    saved, inputs = [], []
    h = x
    for i, blk in enumerate(blocks):
        if not isinstance(h, torch.Tensor):
            raise PttError(
                f"block {i} of the chain got a {type(h).__name__}; the planner needs tensors between blocks."
            )
        h_in = h.detach().requires_grad_(h.is_floating_point())
        if h.is_floating_point():
            h_in = (
                h_in.clone()
            )  # a non-leaf, like a real activation (the meter files grad leaves under params)
        with SavedTensorMeter() as meter:
            out = blk(h_in)
        saved.append(meter.saved_bytes)
        inputs.append(h_in.untyped_storage().nbytes())
        h = out.detach() if isinstance(out, torch.Tensor) else out
    return saved, inputs


def _probe(
    blocks: Sequence[nn.Module], runs: list[tuple[int, int, bool]], x: torch.Tensor
) -> tuple[int, int, str]:
    """Measured (bytes kept for backward after forward, activation peak of forward+backward, peak method)."""
    kept: list[int] = []

    def fwd_bwd() -> None:
        leaf = x.detach().requires_grad_(True)
        h = leaf.clone()  # a non-leaf activation, as inside a network
        inputs: dict[int, int] = {}

        def note(t: Any) -> None:
            if isinstance(t, torch.Tensor):
                inputs[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()

        with (
            SavedTensorMeter() as meter
        ):  # sees what unchecked blocks save; checkpoints keep only their inputs
            out = _run_plan(blocks, runs, h, note)
        seen = {key[0] for key in meter._seen}  # storages the meter already counted (data_ptr, nbytes)
        kept.append(meter.saved_bytes + sum(v for k, v in inputs.items() if k not in seen))
        torch.autograd.grad(out, leaf, torch.ones_like(out))  # input grads only: parameter .grad untouched

    mem = peak_memory(fwd_bwd, x.device)
    return kept[0], mem.peak_bytes, mem.method


def _make_plan(chain: nn.Sequential, plan: CheckpointPlan, x: torch.Tensor) -> None:
    blocks = list(chain)
    with _side_effect_free(chain, x), _no_stat_update(blocks):
        saved, inputs = _measure_blocks(blocks, x)
        unchecked = [(0, len(blocks), False)]
        if plan.budget_bytes is not None:
            runs = plan_budget(saved, inputs, plan.budget_bytes)
            if runs is None:
                raise PttError(
                    f"checkpoint_activations_: no plan fits budget_bytes={plan.budget_bytes} (lowest modeled "
                    f"activation peak is {min_peak(saved, inputs)} bytes); raise the budget or shrink the batch."
                )
        else:
            runs = plan_default(saved, inputs)
        plan.block_saved_bytes, plan.block_input_bytes = saved, inputs
        plan.planned_saved_bytes, plan.planned_peak_bytes = cost(runs, saved, inputs)
        plan.unchecked_peak_bytes = cost(unchecked, saved, inputs)[1]
        plan.measured_saved_bytes, plan.measured_peak_bytes, plan.peak_method = _probe(blocks, runs, x)
    plan.runs = runs
    if not any(ck for _, _, ck in runs):
        warnings.warn(
            f"checkpoint_activations_: budget {plan.budget_bytes} bytes is met without checkpointing; nothing is "
            "recomputed.",
            NoEffectWarning,
            stacklevel=4,
        )


def _sequential_forward(self: nn.Sequential, x: Any) -> Any:
    plan: CheckpointPlan = getattr(self, "_ptt_checkpoint_plan")  # noqa: B009
    if not torch.is_grad_enabled():
        return _run(list(self), x)
    if plan.pending:
        if not isinstance(x, torch.Tensor):
            raise PttError(
                "checkpoint_activations_ plans from a tensor input; pass segments= for other inputs."
            )
        _make_plan(self, plan, x)
    return _run_plan(list(self), plan.runs, x)


def _block_forward(self: nn.Module, *args: Any, **kwargs: Any) -> Any:
    fwd: Callable[..., Any] = getattr(self, "_ptt_checkpoint_forward")  # noqa: B009
    if not torch.is_grad_enabled():
        return fwd(*args, **kwargs)
    ctx = (contextlib.nullcontext(), _no_stat_update([self]))
    return checkpoint(
        fwd, *args, use_reentrant=False, preserve_rng_state=True, context_fn=lambda: ctx, **kwargs
    )


def _find_chain(
    model: nn.Module, blocks: nn.Module | str | None
) -> tuple[str, nn.Sequential | nn.ModuleList]:
    found: tuple[str, nn.Module] | None = None
    if isinstance(blocks, str):
        try:
            found = (blocks, model.get_submodule(blocks))
        except AttributeError as exc:
            raise PttError(
                f"no submodule {blocks!r}; pass blocks= a name from model.named_modules()."
            ) from exc
    elif isinstance(blocks, nn.Module):
        found = next(((n or "<model>", m) for n, m in model.named_modules() if m is blocks), None)
        if found is None:
            raise PttError(
                "blocks= must be a submodule of model (an nn.Sequential or nn.ModuleList inside it)."
            )
    else:
        chains = [
            (n or "<model>", m)
            for n, m in model.named_modules()
            if isinstance(m, nn.Sequential | nn.ModuleList)
        ]
        if not chains:
            raise PttError(
                "no nn.Sequential/nn.ModuleList chain found; pass blocks= the container of the blocks."
            )
        found = max(chains, key=lambda nm: (len(nm[1]), isinstance(nm[1], nn.Sequential)))  # type: ignore[arg-type]
    name, chain = found
    if not isinstance(chain, nn.Sequential | nn.ModuleList):
        raise PttError(
            f"blocks {name!r} is a {type(chain).__name__}; pass an nn.Sequential or nn.ModuleList."
        )
    return name, chain


def checkpoint_activations_(
    model: nn.Module,
    *,
    budget: int | float | str | None = None,
    budget_bytes: int | None = None,
    segments: int | None = None,
    blocks: nn.Module | str | None = None,
    example_inputs: Any = None,
) -> nn.Module:
    """Checkpoint the chain of blocks of ``model`` in place (state_dict unchanged) and return ``model``.

    A torchvision detector (a ``backbone`` and a ``transform``; it takes lists of images and targets) gets the
    module-tree planner on its backbone + FPN, judged by the peak of the detector's whole training step (the
    heads' share of it is room the backbone's recomputation may use), planned at its first training forward (or
    on ``example_inputs=(images, targets)``); ``checkpoint_plan(model)`` is that plan.

    Two planners. ``budget=`` (or a model without a chain of >= 2 blocks) plans over the whole module tree:
    submodules, runs of consecutive siblings (a ResNet's stem) and, inside each, full or selective recomputation
    (keep convolution and matmul outputs, recompute BatchNorm, activations, elementwise ops and pooling) or, for
    a convolution on the image followed by per-channel modules, recomputation one channel slice at a time, or
    for a block with runs inside, those runs checkpointed again inside its recomputation (``nested``); costs
    measured on the batch, the least recompute time whose measured forward + backward peak fits. The other
    arguments plan over one chain of blocks (segments of an ``nn.Sequential``).

    Args:
        budget: activation-peak budget of one forward + backward: bytes (int) or a share of the untreated peak
            (float in (0, 1]) or ``"min"`` (the lowest modeled peak); ``checkpoint_plan(model)`` reports planned and measured peaks region by region.
        budget_bytes: chain planner: activation-peak budget; the plan with the least recomputation that fits.
        segments: checkpoint every one of ``segments`` near-equal segments (no measuring); exclusive with budget.
        blocks: the chain: an ``nn.Sequential``/``nn.ModuleList`` inside ``model`` or its name (default: the
            longest one).
        example_inputs: plan now with one call ``model(*example_inputs)`` (side effects undone); otherwise the
            plan is made at the first training forward.

    Example:
        >>> m = nn.Sequential(*[nn.Sequential(nn.Linear(8, 8), nn.Tanh()) for _ in range(9)])
        >>> m = ptt.checkpoint_activations_(m, example_inputs=torch.randn(4, 8))
        >>> ptt.checkpoint_plan(m).checkpointed_segments > 0
        True
        >>> net = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU(), nn.Conv2d(8, 8, 3), nn.GELU())
        >>> net = ptt.checkpoint_activations_(net, budget="min", example_inputs=torch.randn(4, 3, 16, 16))
        >>> plan = ptt.checkpoint_plan(net)  # the module-tree planner: regions, measured peaks
        >>> plan.measured_peak_bytes < plan.untreated_peak_bytes
        True
    """
    if _is_detector(model) and budget_bytes is None and segments is None and blocks is None:
        return _checkpoint_detector(model, "min" if budget is None else budget, example_inputs)
    if budget is not None or (
        budget_bytes is None and segments is None and blocks is None and not _has_chain(model)
    ):
        if budget_bytes is not None or segments is not None or blocks is not None:
            raise PttError("budget= plans the whole module tree: drop budget_bytes=, segments= and blocks=.")
        return _checkpoint_tree(model, budget, example_inputs)
    if budget_bytes is not None and segments is not None:
        raise PttError("pass budget_bytes= or segments=, not both.")
    if segments is not None and (isinstance(segments, bool) or segments < 1):
        raise PttError(f"segments must be a positive integer, got {segments!r}.")
    if budget_bytes is not None and budget_bytes <= 0:
        raise PttError(f"budget_bytes must be positive, got {budget_bytes!r}.")
    name, chain = _find_chain(model, blocks)
    if getattr(chain, "_ptt_checkpoint_plan", None) is not None:
        raise PttError(f"{name!r} is already checkpointed; build the model again to change the plan.")
    if len(chain) < 2:
        raise PttError(
            f"the chain {name!r} has {len(chain)} block(s); checkpointing needs a chain of >= 2 blocks."
        )
    if isinstance(chain, nn.ModuleList):
        if budget_bytes is not None or segments is not None:
            raise PttError(
                f"{name!r} is an nn.ModuleList whose forward belongs to its parent: only per-block checkpointing "
                "is possible. Drop budget_bytes/segments, or make the chain an nn.Sequential."
            )
        for blk in chain:
            setattr(blk, "_ptt_checkpoint_forward", blk.forward)  # noqa: B010
            setattr(blk, "forward", types.MethodType(_block_forward, blk))  # noqa: B010
        plan = CheckpointPlan(name, len(chain), "per block", [(i, i + 1, True) for i in range(len(chain))])
    else:
        assert isinstance(chain, nn.Sequential)
        if segments is not None:
            runs = [(s, e, True) for s, e in uniform_runs(len(chain), segments)]
            plan = CheckpointPlan(name, len(chain), f"segments={segments}", runs)
        else:
            method = f"budget {budget_bytes} bytes" if budget_bytes else "sqrt(N) rule on measured bytes"
            plan = CheckpointPlan(name, len(chain), method, budget_bytes=budget_bytes)
        setattr(chain, "forward", types.MethodType(_sequential_forward, chain))  # noqa: B010
    setattr(chain, "_ptt_checkpoint_plan", plan)  # noqa: B010
    setattr(model, "_ptt_checkpoint_plan", plan)  # noqa: B010
    if example_inputs is not None and plan.pending:
        args = tuple(example_inputs) if isinstance(example_inputs, list | tuple) else (example_inputs,)
        first = next((a for a in args if isinstance(a, torch.Tensor)), torch.empty(0))
        with _side_effect_free(model, first), torch.enable_grad():
            model(*args)
    return model


def _is_detector(model: nn.Module) -> bool:
    """A torchvision detector (``GeneralizedRCNN``, RetinaNet, FCOS, SSD): a ``backbone`` module that takes the
    batched image tensor, and a ``transform`` that makes it from the lists the detector is called with."""
    return isinstance(getattr(model, "backbone", None), nn.Module) and isinstance(
        getattr(model, "transform", None), nn.Module
    )


def _checkpoint_detector(model: nn.Module, budget: Any, example_inputs: Any) -> nn.Module:
    """A torchvision detector: the module-tree planner on ``model.backbone`` (the feature extractor and FPN, where
    the activations of the image batch live), judged by the detector's whole training step: the heads' part of the
    step's peak (the box head's RoI features and their gradient, above what the backbone keeps) is headroom that
    the backbone's recomputation may use for free, so the plan keeps as little of the backbone as that allows.
    Planned at the detector's first training forward, or now on ``example_inputs=(images, targets)``; a batch
    tensor plans the backbone alone (its own peak, heads unknown). ``budget`` is the step's activation peak."""
    if getattr(model, "_ptt_checkpoint_plan", None) is not None:
        raise PttError("model is already checkpointed; build the model again to change the plan.")
    if isinstance(example_inputs, torch.Tensor) or (
        isinstance(example_inputs, list | tuple) and len(example_inputs) == 1
    ):
        _checkpoint_tree(model.backbone, budget, example_inputs)  # type: ignore[arg-type]
        model.__dict__["_ptt_checkpoint_plan"] = checkpoint_plan(model.backbone)  # type: ignore[arg-type]
        return model
    plan = _tree_plan(budget)
    model.backbone.__dict__["_ptt_checkpoint_plan"] = plan  # type: ignore[union-attr]
    model.__dict__["_ptt_checkpoint_plan"] = plan
    if example_inputs is None:
        model.__dict__["_ptt_pending_forward"] = model.__dict__.get("forward")
        model.forward = types.MethodType(_pending_detector_forward, model)  # type: ignore[method-assign]
        return model
    if not (isinstance(example_inputs, list | tuple) and len(example_inputs) == 2):
        raise PttError(
            "example_inputs of a detector: (images, targets) as its training forward takes them, or one batch "
            f"tensor for its backbone; got {type(example_inputs).__name__}."
        )
    try:
        _plan_detector(model, plan, *example_inputs)
    except BaseException:
        model.__dict__.pop("_ptt_checkpoint_plan")
        model.backbone.__dict__.pop("_ptt_checkpoint_plan")  # type: ignore[union-attr]
        raise
    return model


def _pending_detector_forward(self: nn.Module, images: Any, targets: Any = None) -> Any:
    """The detector's forward until its first training forward (images and targets): plan there, then run."""
    original = self.__dict__.pop("_ptt_pending_forward")
    if original is None:
        self.__dict__.pop("forward", None)
    else:
        self.__dict__["forward"] = original
    if torch.is_grad_enabled() and self.training and targets is not None:
        _plan_detector(self, self.__dict__["_ptt_checkpoint_plan"], images, targets)
    else:  # not a training forward: plan at the next one
        self.__dict__["_ptt_pending_forward"] = original
        self.__dict__["forward"] = types.MethodType(_pending_detector_forward, self)
        return (original or type(self).forward.__get__(self))(images, targets)
    return self.forward(images, targets)


def _plan_detector(model: nn.Module, plan: RegionPlan, images: Any, targets: Any) -> None:
    """Plan ``model.backbone`` on the batch tensor the detector's transform makes of ``images``, every plan judged
    by the peak of the detector's whole step on ``(images, targets)`` (buffers and RNG restored)."""
    first = images[0] if isinstance(images, list | tuple) and images else torch.empty(0)
    transform: Any = model.transform
    with side_effect_free(model, first), torch.no_grad():
        batch, targets = transform(list(images), [dict(t) for t in targets])
    # planned on the images at the detector's own size: its resize of full-size photos, the same under every plan,
    # stays out of the peaks measured (where it could hide the heads'); the values do not matter to a plan
    images = [batch.tensors[i, :, :h, :w] for i, (h, w) in enumerate(batch.image_sizes)]
    seen: list[torch.Tensor] = []
    hook = model.backbone.register_forward_pre_hook(  # type: ignore[union-attr]
        lambda _m, args: seen.append(args[0].detach()) if not seen else None
    )
    try:
        with side_effect_free(model, first), torch.enable_grad():
            model(images, targets)  # the batch tensor the backbone sees; first-call work out of the meter
    finally:
        hook.remove()
    if not seen or not isinstance(seen[0], torch.Tensor):
        raise PttError("checkpoint_activations_: the detector's backbone was not called with a batch tensor.")

    def step_peak() -> int:  # the gradients are allocated inside it, as in a training step
        return fwd_bwd_peak(model, (images, targets), {}, grads_in_step=True)[0]

    plan.scope = "the detector's whole step"
    with side_effect_free(model, first):
        make_plan(model.backbone, plan, (seen[0],), {}, outer=step_peak)  # type: ignore[arg-type]


def _has_chain(model: nn.Module) -> bool:
    return any(isinstance(m, nn.Sequential | nn.ModuleList) and len(m) >= 2 for m in model.modules())


def _checkpoint_tree(model: nn.Module, budget: int | float | str | None, example_inputs: Any) -> nn.Module:
    if getattr(model, "_ptt_checkpoint_plan", None) is not None:
        raise PttError("model is already checkpointed; build the model again to change the plan.")
    plan = _tree_plan(budget)
    model.__dict__["_ptt_checkpoint_plan"] = plan
    if example_inputs is not None:
        args = tuple(example_inputs) if isinstance(example_inputs, list | tuple) else (example_inputs,)
        try:
            make_plan(model, plan, args, {})
        except BaseException:
            model.__dict__.pop("_ptt_checkpoint_plan")  # nothing applied: the model is as it was
            raise
    else:
        plan_at_first_forward(model)
    return model


def _tree_plan(budget: int | float | str | None) -> RegionPlan:
    """An empty module-tree plan for ``budget`` (bytes, a share of the untreated peak in (0, 1], or "min")."""
    share = None
    if budget == "min":
        budget = None
    elif isinstance(budget, str):
        raise PttError(f"budget={budget!r}: pass bytes, a share in (0, 1] or 'min'.")
    if isinstance(budget, float):
        if not 0 < budget <= 1:
            raise PttError(
                f"budget={budget}: a share of the untreated activation peak is in (0, 1], e.g. 0.5."
            )
        share = budget
    elif budget is not None and (isinstance(budget, bool) or budget <= 0):
        raise PttError(f"budget must be positive bytes or a share in (0, 1], got {budget!r}.")
    method = "lowest modeled peak" if budget is None else (
        f"budget {share:.0%} of the untreated peak" if share is not None else f"budget {budget} bytes"
    )  # fmt: skip
    return RegionPlan(method, None if share is not None else budget, budget_share=share)  # type: ignore[arg-type]


def checkpoint_plan(model: nn.Module) -> CheckpointPlan | RegionPlan:
    """The plan ``checkpoint_activations_`` made for ``model``: segments, planned vs measured bytes.

    Example:
        >>> m = ptt.checkpoint_activations_(nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2)), segments=2)
        >>> ptt.checkpoint_plan(m).runs
        [(0, 1, True), (1, 2, True)]
    """
    plan = getattr(model, "_ptt_checkpoint_plan", None)
    if plan is None:
        raise PttError("model is not checkpointed; call ptt.checkpoint_activations_(model) first.")
    return plan


def _residual_mlp(depth: int, width: int) -> nn.Sequential:
    return nn.Sequential(*[_Residual(width) for _ in range(depth)])


class _Residual(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.f = nn.Sequential(nn.Linear(width, width), nn.ReLU(), nn.Linear(width, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.f(x)


def bench_case(size: str = "smoke", device: str = "cpu") -> BenchCase:
    """Training step of a deep residual MLP: unchecked vs the default (sqrt N) plan - time cost of the memory saved."""
    depth, width, batch = (16, 64, 128) if size == "smoke" else (64, 256, 512)
    dev = torch.device(device)
    torch.manual_seed(0)
    base = _residual_mlp(depth, width).to(dev)
    x = torch.randn(batch, width, device=dev)
    treated = checkpoint_activations_(copy.deepcopy(base), example_inputs=x)

    return train_step_case(
        base,
        treated,
        x,
        lr=None,
        unit="samples",
        description=f"{depth}-block residual MLP width {width}, batch {batch}: train step, unchecked vs sqrt(N) plan",
        check=lambda a, b: torch.testing.assert_close(b, a),
    )
