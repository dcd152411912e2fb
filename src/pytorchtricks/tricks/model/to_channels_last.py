"""Store 4-D conv weights (and 5-D ones) in channels-last (NHWC) memory format, the layout fast conv kernels want.

Why: oneDNN (CPU) and cuDNN tensor-core kernels compute convolutions in NHWC; with NCHW tensors every conv pays a
layout conversion. With weights and inputs channels-last, the whole network stays NHWC end to end.
When: CNN training and inference, especially with bf16/fp16 autocast on GPUs and on CPUs with AVX-512.
Also convert the input batch: ``x = x.to(memory_format=torch.channels_last)`` (or ask the loader for it).
Caveats: grouped and depthwise convolutions can be much slower in NHWC on some backends: this warns when it sees
them - measure (``ptt bench to_channels_last``). Pure MLP/transformer models have no 4-D weights: NoEffectWarning.
Numerics are unchanged up to kernel-choice rounding (not bit-exact).
See also: mixed_precision, compile_, 代码层面 / channels_last.
"""

from __future__ import annotations

import warnings

import torch
from torch import nn

from pytorchtricks.core import BenchCase, NoEffectWarning, TrickInfo
from pytorchtricks.tricks._cases import small_cnn_pair
from pytorchtricks.tunable import TuneFacts, TuneHook, TuneSetup

__all__ = ["to_channels_last_"]

TRICK = TrickInfo(gains=("speed",), phase=("train", "infer"), exact=True)


def _tune_applies(facts: TuneFacts) -> str | None:
    if not facts.has_conv2d:
        return "no 2-D convolutions: the memory format does not matter"
    if facts.baseline.get("channels_last"):
        return "already in place: the model's convolution weights are channels_last"
    return None


def _tune_apply(setup: TuneSetup, state: object) -> None:
    to_channels_last_(setup.model)
    setup.channels_last = True  # inputs follow: x.contiguous(memory_format=torch.channels_last)


TUNE = TuneHook(
    changes="model",
    check="exact",
    receipt="ptt.to_channels_last_(model)  # and x = x.contiguous(memory_format=torch.channels_last) in the loop",
    apply=_tune_apply,
    applies=_tune_applies,
    order=30,
    tasks=("classification", "detection"),  # a detector's step too (its loss dict, checked the same way)
)


def to_channels_last_(model: nn.Module) -> nn.Module:
    """Convert every 4-D parameter/buffer to ``torch.channels_last`` (5-D to ``channels_last_3d``), in place.

    Returns ``model``. Warns when the model has grouped/depthwise convolutions (often slower in NHWC) and
    ``NoEffectWarning`` when it has no 4-D or 5-D weights at all.

    Example:
        >>> m = ptt.to_channels_last_(nn.Sequential(nn.Conv2d(3, 8, 3)))
        >>> m[0].weight.is_contiguous(memory_format=torch.channels_last)
        True
    """
    dims = {t.dim() for t in list(model.parameters()) + list(model.buffers())}
    if 4 not in dims and 5 not in dims:
        warnings.warn(
            "to_channels_last_ changed nothing: the model has no 4-D (conv2d) or 5-D (conv3d) weights.",
            NoEffectWarning,
            stacklevel=2,
        )
        return model
    grouped = [
        name
        for name, m in model.named_modules()
        if isinstance(m, nn.modules.conv._ConvNd) and m.groups > 1 and m.weight.dim() == 4
    ]
    if grouped:
        shown = ", ".join(grouped[:3]) + (f" and {len(grouped) - 3} more" if len(grouped) > 3 else "")
        warnings.warn(
            f"to_channels_last_: {len(grouped)} grouped/depthwise conv(s) ({shown}) can run slower in "
            "channels_last on some backends; measure both layouts (`ptt bench to_channels_last`).",
            UserWarning,
            stacklevel=2,
        )
    if 4 in dims:
        model.to(memory_format=torch.channels_last)  # nn.Module.to only restrides 4-D tensors
    if 5 in dims:
        with torch.no_grad():
            for p in list(model.parameters()) + list(model.buffers()):
                if p.dim() == 5:
                    p.data = p.data.contiguous(memory_format=torch.channels_last_3d)
    return model


def bench_case(size: str = "smoke", device: str = "cpu") -> BenchCase:
    """Forward+backward of a small Conv-BN-ReLU stack (``small_cnn``), NCHW vs channels-last weights and inputs."""
    base, treated, x = small_cnn_pair(to_channels_last_, size, device)
    batch, px = len(x), x.shape[-1]
    x_cl = x.contiguous(memory_format=torch.channels_last)

    def step(m: nn.Module, inp: torch.Tensor) -> torch.Tensor:
        out = m(inp)
        out.sum().backward()
        m.zero_grad(set_to_none=True)
        return out.detach()

    return BenchCase(
        baseline=lambda: step(base, x),
        treated=lambda: step(treated, x_cl),
        items_per_call=batch,
        unit="images",
        device=str(x.device),
        description=f"3-conv CNN forward+backward, batch {batch}, {px}px",
    )
