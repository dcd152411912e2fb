"""Normalisation constants: the ImageNet channel statistics (RGB) that torchvision's pretrained models expect.

In ``[0, 1]`` units (``Normalize`` after ``ToTensor``, the baseline loader and ``ptt optimize``'s calibration images)
and in pixel units (uint8 batches from the library's loaders, normalised on the device).
"""

from __future__ import annotations

IMAGENET_MEAN: tuple[float, ...] = (0.485, 0.456, 0.406)
IMAGENET_STD: tuple[float, ...] = (0.229, 0.224, 0.225)
IMAGENET_MEAN_PX: tuple[float, ...] = tuple(255 * m for m in IMAGENET_MEAN)
IMAGENET_STD_PX: tuple[float, ...] = tuple(255 * s for s in IMAGENET_STD)
