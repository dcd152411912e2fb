"""Let fp32 matmuls and convolutions use TensorFloat-32 tensor cores (10-bit mantissa inputs, fp32 accumulate).

Why: on Ampere and newer GPUs fp32 matmul/conv runs up to ~8x faster on tensor cores with TF32 inputs.
When: CUDA training and inference in fp32 where ~1e-3 relative error per matmul is acceptable (almost always).
Caveats: results change slightly (not exact); no effect on CPUs without TF32 units (a NoEffectWarning says so);
uses ``torch.set_float32_matmul_precision("high")`` for matmuls and ``torch.backends.cudnn.allow_tf32`` for convs,
and restores both. Mixed precision (``mixed_precision``) usually gains more.
See also: mixed_precision, 代码层面 / TF32.
"""

from __future__ import annotations

import warnings

import torch

from pytorchtricks.core import BenchCase, NoEffectWarning, TrickInfo
from pytorchtricks.tricks.runtime._switch import Switch
from pytorchtricks.tunable import TuneFacts, TuneHook, TuneSetup

__all__ = ["enable_tf32"]

TRICK = TrickInfo(gains=("speed",), phase=("train", "infer"), exact=False, needs=("cuda",))


def _tune_applies(facts: TuneFacts) -> str | None:
    return None if facts.device == "cuda" else "needs a CUDA GPU (TF32 tensor cores); this run is on the CPU"


def _tune_apply(setup: TuneSetup, state: object) -> None:
    setup.switches.append(enable_tf32)  # entered around every step: interleaved variants do not leak


TUNE = TuneHook(
    changes="switch",
    check="approximate",
    receipt="ptt.enable_tf32()",
    apply=_tune_apply,
    applies=_tune_applies,
    order=90,
)


class enable_tf32(Switch):
    """Allow TF32 in fp32 matmuls and cuDNN convolutions; as a call or a ``with`` that restores the old state.

    Example:
        >>> import warnings
        >>> with warnings.catch_warnings():
        ...     warnings.simplefilter("ignore")
        ...     with ptt.enable_tf32():
        ...         torch.get_float32_matmul_precision()
        'high'
        >>> torch.get_float32_matmul_precision()
        'highest'
    """

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = bool(enabled)
        super().__init__()

    def _get_state(self) -> tuple[str, bool]:
        return torch.get_float32_matmul_precision(), bool(torch.backends.cudnn.allow_tf32)

    def _set_state(self, state: tuple[str, bool]) -> None:
        torch.set_float32_matmul_precision(state[0])
        torch.backends.cudnn.allow_tf32 = state[1]

    def _apply(self) -> None:
        if self.enabled and not _has_tf32_gpu():
            warnings.warn(
                "enable_tf32 has no effect here: TF32 needs a CUDA GPU of compute capability >= 8.0 (Ampere+).",
                NoEffectWarning,
                stacklevel=3,
            )
        torch.set_float32_matmul_precision("high" if self.enabled else "highest")
        torch.backends.cudnn.allow_tf32 = self.enabled


def _has_tf32_gpu() -> bool:
    return torch.cuda.is_available() and torch.cuda.get_device_capability()[0] >= 8


def bench_case(size: str = "smoke", device: str = "cpu") -> BenchCase:
    """fp32 matmul with highest precision vs TF32 allowed; ``check`` bounds the relative error."""
    n = 256 if size == "smoke" else 2048
    dev = torch.device(device)
    a = torch.randn(n, n, device=dev)
    b = torch.randn(n, n, device=dev)

    def run(enabled: bool) -> torch.Tensor:
        old = torch.get_float32_matmul_precision()
        torch.set_float32_matmul_precision("high" if enabled else "highest")
        try:
            return a @ b
        finally:
            torch.set_float32_matmul_precision(old)

    def check(base: torch.Tensor, treated: torch.Tensor) -> None:
        rel = ((base - treated).norm() / base.norm()).item()
        if rel > 1e-2:  # TF32 keeps a 10-bit mantissa: ~1e-3 relative error on random data
            raise AssertionError(f"TF32 matmul relative error {rel:.2e} exceeds 1e-2")

    return BenchCase(
        baseline=lambda: run(False),
        treated=lambda: run(True),
        items_per_call=1,
        unit="matmuls",
        device=str(dev),
        description=f"{n}x{n} fp32 matmul",
        check=check,
    )
