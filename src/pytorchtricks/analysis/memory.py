"""Where training memory goes: ``memory_breakdown``, ``estimate_memory`` and ``find_batch_size``.

A training step holds: parameters, gradients (one per trainable parameter), optimizer state (Adam: two per
parameter), the activations autograd saves for backward, and transient workspace. Parameters and gradients follow
from shapes. Everything else is measured on a copy of the model with one probe step: a forward under
``saved_tensors_hooks`` gives the exact saved bytes per module (storages counted once; parameters, buffers and the
input batch excluded: they are live anyway), the backward that follows runs under the allocator meter
(``clock.peak_memory``) with gradients already allocated, as in every step but the first, and two optimizer
steps give the state and the step's own temporaries (foreach/fused buffers, Adam's ``sqrt``/``div``).

The backward workspace is measured, not modelled, because the backend decides it: oneDNN picks a backward-weights
kernel per shape, ISA and thread count (limited to AVX2, ResNet-18's 512-channel 3x3 convs at 2x2 pixels fall back
to ``gemm:jit``, whose scratchpad holds several weight copies *per thread*, where ``jit:avx2`` at 4x4 pixels needs
none), and the gradients in flight scale with the batch. So the estimate holds for the thread count and ISA limits of the process that made it
(``ATEN_CPU_CAPABILITY``, ``ONEDNN_MAX_CPU_ISA``). The total is checked against the peak of live tensor bytes of a
real steady-state step (``measure_step_peak``) in the tests.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.utils._pytree import tree_flatten

from pytorchtricks.analysis._probe import ModuleTracker, as_args, check_module, display
from pytorchtricks.core import PttError, config_first, options_of

__all__ = [
    "BatchSizeConfig",
    "BatchSizeResult",
    "MemoryBreakdown",
    "estimate_memory",
    "find_batch_size",
    "memory_breakdown",
]

LossFn = Callable[[Any], torch.Tensor]
MiB = 2**20


def _default_loss(output: Any) -> torch.Tensor:
    outs = [t for t in tree_flatten(output)[0] if isinstance(t, torch.Tensor) and t.is_floating_point()]
    if not outs:
        raise PttError(
            "the model returned no floating-point tensor; pass loss_fn=lambda out: ... returning a scalar."
        )
    return sum(o.float().mean() for o in outs)  # type: ignore[return-value]


def _storage_key(t: torch.Tensor) -> tuple[int, int]:
    st = t.untyped_storage()
    return st.data_ptr(), st.nbytes()


def _unique_bytes(tensors: Sequence[torch.Tensor]) -> int:
    seen: dict[tuple[int, int], int] = {}
    for t in tensors:
        seen[_storage_key(t)] = t.untyped_storage().nbytes()
    return sum(seen.values())


@dataclass
class MemoryBreakdown:
    """Bytes of one training step by kind; ``per_module`` lists saved-activation bytes per module path.

    ``total_bytes`` = params + buffers + grads + optimizer state + input batch + the larger of the two transient
    peaks: backward (saved activations + ``backward_workspace_bytes``, the measured excess of the probe's forward +
    backward peak over them) and the optimizer step (``optimizer_workspace_bytes``, when the activations are already
    freed). ``measured_peak_bytes`` is the measured peak of live tensor bytes during a steady-state step (``None``
    when not measured) and ``peak_method`` says how it was measured.
    """

    param_bytes: int
    buffer_bytes: int
    grad_bytes: int
    optimizer_state_bytes: int
    activation_bytes: int
    input_bytes: int
    backward_workspace_bytes: int = 0
    optimizer_workspace_bytes: int = 0
    per_module: list[tuple[str, str, int]] = field(
        default_factory=list
    )  # (path, type, saved bytes), largest first
    measured_peak_bytes: int | None = None
    peak_method: str = ""
    # a model planned by ``checkpoint_activations_(model, budget=...)``: (region, mode, bytes it frees, recompute
    # seconds) per checkpointed region and the plan's one-line report (planned and measured activation peaks)
    checkpoint_regions: list[tuple[str, str, int, float]] = field(default_factory=list)
    checkpoint_plan: str = ""

    @property
    def workspace_bytes(self) -> int:
        """Transient bytes on top of the saved activations at the step's peak (backward or optimizer step)."""
        return max(self.backward_workspace_bytes, self.optimizer_workspace_bytes - self.activation_bytes, 0)

    @property
    def total_bytes(self) -> int:
        return (
            self.param_bytes
            + self.buffer_bytes
            + self.grad_bytes
            + self.optimizer_state_bytes
            + self.activation_bytes
            + self.input_bytes
            + self.workspace_bytes
        )

    def table(self, top: int = 15) -> str:
        lines = [f"{'module':<44} {'type':<20} {'saved MiB':>10} {'share':>6}"]
        for path, kind, nbytes in sorted(self.per_module, key=lambda r: -r[2])[:top]:
            share = nbytes / self.activation_bytes if self.activation_bytes else 0.0
            lines.append(f"{display(path)[:44]:<44} {kind[:20]:<20} {nbytes / MiB:>10.3f} {share:>6.1%}")
        return "\n".join(lines)

    def __str__(self) -> str:
        parts = [
            ("params", self.param_bytes),
            ("buffers", self.buffer_bytes),
            ("grads", self.grad_bytes),
            ("optimizer state", self.optimizer_state_bytes),
            ("activations (saved for backward)", self.activation_bytes),
            ("input batch", self.input_bytes),
            ("workspace (transient, measured)", self.workspace_bytes),
        ]
        lines = [f"{name:<34} {nbytes / MiB:>10.2f} MiB" for name, nbytes in parts]
        lines.append(
            f"{'  (backward / optimizer step)':<34} {self.backward_workspace_bytes / MiB:>10.2f} / "
            f"{self.optimizer_workspace_bytes / MiB:.2f} MiB"
        )
        lines.append(f"{'total (estimate)':<34} {self.total_bytes / MiB:>10.2f} MiB")
        if self.checkpoint_plan:  # what the saved-tensor hooks cannot see inside a checkpoint: the plan says
            lines.append(f"checkpointed: {self.checkpoint_plan}")
            lines += [
                f"  {display(name)[:40]:<40} {mode:<10} frees {freed / MiB:>8.2f} MiB, recompute {secs * 1e3:.1f} ms"
                for name, mode, freed, secs in self.checkpoint_regions
            ]
        if self.measured_peak_bytes is not None:
            err = self.total_bytes / self.measured_peak_bytes - 1 if self.measured_peak_bytes else 0.0
            lines.append(
                f"{'measured peak (' + self.peak_method + ')':<34} {self.measured_peak_bytes / MiB:>10.2f} MiB "
                f"(estimate {err:+.1%})"
            )
        return "\n".join(lines)


class _SavedByModule:
    """saved_tensors_hooks that attribute each newly saved storage to the module running when it was saved."""

    def __init__(
        self, tracker: ModuleTracker, exclude: set[tuple[int, int]], inputs: set[tuple[int, int]]
    ) -> None:
        self.tracker = tracker
        self.exclude = exclude
        self.inputs = inputs
        # (module path, bytes) per storage; no reference here keeps a saved tensor alive into the backward
        self.by_key: dict[tuple[int, int], tuple[str, int]] = {}
        self.input_bytes: dict[tuple[int, int], int] = {}

    def pack(self, t: torch.Tensor) -> torch.Tensor:
        key = _storage_key(t)
        if key in self.exclude:
            return t
        if key in self.inputs:
            self.input_bytes[key] = t.untyped_storage().nbytes()
        elif key not in self.by_key:
            self.by_key[key] = (self.tracker.current, t.untyped_storage().nbytes())
        return t


@dataclass(frozen=True)
class _Probe:
    activation_bytes: int  # saved for backward, parameters, buffers and the input excluded
    input_bytes: int  # the part of the input batch that is saved
    per_module: list[tuple[str, str, int]]
    peak_bytes: int  # peak of live bytes allocated during forward + backward (above what was live before)


def _device_of(model: nn.Module) -> torch.device:
    return next((p.device for p in model.parameters()), torch.device("cpu"))


def _probe_step(model: nn.Module, args: tuple[Any, ...], loss_fn: LossFn) -> _Probe:
    """One forward (saved bytes per module) and backward on ``model`` - a copy - under the allocator meter.

    Gradients are allocated first, as in every step but the first: backward then adds each new gradient into
    ``.grad`` and frees it, so the peak holds only the backend's own transients (kernel scratchpads, the gradients
    in flight, reorders) on top of the saved activations that have not been freed yet.
    """
    from pytorchtricks.clock import peak_memory

    for p in model.parameters():
        if p.requires_grad and p.grad is None:
            p.grad = torch.zeros_like(p)
    exclude = {_storage_key(t) for t in [*model.parameters(), *model.buffers()]}
    inputs = {_storage_key(t) for t in tree_flatten(args)[0] if isinstance(t, torch.Tensor)}
    tracker = ModuleTracker(model)
    saver = _SavedByModule(tracker, exclude, inputs)

    def step() -> None:
        with tracker, torch.autograd.graph.saved_tensors_hooks(saver.pack, lambda t: t):
            loss = loss_fn(model(*args))
        if loss.requires_grad:  # the graph (and the saved tensors) go with the loss, inside the meter
            loss.backward()

    peak = peak_memory(step, _device_of(model)).peak_bytes
    per: dict[str, int] = {}
    for path, nbytes in saver.by_key.values():
        per[path] = per.get(path, 0) + nbytes
    modules = dict(model.named_modules())
    rows = sorted(((p, type(modules.get(p, model)).__name__, b) for p, b in per.items()), key=lambda r: -r[2])
    return _Probe(sum(per.values()), sum(saver.input_bytes.values()), rows, peak)


def _copy_with_optimizer(
    model: nn.Module, optimizer: torch.optim.Optimizer | None
) -> tuple[nn.Module, torch.optim.Optimizer | None]:
    """A deep copy of the model and a fresh optimizer of the same class and hyper-parameters over the copy."""
    clone = copy.deepcopy(model)
    if optimizer is None:
        return clone, None
    mapping = {id(p): q for p, q in zip(model.parameters(), clone.parameters())}
    groups = []
    for g in optimizer.param_groups:
        missing = [p for p in g["params"] if id(p) not in mapping]
        if missing:
            raise PttError(
                "the optimizer holds parameters that are not the model's; build it from model.parameters()."
            )
        groups.append(
            {**{k: v for k, v in g.items() if k != "params"}, "params": [mapping[id(p)] for p in g["params"]]}
        )
    try:  # every group carries all its hyper-parameters; defaults only fill what a group lacks
        return clone, type(optimizer)(groups)  # type: ignore[call-arg]
    except TypeError:  # optimizers whose constructor insists on lr=
        return clone, type(optimizer)(groups, lr=optimizer.defaults.get("lr"))  # type: ignore[call-arg]


def _state_bytes(optimizer: torch.optim.Optimizer) -> int:
    return _unique_bytes(
        [t for s in optimizer.state.values() for t in tree_flatten(s)[0] if isinstance(t, torch.Tensor)]
    )


def _optimizer_probe(
    clone: nn.Module, opt: torch.optim.Optimizer | None, original: torch.optim.Optimizer | None
) -> tuple[int, int]:
    """(state bytes, transient bytes of one step) from two steps of ``opt`` over ``clone`` with zero gradients.

    The transient (foreach/fused temporaries; the single-tensor Adam's ``sqrt``/``div`` of each parameter) is
    measured on the second step, when the state exists.
    """
    from pytorchtricks.clock import peak_memory

    if opt is None or original is None:
        return 0, 0
    for p in clone.parameters():
        if p.requires_grad:
            p.grad = torch.zeros_like(p)
    opt.step()
    transient = peak_memory(opt.step, _device_of(clone)).peak_bytes
    return (_state_bytes(original) if original.state else _state_bytes(opt)), transient


def estimate_memory(
    model: nn.Module,
    example_batch: Any,
    optimizer: torch.optim.Optimizer | None = None,
    *,
    loss_fn: LossFn | None = None,
) -> MemoryBreakdown:
    """Estimate a training step's memory: params, grads, optimizer state, activations, workspace, total.

    One probe step on a copy of the model measures what the backend allocates: a forward and backward of
    ``example_batch`` (saved activations per module, the backward's transient peak) and two optimizer steps (state
    and its temporaries). ``example_batch`` is the model input (a tensor or a tuple of positional arguments);
    ``loss_fn(output)`` makes the scalar to differentiate (default: mean of the floating outputs; a real loss adds
    negligible memory). The model and optimizer are left unchanged. The workspace is the one of this process's
    kernels: its thread count and ISA limits (oneDNN's scratchpads are per thread).

    Example:
        >>> m = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 10))
        >>> est = ptt.estimate_memory(m, torch.randn(32, 64), torch.optim.Adam(m.parameters()))
        >>> est.grad_bytes == est.param_bytes, est.optimizer_state_bytes >= 2 * est.param_bytes
        (True, True)
    """
    check_module(model)
    args = as_args(example_batch)
    loss_fn = loss_fn or _default_loss
    params = list({id(p): p for p in model.parameters()}.values())
    clone, opt = _copy_with_optimizer(model, optimizer)
    probe = _probe_step(clone, args, loss_fn)
    state_bytes, optimizer_ws = _optimizer_probe(clone, opt, optimizer)
    return MemoryBreakdown(
        param_bytes=_unique_bytes(params),
        buffer_bytes=_unique_bytes(list(model.buffers())),
        grad_bytes=sum(p.nbytes for p in params if p.requires_grad),
        optimizer_state_bytes=state_bytes,
        activation_bytes=probe.activation_bytes,
        input_bytes=probe.input_bytes,
        backward_workspace_bytes=max(probe.peak_bytes - probe.activation_bytes, 0),
        optimizer_workspace_bytes=optimizer_ws,
        per_module=probe.per_module,
    )


def measure_step_peak(
    model: nn.Module,
    example_batch: Any,
    optimizer: torch.optim.Optimizer | None = None,
    *,
    loss_fn: LossFn | None = None,
    device: str | torch.device = "cpu",
) -> tuple[int, str]:
    """Measured peak bytes of a steady-state training step on a copy: live before the step + peak inside it.

    The step is ``zero_grad(set_to_none=False)``, forward, backward, ``optimizer.step()`` after one warm-up step
    (so gradients and optimizer state already exist, as in every step but the first).
    """
    from pytorchtricks.clock import peak_memory

    args = as_args(example_batch)
    loss_fn = loss_fn or _default_loss
    clone, opt = _copy_with_optimizer(model, optimizer)

    def step() -> None:
        if opt is not None:
            opt.zero_grad(set_to_none=False)
        else:
            clone.zero_grad(set_to_none=False)
        loss_fn(clone(*args)).backward()
        if opt is not None:
            opt.step()

    step()  # creates grads and optimizer state
    live = [*clone.parameters(), *clone.buffers()]
    live += [p.grad for p in clone.parameters() if p.grad is not None]
    before = _unique_bytes(live) + (_state_bytes(opt) if opt is not None else 0)
    before += _unique_bytes([t for t in tree_flatten(args)[0] if isinstance(t, torch.Tensor)])
    result = peak_memory(step, device)
    return before + result.peak_bytes, result.method


def memory_breakdown(
    model: nn.Module,
    example_batch: Any,
    optimizer: torch.optim.Optimizer | None = None,
    *,
    loss_fn: LossFn | None = None,
    measure_peak: bool = True,
) -> MemoryBreakdown:
    """``estimate_memory`` plus the per-module activation table and the measured peak of a real step.

    ``print(result)`` shows the parts and the estimate's error against the measured peak; ``result.table()``
    lists the modules that save the most bytes for backward. For a model planned by
    ``ptt.checkpoint_activations_(model, budget=...)`` it also lists, region by region, what the plan frees and
    what its recomputation costs (``checkpoint_regions``): the saved-tensor hooks do not see inside a checkpoint
    (its own hooks take over there), so ``activation_bytes`` counts what the unchecked part saves and the measured
    peak is the one to read.

    Example:
        >>> m = nn.Sequential(nn.Conv2d(3, 16, 3), nn.ReLU(), nn.Flatten(), nn.Linear(16 * 30 * 30, 10))
        >>> b = ptt.memory_breakdown(m, torch.randn(8, 3, 32, 32))
        >>> b.per_module[0][:2], b.activation_bytes == 8 * 16 * 30 * 30 * 4  # ReLU output, saved once
        (('1', 'ReLU'), True)
    """
    est = estimate_memory(model, example_batch, optimizer, loss_fn=loss_fn)
    plan = getattr(model, "_ptt_checkpoint_plan", None)
    if plan is not None and not getattr(plan, "pending", True) and hasattr(plan, "table"):
        est.checkpoint_regions, est.checkpoint_plan = list(plan.regions), str(plan)
    if measure_peak:
        device = next((p.device for p in model.parameters()), torch.device("cpu"))
        est.measured_peak_bytes, est.peak_method = measure_step_peak(
            model, example_batch, optimizer, loss_fn=loss_fn, device=device
        )
    return est


# ----------------------------------------------------------------------------------------------- batch size


@dataclass
class BatchSizeResult:
    """Outcome of ``find_batch_size``: the chosen size and every candidate's prediction and measured speed."""

    batch_size: int
    samples_per_s: float
    budget_bytes: int
    rows: list[dict[str, Any]]  # batch_size, predicted_bytes, fits, samples_per_s (None when not timed)

    def __str__(self) -> str:
        lines = [f"{'batch':>6} {'predicted MiB':>14} {'fits':>5} {'samples/s':>10}"]
        for r in self.rows:
            sps = f"{r['samples_per_s']:.1f}" if r.get("samples_per_s") else "-"
            mark = "  <- chosen" if r["batch_size"] == self.batch_size else ""
            lines.append(
                f"{r['batch_size']:>6} {r['predicted_bytes'] / MiB:>14.1f} {('yes' if r['fits'] else 'no'):>5} {sps:>10}{mark}"
            )
        lines.append(
            f"fastest fitting batch size: {self.batch_size} ({self.samples_per_s:.1f} samples/s, budget "
            f"{self.budget_bytes / MiB:.0f} MiB)"
        )
        return "\n".join(lines)


def _predict_bytes(e1: MemoryBreakdown, e2: MemoryBreakdown, n1: int, n2: int, n: int) -> int:
    """Bytes of a step at batch ``n`` from the estimates at batches ``n1`` < ``n2``.

    The input and the backward's peak (saved activations + backward workspace: gradients in flight grow with the
    batch, kernel scratchpads may not) are extrapolated linearly; weights, grads, optimizer state and the optimizer
    step's temporaries do not depend on the batch. At ``n1`` and ``n2`` this is exactly ``total_bytes``.
    """

    def at(part: Callable[[MemoryBreakdown], int]) -> float:
        return part(e1) + (part(e2) - part(e1)) * (n - n1) / (n2 - n1)

    fixed = e2.param_bytes + e2.buffer_bytes + e2.grad_bytes + e2.optimizer_state_bytes
    backward = at(lambda e: e.activation_bytes + e.backward_workspace_bytes)
    optimizer = max(e1.optimizer_workspace_bytes, e2.optimizer_workspace_bytes)
    return int(fixed + max(at(lambda e: e.input_bytes), 0.0) + max(backward, optimizer, 0.0))


def _snap8(n: int) -> int:
    return max(8, n // 8 * 8)


def _default_candidates(max_batch: int) -> list[int]:
    out, b = [], 8
    while b <= max_batch:
        out.append(b)
        b *= 2
    if max_batch >= 8 and _snap8(max_batch) not in out:
        out.append(_snap8(max_batch))
    return out


@dataclass(frozen=True)
class BatchSizeConfig:
    """``find_batch_size``'s options as one value: ``ptt.find_batch_size(m, make_batch, opt,
    ptt.BatchSizeConfig(budget_bytes=2**30))``, or its fields as keywords (``budget_bytes=2**30``).

    ``budget_bytes``: the memory a step may peak at (required). ``loss_fn``: the loss of the model's output
    (default: its mean). ``max_batch``: the largest candidate (default candidates: multiples of 8 up to it).
    ``candidates``: the batch sizes to try instead (snapped down to multiples of 8). ``min_run_time_s``: timing per
    candidate. ``device``: where the steps run.

    Example:
        >>> cfg = ptt.BatchSizeConfig(budget_bytes=2**22, candidates=(8, 16), min_run_time_s=0.01)
        >>> ptt.find_batch_size(nn.Linear(8, 2), lambda n: torch.randn(n, 8), None, cfg).batch_size in (8, 16)
        True
    """

    budget_bytes: int
    loss_fn: LossFn | None = None
    max_batch: int = 512
    candidates: Sequence[int] | None = None
    min_run_time_s: float = 0.2
    device: str | torch.device = "cpu"


@options_of(BatchSizeConfig)
def find_batch_size(
    model: nn.Module,
    make_batch: Callable[[int], Any],
    optimizer: torch.optim.Optimizer | None = None,
    config: BatchSizeConfig | None = None,
    **options: Any,
) -> BatchSizeResult:
    """Pick the *fastest* batch size (samples/s) whose training step fits ``budget_bytes``, in multiples of 8.

    Memory per candidate is predicted from two probes (the backward's measured peak grows linearly with the
    batch, the optimizer's part does not); every candidate that fits is timed (a few training steps on a copy of
    the model, ``clock``), and the winner is checked by running a real step and measuring its peak (falling
    back to the next fastest if it does not fit).
    ``make_batch(n)`` returns the model input for batch size ``n``. The model and optimizer are left unchanged.
    The options are ``BatchSizeConfig``'s fields: one ``config``, or its fields as keywords (not both).

    Example:
        >>> m = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4))
        >>> r = ptt.find_batch_size(m, lambda n: torch.randn(n, 32), budget_bytes=2**22, max_batch=64,
        ...                         min_run_time_s=0.01)
        >>> r.batch_size % 8 == 0 and r.batch_size <= 64
        True
    """
    from pytorchtricks.clock import measure

    cfg = config_first(config, BatchSizeConfig, options)
    budget_bytes, loss_fn, device = cfg.budget_bytes, cfg.loss_fn, cfg.device
    check_module(model)
    if budget_bytes <= 0:
        raise PttError(f"budget_bytes must be positive, got {budget_bytes}.")
    cands = sorted({_snap8(c) for c in (cfg.candidates or _default_candidates(cfg.max_batch))})
    small, big = cands[0], max(cands[0] * 2, 16)
    e1 = estimate_memory(model, make_batch(small), optimizer, loss_fn=loss_fn)
    e2 = estimate_memory(model, make_batch(big), optimizer, loss_fn=loss_fn)
    rows: list[dict[str, Any]] = []
    for b in cands:
        predicted = _predict_bytes(e1, e2, small, big, b)
        rows.append(
            {
                "batch_size": b,
                "predicted_bytes": predicted,
                "fits": predicted <= budget_bytes,
                "samples_per_s": None,
            }
        )
    fitting = [r for r in rows if r["fits"]]
    if not fitting:
        raise PttError(
            f"no batch size in {cands} fits {budget_bytes / MiB:.0f} MiB (batch {cands[0]} needs "
            f"~{rows[0]['predicted_bytes'] / MiB:.0f} MiB); raise the budget or shrink the model/input."
        )
    loss = loss_fn or _default_loss
    for r in fitting:
        clone, opt = _copy_with_optimizer(model, optimizer)
        args = as_args(make_batch(r["batch_size"]))

        def step(clone: nn.Module = clone, opt: Any = opt, args: tuple[Any, ...] = args) -> None:
            clone.zero_grad(set_to_none=True)
            loss(clone(*args)).backward()
            if opt is not None:
                opt.step()

        stats = measure(step, device=device, min_run_time_s=cfg.min_run_time_s, warmup=1)
        r["samples_per_s"] = r["batch_size"] / stats.median_s
    for r in sorted(fitting, key=lambda r: -r["samples_per_s"]):
        peak, _ = measure_step_peak(
            model, make_batch(r["batch_size"]), optimizer, loss_fn=loss_fn, device=device
        )
        r["measured_bytes"] = peak
        if peak <= budget_bytes and math.isfinite(r["samples_per_s"]):
            return BatchSizeResult(r["batch_size"], r["samples_per_s"], budget_bytes, rows)
        r["fits"] = False
    raise PttError(
        f"every predicted-fitting batch size exceeded {budget_bytes / MiB:.0f} MiB when measured; raise the budget."
    )
