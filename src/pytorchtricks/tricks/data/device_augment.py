"""Augment whole uint8 batches on the device: random resized crop, flip, translate, cutout, normalize - seeded.

Why: per-sample PIL transforms cost CPU time per image in the workers; the same maths as one batched tensor op on
the GPU (or vectorized on the CPU) is nearly free, so a small CPU can feed a big GPU (airbench's flip/translate).
When: after ``prefetch_to_device``, or with ``dataset_on_device``; images uint8 ``[N, C, H, W]``.
Caveats: random resized crop resamples with ``grid_sample`` (bilinear, float32, rounded back to uint8): close to,
not identical with, PIL's filter. All randomness comes from the ``generator`` you pass (on the batch's device),
so a fixed seed gives the same batch on every run.
See also: prefetch_to_device, dataset_on_device, make_loader; airbench, DALI; 预处理提速.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence

import torch
import torch.nn.functional as F

from pytorchtricks.core import BenchCase, NoEffectWarning, PttError, TrickInfo

__all__ = [
    "device_augment",
    "crop_boxes",
    "batch_random_resized_crop",
    "batch_flip",
    "batch_translate",
    "batch_cutout",
    "batch_normalize",
]

TRICK = TrickInfo(gains=("speed",), phase=("train",), exact=False)


def _check(images: torch.Tensor) -> None:
    if not isinstance(images, torch.Tensor) or images.dim() != 4:
        raise PttError(f"expected a [N, C, H, W] batch tensor, got {getattr(images, 'shape', type(images))}.")


def crop_boxes(
    n: int,
    height: int,
    width: int,
    *,
    scale: tuple[float, float] = (0.08, 1.0),
    ratio: tuple[float, float] = (3 / 4, 4 / 3),
    generator: torch.Generator | None = None,
    device: torch.device | str = "cpu",
    tries: int = 10,
) -> torch.Tensor:
    """RandomResizedCrop boxes ``[n, 4]`` (top, left, height, width), vectorized; always inside the image.

    Each image gets the first of ``tries`` proposals that fits, else the centre crop at the clamped aspect ratio.
    """
    area = height * width
    u = torch.rand(n, tries, 4, generator=generator, device=device, dtype=torch.float64)
    target = area * (scale[0] + (scale[1] - scale[0]) * u[..., 0])
    log_r = math.log(ratio[0]) + (math.log(ratio[1]) - math.log(ratio[0])) * u[..., 1]
    aspect = torch.exp(log_r)
    w = torch.sqrt(target * aspect).round()
    h = torch.sqrt(target / aspect).round()
    ok = (w > 0) & (w <= width) & (h > 0) & (h <= height)
    first = torch.where(ok.any(1), ok.float().argmax(1), torch.full((n,), -1, device=device))
    in_ratio = width / height
    if in_ratio < ratio[0]:
        cw, ch = width, round(width / ratio[0])
    elif in_ratio > ratio[1]:
        cw, ch = round(height * ratio[1]), height
    else:
        cw, ch = width, height
    pick = first.clamp(min=0)
    rows = torch.arange(n, device=device)
    hh = torch.where(
        first >= 0, h[rows, pick], torch.full((n,), float(ch), device=device, dtype=torch.float64)
    )
    ww = torch.where(
        first >= 0, w[rows, pick], torch.full((n,), float(cw), device=device, dtype=torch.float64)
    )
    top = torch.where(first >= 0, (u[rows, pick, 2] * (height - hh + 1)).floor(), ((height - hh) // 2))
    left = torch.where(first >= 0, (u[rows, pick, 3] * (width - ww + 1)).floor(), ((width - ww) // 2))
    return torch.stack([top, left, hh, ww], 1).long()


def batch_random_resized_crop(
    images: torch.Tensor,
    size: int | tuple[int, int],
    *,
    scale: tuple[float, float] = (0.08, 1.0),
    ratio: tuple[float, float] = (3 / 4, 4 / 3),
    generator: torch.Generator | None = None,
    boxes: torch.Tensor | None = None,
) -> torch.Tensor:
    """Crop a random box per image and resize it to ``size`` (bilinear), as one ``grid_sample``; keeps dtype."""
    _check(images)
    n, _, h, w = images.shape
    oh, ow = (size, size) if isinstance(size, int) else size
    if boxes is None:
        boxes = crop_boxes(n, h, w, scale=scale, ratio=ratio, generator=generator, device=images.device)
    b = boxes.to(images.device, torch.float32)
    # pixel centres of the output, mapped into the box, in grid_sample's [-1, 1] coordinates (align_corners=False)
    ys = (torch.arange(oh, device=images.device, dtype=torch.float32) + 0.5) / oh
    xs = (torch.arange(ow, device=images.device, dtype=torch.float32) + 0.5) / ow
    gy = (b[:, 0:1] + ys[None] * b[:, 2:3]) / h * 2 - 1  # [n, oh]
    gx = (b[:, 1:2] + xs[None] * b[:, 3:4]) / w * 2 - 1  # [n, ow]
    grid = torch.stack([gx[:, None, :].expand(n, oh, ow), gy[:, :, None].expand(n, oh, ow)], -1)
    out = F.grid_sample(images.float(), grid, mode="bilinear", padding_mode="border", align_corners=False)
    return (
        out.round_().clamp_(0, 255).to(images.dtype) if images.dtype == torch.uint8 else out.to(images.dtype)
    )


def batch_flip(
    images: torch.Tensor, p: float = 0.5, *, generator: torch.Generator | None = None
) -> torch.Tensor:
    """Mirror each image left-right with probability ``p`` (exact: pixels are only moved)."""
    _check(images)
    mask = torch.rand(images.shape[0], generator=generator, device=images.device) < p
    return torch.where(mask[:, None, None, None], images.flip(-1), images)


def batch_translate(
    images: torch.Tensor, pad: int, *, generator: torch.Generator | None = None, mode: str = "reflect"
) -> torch.Tensor:
    """Pad by ``pad`` pixels and take a random same-size crop per image (airbench / CIFAR translate)."""
    _check(images)
    if pad < 0:
        raise PttError(f"pad must be >= 0 pixels, got {pad}.")
    if pad == 0:
        return images
    n, c, h, w = images.shape
    padded = F.pad(images.float() if mode == "reflect" else images, (pad, pad, pad, pad), mode=mode).to(
        images.dtype
    )
    dy = torch.randint(0, 2 * pad + 1, (n,), generator=generator, device=images.device)
    dx = torch.randint(0, 2 * pad + 1, (n,), generator=generator, device=images.device)
    rows = (dy[:, None] + torch.arange(h, device=images.device)[None])[:, None, :, None].expand(
        n, c, h, w + 2 * pad
    )
    out = padded.gather(2, rows)
    cols = (dx[:, None] + torch.arange(w, device=images.device)[None])[:, None, None, :].expand(n, c, h, w)
    return out.gather(3, cols)


def batch_cutout(
    images: torch.Tensor, size: int, *, generator: torch.Generator | None = None, value: int = 0
) -> torch.Tensor:
    """Set a ``size`` x ``size`` square (centre uniform over the image, clipped at borders) to ``value``."""
    _check(images)
    n, _, h, w = images.shape
    cy = torch.randint(0, h, (n,), generator=generator, device=images.device)
    cx = torch.randint(0, w, (n,), generator=generator, device=images.device)
    y = torch.arange(h, device=images.device)[None, :, None]
    x = torch.arange(w, device=images.device)[None, None, :]
    y0, x0 = (cy - size // 2)[:, None, None], (cx - size // 2)[:, None, None]
    inside = (y >= y0) & (y < y0 + size) & (x >= x0) & (x < x0 + size)
    return images.masked_fill(inside[:, None], value)


def batch_normalize(
    images: torch.Tensor,
    mean: Sequence[float],
    std: Sequence[float],
    *,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """``(x - mean) / std`` per channel in float32 (pixel units for uint8 input), then cast to ``dtype``."""
    _check(images)
    m = torch.tensor(mean, dtype=torch.float32, device=images.device).view(1, -1, 1, 1)
    s = torch.tensor(std, dtype=torch.float32, device=images.device).view(1, -1, 1, 1)
    return ((images.float() - m) / s).to(dtype)


def device_augment(
    images: torch.Tensor,
    *,
    crop: int | tuple[int, int] | None = None,
    scale: tuple[float, float] = (0.08, 1.0),
    flip: bool = True,
    translate: int = 0,
    cutout: int = 0,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """The common recipe in one call: [random resized crop] -> [flip] -> [translate] -> [cutout]; uint8 in/out.

    Example:
        >>> g = torch.Generator().manual_seed(0)
        >>> x = torch.randint(0, 256, (4, 3, 32, 32), dtype=torch.uint8)
        >>> ptt.device_augment(x, crop=24, translate=2, cutout=8, generator=g).shape
        torch.Size([4, 3, 24, 24])
    """
    _check(images)
    if crop is None and not flip and not translate and not cutout:
        warnings.warn(
            "device_augment: every transform is off; the batch is returned unchanged.",
            NoEffectWarning,
            stacklevel=2,
        )
        return images
    if crop is not None:
        images = batch_random_resized_crop(images, crop, scale=scale, generator=generator)
    if flip:
        images = batch_flip(images, generator=generator)
    if translate:
        images = batch_translate(images, translate, generator=generator)
    if cutout:
        images = batch_cutout(images, cutout, generator=generator)
    return images


def bench_case(size: str = "smoke", device: str = "cpu") -> BenchCase:
    """Flip + translate + cutout of a uint8 batch: per-image Python loop vs one vectorized call."""
    n, hw = (64, 32) if size == "smoke" else (512, 32)
    dev = torch.device(device)
    x = torch.randint(0, 256, (n, 3, hw, hw), dtype=torch.uint8, device=dev)

    def per_image() -> torch.Tensor:
        g = torch.Generator(device=dev).manual_seed(0)
        return torch.cat([device_augment(x[i : i + 1], translate=2, cutout=8, generator=g) for i in range(n)])

    def batched() -> torch.Tensor:
        g = torch.Generator(device=dev).manual_seed(0)
        return device_augment(x, translate=2, cutout=8, generator=g)

    return BenchCase(
        baseline=per_image,
        treated=batched,
        items_per_call=n,
        unit="images",
        device=str(dev),
        description=f"flip + translate 2 + cutout 8 on {n}x3x{hw}x{hw} uint8: per image vs whole batch",
    )
