"""Find where two runs from the same seed part ways: ``check_reproducible``."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from pytorchtricks.core import PttError
from pytorchtricks.tricks.runtime.seed_everything import seed_everything

StepResult = Any  # Module | Tensor | Mapping[str, Tensor] | sequence of tensors


@dataclass
class ReproReport:
    """Outcome of ``check_reproducible``: ``ok``, or the first step and tensor that differ."""

    ok: bool
    steps: int
    step: int | None = None
    tensor: str | None = None
    max_abs_diff: float | None = None

    def __str__(self) -> str:
        if self.ok:
            return f"reproducible: {self.steps} steps bitwise equal across two seeded runs"
        return (
            f"not reproducible: first divergence at step {self.step}, tensor {self.tensor!r} "
            f"(max abs diff {self.max_abs_diff:.3g})"
        )


def _snapshot(result: StepResult) -> dict[str, torch.Tensor]:
    """Flatten what a step returned into named CPU copies (a module gives its state and gradients)."""
    out: dict[str, torch.Tensor] = {}
    if isinstance(result, torch.nn.Module):
        for name, t in result.state_dict().items():
            out[name] = t.detach().cpu().clone()
        for name, p in result.named_parameters():
            if p.grad is not None:
                out[name + ".grad"] = p.grad.detach().cpu().clone()
    elif isinstance(result, torch.Tensor):
        out["output"] = result.detach().cpu().clone()
    elif isinstance(result, Mapping):
        for k, v in result.items():
            for sub, t in _snapshot(v).items():
                out[str(k) if sub == "output" else f"{k}.{sub}"] = t
    elif isinstance(result, list | tuple):
        for i, v in enumerate(result):
            for sub, t in _snapshot(v).items():
                out[str(i) if sub == "output" else f"{i}.{sub}"] = t
    elif result is None:
        pass
    else:
        raise PttError(
            f"a step returned {type(result).__name__}; return a Module, a Tensor, or a dict/list of tensors."
        )
    return out


def _run(make_step: Callable[[], Callable[[int], StepResult]], steps: int, seed: int) -> list[dict[str, Any]]:
    with seed_everything(seed, workers=False):
        step = make_step()
        return [_snapshot(step(i)) for i in range(steps)]


def check_reproducible(
    make_step: Callable[[], Callable[[int], StepResult]], steps: int = 3, *, seed: int = 0
) -> ReproReport:
    """Build and run a training loop twice from the same seed; report the first step and tensor that diverge.

    ``make_step()`` is called right after seeding and builds everything (model, optimizer, data); it returns
    ``step(i)``, which runs step ``i`` and returns what to compare: the model (its state and gradients), a tensor,
    or a dict/list of tensors. Comparison is bitwise (NaNs equal). The global RNG states are restored afterwards.

    Example:
        >>> def make_step():
        ...     model = torch.nn.Linear(4, 1)
        ...     opt = torch.optim.SGD(model.parameters(), lr=0.1)
        ...     def step(i):
        ...         opt.zero_grad()
        ...         model(torch.randn(8, 4)).pow(2).mean().backward()
        ...         opt.step()
        ...         return model
        ...     return step
        >>> ptt.check_reproducible(make_step, steps=3).ok
        True
    """
    if steps < 1:
        raise PttError(f"steps must be >= 1, got {steps}")
    first = _run(make_step, steps, seed)
    second = _run(make_step, steps, seed)
    for i, (a, b) in enumerate(zip(first, second)):
        for name in list(a) + [n for n in b if n not in a]:  # a's order: 'first' is well defined
            if name not in a or name not in b:
                return ReproReport(False, steps, i, name, float("inf"))
            ta, tb = a[name], b[name]
            if ta.shape != tb.shape or ta.dtype != tb.dtype:
                return ReproReport(False, steps, i, name, float("inf"))
            if not torch.equal(ta, tb) and not bool(
                torch.isclose(ta, tb, rtol=0, atol=0, equal_nan=True).all()
            ):
                diff = (ta.double() - tb.double()).abs().nan_to_num(nan=float("inf")).max().item()
                return ReproReport(False, steps, i, name, diff)
    return ReproReport(True, steps)
