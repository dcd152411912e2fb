"""Scale the learning rate with the batch size (linear or square-root rule) and warm it up (Goyal et al. 2017).

Why: a k-times larger batch takes k-times fewer steps; to cover the same distance SGD needs about k-times the
learning rate (linear rule, Goyal et al.), adaptive optimizers such as Adam about sqrt(k) (Krizhevsky 2014; Hoffer
et al.). The large rate is unstable at the start, so ramp up to it over a few epochs (gradual warmup).
When: changing the batch size of a recipe tuned at another batch size; multi-GPU scaling; gradient accumulation
(the effective batch is micro-batch x steps x world size).
Caveats: a rule of thumb, not a law: beyond ~8k images (ImageNet/ResNet) linear scaling breaks down (use LARS/LAMB).
Warmup of ~5 epochs in Goyal et al.; the schedule multiplies whatever schedule follows, via ``LambdaLR``.
See also: accumulate_gradients, 训练策略 / 大 batch 与学习率.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import nn

from pytorchtricks.core import BenchCase, PttError, TrickInfo

__all__ = ["scale_lr", "warmup_schedule"]

TRICK = TrickInfo(gains=("accuracy",), phase=("train",), exact=True)


def scale_lr(base_lr: float, base_batch: int, batch: int, rule: str = "linear") -> float:
    """The learning rate for ``batch`` given one tuned at ``base_batch``: ``linear`` (SGD) or ``sqrt`` (Adam).

    Example:
        >>> ptt.scale_lr(0.1, 256, 1024)
        0.4
        >>> ptt.scale_lr(1e-3, 256, 1024, rule="sqrt")
        0.002
    """
    if base_lr <= 0 or not math.isfinite(base_lr):
        raise PttError(f"base_lr must be a positive number, got {base_lr!r}.")
    if base_batch <= 0 or batch <= 0:
        raise PttError(f"batch sizes must be positive, got base_batch={base_batch}, batch={batch}.")
    k = batch / base_batch
    if rule == "linear":
        return base_lr * k
    if rule == "sqrt":
        return base_lr * math.sqrt(k)
    raise PttError(
        f"unknown rule {rule!r}; use 'linear' (SGD, Goyal et al.) or 'sqrt' (Adam-type optimizers)."
    )


def warmup_schedule(
    optimizer: torch.optim.Optimizer,
    warmup_steps: int,
    *,
    start_factor: float = 0.1,
    after: Callable[[int], float] | None = None,
) -> torch.optim.lr_scheduler.LambdaLR:
    """Linear warmup from ``start_factor * lr`` to ``lr`` over ``warmup_steps`` steps, then ``after(step)``.

    ``after`` is a multiplier of the step counted from the end of warmup (default: constant 1). Call
    ``scheduler.step()`` once per optimizer step. Goyal et al. start at the small-batch rate: pass
    ``start_factor = base_lr / scaled_lr``.

    Example:
        >>> opt = torch.optim.SGD(nn.Linear(2, 2).parameters(), lr=0.4)
        >>> sched = ptt.warmup_schedule(opt, 4, start_factor=0.25)
        >>> lrs = []
        >>> for _ in range(6):
        ...     lrs.append(round(opt.param_groups[0]["lr"], 3)); opt.step(); sched.step()
        >>> lrs
        [0.1, 0.175, 0.25, 0.325, 0.4, 0.4]
    """
    if warmup_steps < 0:
        raise PttError(f"warmup_steps must be >= 0, got {warmup_steps}.")
    if not 0 < start_factor <= 1:
        raise PttError(f"start_factor must be in (0, 1], got {start_factor}; it multiplies the target lr.")

    def factor(step: int) -> float:
        if step < warmup_steps:
            return start_factor + (1.0 - start_factor) * step / warmup_steps
        return after(step - warmup_steps) if after is not None else 1.0

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def bench_case(size: str = "smoke", device: str = "cpu") -> BenchCase:
    """The cost of the schedule itself: an SGD step without vs with ``warmup_schedule().step()`` (negligible)."""
    width = 64 if size == "smoke" else 512
    dev = torch.device(device)
    torch.manual_seed(0)
    model = nn.Linear(width, width).to(dev)
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    opt_a = torch.optim.SGD(model.parameters(), lr=scale_lr(0.1, 256, 1024))
    opt_b = torch.optim.SGD(model.parameters(), lr=scale_lr(0.1, 256, 1024))
    sched = warmup_schedule(opt_b, 10**9, start_factor=0.25)

    def treated() -> None:
        opt_b.step()
        sched.step()

    return BenchCase(
        baseline=opt_a.step,
        treated=treated,
        items_per_call=1,
        unit="steps",
        device=str(dev),
        description=f"SGD step on Linear({width}, {width}) with zero grads, plus a warmup scheduler step",
    )
