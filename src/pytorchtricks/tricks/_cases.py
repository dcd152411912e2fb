"""Bench-case builders shared by the tricks: the same model untreated vs treated (training step or inference), and
the first batch of two loaders."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import nn

from pytorchtricks.core import BenchCase


def small_cnn_pair(
    treat: Callable[[nn.Module], nn.Module], size: str, device: str
) -> tuple[nn.Module, nn.Module, torch.Tensor]:
    """(``small_cnn`` seeded, ``treat`` of a copy of it, a random batch) at the bench size ``size``: "smoke" is
    batch 16 at 32 px, otherwise batch 64 at 64 px - the shared start of the small-CNN bench cases."""
    import copy

    from pytorchtricks.fixtures import small_cnn

    batch, px = (16, 32) if size == "smoke" else (64, 64)
    dev = torch.device(device)
    torch.manual_seed(0)
    base = small_cnn(in_channels=3, width=32).to(dev)
    return base, treat(copy.deepcopy(base)), torch.randn(batch, 3, px, px, device=dev)


def train_step_case(
    base: nn.Module,
    treated: nn.Module,
    x: torch.Tensor,
    *,
    description: str,
    lr: float | None = 0.01,
    unit: str = "images",
    check: Callable[[torch.Tensor, torch.Tensor], None] | None = None,
) -> BenchCase:
    """A training step (forward, squared-output loss, backward, SGD step unless ``lr=None``, zero_grad)."""
    opts = {
        id(m): torch.optim.SGD([p for p in m.parameters() if p.requires_grad], lr=lr)
        for m in (base, treated)
        if lr is not None
    }

    def step(m: nn.Module) -> torch.Tensor:
        out = m(x)
        out.square().mean().backward()
        if lr is not None:
            opts[id(m)].step()
        m.zero_grad(set_to_none=True)
        return out.detach()

    return BenchCase(
        baseline=lambda: step(base),
        treated=lambda: step(treated),
        items_per_call=x.shape[0],
        unit=unit,
        device=str(x.device),
        description=description,
        check=check,
    )


def inference_case(
    base: nn.Module,
    treated: nn.Module,
    x: torch.Tensor,
    *,
    description: str,
    check: Callable[[torch.Tensor, torch.Tensor], None] | None = None,
    unit: str = "images",
) -> BenchCase:
    """A no-grad forward of ``base`` vs ``treated`` on the same batch (``unit``: what one row of ``x`` is)."""

    def run(m: nn.Module) -> torch.Tensor:
        with torch.no_grad():
            return m(x)

    return BenchCase(
        baseline=lambda: run(base),
        treated=lambda: run(treated),
        items_per_call=x.shape[0],
        unit=unit,
        device=str(x.device),
        description=description,
        check=check,
    )


def first_batch_case(
    base: Iterable[Any],
    treated: Iterable[Any],
    items: int,
    *,
    description: str,
    device: str = "cpu",
    cleanup: Callable[[], None] | None = None,
) -> BenchCase:
    """The first batch's images of a fresh iterator over ``base`` vs over ``treated`` (``items`` images each)."""
    return BenchCase(
        baseline=lambda: next(iter(base))[0],
        treated=lambda: next(iter(treated))[0],
        items_per_call=items,
        unit="images",
        device=device,
        description=description,
        cleanup=cleanup,
    )
