"""How one image of the detection set is made (``data.detection_set`` builds the set): a seeded crop of a wallpaper
photo, and Fashion-MNIST items blended onto it with an alpha from their grey value, each with its tight box.

``DetectionSetConfig`` holds the parameters; ``render_images`` makes the images of one photo, every draw from a
generator seeded by (seed, image index), so an image does not depend on which process makes it or in what order.
"""

from __future__ import annotations

import dataclasses
import functools
import io
from collections.abc import Sequence
from typing import Any

import numpy as np

from pytorchtricks.core import PttError
from pytorchtricks.data.photoset import load_source

__all__ = ["BOX_ALPHA", "DetectionSetConfig", "item_alpha", "object_pool", "render_images"]

ALPHA_LO, ALPHA_HI = (
    8.0,
    40.0,
)  # grey levels of the 28x28 item: alpha ramps from its black square to the garment
BOX_ALPHA = 0.5  # a box holds the scaled item's pixels whose alpha is above this
_TRIES = 20  # placements drawn per object before it is left out
_CROP_AREA = (0.3, 1.0)  # background crop, as a fraction of the photo's area


@dataclasses.dataclass(frozen=True)
class DetectionSetConfig:
    """What a detection set is built from; all of it is written into the set's ``ptt-set.json``.

    ``train``/``val``: images per split. ``long_side``: the images' long side in pixels (``None``: crops at the
    photo's native resolution, the high-resolution case). ``objects``: the inclusive range of objects per image.
    ``object_size``: the range of an item's square side, as a fraction of the image's short side (drawn
    log-uniformly). ``max_iou``: the most a new box may overlap an earlier one. ``min_mp``: only photos of at least
    this many megapixels. ``quality``: the JPEG quality of every image.
    """

    train: int = 400
    val: int = 100
    long_side: int | None = 640
    objects: tuple[int, int] = (1, 8)
    object_size: tuple[float, float] = (0.1, 0.4)
    max_iou: float = 0.1
    min_mp: float = 2.0
    quality: int = 90
    seed: int = 0

    def __post_init__(self) -> None:
        if self.train < 1 or self.val < 0:
            raise PttError(f"train={self.train}, val={self.val}: give at least one train image and val >= 0.")
        if self.long_side is not None and self.long_side < 64:
            raise PttError(
                f"long_side={self.long_side} is too small for objects: use >= 64, or None (native)."
            )
        lo, hi = self.objects
        if not 0 <= lo <= hi:
            raise PttError(f"objects={self.objects}: give (min, max) with 0 <= min <= max, e.g. (1, 8).")
        a, b = self.object_size
        if not 0 < a <= b <= 1:
            raise PttError(
                f"object_size={self.object_size}: give (min, max) fractions with 0 < min <= max <= 1."
            )
        if not 0 <= self.max_iou <= 1:
            raise PttError(f"max_iou={self.max_iou}: give an IoU in [0, 1].")
        if not 1 <= self.quality <= 100:
            raise PttError(f"quality={self.quality}: give a JPEG quality in 1..100.")


def item_alpha(item: np.ndarray, size: int, flip: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """A 28x28 uint8 item scaled to ``size`` x ``size`` (bicubic): ``(grey, alpha)``, float32 in [0, 1] each;
    alpha is ``smoothstep`` of the grey level between ``ALPHA_LO`` and ``ALPHA_HI``.

    Example:
        >>> item = np.zeros((28, 28), np.uint8); item[10:20, 5:12] = 200
        >>> grey, alpha = item_alpha(item, 56)
        >>> ys, xs = np.nonzero(alpha > BOX_ALPHA)  # rows 20-39, columns 10-23 scaled, widened by the filter
        >>> [int(v) for v in (ys.min(), ys.max(), xs.min(), xs.max())]
        [19, 40, 9, 24]
    """
    from PIL import Image

    img = Image.fromarray(np.ascontiguousarray(item[:, ::-1] if flip else item))
    g = np.asarray(img.resize((size, size), Image.Resampling.BICUBIC), np.float32)
    t = np.clip((g - ALPHA_LO) / (ALPHA_HI - ALPHA_LO), 0.0, 1.0)
    return g / 255.0, t * t * (3.0 - 2.0 * t)


def _iou(a: Sequence[int], b: Sequence[int]) -> float:
    iw = min(a[2], b[2]) - max(a[0], b[0])
    ih = min(a[3], b[3]) - max(a[1], b[1])
    if iw <= 0 or ih <= 0:
        return 0.0
    inter = iw * ih
    return inter / ((a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter)


def _background(photo: Any, cfg: DetectionSetConfig, rng: np.random.Generator) -> np.ndarray:
    from PIL import Image

    w, h = photo.size
    lo = _CROP_AREA[0]
    if cfg.long_side is None:  # native: keep a crop of about min_mp megapixels or more
        lo = min(1.0, max(lo, cfg.min_mp * 1e6 / (w * h)))
    area = w * h * rng.uniform(lo, _CROP_AREA[1])
    aspect = float(np.exp(rng.uniform(np.log(3 / 4), np.log(4 / 3))))
    cw = int(min(w, max(64, round(np.sqrt(area * aspect)))))
    ch = int(min(h, max(64, round(np.sqrt(area / aspect)))))
    left, top = int(rng.integers(0, w - cw + 1)), int(rng.integers(0, h - ch + 1))
    box = (left, top, left + cw, top + ch)
    if cfg.long_side is None:
        out = photo.crop(box)
    else:
        f = cfg.long_side / max(cw, ch)
        size = (max(64, round(cw * f)), max(64, round(ch * f)))
        out = photo.resize(size, Image.Resampling.BILINEAR, box=box, reducing_gap=3.0)
    if rng.random() < 0.5:
        out = out.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    return np.asarray(out, np.uint8)


def _colour(rng: np.random.Generator) -> tuple[np.ndarray, float, float, float]:
    """Four draws per object whatever the background: a tint, a dark and a bright value, a texture contrast."""
    hue, sat = rng.uniform(0.0, 1.0, 3), rng.uniform(0.0, 0.8)
    tint = (1.0 - sat) + sat * hue
    return tint / tint.max(), rng.uniform(0.05, 0.4), rng.uniform(0.75, 1.0), rng.uniform(0.3, 0.7)


def _paste(canvas: np.ndarray, item: np.ndarray, rng: np.random.Generator, cfg: DetectionSetConfig,
           boxes: list[list[int]]) -> dict[str, Any] | None:  # fmt: skip
    """Blend one item onto ``canvas`` (float32 HxWx3, 0..255) in place; its box and paste record, or None."""
    h, w = canvas.shape[:2]
    lo, hi = cfg.object_size
    size = max(8, min(h, w, round(float(np.exp(rng.uniform(np.log(lo), np.log(hi)))) * min(h, w))))
    flip = bool(rng.random() < 0.5)
    tint, dark, bright, contrast = _colour(rng)
    grey, alpha = item_alpha(item, size, flip)
    ys, xs = np.nonzero(alpha > BOX_ALPHA)
    if len(ys) == 0:
        return None
    for _ in range(_TRIES):
        x0, y0 = int(rng.integers(0, w - size + 1)), int(rng.integers(0, h - size + 1))
        box = [x0 + int(xs.min()), y0 + int(ys.min()), x0 + int(xs.max()) + 1, y0 + int(ys.max()) + 1]
        if all(_iou(box, b) <= cfg.max_iou for b in boxes):
            break
    else:
        return None
    region = canvas[y0 : y0 + size, x0 : x0 + size]
    a = alpha[..., None]
    luma = float(
        (region @ np.array([0.299, 0.587, 0.114], np.float32) * alpha).sum() / max(alpha.sum(), 1e-6)
    )
    value = dark if luma > 127.5 else bright  # stand out from what lies under the item
    shade = (1.0 - contrast) + contrast * grey  # the item's own texture
    colour = (255.0 * value) * tint[None, None, :] * shade[..., None]
    region *= 1.0 - a
    region += a * colour
    boxes.append(box)
    return {"box": box, "x": x0, "y": y0, "size": size, "flip": int(flip), "area": len(ys)}


def render_images(
    args: tuple[str, DetectionSetConfig, list[int]],
) -> list[tuple[int, bytes, list[dict[str, Any]]]]:
    """The images ``indices`` (global: train first, then val), all on crops of the photo ``path``."""
    from PIL import Image

    path, cfg, indices = args
    photo = load_source(path, None if cfg.long_side is None else 2 * cfg.long_side)
    pools = {s: _items(s) for s in {object_pool(g, cfg) for g in indices}}
    out = []
    for g in indices:
        rng = np.random.default_rng([cfg.seed, g])
        canvas = _background(photo, cfg, rng).astype(np.float32)
        items, labels = pools[object_pool(g, cfg)]
        boxes: list[list[int]] = []
        objects = []
        for _ in range(int(rng.integers(cfg.objects[0], cfg.objects[1] + 1))):
            k = int(rng.integers(0, len(items)))
            placed = _paste(canvas, items[k], rng, cfg, boxes)
            if placed is not None:
                objects.append(
                    {**placed, "label": int(labels[k]), "item": k, "fmnist_split": object_pool(g, cfg)}
                )
        buf = io.BytesIO()
        Image.fromarray(np.clip(np.rint(canvas), 0, 255).astype(np.uint8)).save(
            buf, "JPEG", quality=cfg.quality
        )
        out.append((g, buf.getvalue(), objects))
    return out


@functools.lru_cache(maxsize=2)
def _items(split: str) -> tuple[np.ndarray, np.ndarray]:
    from pytorchtricks import fashion_mnist

    return fashion_mnist.load_uint8(split)  # read once per process: 47 MB of items for the train split


def object_pool(g: int, cfg: DetectionSetConfig) -> str:
    return "train" if g < cfg.train else "test"  # val objects are garments the train images never show
