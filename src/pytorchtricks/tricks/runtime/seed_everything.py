"""Seed Python, NumPy and torch (every device) in one call, and seed DataLoader workers and generators.

Why: an experiment is only reproducible when every random source starts from a known state.
When: the first line of every training script; ``with`` form in tests to restore the global RNGs afterwards.
Caveats: seeding is not determinism (atomics, cuDNN search): add enable_determinism. ``PYTHONHASHSEED`` is read
once by the interpreter at start-up: setting it inside a running process does NOT change that process's ``hash()``
of str/bytes (set-iteration order stays random); this call exports it only so that child processes started
afterwards (spawned workers, subprocesses) inherit it - to fix it here, launch with ``PYTHONHASHSEED=0 python ...``.
``torch.manual_seed`` already seeds all CUDA devices. DataLoader workers get distinct seeds from the base seed
since PyTorch 1.9; ``seed_worker`` also derives Python's ``random`` and NumPy's global state from it.
See also: enable_determinism, check_reproducible, 代码层面 / 固定随机种子.
"""

from __future__ import annotations

import os
import random
from typing import Any

import numpy as np
import torch

from pytorchtricks.core import BenchCase, TrickInfo
from pytorchtricks.tricks.runtime._switch import Switch

__all__ = ["seed_everything", "seed_worker", "seeded_generator"]

TRICK = TrickInfo(gains=("reproducibility",), phase=("train", "infer"), exact=True)

_MAX_SEED = 2**32 - 1


class seed_everything(Switch):
    """Seed ``random``, NumPy's global RNG and torch on all devices; a ``with`` restores the previous RNG states.

    Args:
        seed: an integer in [0, 2**32 - 1].
        workers: also export ``PYTHONHASHSEED`` for child processes (see the card: not for this process).

    Example:
        >>> _ = ptt.seed_everything(0)
        >>> a = torch.rand(2)
        >>> with ptt.seed_everything(0):
        ...     torch.equal(torch.rand(2), a)
        True
    """

    def __init__(self, seed: int, *, workers: bool = True) -> None:
        if (
            isinstance(seed, bool)
            or not isinstance(seed, int | np.integer)
            or not 0 <= int(seed) <= _MAX_SEED
        ):
            raise ValueError(f"seed must be an integer in [0, {_MAX_SEED}], got {seed!r}")
        self.seed = int(seed)
        self.workers = workers
        super().__init__()

    def _get_state(self) -> dict[str, Any]:
        state: dict[str, Any] = {
            "random": random.getstate(),
            "numpy": np.random.get_state(),
            "torch": torch.get_rng_state(),
            "hashseed": os.environ.get("PYTHONHASHSEED"),
        }
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            state["cuda"] = torch.cuda.get_rng_state_all()
        return state

    def _set_state(self, state: dict[str, Any]) -> None:
        random.setstate(state["random"])
        np.random.set_state(state["numpy"])
        torch.set_rng_state(state["torch"])
        if "cuda" in state:
            torch.cuda.set_rng_state_all(state["cuda"])
        if state["hashseed"] is None:
            os.environ.pop("PYTHONHASHSEED", None)
        else:
            os.environ["PYTHONHASHSEED"] = state["hashseed"]

    def _apply(self) -> None:
        random.seed(self.seed)
        np.random.seed(self.seed)
        torch.manual_seed(self.seed)  # seeds every CUDA device too (lazily, without initialising CUDA)
        if self.workers:
            os.environ["PYTHONHASHSEED"] = str(self.seed)  # for child processes only; see the card

    def __int__(self) -> int:
        return self.seed


def seed_worker(worker_id: int) -> None:
    """``DataLoader(worker_init_fn=seed_worker)``: derive ``random`` and NumPy seeds from the worker's torch seed.

    Example:
        >>> loader = torch.utils.data.DataLoader(range(4), worker_init_fn=ptt.seed_worker,
        ...                                      generator=ptt.seeded_generator(0))
    """
    seed = torch.initial_seed() % (_MAX_SEED + 1)  # distinct per worker and per epoch: base_seed + worker_id
    random.seed(seed)
    np.random.seed(seed)


def seeded_generator(seed: int, device: str | torch.device = "cpu") -> torch.Generator:
    """A ``torch.Generator`` seeded with ``seed``, for ``DataLoader(generator=...)`` and samplers.

    Example:
        >>> torch.randint(0, 100, (3,), generator=ptt.seeded_generator(1)).tolist() == \\
        ...     torch.randint(0, 100, (3,), generator=ptt.seeded_generator(1)).tolist()
        True
    """
    g = torch.Generator(device=device)
    g.manual_seed(int(seed))
    return g


def bench_case(size: str = "smoke", device: str = "cpu") -> BenchCase:
    """What seeding costs per step: a small MLP step unseeded vs re-seeded before the step (and equal results)."""
    n = 64 if size == "smoke" else 1024
    dev = torch.device(device)
    model = torch.nn.Sequential(
        torch.nn.Linear(128, 256), torch.nn.Dropout(0.1), torch.nn.Linear(256, 10)
    ).to(dev)
    x = torch.randn(n, 128, device=dev)

    def step() -> torch.Tensor:
        return model(x)

    def seeded() -> torch.Tensor:
        with seed_everything(0, workers=False):
            return step()

    return BenchCase(
        baseline=step,
        treated=seeded,
        items_per_call=n,
        unit="samples",
        device=str(dev),
        description=f"MLP forward with dropout, batch {n}; treated re-seeds every call",
    )
