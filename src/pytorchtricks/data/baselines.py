"""The input pipelines users run, as they run them: the baselines every data trick is measured against.

- ``imagefolder_loader``: torchvision ``ImageFolder`` + PIL ``RandomResizedCrop`` + ``RandomHorizontalFlip`` +
  ``ToTensor`` + ``Normalize`` (ImageNet's mean and std, ``data.normalization``) in a ``DataLoader`` with the
  user's ``num_workers`` (default 2), shuffled, ``drop_last=True`` (equal batches) - the recipe of the official
  ImageNet example. For inference: ``Resize`` + ``CenterCrop``, in order. Batches arrive as normalised float32 on
  the host (what that recipe gives); the library's loaders give uint8 and normalise on the device.
- ``detection_reference_loader``: the torchvision detection reference (``references/detection``, its "hflip"
  policy, ``ReferencePolicy``) over a detection dataset: PIL decodes the whole photo, flip, ``PILToTensor``,
  ``ToDtype(float32, scale=True)``, a list collate; the model's ``GeneralizedRCNNTransform`` then shrinks each image.

Their workers persist across epochs (a timed block then sees the steady state; the caller stops them). ``ptt
tune`` times the user's loader with these, the benchmarks draw their torchvision rows from the same recipes.
"""

from __future__ import annotations

import io
import os
from collections.abc import Callable
from typing import Any

import torch

from pytorchtricks.core import PttError, require
from pytorchtricks.data.normalization import IMAGENET_MEAN, IMAGENET_STD

__all__ = ["DEFAULT_WORKERS", "ReferencePolicy", "detection_reference_loader", "imagefolder_loader"]

DEFAULT_WORKERS = 2  # the baseline loader's workers when the user does not say (the common script's -j 2)


def imagefolder_loader(
    root: str,
    batch_size: int,
    size: int | tuple[int, int],
    *,
    num_workers: int = DEFAULT_WORKERS,
    train: bool = True,
    seed: int = 0,
    channels: int = 3,
    persistent: bool = True,
    worker_init_fn: Callable[[int], None] | None = None,
) -> torch.utils.data.DataLoader[Any]:
    """The torchvision ImageFolder + PIL pipeline over ``root`` at ``size`` px, as a user's script builds it
    (``channels=1``: a ``Grayscale`` first and mean/std 0.5). ``worker_init_fn``: the script's worker seeding, e.g.
    ``ptt.seed_worker``.

    Example:
        >>> import tempfile, os; from PIL import Image
        >>> d = tempfile.mkdtemp(); os.makedirs(f"{d}/a")
        >>> for i in range(4): Image.new("RGB", (40, 30)).save(f"{d}/a/{i}.jpg")
        >>> x, y = next(iter(imagefolder_loader(d, 2, 16, num_workers=0)))
        >>> tuple(x.shape), x.dtype
        ((2, 3, 16, 16), torch.float32)
    """
    datasets = require("torchvision.datasets", "data", package="torchvision")
    tf = require("torchvision.transforms", "data", package="torchvision")
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
        kwargs.update(persistent_workers=persistent, worker_init_fn=worker_init_fn)
    return torch.utils.data.DataLoader(
        ds,
        batch_size=batch_size,
        shuffle=train,
        drop_last=train,
        num_workers=num_workers,
        generator=g,
        **kwargs,
    )


class ReferencePolicy(torch.utils.data.Dataset):  # type: ignore[type-arg]
    """The torchvision detection reference's "hflip" policy over ``(jpeg bytes, target)`` samples: PIL decodes
    the whole photo, ``RandomHorizontalFlip(0.5)`` flips image and boxes, ``PILToTensor`` + ``ToDtype(float32,
    scale=True)``: a full-resolution float32 image (a 12 MP photo is 144 MB) and its target, as ``CocoDetection``
    wrapped for transforms v2 gives them."""

    def __init__(self, dataset: Any) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, dict[str, Any]]:
        from PIL import Image
        from torchvision import tv_tensors
        from torchvision.transforms import v2 as T

        raw, t = self.dataset[i]
        img = Image.open(io.BytesIO(raw)).convert("RGB")
        boxes = tv_tensors.BoundingBoxes(t["boxes"], format="XYXY", canvas_size=(img.height, img.width))
        policy = T.Compose(
            [T.RandomHorizontalFlip(0.5), T.PILToTensor(), T.ToDtype(torch.float32, scale=True)]
        )
        out, b = policy(img, boxes)
        return out, {"boxes": b.as_subclass(torch.Tensor), "labels": t["labels"]}


def _collate(batch: Any) -> Any:
    return tuple(zip(*batch, strict=True))  # the reference's utils.collate_fn: lists, no stacking


def detection_reference_loader(
    dataset: Any, batch_size: int, num_workers: int = DEFAULT_WORKERS, seed: int = 0, train: bool = True
) -> torch.utils.data.DataLoader[Any]:
    """The user's detection pipeline as the torchvision reference runs it (``ReferencePolicy``), list-collated."""
    g = torch.Generator().manual_seed(seed)
    return torch.utils.data.DataLoader(
        ReferencePolicy(dataset), batch_size=batch_size, shuffle=train, drop_last=train, num_workers=num_workers,
        collate_fn=_collate, generator=g, persistent_workers=num_workers > 0,
    )  # fmt: skip
