"""Let cuDNN time several convolution algorithms per input shape and keep the fastest.

Why: the default heuristic picks a reasonable algorithm; benchmarking picks the fastest for each new shape,
often 5-30% on convolution-heavy nets with fixed input sizes.
When: CUDA training or inference with fixed input shapes.
Caveats: every new input shape pays a one-off search; shapes that change each step (variable-size batches,
progressive resizing) make it slower. Not bitwise deterministic (``enable_determinism`` turns it off). No effect on CPU.
See also: enable_determinism, 代码层面 / torch.backends.cudnn.benchmark.
"""

from __future__ import annotations

import warnings

import torch

from pytorchtricks.core import BenchCase, NoEffectWarning, TrickInfo
from pytorchtricks.tricks.runtime._switch import Switch
from pytorchtricks.tunable import TuneFacts, TuneHook, TuneSetup

__all__ = ["enable_cudnn_benchmark"]

TRICK = TrickInfo(gains=("speed",), phase=("train", "infer"), exact=False, needs=("cuda",))


def _tune_applies(facts: TuneFacts) -> str | None:
    return None if facts.device == "cuda" else "needs a CUDA GPU (cuDNN autotuning); this run is on the CPU"


def _tune_apply(setup: TuneSetup, state: object) -> None:
    setup.switches.append(
        enable_cudnn_benchmark
    )  # entered around every step: interleaved variants do not leak


TUNE = TuneHook(
    changes="switch",
    check="exact",
    receipt="ptt.enable_cudnn_benchmark()",
    apply=_tune_apply,
    applies=_tune_applies,
    order=90,
)


class enable_cudnn_benchmark(Switch):
    """Turn ``torch.backends.cudnn.benchmark`` on (or off); as a call or a ``with`` that restores it.

    Example:
        >>> import warnings
        >>> with warnings.catch_warnings():
        ...     warnings.simplefilter("ignore")
        ...     with ptt.enable_cudnn_benchmark():
        ...         torch.backends.cudnn.benchmark
        True
        >>> torch.backends.cudnn.benchmark
        False
    """

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = bool(enabled)
        super().__init__()

    def _get_state(self) -> bool:
        return bool(torch.backends.cudnn.benchmark)

    def _set_state(self, state: bool) -> None:
        torch.backends.cudnn.benchmark = state

    def _apply(self) -> None:
        if self.enabled and not torch.cuda.is_available():
            warnings.warn(
                "enable_cudnn_benchmark has no effect without CUDA (CPU convolutions do not use cuDNN).",
                NoEffectWarning,
                stacklevel=3,
            )
        torch.backends.cudnn.benchmark = self.enabled


def bench_case(size: str = "smoke", device: str = "cpu") -> BenchCase:
    """Conv forward+backward with cudnn.benchmark off vs on (an honest no-op on CPU)."""
    n, c, hw = (8, 32, 32) if size == "smoke" else (32, 64, 56)
    dev = torch.device(device)
    conv = torch.nn.Sequential(
        torch.nn.Conv2d(c, c, 3, padding=1), torch.nn.ReLU(), torch.nn.Conv2d(c, c, 3, padding=1)
    ).to(dev)
    x = torch.randn(n, c, hw, hw, device=dev)

    def step() -> torch.Tensor:
        return conv(x).sum()

    def with_flag(flag: bool) -> torch.Tensor:
        old = torch.backends.cudnn.benchmark
        torch.backends.cudnn.benchmark = flag
        try:
            return step()
        finally:
            torch.backends.cudnn.benchmark = old

    return BenchCase(
        baseline=lambda: with_flag(False),
        treated=lambda: with_flag(True),
        items_per_call=n,
        unit="images",
        device=str(dev),
        description=f"two 3x3 convs, {n}x{c}x{hw}x{hw}",
    )
