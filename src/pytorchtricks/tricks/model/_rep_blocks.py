"""Re-parameterizable blocks: multi-branch for training, one conv for inference.

Protocol: a block implements ``reparameterize_(self)`` that switches itself, in place and in eval mode, to an
equivalent single-branch deploy form. ``ptt.reparameterize_(model)`` calls it on every block.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from pytorchtricks.core import PttError


def _fold(conv: Any, bn: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """Kernel and bias of conv followed by eval-mode BN, in float64 (BN already folded by fuse_conv_bn_: as is)."""
    if isinstance(bn, nn.Identity):
        bias0 = (
            conv.bias.double()
            if conv.bias is not None
            else torch.zeros(conv.out_channels, dtype=torch.float64)
        )
        return conv.weight.double(), bias0
    std = (bn.running_var.double() + bn.eps).sqrt()
    scale = bn.weight.double() / std
    kernel = conv.weight.double() * scale.reshape(-1, 1, 1, 1)
    bias = bn.bias.double() - bn.running_mean.double() * scale
    if conv.bias is not None:
        bias = bias + conv.bias.double() * scale
    return kernel, bias


def _fold_identity(bn: Any, channels: int, groups: int, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The identity branch as a k x k kernel (1 at the centre of each channel's own input), folded with ``bn``."""
    per_group = channels // groups
    ident = torch.zeros(channels, per_group, k, k, dtype=torch.float64, device=bn.running_mean.device)
    for c in range(channels):
        ident[c, c % per_group, k // 2, k // 2] = 1.0
    std = (bn.running_var.double() + bn.eps).sqrt()
    scale = bn.weight.double() / std
    return ident * scale.reshape(-1, 1, 1, 1), bn.bias.double() - bn.running_mean.double() * scale


def _conv_bn(
    c_in: int, c_out: int, kernel: tuple[int, int], stride: int, padding: tuple[int, int], groups: int
):
    return nn.Sequential(
        nn.Conv2d(c_in, c_out, kernel, stride=stride, padding=padding, groups=groups, bias=False),
        nn.BatchNorm2d(c_out),
    )


def _deploy_conv(block: nn.Module, like: Any, kernel: torch.Tensor, bias: torch.Tensor) -> nn.Conv2d:
    if block.training:
        raise PttError(f"{type(block).__name__}.reparameterize_ needs eval mode: call model.eval() first.")
    conv = nn.Conv2d(
        like.in_channels,
        like.out_channels,
        like.kernel_size,
        stride=like.stride,
        padding=like.padding,
        groups=like.groups,
        bias=True,
    ).to(device=like.weight.device, dtype=like.weight.dtype)
    with torch.no_grad():
        conv.weight.copy_(kernel.to(like.weight.dtype))
        conv.bias.copy_(bias.to(like.weight.dtype))  # type: ignore[union-attr]
    return conv


class RepVGGBlock(nn.Module):
    """RepVGG block: 3x3 conv+BN, 1x1 conv+BN and (when shapes allow) identity BN, summed, then ReLU.

    After ``reparameterize_()`` it is one 3x3 conv with bias + ReLU, exactly equivalent in eval mode.

    Example:
        >>> b = ptt.RepVGGBlock(8, 8).eval()
        >>> x = torch.randn(1, 8, 5, 5)
        >>> y = b(x)
        >>> torch.allclose(b.reparameterize_()(x), y, atol=1e-5)
        True
    """

    def __init__(self, in_channels: int, out_channels: int, stride: int = 1, groups: int = 1) -> None:
        super().__init__()
        self.in_channels, self.out_channels, self.groups = in_channels, out_channels, groups
        self.dense = _conv_bn(in_channels, out_channels, (3, 3), stride, (1, 1), groups)
        self.pointwise = _conv_bn(in_channels, out_channels, (1, 1), stride, (0, 0), groups)
        self.identity = nn.BatchNorm2d(in_channels) if in_channels == out_channels and stride == 1 else None
        self.act = nn.ReLU()
        self.reparam: nn.Conv2d | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.reparam is not None:
            return self.act(self.reparam(x))
        y = self.dense(x) + self.pointwise(x)
        if self.identity is not None:
            y = y + self.identity(x)
        return self.act(y)

    def reparameterize_(self) -> RepVGGBlock:
        """Switch to the deploy form (one 3x3 conv) in place; eval mode only."""
        if self.reparam is not None:
            return self
        k3, b3 = _fold(self.dense[0], self.dense[1])
        k1, b1 = _fold(self.pointwise[0], self.pointwise[1])
        kernel, bias = k3 + F.pad(k1, [1, 1, 1, 1]), b3 + b1
        if self.identity is not None:
            ki, bi = _fold_identity(self.identity, self.in_channels, self.groups, 3)
            kernel, bias = kernel + ki, bias + bi
        self.reparam = _deploy_conv(self, self.dense[0], kernel, bias)
        del self.dense, self.pointwise, self.identity
        self.identity = None
        return self


class ACBlock(nn.Module):
    """Asymmetric convolution block (ACNet): k x k, 1 x k and k x 1 conv+BN branches summed.

    After ``reparameterize_()`` it is one k x k conv with bias (the 1 x k / k x 1 kernels land on the centre
    row / column), exactly equivalent in eval mode.

    Example:
        >>> b = ptt.ACBlock(4, 6, kernel_size=3).eval()
        >>> x = torch.randn(1, 4, 7, 7)
        >>> torch.allclose(b(x), b.reparameterize_()(x), atol=1e-5)
        True
    """

    def __init__(
        self, in_channels: int, out_channels: int, kernel_size: int = 3, stride: int = 1, groups: int = 1
    ) -> None:
        super().__init__()
        if kernel_size % 2 != 1:
            raise PttError(
                f"ACBlock needs an odd kernel_size (got {kernel_size}): branches must share a centre."
            )
        p = kernel_size // 2
        self.square = _conv_bn(in_channels, out_channels, (kernel_size, kernel_size), stride, (p, p), groups)
        self.hor = _conv_bn(in_channels, out_channels, (1, kernel_size), stride, (0, p), groups)
        self.ver = _conv_bn(in_channels, out_channels, (kernel_size, 1), stride, (p, 0), groups)
        self.reparam: nn.Conv2d | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.reparam is not None:
            return self.reparam(x)
        return self.square(x) + self.hor(x) + self.ver(x)

    def reparameterize_(self) -> ACBlock:
        """Switch to the deploy form (one k x k conv) in place; eval mode only."""
        if self.reparam is not None:
            return self
        ks, bs = _fold(self.square[0], self.square[1])
        kh, bh = _fold(self.hor[0], self.hor[1])
        kv, bv = _fold(self.ver[0], self.ver[1])
        p = ks.shape[-1] // 2
        kernel = ks + F.pad(kh, [0, 0, p, p]) + F.pad(kv, [p, p, 0, 0])
        self.reparam = _deploy_conv(self, self.square[0], kernel, bs + bh + bv)
        del self.square, self.hor, self.ver
        return self


def repvgg_net(
    num_classes: int = 10,
    in_channels: int = 3,
    widths: tuple[int, ...] = (48, 96, 192, 384),
    depths: tuple[int, ...] = (2, 4, 8, 1),
    groups: int = 1,
) -> nn.Sequential:
    """A RepVGG-A0-shaped classifier (first block of each stage strides by 2); small defaults for tests."""
    c = widths[0] // 2 if widths[0] > 32 else widths[0]
    layers: list[nn.Module] = [RepVGGBlock(in_channels, c, 2)]
    for w, d in zip(widths, depths):
        for i in range(d):
            g = groups if (i % 2 == 1 and c == w) else 1
            layers.append(RepVGGBlock(c, w, stride=2 if i == 0 else 1, groups=g))
            c = w
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(c, num_classes)]
    return nn.Sequential(*layers)
