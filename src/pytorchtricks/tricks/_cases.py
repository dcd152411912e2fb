"""Bench-case builders shared by the model tricks: the same model untreated vs treated, for training or inference."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from pytorchtricks.core import BenchCase


def train_step_case(
    base: nn.Module, treated: nn.Module, x: torch.Tensor, *, description: str, lr: float = 0.01
) -> BenchCase:
    """One SGD step (forward, squared-output loss, backward, step, zero_grad) on ``base`` vs ``treated``."""
    opts = {
        id(m): torch.optim.SGD([p for p in m.parameters() if p.requires_grad], lr=lr) for m in (base, treated)
    }

    def step(m: nn.Module) -> torch.Tensor:
        out = m(x)
        out.square().mean().backward()
        opts[id(m)].step()
        opts[id(m)].zero_grad(set_to_none=True)
        return out.detach()

    return BenchCase(
        baseline=lambda: step(base),
        treated=lambda: step(treated),
        items_per_call=x.shape[0],
        unit="images",
        device=str(x.device),
        description=description,
    )


def inference_case(
    base: nn.Module,
    treated: nn.Module,
    x: torch.Tensor,
    *,
    description: str,
    check: Callable[[torch.Tensor, torch.Tensor], None] | None = None,
) -> BenchCase:
    """A no-grad forward of ``base`` vs ``treated`` on the same batch."""

    def run(m: nn.Module) -> torch.Tensor:
        with torch.no_grad():
            return m(x)

    return BenchCase(
        baseline=lambda: run(base),
        treated=lambda: run(treated),
        items_per_call=x.shape[0],
        unit="images",
        device=str(x.device),
        description=description,
        check=check,
    )
