"""Mixed precision in three calls: ``with mp.autocast(): ...``, ``mp.backward(loss)``, ``mp.step(optimizer)``.

Why: matmuls and convs in bf16/fp16 run on the fast units (GPU tensor cores; AVX-512 BF16 / AMX on CPUs) and
halve activation memory, while weights, optimizer state and reductions stay fp32.
When: almost every training run. bf16 (default) has fp32's range, so it needs no loss scaling; fp16 needs the
GradScaler, which this object drives for you (scale, unscale, skip the step on inf/NaN, adapt the scale).
Caveats: uses ``torch.amp`` only (``torch.cuda.amp`` is deprecated). fp16 steps that overflow are skipped: read
``mp.skipped_steps`` / ``mp.last_step_skipped`` (a few at the start are normal while the scale calibrates; many
mean a real overflow - try bf16). Not bit-exact: a named error bound is tested. CPU bf16 is fast only with
AVX-512 BF16 or AMX; elsewhere it can be slower than fp32 (measure).
See also: accumulate_gradients, to_channels_last_, compile_, 代码层面 / 混合精度训练.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from pytorchtricks.core import BenchCase, PttError, TrickInfo, resolve_device
from pytorchtricks.tunable import TuneFacts, TuneHook, TuneSetup

__all__ = ["mixed_precision"]

TRICK = TrickInfo(gains=("speed", "memory"), phase=("train", "infer"), exact=False)


def _tune_applies(facts: TuneFacts) -> str | None:
    if not facts.native_bf16:
        return (
            "this device has no native bf16 (CPU: avx512_bf16 or AMX; CUDA: compute capability >= 8): bf16 would "
            "be emulated and slower than fp32"
        )
    return None


def _tune_apply(setup: TuneSetup, state: object) -> None:
    setup.precision = mixed_precision(setup.device, dtype="bf16")


TUNE = TuneHook(
    changes="precision",
    check="approximate",
    receipt='mp = ptt.mixed_precision(device, dtype="bf16")  # with mp.autocast(): ...; mp.backward(loss); mp.step(opt)',
    apply=_tune_apply,
    applies=_tune_applies,
    order=60,
    bound="loss within 5% of fp32 over 3 steps, outputs >= 20 dB SQNR",
    tasks=("classification", "detection"),  # a detector's step too (its loss dict, checked the same way)
)

_DTYPES = {
    "bf16": torch.bfloat16,
    "bfloat16": torch.bfloat16,
    "fp16": torch.float16,
    "float16": torch.float16,
}


class mixed_precision:
    """An autocast context + (for fp16) a GradScaler behind one small object.

    Args:
        device: ``"cpu"``, ``"cuda"`` or a ``torch.device``.
        dtype: ``"bf16"`` (default; no loss scaling needed) or ``"fp16"`` (GradScaler on).
        enabled: False turns everything into plain fp32 calls (handy for A/B switches).

    Example:
        >>> model, opt = nn.Linear(4, 2), None
        >>> mp = ptt.mixed_precision("cpu", dtype="bf16")
        >>> opt = torch.optim.SGD(model.parameters(), lr=0.1)
        >>> with mp.autocast():
        ...     loss = model(torch.randn(8, 4)).float().square().mean()
        >>> mp.backward(loss)
        >>> mp.step(opt)
        True
    """

    def __init__(
        self, device: str | torch.device = "cuda", dtype: str = "bf16", *, enabled: bool = True
    ) -> None:
        if dtype not in _DTYPES:
            raise PttError(f"unknown dtype {dtype!r}; use 'bf16' (recommended) or 'fp16'.")
        self.device = resolve_device(device)
        self.dtype = _DTYPES[dtype]
        self.enabled = bool(enabled)
        use_scaler = self.enabled and self.dtype == torch.float16
        self.scaler = torch.amp.GradScaler(self.device.type, enabled=use_scaler)
        self.skipped_steps = 0
        self.steps = 0
        self.last_step_skipped = False
        self._unscaled: set[int] = set()

    def __repr__(self) -> str:
        name = {torch.bfloat16: "bf16", torch.float16: "fp16"}[self.dtype]
        return f"mixed_precision({self.device.type!r}, dtype={name!r}, enabled={self.enabled})"

    @property
    def uses_scaler(self) -> bool:
        return self.scaler.is_enabled()

    @contextlib.contextmanager
    def autocast(self) -> Iterator[None]:
        """``torch.autocast`` for this device and dtype; wrap the forward pass and the loss, not backward."""
        with torch.autocast(self.device.type, dtype=self.dtype, enabled=self.enabled):
            yield

    def backward(self, loss: torch.Tensor, **kwargs: Any) -> None:
        """``loss.backward()``, scaled first when fp16 loss scaling is on."""
        if loss.dim() != 0:
            raise PttError(
                f"backward needs a scalar loss, got shape {tuple(loss.shape)}; reduce it (e.g. .mean())."
            )
        self.scaler.scale(loss).backward(**kwargs)

    def unscale_(self, optimizer: torch.optim.Optimizer) -> None:
        """Divide the gradients by the loss scale now (call before gradient clipping); no-op without a scaler."""
        if self.uses_scaler and id(optimizer) not in self._unscaled:
            self.scaler.unscale_(optimizer)
            self._unscaled.add(id(optimizer))

    def step(self, optimizer: torch.optim.Optimizer) -> bool:
        """Step ``optimizer`` (skipped when fp16 gradients hold inf/NaN) and update the scale.

        Returns True when the step was taken, False when it was skipped (counted in ``skipped_steps``).
        """
        self.steps += 1
        if not self.uses_scaler:
            optimizer.step()
            self.last_step_skipped = False
            return True
        scale_before = self.scaler.get_scale()
        self.scaler.step(optimizer)
        self.scaler.update()
        self._unscaled.discard(id(optimizer))
        # GradScaler lowers the scale exactly when it found inf/NaN and skipped optimizer.step()
        self.last_step_skipped = self.scaler.get_scale() < scale_before
        self.skipped_steps += int(self.last_step_skipped)
        return not self.last_step_skipped

    def state_dict(self) -> dict[str, Any]:
        """Scaler state and step counters, for checkpoints."""
        return {"scaler": self.scaler.state_dict(), "steps": self.steps, "skipped_steps": self.skipped_steps}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("scaler"):
            self.scaler.load_state_dict(state["scaler"])
        self.steps = int(state.get("steps", 0))
        self.skipped_steps = int(state.get("skipped_steps", 0))


def bench_case(size: str = "smoke", device: str = "cpu") -> BenchCase:
    """One training step of a small CNN in fp32 vs bf16 autocast (the default dtype)."""
    batch, px, width = (32, 32, 32) if size == "smoke" else (64, 64, 64)
    dev = torch.device(device)
    torch.manual_seed(0)
    base = nn.Sequential(
        nn.Conv2d(3, width, 3, padding=1, bias=False),
        nn.BatchNorm2d(width),
        nn.ReLU(),
        nn.Conv2d(width, 2 * width, 3, padding=1, stride=2, bias=False),
        nn.BatchNorm2d(2 * width),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(2 * width, 10),
    ).to(dev)
    treated = copy.deepcopy(base)
    x = torch.randn(batch, 3, px, px, device=dev)
    y = torch.randint(0, 10, (batch,), device=dev)
    fp32 = mixed_precision(dev, enabled=False)
    bf16 = mixed_precision(dev, "bf16")
    opts = {id(m): torch.optim.SGD(m.parameters(), lr=0.01) for m in (base, treated)}

    def step(m: nn.Module, mp: mixed_precision) -> torch.Tensor:
        with mp.autocast():
            loss = nn.functional.cross_entropy(m(x), y)
        mp.backward(loss)
        mp.step(opts[id(m)])
        opts[id(m)].zero_grad(set_to_none=True)
        return loss.detach()

    return BenchCase(
        baseline=lambda: step(base, fp32),
        treated=lambda: step(treated, bf16),
        items_per_call=batch,
        unit="images",
        device=str(dev),
        description=f"2-conv CNN train step, batch {batch}, {px}px, fp32 vs bf16 autocast",
    )
