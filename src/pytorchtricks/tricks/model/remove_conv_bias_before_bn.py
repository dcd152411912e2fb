"""Drop the bias of every convolution that feeds only a BatchNorm, folding it into the running mean (exact).

Why: BatchNorm subtracts the per-channel mean right after the conv, so a conv bias is cancelled in training and
is a constant shift in eval: it costs a parameter, an add kernel and optimizer work for nothing.
When: any CNN with Conv -> BatchNorm (timm/torchvision models already use bias=False; many custom ones do not).
Apply before building the optimizer (the bias parameters disappear).
Caveats: exact in train AND eval: the bias b is folded into ``running_mean -= b`` so eval outputs are unchanged,
and training batch statistics shift by exactly b, so future running means stay consistent. Only pairs where the
conv's output goes to the BatchNorm and nowhere else are changed (found with torch.fx, or nn.Sequential order
where the model does not trace); convs whose output is also used elsewhere keep their bias.
See also: fuse_conv_bn (inference), ``ptt lint`` rule conv-bias-before-bn, 模型设计 / 卷积后接 BN 不用 bias.
"""

from __future__ import annotations

import copy
import warnings

import torch
from torch import nn

from pytorchtricks.core import BenchCase, NoEffectWarning, TrickInfo
from pytorchtricks.tricks._cases import train_step_case
from pytorchtricks.tricks.graph import BATCHNORMS, CONVS, conv_bn_links
from pytorchtricks.tunable import TuneFacts, TuneHook, TuneSetup

__all__ = ["remove_conv_bias_before_bn_"]

TRICK = TrickInfo(gains=("speed", "memory"), phase=("train", "infer"), exact=True)


def _tune_applies(facts: TuneFacts) -> str | None:
    return (
        None if facts.conv_bias_pairs else "no convolution with a bias feeds a BatchNorm: nothing to remove"
    )


def _tune_apply(setup: TuneSetup, state: object) -> None:
    remove_conv_bias_before_bn_(setup.model)


TUNE = TuneHook(
    changes="model",
    check="exact",
    receipt="ptt.remove_conv_bias_before_bn_(model)  # exact: the bias moves into BN's running_mean",
    apply=_tune_apply,
    applies=_tune_applies,
    order=10,
    fixes="PTL001",
)


def remove_conv_bias_before_bn_(model: nn.Module) -> nn.Module:
    """Remove the bias of each conv whose only consumer is a BatchNorm, folding it into ``running_mean``.

    Returns ``model`` (changed in place). Warns ``NoEffectWarning`` when no conv with a bias feeds a BatchNorm.

    Example:
        >>> m = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU())
        >>> ptt.remove_conv_bias_before_bn_(m)[0].bias is None
        True
    """
    changed = 0
    for link in conv_bn_links(model):
        conv, bn = link.first, link.second
        if not isinstance(conv, CONVS) or not isinstance(bn, BATCHNORMS):
            continue
        if conv.bias is None or bn.num_features != conv.out_channels:
            continue
        with torch.no_grad():
            bias = conv.bias.detach()
            if bn.running_mean is not None:
                # eval: BN(y + b) uses (y + b - mu) = (y - (mu - b)); train: the batch mean shifts by b too
                bn.running_mean.sub_(bias.to(bn.running_mean.dtype))
        conv.register_parameter("bias", None)  # state_dict loses "<conv>.bias"
        changed += 1
    if changed == 0:
        warnings.warn(
            "remove_conv_bias_before_bn_ changed nothing: no conv with a bias feeds only a BatchNorm.",
            NoEffectWarning,
            stacklevel=2,
        )
    return model


def bench_case(size: str = "smoke", device: str = "cpu") -> BenchCase:
    """Training step of a Conv(bias)->BN->ReLU stack, before and after removing the conv biases."""
    batch, width, px = (16, 32, 32) if size == "smoke" else (64, 64, 64)
    dev = torch.device(device)

    def net() -> nn.Module:
        layers: list[nn.Module] = []
        c = 3
        for _ in range(4):
            layers += [nn.Conv2d(c, width, 3, padding=1), nn.BatchNorm2d(width), nn.ReLU()]
            c = width
        return nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(width, 10))

    torch.manual_seed(0)
    base = net().to(dev)
    treated = remove_conv_bias_before_bn_(copy.deepcopy(base))
    x = torch.randn(batch, 3, px, px, device=dev)
    return train_step_case(
        base, treated, x, description=f"4x Conv3x3({width})->BN->ReLU train step, batch {batch}, {px}px"
    )
