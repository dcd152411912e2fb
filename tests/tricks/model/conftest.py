"""Fashion-MNIST fixture for the compression tests: a small CNN trained once, cached on disk across sessions."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch
from torch import nn


@dataclass
class FashionMnist:
    model: nn.Module
    train_x: torch.Tensor
    train_y: torch.Tensor
    test_x: torch.Tensor
    test_y: torch.Tensor
    fp32_acc: float


@pytest.fixture(scope="session")
def fmnist() -> FashionMnist:
    from pytorchtricks.bench import fashion_mnist as fm

    if not fm.available():
        pytest.skip("Fashion-MNIST not installed (apt-get install dataset-fashion-mnist)")
    model = fm.trained_small_cnn()
    tx, ty = fm.load("train")
    ex, ey = fm.load("test")
    return FashionMnist(model, tx[:20000], ty[:20000], ex, ey, fm.evaluate(model, ex, ey))
