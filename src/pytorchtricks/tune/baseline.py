"""The user's input pipeline as most users have it: the baseline every data trick is measured against.

torchvision ``ImageFolder`` + PIL ``RandomResizedCrop`` + ``RandomHorizontalFlip`` + ``ToTensor`` + ``Normalize``
in a ``DataLoader`` with the user's ``num_workers`` (default 2), shuffled, ``drop_last=True`` (equal batches),
seeded workers - the recipe of the official ImageNet example. For inference: ``Resize`` + ``CenterCrop``, in order.
Batches arrive as normalised float32 on the host (what that recipe gives); the library's loaders give uint8 and
normalise on the device (``normalize``), which is part of what they buy.
"""

from __future__ import annotations

import os
from typing import Any

import torch

from pytorchtricks.core import PttError, require
from pytorchtricks.data.normalization import IMAGENET_MEAN, IMAGENET_MEAN_PX, IMAGENET_STD, IMAGENET_STD_PX

DEFAULT_WORKERS = 2  # the baseline loader's workers when the user does not say (the common script's -j 2)


def user_loader(
    root: str,
    batch_size: int,
    size: int | tuple[int, int],
    *,
    num_workers: int = DEFAULT_WORKERS,
    train: bool = True,
    seed: int = 0,
    channels: int = 3,
    persistent: bool = True,
) -> torch.utils.data.DataLoader[Any]:
    """The torchvision ImageFolder + PIL pipeline over ``root`` at ``size`` px, as a user's script builds it."""
    datasets = require("torchvision.datasets", "data", package="torchvision")
    tf = require("torchvision.transforms", "data", package="torchvision")
    from pytorchtricks.tricks.runtime.seed_everything import seed_worker

    if not os.path.isdir(root):
        raise PttError(f"{root!r} is not a folder; pass an image folder (root/<class>/<image>).")
    mean, std = (IMAGENET_MEAN, IMAGENET_STD) if channels == 3 else ((0.5,), (0.5,))
    gray = [tf.Grayscale(num_output_channels=1)] if channels == 1 else []
    if train:
        steps = [tf.RandomResizedCrop(size), tf.RandomHorizontalFlip()]
    else:
        side = min(size) if isinstance(size, tuple) else size
        steps = [tf.Resize(round(side / 0.875)), tf.CenterCrop(size)]
    transform = tf.Compose([*gray, *steps, tf.ToTensor(), tf.Normalize(mean, std)])
    ds = datasets.ImageFolder(root, transform=transform)
    g = torch.Generator().manual_seed(seed)
    kwargs: dict[str, Any] = {}
    if num_workers > 0:
        kwargs.update(persistent_workers=persistent, worker_init_fn=seed_worker)
    return torch.utils.data.DataLoader(
        ds,
        batch_size=batch_size,
        shuffle=train,
        drop_last=train,
        num_workers=num_workers,
        generator=g,
        **kwargs,
    )


def normalize(x: torch.Tensor, device: torch.device, *, channels_last: bool = False) -> torch.Tensor:
    """A batch from either road -> normalised float32 on ``device``: uint8 (library loaders) is normalised there,
    float (the torchvision baseline) is already normalised on the host and only moved."""
    from pytorchtricks.tricks.data.device_augment import batch_normalize

    x = x.to(device, non_blocking=True)
    if x.dtype == torch.uint8:
        gray = x.shape[1] == 1
        x = batch_normalize(x, (127.5,) if gray else IMAGENET_MEAN_PX, (127.5,) if gray else IMAGENET_STD_PX)
    return x.contiguous(memory_format=torch.channels_last) if channels_last else x
