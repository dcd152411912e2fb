"""``TuneConfig``: everything ``ptt tune`` takes, as one value - read by the engine (``tune_model``) and carried whole
into the workload (``build_workload``), so no option is handed down field by field."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from pytorchtricks.data.baselines import DEFAULT_WORKERS

__all__ = ["TuneConfig"]


@dataclasses.dataclass(frozen=True, eq=False)
class TuneConfig:
    """Everything ``ptt tune`` takes - the CLI's flags as one value: ``ptt.tune_model(ptt.TuneConfig(...))``.

    ``model``: ``torchvision:NAME``, ``package.module:factory``, ``path.py:factory`` or a module object (default: a
    ResNet-18 on the built-in image set); ``data``: an image folder, a ``ptt pack`` folder, ``synthetic``, or None for
    the built-in set. ``input_shape`` is one sample's C,H,W (default: the model's channels, ``input_size`` px);
    ``num_workers`` the loader workers the user's loop already uses (the baseline loads with them).
    ``memory_budget``: the memory search (``run_tune``); with ``batch_size="auto"`` (and a budget in bytes) the
    batch is the fastest that fits. ``script``: where the model, optimizer and loader come from in the user's script
    (``ptt doctor run --tune``). ``device_step_ms``: the accelerator's step, declared (a projection for it).
    ``accuracy_steps``: after the recommendation, train that many steps of the baseline and of the recommended
    pipeline from one initialisation, ``accuracy_seeds`` seeds each, and say whether the recommended loss stays
    inside the baseline's seed-to-seed band (``tune.accuracy``; extra time, outside ``time_budget_s``).
    """

    model: str | torch.nn.Module | None = None
    data: str | None = None
    batch_size: int | str | None = None
    input_size: int | None = None
    input_shape: str | tuple[int, ...] | None = None
    num_workers: int = DEFAULT_WORKERS
    goal: str = "speed"
    for_: str = "train"
    time_budget_s: float | None = None
    device: str | None = "cpu"
    out: str | None = "tune-out"  # the receipt's folder, replaced atomically; None: write nothing
    memory_budget: str | int | None = None
    optimizer: tuple[str, dict[str, Any]] | None = None
    script: dict[str, Any] | None = None
    device_step_ms: float | None = None
    task: str = "classification"  # or "detection": a torchvision detector on a COCO / YOLO / VOC root
    split: str | None = None  # the split of a data root that has several (default: its train split)
    accuracy_steps: int = 0  # the parity check (tune.accuracy): train this many steps per run; 0: no check
    accuracy_seeds: int = 3  # ... for this many seeds of the baseline and of the recommendation each
