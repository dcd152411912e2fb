"""Make PyTorch pick deterministic kernels, or fail loudly where none exists.

Why: two runs from the same seed give bitwise-equal results only when every kernel is deterministic; atomics in
scatter/index_add and cuDNN algorithm search are the usual culprits.
When: debugging, regression tests, ablations where run-to-run noise would hide the effect.
Caveats: slower (deterministic kernels, no cudnn.benchmark); ops without a deterministic implementation raise
(or warn with ``warn_only=True``). On CUDA, cuBLAS needs ``CUBLAS_WORKSPACE_CONFIG=:4096:8`` set before its first
use in the process: this switch sets it if unset, but if cuBLAS was already initialised it cannot take effect -
set it in the environment before launching. Seeds are a separate matter: see seed_everything.
See also: seed_everything, check_reproducible, 代码层面 / 可复现性.
"""

from __future__ import annotations

import os

import torch

from pytorchtricks.core import BenchCase, TrickInfo
from pytorchtricks.tricks.runtime._switch import Switch

__all__ = ["enable_determinism"]

TRICK = TrickInfo(gains=("reproducibility",), phase=("train", "infer"), exact=True)

CUBLAS_VAR = "CUBLAS_WORKSPACE_CONFIG"


class enable_determinism(Switch):
    """Deterministic algorithms, deterministic cuDNN, no cuDNN benchmark; as a call or a restoring ``with``.

    Example:
        >>> with ptt.enable_determinism(warn_only=True):
        ...     torch.are_deterministic_algorithms_enabled()
        True
        >>> torch.are_deterministic_algorithms_enabled()
        False
    """

    def __init__(self, enabled: bool = True, *, warn_only: bool = False) -> None:
        self.enabled = bool(enabled)
        self.warn_only = bool(warn_only)
        super().__init__()

    def _get_state(self) -> tuple[bool, bool, bool, bool, str | None]:
        return (
            torch.are_deterministic_algorithms_enabled(),
            torch.is_deterministic_algorithms_warn_only_enabled(),
            bool(torch.backends.cudnn.deterministic),
            bool(torch.backends.cudnn.benchmark),
            os.environ.get(CUBLAS_VAR),
        )

    def _set_state(self, state: tuple[bool, bool, bool, bool, str | None]) -> None:
        algos, warn_only, cudnn_det, cudnn_bench, cublas = state
        torch.use_deterministic_algorithms(algos, warn_only=warn_only)
        torch.backends.cudnn.deterministic = cudnn_det
        torch.backends.cudnn.benchmark = cudnn_bench
        if cublas is None:
            os.environ.pop(CUBLAS_VAR, None)
        else:
            os.environ[CUBLAS_VAR] = cublas

    def _apply(self) -> None:
        if self.enabled:
            # cuBLAS reads this once, at its initialisation; setting it later in the process is too late.
            os.environ.setdefault(CUBLAS_VAR, ":4096:8")
        torch.use_deterministic_algorithms(self.enabled, warn_only=self.warn_only)
        torch.backends.cudnn.deterministic = self.enabled
        if self.enabled:
            torch.backends.cudnn.benchmark = False


def bench_case(size: str = "smoke", device: str = "cpu") -> BenchCase:
    """What determinism costs: a conv training step (with index_add) with the switch off vs on."""
    n, c, hw = (8, 16, 32) if size == "smoke" else (32, 64, 56)
    dev = torch.device(device)
    conv = torch.nn.Conv2d(c, c, 3, padding=1).to(dev)
    x = torch.randn(n, c, hw, hw, device=dev)
    idx = torch.randint(0, 64, (n * c,), device=dev)

    def step() -> torch.Tensor:
        conv.zero_grad(set_to_none=True)
        y = conv(x)
        acc = torch.zeros(64, hw, hw, device=dev).index_add_(0, idx, y.flatten(0, 1))
        acc.sum().backward()
        return acc

    def run(enabled: bool) -> torch.Tensor:
        with enable_determinism(enabled, warn_only=True):
            return step()

    def check(base: torch.Tensor, treated: torch.Tensor) -> None:
        torch.testing.assert_close(base, treated, rtol=1e-4, atol=1e-4)

    return BenchCase(
        baseline=lambda: run(False),
        treated=lambda: run(True),
        items_per_call=n,
        unit="images",
        device=str(dev),
        description=f"conv + index_add training step, {n}x{c}x{hw}x{hw}",
        check=check,
    )
