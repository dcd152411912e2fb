"""Tiny reference models for tests and the tricks' bench cases (bottom floor: every floor may use them).

``small_cnn`` is a Conv-BN-ReLU network for 28x28 inputs; ``many_small_tensors`` a deep Linear-LayerNorm stack
(many small parameter tensors: the optimizer tricks' case); ``randomize_bn_`` gives BatchNorms non-trivial
statistics so that a transform that mishandles them (fusion, re-parameterization, export) shows in the outputs.
"""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["ConvUsedTwice", "many_small_tensors", "randomize_bn_", "small_cnn", "tiny_mlp"]


def small_cnn(num_classes: int = 10, in_channels: int = 1, width: int = 32) -> nn.Module:
    """A small Conv-BN-ReLU CNN (for 28x28 Fashion-MNIST-like inputs and quick tests)."""
    w = width
    return nn.Sequential(
        nn.Conv2d(in_channels, w, 3, padding=1, bias=False),
        nn.BatchNorm2d(w),
        nn.ReLU(inplace=True),
        nn.Conv2d(w, 2 * w, 3, padding=1, stride=2, bias=False),
        nn.BatchNorm2d(2 * w),
        nn.ReLU(inplace=True),
        nn.Conv2d(2 * w, 4 * w, 3, padding=1, stride=2, bias=False),
        nn.BatchNorm2d(4 * w),
        nn.ReLU(inplace=True),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(4 * w, num_classes),
    )


def tiny_mlp(seed: int = 0) -> nn.Module:
    """Linear(12, 32) - Tanh - Linear(32, 5), seeded: the same weights on every call (and in every process)."""
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(12, 32), nn.Tanh(), nn.Linear(32, 5))


class ConvUsedTwice(nn.Module):
    """One conv called at two sites, only one of them followed by its BatchNorm (fusion must leave it alone)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(4, 4, 3, padding=1)
        self.bn = nn.BatchNorm2d(4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.bn(self.conv(x)) + self.conv(x)


def many_small_tensors(depth: int, width: int) -> nn.Module:
    """``depth`` x (Linear(width, width), LayerNorm(width)): ``4 * depth`` small parameter tensors."""
    layers: list[nn.Module] = []
    for _ in range(depth):
        layers += [nn.Linear(width, width), nn.LayerNorm(width)]
    return nn.Sequential(*layers)


def randomize_bn_(model: nn.Module, seed: int = 0) -> nn.Module:
    """Give every BatchNorm non-trivial running statistics and affine parameters (exposes fusion bugs)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.modules.batchnorm._BatchNorm):
                n = m.num_features
                if m.running_mean is not None and m.running_var is not None:
                    m.running_mean.copy_(torch.randn(n, generator=g) * 0.1)
                    m.running_var.copy_(torch.rand(n, generator=g) * 0.5 + 0.75)
                if m.affine:
                    m.weight.copy_(torch.rand(n, generator=g) * 0.5 + 0.75)
                    m.bias.copy_(torch.randn(n, generator=g) * 0.1)
    return model
