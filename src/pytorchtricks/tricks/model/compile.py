"""``torch.compile`` a model in place with settings that make sense per device, and warn when shapes churn.

Why: TorchInductor fuses element-wise chains into the surrounding kernels and removes Python overhead; for CPU
inference, ``freezing`` additionally constant-folds the weights into oneDNN-prepacked layouts (ResNet-18 layout,
160 px, 1 thread, batch 1 / 8 on a Zen 4 CPU: plain compile 1.07x / 1.21x over eager, compile + freezing
1.63x / 1.36x; shared/ANCHORS.md section 3).
When: steady-shape training or inference loops that run long enough to repay the compile (seconds to minutes).
Caveats: the first call compiles (slow). Every new input shape can recompile: this warns once the model has seen
``warn_after`` distinct input shapes - pass ``dynamic=True``, pad to a few bucket sizes, or drop the last partial
batch. ``for_inference=True`` on CPU turns on freezing: weights become constants, so later weight updates are
NOT seen - use it for inference only, under ``torch.no_grad()``. Outputs match eager within float tolerance.
See also: mixed_precision, to_channels_last_, 推理加速 / torch.compile.
"""

from __future__ import annotations

import copy
import warnings
from typing import Any

import torch
from torch import nn

from pytorchtricks.core import BenchCase, PttError, TrickInfo
from pytorchtricks.tricks._cases import inference_case
from pytorchtricks.tunable import TuneFacts, TuneHook, TuneSetup

__all__ = ["compile_"]

TRICK = TrickInfo(gains=("speed",), phase=("train", "infer"), exact=False)

COMPILE_MIN_BUDGET_S = 420.0  # CPU inductor compiles a ResNet-18 training step in minutes on 2 cores


def _tune_applies(facts: TuneFacts) -> str | None:
    if facts.budget_left_s < COMPILE_MIN_BUDGET_S:
        return (
            f"torch.compile needs minutes of compilation on this CPU, more than the {facts.budget_left_s:.0f} s "
            f"left of the time budget; rerun with --time-budget {int(COMPILE_MIN_BUDGET_S * 2)} to try it"
        )
    return None


def _tune_apply(setup: TuneSetup, state: object) -> None:
    setup.forward = compile_(setup.model, for_inference=not setup.train)


TUNE = TuneHook(
    changes="step",
    check="approximate",
    receipt="model = ptt.compile_(model)",
    apply=_tune_apply,
    applies=_tune_applies,
    cost="compile",
    order=80,
    bound="loss within 5% of eager over 3 steps, outputs >= 20 dB SQNR",
)

_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")


def compile_settings(device: str | torch.device, for_inference: bool) -> dict[str, Any]:
    """The ``torch.compile`` keyword arguments ``compile_`` uses for a device and phase.

    CPU inference: inductor ``freezing`` (weights folded as constants). CUDA inference: ``max-autotune`` (CUDA
    graphs + tuned kernels). Training anywhere: the default mode (CUDA graphs fight optimizers that mutate weights).

    Example:
        >>> compile_settings("cpu", for_inference=True)
        {'mode': 'default', 'options': {'freezing': True}}
    """
    dev = torch.device(device)
    if for_inference and dev.type == "cpu":
        return {"mode": "default", "options": {"freezing": True}}
    if for_inference and dev.type == "cuda":
        return {"mode": "max-autotune", "options": {}}
    return {"mode": "default", "options": {}}


class _ShapeWatch:
    """Calls the compiled function and counts distinct input signatures (shapes, dtypes) to warn on churn."""

    def __init__(self, compiled: Any, warn_after: int) -> None:
        self.compiled = compiled
        self.warn_after = warn_after
        self.signatures: set[tuple[Any, ...]] = set()
        self.warned = False

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        sig = tuple(
            (tuple(a.shape), a.dtype) if isinstance(a, torch.Tensor) else type(a).__name__
            for a in (*args, *kwargs.values())
        )
        if sig not in self.signatures and not self.warned:
            self.signatures.add(sig)
            if len(self.signatures) >= self.warn_after:
                self.warned = True
                warnings.warn(
                    f"compile_: the model has seen {len(self.signatures)} distinct input shapes; each new static "
                    "shape can recompile (slow, and capped by torch._dynamo.config.recompile_limit). Pass "
                    "dynamic=True, pad inputs to a few bucket sizes, or use drop_last=True in the DataLoader.",
                    UserWarning,
                    stacklevel=3,
                )
        return self.compiled(*args, **kwargs)


def compile_(
    model: nn.Module,
    *,
    mode: str | None = None,
    for_inference: bool = False,
    dynamic: bool | None = None,
    device: str | torch.device | None = None,
    warn_after: int = 3,
    backend: str = "inductor",
    **options: Any,
) -> nn.Module:
    """Compile ``model`` in place (``nn.Module.compile``-style: same object, same state_dict) and return it.

    Args:
        mode: a ``torch.compile`` mode; default picked per device and phase (see ``compile_settings``).
        for_inference: inference-only settings (CPU: freezing). Run the model under ``torch.no_grad()``.
        dynamic: passed to ``torch.compile`` (None: automatic dynamic shapes after the first recompile).
        device: where the model runs; default: the device of its first parameter.
        warn_after: warn once this many distinct input shapes were seen.
        backend: the ``torch.compile`` backend; per-device modes and options apply to ``"inductor"`` only.
        options: extra inductor options, merged over the per-device ones.

    Example:
        >>> m = ptt.compile_(nn.Linear(4, 2), backend="eager")  # "inductor" (default) generates kernels
        >>> type(m).__name__
        'Linear'
    """
    if mode is not None and mode not in _MODES:
        raise PttError(f"unknown mode {mode!r}; use one of {', '.join(_MODES)}.")
    if warn_after < 2:
        raise PttError("warn_after must be >= 2 (the first shape always compiles).")
    if getattr(model, "_compiled_call_impl", None) is not None:
        raise PttError(
            "model is already compiled; build a fresh model (or deepcopy the eager one) to recompile."
        )
    if device is None:
        first = next(iter(model.parameters()), None)
        device = first.device if first is not None else torch.device("cpu")
    settings = compile_settings(device, for_inference)
    if for_inference and model.training:
        model.eval()  # freezing and cudagraphs assume inference behaviour (BN running stats, no dropout)
    use_mode = mode or settings["mode"]
    opts = {**settings["options"], **options}
    if backend != "inductor":
        compiled = torch.compile(model._call_impl, backend=backend, dynamic=dynamic)
    elif opts:  # torch.compile takes a mode OR options: expand the mode into its inductor options
        from torch._inductor import list_mode_options

        opts = {**list_mode_options(use_mode, dynamic), **opts}
        compiled = torch.compile(model._call_impl, dynamic=dynamic, options=opts)
    else:
        compiled = torch.compile(model._call_impl, mode=use_mode, dynamic=dynamic)
    # nn.Module.__call__ dispatches to _compiled_call_impl when set (what nn.Module.compile does); we wrap it
    # to count input shapes outside the compiled region.
    model._compiled_call_impl = _ShapeWatch(compiled, warn_after)
    return model


def bench_case(size: str = "smoke", device: str = "cpu") -> BenchCase:
    """Inference of a small CNN: eager vs ``compile_(for_inference=True)`` (CPU: inductor freezing)."""
    batch, px = (8, 32) if size == "smoke" else (32, 64)
    dev = torch.device(device)
    torch.manual_seed(0)
    base = (
        nn.Sequential(
            nn.Conv2d(3, 32, 3, padding=1),
            nn.BatchNorm2d(32),
            nn.ReLU(),
            nn.Conv2d(32, 32, 3, padding=1),
            nn.BatchNorm2d(32),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
            nn.Linear(32, 10),
        )
        .to(dev)
        .eval()
    )
    treated = compile_(copy.deepcopy(base), for_inference=True)
    x = torch.randn(batch, 3, px, px, device=dev)

    return inference_case(
        base,
        treated,
        x,
        description=f"2-conv CNN inference, batch {batch}, {px}px, eager vs compiled (freezing on CPU)",
        check=lambda a, b: torch.testing.assert_close(b, a, rtol=1e-3, atol=1e-3),
    )
