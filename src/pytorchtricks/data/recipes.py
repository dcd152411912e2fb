"""Detection recipes as geometry plans: each draws its random parameters and returns one ``Geometry`` per image.

The recipes are torchvision's (``references/detection`` presets, ``transforms.v2``), with the same arithmetic, so
the same parameters give the same boxes and, within resampling, the same pixels:

- ``shortest_side``: ``RandomShortestSize(min_size, max_size)`` / ``GeneralizedRCNNTransform``'s resize: scale
  ``r = min(s / short, max_size / long)``, output ``(int(h * r), int(w * r))``; ``s`` drawn per batch from a
  tuple (multi-scale training) or fixed; then a horizontal flip with ``flip`` probability.
- ``lsj``: ``ScaleJitter(target, (0.1, 2.0))`` (``r = min(T / h, T / w) * uniform(lo, hi)``, ``int`` sizes) then
  the reference's ``FixedSizeCrop(T)`` (a random ``min(h, T) x min(w, T)`` window, padded to ``T x T``), flip.
- ``ssd``: ``RandomZoomOut((1, 4), p=0.5)`` then ``RandomIoUCrop()`` (min IoU drawn from 0, .1, .3, .5, .7, .9 or
  no crop; 40 trials; boxes whose centre leaves the crop dropped) then flip and a resize to the fixed size (what
  the SSD model's own transform does).

Random draws use numpy generators seeded per (seed, epoch, sample) - never torch's global state.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from pytorchtricks.core import PttError
from pytorchtricks.data.decode import short_side_hw
from pytorchtricks.data.geometry import Geometry

Flip = Callable[[np.random.Generator], bool]
IOU_CHOICES = (
    0.0,
    0.1,
    0.3,
    0.5,
    0.7,
    0.9,
    1.0,
)  # RandomIoUCrop's sampler_options; 1.0 = leave the image as is


@dataclass(frozen=True)
class DetectionRecipe:
    """What happens to each image (see the module docstring); build one with ``shortest_side``, ``lsj``, ``ssd``.

    ``min_size``: short side(s); one is drawn per batch. ``max_size``: cap on the long side. ``flip``: probability
    of a horizontal flip. ``jitter``/``crop``: scale range and square size of the LSJ recipe. ``fixed``: output size
    of the SSD recipe; ``zoom_out``: its side range; ``fill``: the padding value.

    Example:
        >>> r = DetectionRecipe.shortest_side(800, 1333, flip=0.0)
        >>> g = r.plan((3000, 4000), np.random.default_rng(0), 800)
        >>> g.out_hw, r.canvas_hw([g.out_hw])
        ((800, 1066), (800, 1088))
    """

    kind: str = "shortest_side"
    min_size: tuple[int, ...] = (800,)
    max_size: int | None = 1333
    flip: float = 0.5
    jitter: tuple[float, float] = (0.1, 2.0)
    crop: int = 1024
    fixed: tuple[int, int] = (300, 300)
    zoom_out: tuple[float, float] = (1.0, 4.0)
    fill: int = 0
    size_divisible: int = 32

    def __post_init__(self) -> None:
        if self.kind not in ("shortest_side", "lsj", "ssd"):
            raise PttError(f"unknown recipe {self.kind!r}; use shortest_side, lsj or ssd.")
        if not self.min_size or min(self.min_size) < 1 or (self.max_size is not None and self.max_size < 1):
            raise PttError(f"min_size/max_size must be positive pixels, got {self.min_size}/{self.max_size}.")
        if not 0.0 <= self.flip <= 1.0:
            raise PttError(f"flip is a probability in [0, 1], got {self.flip}.")

    @classmethod
    def shortest_side(
        cls, min_size: int | tuple[int, ...] = 800, max_size: int | None = 1333, *, flip: float = 0.5
    ) -> DetectionRecipe:
        """Faster R-CNN's recipe: short side ``min_size`` (a tuple: drawn per batch), long side <= ``max_size``."""
        sizes = (min_size,) if isinstance(min_size, int) else tuple(int(s) for s in min_size)
        return cls("shortest_side", sizes, max_size, flip)

    @classmethod
    def lsj(
        cls, size: int = 1024, *, jitter: tuple[float, float] = (0.1, 2.0), flip: float = 0.5, fill: int = 0
    ) -> DetectionRecipe:
        """Large-scale jitter: scale to ``size`` x uniform(``jitter``), random ``size`` x ``size`` crop/pad."""
        return cls("lsj", (size,), None, flip, jitter=jitter, crop=size, fill=fill)

    @classmethod
    def ssd(cls, size: int | tuple[int, int] = 300, *, flip: float = 0.5, fill: int = 0) -> DetectionRecipe:
        """SSD's recipe: zoom-out (p=0.5), IoU crop, flip, resize to ``size``."""
        hw = (size, size) if isinstance(size, int) else (int(size[0]), int(size[1]))
        return cls("ssd", (min(hw),), None, flip, fixed=hw, fill=fill)

    def batch_min_size(self, rng: np.random.Generator) -> int:
        """The short side of one batch (multi-scale training draws it per batch so images share a size)."""
        return (
            self.min_size[int(rng.integers(len(self.min_size)))]
            if len(self.min_size) > 1
            else self.min_size[0]
        )

    def canvas_hw(self, sizes: list[tuple[int, int]]) -> tuple[int, int]:
        """The padded batch size for these output sizes: the fixed size, or the largest rounded up to
        ``size_divisible`` (GeneralizedRCNNTransform's batching)."""
        if self.kind == "lsj":
            return self.crop, self.crop
        if self.kind == "ssd":
            return self.fixed
        d = self.size_divisible
        h = max(s[0] for s in sizes)
        w = max(s[1] for s in sizes)
        return -(-h // d) * d, -(-w // d) * d

    def largest_canvas_hw(self, sizes: np.ndarray | None = None) -> tuple[int, int] | None:
        """The largest padded batch this recipe makes: from the images' ``(h, w)`` rows ``sizes`` when given,
        else the bound ``max_size`` sets (a batch may mix portrait and landscape images); None when neither
        bounds it (shortest side without ``max_size`` and no sizes). What a loader sizes its buffers by.

        Example:
            >>> DetectionRecipe.shortest_side(800, 1333).largest_canvas_hw()
            (1344, 1344)
            >>> DetectionRecipe.shortest_side(800, 1333).largest_canvas_hw(np.array([[3000, 4000], [600, 800]]))
            (800, 1088)
        """
        if self.kind != "shortest_side":
            return self.canvas_hw([])
        s = max(self.min_size)
        if sizes is not None and len(sizes):
            hw = np.asarray(sizes, np.float64).reshape(-1, 2)
            r = s / hw.min(axis=1)
            if self.max_size is not None:
                r = np.minimum(r, self.max_size / hw.max(axis=1))
            out = np.floor(hw * r[:, None]).astype(np.int64)
            return self.canvas_hw([(int(out[:, 0].max()), int(out[:, 1].max()))])
        if self.max_size is None:
            return None
        return self.canvas_hw([(self.max_size, self.max_size)])  # both sides are at most max_size

    def plan(
        self, hw: tuple[int, int], rng: np.random.Generator, min_size: int, boxes: np.ndarray | None = None
    ) -> Geometry:
        """The geometry of one image of size ``hw`` (boxes: its XYXY boxes, which the IoU crop needs)."""
        h, w = hw
        if self.kind == "shortest_side":
            return shortest_side_geometry(h, w, min_size, self.max_size, self._flip(rng))
        if self.kind == "lsj":
            return lsj_geometry(h, w, self.crop, self.jitter, rng, self._flip)
        return ssd_geometry(
            h, w, boxes if boxes is not None else np.zeros((0, 4)), self.fixed, self.zoom_out, rng, self._flip
        )

    def _flip(self, rng: np.random.Generator) -> bool:
        return bool(self.flip > 0 and rng.random() < self.flip)


def shortest_side_size(h: int, w: int, min_size: int, max_size: int | None) -> tuple[int, int]:
    """RandomShortestSize's output ``(height, width)``: ``r = min(min_size / short, max_size / long)``, truncated."""
    return short_side_hw(h, w, min_size, max_size=max_size, enlarge=True, rounding="floor", scale_first=True)


def shortest_side_geometry(h: int, w: int, min_size: int, max_size: int | None, flip: bool) -> Geometry:
    return Geometry(
        (h, w), (0.0, 0.0, float(h), float(w)), shortest_side_size(h, w, min_size, max_size), flip
    )


def lsj_params(
    h: int, w: int, size: int, jitter: tuple[float, float], rng: np.random.Generator
) -> tuple[tuple[int, int], tuple[int, int, int, int]]:
    """ScaleJitter's resized ``(height, width)`` and FixedSizeCrop's window ``(top, left, height, width)`` in it."""
    r = min(size / h, size / w) * (jitter[0] + rng.random() * (jitter[1] - jitter[0]))
    nh, nw = max(1, int(h * r)), max(1, int(w * r))
    ch, cw = min(nh, size), min(nw, size)
    top = int(rng.integers(0, nh - ch + 1))
    left = int(rng.integers(0, nw - cw + 1))
    return (nh, nw), (top, left, ch, cw)


def lsj_geometry(
    h: int, w: int, size: int, jitter: tuple[float, float], rng: np.random.Generator, flip: Flip
) -> Geometry:
    (nh, nw), (t, lf, ch, cw) = lsj_params(h, w, size, jitter, rng)
    fy, fx = h / nh, w / nw  # resized pixels -> source pixels
    return Geometry((h, w), (t * fy, lf * fx, ch * fy, cw * fx), (ch, cw), flip(rng))


def zoom_out_params(
    h: int, w: int, side: tuple[float, float], rng: np.random.Generator
) -> tuple[int, int, int, int] | None:
    """RandomZoomOut (p=0.5): ``(top, left, canvas_h, canvas_w)`` of the image on the bigger canvas, or None."""
    if rng.random() >= 0.5:
        return None
    r = side[0] + rng.random() * (side[1] - side[0])
    ch, cw = int(h * r), int(w * r)
    u = rng.random(2)
    return int((ch - h) * u[1]), int((cw - w) * u[0]), ch, cw


def box_iou(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """IoU of XYXY boxes ``a`` [N, 4] against ``b`` [M, 4] -> [N, M]."""
    area_a = (a[:, 2] - a[:, 0]) * (a[:, 3] - a[:, 1])
    area_b = (b[:, 2] - b[:, 0]) * (b[:, 3] - b[:, 1])
    lt = np.maximum(a[:, None, :2], b[None, :, :2])
    rb = np.minimum(a[:, None, 2:], b[None, :, 2:])
    inter = np.prod((rb - lt).clip(min=0), axis=2)
    return inter / np.maximum(area_a[:, None] + area_b[None, :] - inter, 1e-12)


def iou_crop_params(
    h: int, w: int, boxes: np.ndarray, rng: np.random.Generator, trials: int = 40
) -> tuple[int, int, int, int] | None:
    """RandomIoUCrop's window ``(top, left, height, width)`` (scale 0.3-1, aspect 0.5-2, at least one box centre
    inside and IoU >= the drawn minimum), or None: keep the image as it is."""
    while True:  # torchvision loops until a choice succeeds (1.0, or an image without boxes, returns at once)
        min_iou = IOU_CHOICES[int(rng.integers(len(IOU_CHOICES)))]
        if min_iou >= 1.0 or len(boxes) == 0:
            return None
        for _ in range(trials):
            r = 0.3 + 0.7 * rng.random(2)
            nw, nh = int(w * r[0]), int(h * r[1])
            if nw == 0 or nh == 0 or not 0.5 <= nw / nh <= 2.0:
                continue
            u = rng.random(2)
            left, top = int((w - nw) * u[0]), int((h - nh) * u[1])
            right, bottom = left + nw, top + nh
            if left == right or top == bottom:
                continue
            cx, cy = (boxes[:, 0] + boxes[:, 2]) / 2, (boxes[:, 1] + boxes[:, 3]) / 2
            inside = (left < cx) & (cx < right) & (top < cy) & (cy < bottom)
            if not inside.any():
                continue
            iou = box_iou(boxes[inside], np.array([[left, top, right, bottom]], np.float64))
            if iou.max() < min_iou:
                continue
            return top, left, nh, nw


def ssd_geometry(
    h: int,
    w: int,
    boxes: np.ndarray,
    fixed: tuple[int, int],
    side: tuple[float, float],
    rng: np.random.Generator,
    flip: Flip,
) -> Geometry:
    zo = zoom_out_params(h, w, side, rng)
    zt, zl, ch, cw = (0, 0, h, w) if zo is None else zo
    b = np.asarray(boxes, np.float64).reshape(-1, 4) + np.array([zl, zt, zl, zt], np.float64)
    crop = iou_crop_params(ch, cw, b, rng)
    t, lf, wh, ww = (0, 0, ch, cw) if crop is None else crop
    return Geometry(
        (h, w), (float(t - zt), float(lf - zl), float(wh), float(ww)), fixed, flip(rng), crop is not None
    )


__all__ = [
    "DetectionRecipe",
    "box_iou",
    "iou_crop_params",
    "lsj_params",
    "shortest_side_size",
    "zoom_out_params",
]
