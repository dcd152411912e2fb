"""The staged pipeline (what the inference benchmarks time): every step safety-checked and exact in fp32."""

from __future__ import annotations

import torch
from torch import nn

import pytorchtricks as ptt
from pytorchtricks.fixtures import randomize_bn_
from pytorchtricks.infer.pipeline import optimize


class Net(nn.Module):
    """Shared ReLU, a RepVGG block and a Conv->BN pair: every fp32 step has something to do."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8))
        self.relu = nn.ReLU()
        self.block = ptt.RepVGGBlock(8, 8)
        self.conv, self.bn = nn.Conv2d(8, 8, 3, padding=1), nn.BatchNorm2d(8)
        self.head = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.block(self.relu(self.stem(x)))
        return self.head(self.relu(self.bn(self.conv(x))).mean((2, 3)))


def build() -> nn.Module:
    torch.manual_seed(0)
    return randomize_bn_(Net())


def test_pipeline_steps_exact_without_compile() -> None:
    model = build().eval()
    x = torch.randn(2, 3, 12, 12)
    ref = model(x).detach()
    res = optimize(model, x, compile=False)
    assert [s.status for s in res.steps[1:]] == ["applied", "applied", "applied"]
    assert all(s.max_abs_diff < 1e-5 for s in res.steps)
    torch.testing.assert_close(res.model(x), ref, atol=1e-5, rtol=1e-5)
    assert not any(isinstance(m, nn.BatchNorm2d) for m in res.fp32_model.modules())
