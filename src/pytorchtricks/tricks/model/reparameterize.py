"""Re-parameterize multi-branch blocks (RepVGG, ACNet) into single convolutions for inference.

Why: a 3x3 + 1x1 + identity block trains like a ResNet but, since every branch is linear before the ReLU, it
folds exactly into one 3x3 conv: K = fold(K3, BN3) + pad(fold(K1, BN1)) + fold(I, BNid); one kernel, no branch
adds, less memory traffic (RepVGG-A0-shaped net, deploy vs train form: 1.37x / 1.24x at batch 1 / 8, 1 thread,
160 px; results/inference_cpu.md).
When: after training, before export/quantization. Ships ``ptt.RepVGGBlock`` and ``ptt.ACBlock``; any module with a
``reparameterize_()`` method (switch itself in place to its deploy form) is converted, as is third-party code that
names the same act ``switch_to_deploy()``.
Caveats: eval mode only. RepVGG collapses under plain per-tensor int8 PTQ (52.2% top-1 in the QARepVGG paper):
check SQNR after quantizing (``quantize`` does) or train quantization-aware.
See also: fuse_conv_bn, quantize, 推理加速 / 结构重参数化.
"""

from __future__ import annotations

import copy
import warnings
from typing import Any

import torch
from torch import nn

from pytorchtricks.core import BenchCase, NoEffectWarning, PttError, TrickInfo
from pytorchtricks.tricks._cases import inference_case
from pytorchtricks.tricks.model._rep_blocks import ACBlock, RepVGGBlock, repvgg_net

__all__ = ["reparameterize_", "RepVGGBlock", "ACBlock"]

TRICK = TrickInfo(gains=("speed",), phase=("infer",), exact=True)


def reparameterize_(
    model: nn.Module, example_inputs: Any = None, *, check: bool = True, atol: float = 1e-4
) -> nn.Module:
    """Switch every re-parameterizable block of ``model`` to its deploy form, in place; returns ``model``.

    With ``example_inputs`` a safety check compares outputs before/after (``atol``) and guards the caller's inputs:
    a failure raises ``SafetyError`` with its report (nothing is stored on the model; ``ptt.check_transform`` gives
    the report itself).

    Example:
        >>> net = nn.Sequential(ptt.RepVGGBlock(3, 8), ptt.RepVGGBlock(8, 8)).eval()
        >>> net = ptt.reparameterize_(net, torch.randn(1, 3, 8, 8))
        >>> type(net[1].reparam).__name__
        'Conv2d'
    """
    if model.training:
        raise PttError("reparameterize_ needs model.eval(): BN statistics are folded into the deploy conv.")
    ref = None
    if example_inputs is not None and check:
        from pytorchtricks.safety import reference_outputs

        ref = reference_outputs(model, example_inputs)
    n = 0
    for m in list(model.modules()):  # the list is taken first: blocks delete their branches as they convert
        # model.modules() yields a reused block once: it converts once and every call site sees the deploy form
        fn = getattr(m, "reparameterize_", None) or getattr(m, "switch_to_deploy", None)
        if callable(fn):
            try:
                fn()
            except PttError:
                raise
            except Exception as exc:  # third-party blocks: say which one failed
                raise PttError(
                    f"{type(m).__name__}.{getattr(fn, '__name__', 'switch_to_deploy')}() failed "
                    f"({type(exc).__name__}: {str(exc)[:200]}); call it on an eval-mode copy to debug the block."
                ) from exc
            n += 1
    if n == 0:
        warnings.warn(
            "reparameterize_ found no block with a reparameterize_() (or switch_to_deploy()) method.",
            NoEffectWarning,
            stacklevel=2,
        )
    if ref is not None:
        from pytorchtricks.safety import check_transform

        check_transform(
            model, example_inputs, ref, step="reparameterize", max_abs_diff=atol
        )  # raises SafetyError
    return model


def bench_case(size: str = "smoke", device: str = "cpu") -> BenchCase:
    """A RepVGG-A0-shaped net: train form (3 branches per block) vs deploy form (one 3x3 conv per block)."""
    from pytorchtricks.fixtures import randomize_bn_

    widths, depths, hw, batch = ((16, 32, 64, 128), (1, 2, 2, 1), 64, 4)
    if size != "smoke":
        widths, depths, hw, batch = ((48, 96, 192, 1280), (2, 4, 14, 1), 160, 8)
    torch.manual_seed(0)
    base = randomize_bn_(repvgg_net(1000, widths=widths, depths=depths)).eval().to(device)
    treated = reparameterize_(copy.deepcopy(base))
    x = torch.randn(batch, 3, hw, hw, device=device)

    return inference_case(
        base,
        treated,
        x,
        description=f"RepVGG net widths {widths} depths {depths}, {hw}px, batch {batch}",
        check=lambda a, b: torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4),
    )
