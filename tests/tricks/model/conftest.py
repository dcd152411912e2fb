"""Fixtures for the model tests: a small Fashion-MNIST CNN (trained once, cached on disk) and real photos at 160 px."""

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
    from pytorchtricks import fashion_mnist as fm

    if not fm.available():
        pytest.skip("Fashion-MNIST not installed (apt-get install dataset-fashion-mnist)")
    model = fm.trained_small_cnn()
    tx, ty = fm.load("train")
    ex, ey = fm.load("test")
    return FashionMnist(model, tx[:20000], ty[:20000], ex, ey, fm.evaluate(model, ex, ey))


@pytest.fixture(scope="session")
def photos_160(tmp_path_factory: pytest.TempPathFactory) -> list[torch.Tensor]:
    """Eight batches of 8 real photos at 160 px (ImageNet-normalised), through the loader ``ptt optimize`` uses.

    Built once per session from the Debian wallpapers (``make system-deps``): 64 distinct crops, fixed seed.
    """
    from pytorchtricks.data.photoset import build_photo_set, wallpaper_sources
    from pytorchtricks.infer.pipeline import load_calibration

    if not wallpaper_sources():
        pytest.skip("Debian wallpaper packages not installed (make system-deps)")
    root = tmp_path_factory.mktemp("photos160")
    build_photo_set(root, 64, seed=0, workers=1)
    return load_calibration(str(root), (8, 3, 160, 160), limit=64)
