"""Fixtures for the tune tests: one compute thread (the 2-core CI machine is shared), tiny models, JPEG folders."""

from __future__ import annotations

import os

import numpy as np
import pytest

TINY = """
from torch import nn


def tiny():
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8), nn.ReLU(),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 10))


def planted():
    # conv bias before BN (twice), fp32 by default
    return nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
                         nn.Conv2d(16, 32, 3, padding=1, stride=2), nn.BatchNorm2d(32), nn.ReLU(),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 4))


def fails_small():
    # a Linear sized for 32 px inputs: any other input size fails in forward
    return nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.Flatten(), nn.Linear(4 * 32 * 32, 10))


def mnist():
    # 1 input channel, a Linear sized for 28x28 (the official MNIST example's shape)
    return nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                         nn.Linear(8 * 14 * 14, 10))


def gray():
    # 1 input channel, any input size
    return nn.Sequential(nn.Conv2d(1, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8), nn.ReLU(),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 10))


def chain():
    # no BatchNorm: K micro-batches give the whole batch's update in train mode too; a chain of 6 blocks to plan
    return nn.Sequential(nn.Conv2d(3, 16, 3, padding=1),
                         nn.Sequential(*[nn.Sequential(nn.Conv2d(16, 16, 3, padding=1), nn.ReLU())
                                         for _ in range(6)]),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 10))


def bn_chain():
    return nn.Sequential(nn.Conv2d(3, 16, 3, padding=1),
                         nn.Sequential(*[nn.Sequential(nn.Conv2d(16, 16, 3, padding=1, bias=False),
                                                       nn.BatchNorm2d(16), nn.ReLU()) for _ in range(6)]),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 10))


def broken_import():
    raise RuntimeError("unreachable")
"""


@pytest.fixture(autouse=True)
def _one_thread(one_thread: None) -> None:
    """Every tune test on one intra-op thread (the root conftest's ``one_thread``)."""


@pytest.fixture
def models_file(tmp_path):
    path = tmp_path / "models.py"
    path.write_text(TINY)
    return str(path)


def write_jpegs(root: str, classes: int, per_class: int, px: int, seed: int = 0, ext: str = "jpg") -> str:
    from PIL import Image

    rng = np.random.default_rng(seed)
    for k in range(classes):
        os.makedirs(os.path.join(root, f"c{k}"), exist_ok=True)
        for j in range(per_class):
            yy, xx = np.mgrid[0:px, 0:px] / px
            img = 128 + 60 * np.sin((k + 1) * 6 * (xx + yy))[..., None] + rng.normal(0, 20, (px, px, 3))
            Image.fromarray(np.clip(img, 0, 255).astype(np.uint8)).save(
                os.path.join(root, f"c{k}", f"{j}.{ext}")
            )
    return root


@pytest.fixture
def jpegs():
    """``jpegs(root, classes, per_class, px)`` writes a deterministic JPEG ImageFolder tree."""
    return write_jpegs


@pytest.fixture
def jpeg_folder(tmp_path):
    return write_jpegs(str(tmp_path / "imgs"), classes=2, per_class=12, px=48)
