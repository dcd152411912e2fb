"""Gradient accumulation that equals the big batch: K micro-steps, one optimizer step, no_sync under DDP.

Why: a batch that does not fit in memory can be split into K micro-batches whose gradients are summed before one
optimizer step - but only if (a) each micro-batch loss is weighted by its share of the samples (or tokens), not
averaged per micro-batch, (b) DDP skips the all-reduce on the K-1 non-final micro-steps (``no_sync``) and (c) the
optimizer, GradScaler and LR scheduler step once per K, not per micro-step. This helper does all three.
When: batch sizes beyond memory (large models, high resolution), matching a recipe's batch on fewer devices.
Caveats: BatchNorm computes statistics per micro-batch, so a BN model is NOT equivalent to the big batch (a
warning says so; use GroupNorm/LayerNorm, freeze_ the BN layers, or accept it). Pass ``weight=`` (samples or
tokens in the micro-batch) when micro-batches differ in size; the loss you pass must be the micro-batch *mean*.
Under DDP the forward of each micro-step must happen inside the ``with`` block (no_sync is entered for it).
``check_accumulation`` measures the gradient difference on your own model.
See also: mixed_precision, scale_lr, distributed, 节省显存 / 梯度累加.
"""

from __future__ import annotations

import contextlib
import copy
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from pytorchtricks.core import BenchCase, PttError, TrickInfo
from pytorchtricks.tunable import TuneFacts, TuneHook, TuneSetup

__all__ = ["accumulate_gradients", "check_accumulation"]

TRICK = TrickInfo(gains=("memory",), phase=("train",), exact=True)

TUNE_STEPS = (2, 4, 8)  # micro-batches per optimizer step that tune tries (the batch stays the user's)
MIN_MICRO_BATCH = 2  # a micro-batch of one sample leaves BatchNorm a single value per channel at 1x1


def _tune_applies(k: int, facts: TuneFacts) -> str | None:
    if facts.batch_size and facts.batch_size // k < MIN_MICRO_BATCH:
        return f"batch {facts.batch_size} split {k} ways leaves micro-batches under {MIN_MICRO_BATCH} samples"
    return None


def _tune_apply(k: int, setup: TuneSetup, state: object) -> None:
    setup.micro_batches = k
    setup.accumulate = lambda model, optimizer, precision: accumulate_gradients(
        model, optimizer, steps=k, precision=precision
    )


def _hook(k: int) -> TuneHook:
    return TuneHook(
        changes="step",
        check="exact",
        receipt=f"acc = ptt.accumulate_gradients(model, optimizer, steps={k}, precision=mp)  # once, before the loop",
        loop=(
            "{receipt}\n"
            "for x, y in loader:  # the batch of {batch_size} in "
            f"{k} micro-batches, one optimizer step\n"
            "    x = x.to(device, non_blocking=True)\n"
            "    with acc:\n"
            f"        for xm, ym in zip(x.tensor_split({k}), y.tensor_split({k})):\n"
            "            with mp.autocast():\n"
            "                loss = loss_fn(model(xm), ym)\n"
            f"            acc.backward(loss, weight=len(xm))  # the {k}th steps the optimizer (and zeroes the grads)"
        ),
        apply=lambda setup, state: _tune_apply(k, setup, state),
        applies=lambda facts: _tune_applies(k, facts),
        order=5,  # first: the model rewrites after it (a checkpoint plan) are planned for the micro-batch
        tasks=("classification", "detection"),  # a detector: K micro-batches of images, its loss dict each
        detection_loop=(
            "{receipt}\n"
            "for batch in loader:  # the batch of {batch_size} images in "
            f"{k} micro-batches, one optimizer step\n"
            "    {detection_inputs}\n"
            "    with acc:\n"
            f"        for idx in torch.arange(len(images)).tensor_split({k}):  # {k} micro-batches, as x.tensor_split\n"
            "            ims, tgs = [images[i] for i in idx], [targets[i] for i in idx]\n"
            "            with mp.autocast():\n"
            "                loss = sum(model(ims, tgs).values())  # the detector's loss dict\n"
            f"            acc.backward(loss, weight=len(ims))  # the {k}th steps the optimizer"
        ),
        group="micro-batch",
        variant=str(k),
        bound="the update equals the whole batch's within 1e-5 relative with BatchNorm in eval mode; BatchNorm's "
        "micro-batch statistics are the one known difference, measured in train mode",
    )


TUNE = tuple(_hook(k) for k in TUNE_STEPS)


class accumulate_gradients:
    """Context manager: ``acc.backward(loss)`` K times, the optimizer steps after the K-th.

    Args:
        model: the model (a DDP/FSDP wrapper gets ``no_sync`` on non-final micro-steps).
        optimizer: stepped once per ``steps`` backward calls, then ``zero_grad(set_to_none=True)``.
        steps: micro-steps per optimizer step (K).
        precision: a ``ptt.mixed_precision`` object: its scaler scales, unscales and steps.
        scheduler: an LR scheduler stepped once per optimizer step that was taken.
        clip_grad_norm: clip the (unscaled, normalized) gradient norm to this value before stepping.
        flush_partial: at exit, step on a partial cycle (normalized by its own weight) instead of dropping it.

    Example:
        >>> model = nn.Linear(4, 1)
        >>> opt = torch.optim.SGD(model.parameters(), lr=0.1)
        >>> x, y = torch.randn(8, 4), torch.randn(8, 1)
        >>> with ptt.accumulate_gradients(model, opt, steps=4) as acc:
        ...     for xb, yb in zip(x.chunk(4), y.chunk(4)):
        ...         _ = acc.backward(nn.functional.mse_loss(model(xb), yb))
        >>> acc.optimizer_steps
        1
    """

    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        steps: int = 4,
        *,
        precision: Any = None,
        scheduler: Any = None,
        clip_grad_norm: float | None = None,
        flush_partial: bool = True,
    ) -> None:
        if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
            raise PttError(f"steps must be an integer >= 1 (micro-steps per optimizer step), got {steps!r}.")
        self.model, self.optimizer, self.steps = model, optimizer, steps
        self.precision, self.scheduler = precision, scheduler
        self.clip_grad_norm, self.flush_partial = clip_grad_norm, flush_partial
        self.optimizer_steps = 0
        self.skipped_steps = 0
        self._count = 0
        self._total = 0.0
        self._weighted = False
        self._no_sync: contextlib.ExitStack | None = None
        self._synced_last = True
        bns = [
            n
            for n, m in model.named_modules()
            if isinstance(m, nn.modules.batchnorm._BatchNorm) and m.training
        ]
        if steps > 1 and bns:
            warnings.warn(
                f"accumulate_gradients: {len(bns)} BatchNorm layer(s) (e.g. {bns[0]!r}) see micro-batches, so "
                "K micro-steps are NOT the full batch (statistics per micro-batch). Fixes: GroupNorm/LayerNorm, "
                "ptt.freeze_ the BN layers, or a larger micro-batch.",
                UserWarning,
                stacklevel=2,
            )

    # -- no_sync handling: entered before the forward of every non-final micro-step -----------------------------
    def _enter_no_sync(self) -> None:
        if self._no_sync is None and self.steps > 1 and hasattr(self.model, "no_sync"):
            self._no_sync = contextlib.ExitStack()
            self._no_sync.enter_context(getattr(self.model, "no_sync")())  # noqa: B009 - DDP/FSDP only

    def _exit_no_sync(self) -> None:
        if self._no_sync is not None:
            self._no_sync.close()
            self._no_sync = None

    def __enter__(self) -> accumulate_gradients:
        self._enter_no_sync()
        return self

    def backward(self, loss: torch.Tensor, weight: float | int | torch.Tensor | None = None) -> bool:
        """Backward of one micro-batch's mean ``loss`` with ``weight`` (its samples or tokens; default 1).

        Returns True when this call stepped the optimizer (every ``steps``-th call).
        """
        if loss.dim() != 0:
            raise PttError(
                f"backward needs the scalar mean loss of the micro-batch, got shape {tuple(loss.shape)}."
            )
        if weight is not None:
            w = float(weight)
            if not w > 0:
                raise PttError(
                    f"weight must be the positive number of samples/tokens in the micro-batch, got {w}."
                )
            self._weighted = True
        else:
            w = 1.0
        self._synced_last = self._no_sync is None
        scaled = loss * w if w != 1.0 else loss
        if self.precision is not None:
            self.precision.backward(scaled)
        else:
            scaled.backward()
        self._count += 1
        self._total += w
        if self._count >= self.steps - 1:
            self._exit_no_sync()  # the final micro-step's forward and backward all-reduce
        if self._count == self.steps:
            self._step()
            self._enter_no_sync()
            return True
        return False

    def _params(self) -> list[torch.Tensor]:
        return [p for g in self.optimizer.param_groups for p in g["params"] if p.grad is not None]

    def _step(self) -> None:
        params = self._params()
        grads = [p.grad for p in params if p.grad is not None]
        if self.precision is not None:
            self.precision.unscale_(self.optimizer)
        dist = torch.distributed
        distributed = dist.is_available() and dist.is_initialized() and hasattr(self.model, "no_sync")
        total = self._total
        if distributed and not self._synced_last:  # partial cycle flushed under no_sync: sync by hand
            world = dist.get_world_size()
            for grad in grads:
                dist.all_reduce(grad)
                grad.div_(world)
        if distributed and self._weighted:
            # DDP averages sum_i(w_i g_i) over ranks; the full batch divides by the weight of ALL ranks
            t = torch.tensor([total], dtype=torch.float64, device=params[0].device if params else "cpu")
            dist.all_reduce(t)
            total = t.item() / dist.get_world_size()
        if total != 1.0 and params:
            torch._foreach_div_(grads, total)
        if self.clip_grad_norm is not None:
            nn.utils.clip_grad_norm_(params, self.clip_grad_norm)
        if self.precision is not None:
            taken = bool(self.precision.step(self.optimizer))
        else:
            self.optimizer.step()
            taken = True
        if taken and self.scheduler is not None:
            self.scheduler.step()
        self.skipped_steps += int(not taken)
        self.optimizer_steps += 1
        self.optimizer.zero_grad(set_to_none=True)
        self._count, self._total, self._weighted = 0, 0.0, False

    def __exit__(self, exc_type: Any, *exc: object) -> None:
        self._exit_no_sync()
        if exc_type is None and self._count:
            if self.flush_partial:
                self._step()
            else:
                self.optimizer.zero_grad(set_to_none=True)
                self._count, self._total = 0, 0.0


@dataclass
class AccumulationCheck:
    """Result of ``check_accumulation``: full-batch vs K-micro-step gradients on the user's model."""

    steps: int
    max_abs_diff: float
    max_rel_diff: float  # max |g_full - g_acc| / max |g_full| over parameters
    worst_param: str
    batchnorm_layers: int
    ok: bool

    def __str__(self) -> str:
        verdict = "equivalent" if self.ok else "NOT equivalent"
        bn = (
            f"; {self.batchnorm_layers} BatchNorm layer(s) see micro-batches" if self.batchnorm_layers else ""
        )
        return (
            f"{self.steps} micro-steps vs one full batch: {verdict} (max |dgrad| {self.max_abs_diff:.3g}, "
            f"relative {self.max_rel_diff:.3g} at {self.worst_param}{bn})"
        )


def check_accumulation(
    model: nn.Module,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    inputs: torch.Tensor,
    targets: torch.Tensor,
    *,
    steps: int = 4,
    rtol: float = 1e-4,
) -> AccumulationCheck:
    """Compare the gradients of one full batch with ``steps`` sample-weighted micro-steps (model untouched).

    Example:
        >>> r = ptt.check_accumulation(nn.Linear(3, 1), nn.functional.mse_loss, torch.randn(8, 3), torch.randn(8, 1))
        >>> r.ok
        True
    """
    if len(inputs) < steps:
        raise PttError(
            f"need at least {steps} samples to split into {steps} micro-batches, got {len(inputs)}."
        )
    full, acc = copy.deepcopy(model), copy.deepcopy(model)
    loss_fn(full(inputs), targets).backward()
    for xb, yb in zip(inputs.tensor_split(steps), targets.tensor_split(steps)):
        (loss_fn(acc(xb), yb) * len(xb)).backward()
    worst, worst_abs, worst_rel = "-", 0.0, 0.0
    for (name, p), q in zip(full.named_parameters(), acc.parameters()):
        if p.grad is None or q.grad is None:
            continue
        diff = (p.grad - q.grad / len(inputs)).abs().max().item()
        rel = diff / max(p.grad.abs().max().item(), 1e-30)
        if rel >= worst_rel:
            worst, worst_abs, worst_rel = name, diff, rel
    bns = sum(isinstance(m, nn.modules.batchnorm._BatchNorm) and m.training for m in model.modules())
    return AccumulationCheck(steps, worst_abs, worst_rel, worst, bns, worst_rel <= rtol)


def bench_case(size: str = "smoke", device: str = "cpu") -> BenchCase:
    """One optimizer step over a batch: full batch at once vs 4 accumulated micro-batches (memory trick)."""
    batch, width = (64, 256) if size == "smoke" else (512, 1024)
    dev = torch.device(device)
    torch.manual_seed(0)
    base = nn.Sequential(
        nn.Linear(width, width), nn.GELU(), nn.Linear(width, width), nn.GELU(), nn.Linear(width, 10)
    )
    base = base.to(dev)
    treated = copy.deepcopy(base)
    x = torch.randn(batch, width, device=dev)
    y = torch.randint(0, 10, (batch,), device=dev)
    opts = {id(m): torch.optim.SGD(m.parameters(), lr=0.01) for m in (base, treated)}

    def full_step() -> torch.Tensor:
        loss = nn.functional.cross_entropy(base(x), y)
        loss.backward()
        opts[id(base)].step()
        opts[id(base)].zero_grad(set_to_none=True)
        return loss.detach()

    def acc_step() -> torch.Tensor:
        with accumulate_gradients(treated, opts[id(treated)], steps=4) as acc:
            for xb, yb in zip(x.chunk(4), y.chunk(4)):
                loss = nn.functional.cross_entropy(treated(xb), yb)
                acc.backward(loss)
        return loss.detach()

    return BenchCase(
        baseline=full_step,
        treated=acc_step,
        items_per_call=batch,
        unit="samples",
        device=str(dev),
        description=f"MLP width {width}, batch {batch}: one step vs 4 accumulated micro-steps",
    )
