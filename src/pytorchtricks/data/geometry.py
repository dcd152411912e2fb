"""The geometry of one sample: which part of the source image lands where in the output, mirrored or not.

A detection recipe (resize to a short side, scale jitter + fixed-size crop, IoU crop, zoom-out, flip) is, for every
image, one axis-aligned affine map from source pixels to output pixels. ``Geometry`` holds it as a value: the source
size, a ``window`` (top, left, height, width in source pixels; fractional, and it may reach past the image: that part
is padding), the output size the window is stretched to, and a horizontal flip. The pixels and the boxes follow the
same map: ``warp`` resamples the DCT-scaled decode once (``data.decode.decode_scaled``: the largest 1/2, 1/4, 1/8
scale that keeps the window at least the output size, and only the window's rows and iMCU columns), and
``map_boxes`` moves XYXY boxes, clips them to the output and drops the degenerate ones, saying how many.

Coordinates are continuous with pixel edges at integers (torchvision's convention for boxes): a box
``(x1, y1, x2, y2)`` covers ``[x1, x2) x [y1, y2)``; output pixel ``i`` has its centre at ``i + 0.5``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from pytorchtricks.core import PttError
from pytorchtricks.data import decode_yuv
from pytorchtricks.data.decode import dct_scale, decode_planes, decode_scaled


@dataclass(frozen=True)
class Geometry:
    """One sample's map from source pixels to output pixels (see the module docstring).

    ``centre_rule``: boxes whose centre falls outside the window are dropped (RandomIoUCrop's rule) rather than
    clipped. ``src_hw`` and ``out_hw`` are ``(height, width)``.

    Example:
        >>> g = Geometry((480, 640), (0.0, 0.0, 480.0, 640.0), (240, 320), flip=True)
        >>> boxes, keep = g.map_boxes(np.array([[0, 0, 64, 48]], np.float32))
        >>> boxes.tolist(), keep.tolist()
        ([[288.0, 0.0, 320.0, 24.0]], [0])
    """

    src_hw: tuple[int, int]
    window: tuple[float, float, float, float]
    out_hw: tuple[int, int]
    flip: bool = False
    centre_rule: bool = False

    def __post_init__(self) -> None:
        if self.window[2] <= 0 or self.window[3] <= 0 or min(self.out_hw) <= 0 or min(self.src_hw) <= 0:
            raise PttError(
                f"degenerate geometry: window {self.window}, output {self.out_hw}, source {self.src_hw}."
            )

    @property
    def scale_yx(self) -> tuple[float, float]:
        """Output pixels per source pixel, (y, x)."""
        return self.out_hw[0] / self.window[2], self.out_hw[1] / self.window[3]

    def map_points(self, xs: np.ndarray, ys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Source x/y (float64) to output x/y: the affine map, flip included (no clipping)."""
        ky, kx = self.scale_yx
        ox = (xs - self.window[1]) * kx
        oy = (ys - self.window[0]) * ky
        return (self.out_hw[1] - ox if self.flip else ox), oy

    def map_boxes(
        self, boxes: Any, min_size: float = 1.0, min_area: float = 1.0
    ) -> tuple[np.ndarray, np.ndarray]:
        """XYXY ``boxes`` [K, 4] in source pixels -> ``(boxes [M, 4] float32 in output pixels, kept indices [M])``.

        Clipped to the output; a box that ends narrower or lower than ``min_size`` output pixels, or smaller than
        ``min_area`` square pixels (torchvision's ``SanitizeBoundingBoxes`` defaults: 1 and 1), is dropped, as is, under ``centre_rule``, one whose centre leaves the
        window. ``K - M`` is how many were dropped.
        """
        b = np.asarray(boxes, dtype=np.float64).reshape(-1, 4)
        keep = np.ones(len(b), dtype=bool)
        if self.centre_rule and len(b):
            cx, cy = (b[:, 0] + b[:, 2]) / 2, (b[:, 1] + b[:, 3]) / 2
            t, lf, h, w = self.window
            keep &= (cx > lf) & (cx < lf + w) & (cy > t) & (cy < t + h)
        x1, y1 = self.map_points(b[:, 0], b[:, 1])
        x2, y2 = self.map_points(b[:, 2], b[:, 3])
        if self.flip:
            x1, x2 = x2, x1
        out = np.stack([x1, y1, x2, y2], axis=1) if len(b) else np.zeros((0, 4))
        out[:, 0::2] = out[:, 0::2].clip(0, self.out_hw[1])
        out[:, 1::2] = out[:, 1::2].clip(0, self.out_hw[0])
        out32 = out.astype(
            np.float32
        )  # judged in float32, as the boxes are handed out (and as v2 judges them)
        ws, hs = out32[:, 2] - out32[:, 0], out32[:, 3] - out32[:, 1]
        keep &= (ws >= min_size) & (hs >= min_size) & (ws * hs >= min_area)
        idx = np.flatnonzero(keep)
        return out32[idx], idx

    def inverse_boxes(self, boxes: Any) -> np.ndarray:
        """Output XYXY boxes back to source pixels (no clipping): ``map_boxes``'s inverse on kept boxes."""
        b = np.asarray(boxes, dtype=np.float64).reshape(-1, 4)
        ky, kx = self.scale_yx
        xa, xb = (self.out_hw[1] - b[:, 2], self.out_hw[1] - b[:, 0]) if self.flip else (b[:, 0], b[:, 2])
        x1, x2 = xa / kx + self.window[1], xb / kx + self.window[1]
        y1, y2 = b[:, 1] / ky + self.window[0], b[:, 3] / ky + self.window[0]
        return np.stack([x1, y1, x2, y2], axis=1)

    def valid_window(self) -> tuple[float, float, float, float] | None:
        """The part of the window inside the source image (top, left, height, width), or None when it misses it."""
        t, lf, h, w = self.window
        t0, l0 = max(0.0, t), max(0.0, lf)
        b0, r0 = min(float(self.src_hw[0]), t + h), min(float(self.src_hw[1]), lf + w)
        if b0 <= t0 or r0 <= l0:
            return None
        return t0, l0, b0 - t0, r0 - l0

    def dct_denom(self) -> int:
        """The largest DCT scale (1, 2, 4, 8) that keeps the window at least the output size."""
        return dct_scale((math.floor(self.window[2]), math.floor(self.window[3])), self.out_hw)

    def warp(
        self,
        raw: Any,
        out: np.ndarray | None = None,
        fill: int = 0,
        backend: str = "auto",
        scaled_decode: bool = True,
    ) -> np.ndarray:
        """The output pixels (``out_hw`` x 3, uint8) from encoded bytes ``raw`` (or decoded HxWx3 uint8 pixels): one DCT-scaled decode of the
        window, one bilinear resample to the output (flip and padding included).

        ``out``: a larger HxWx3 uint8 array (a slot of a padded batch); the output lands at its top-left corner and
        the rest is set to ``fill``. ``scaled_decode=False`` decodes at full size (the reference path).
        """
        import cv2

        canvas_hw = self.out_hw if out is None else out.shape[:2]
        if canvas_hw[0] < self.out_hw[0] or canvas_hw[1] < self.out_hw[1]:
            raise PttError(f"the output slot {canvas_hw} is smaller than the sample's {self.out_hw}.")
        dst = np.empty((*canvas_hw, 3), np.uint8) if out is None else out
        valid = self.valid_window()
        if valid is None:
            dst[...] = fill
            return dst
        if isinstance(raw, np.ndarray) and raw.ndim == 3:  # decoded pixels (a RAM cache): no decode to scale
            px, top, left, denom = raw, 0, 0, 1
        elif scaled_decode and self._warp_planes(raw, backend, dst, valid, fill):
            return dst
        else:
            denom = self.dct_denom() if scaled_decode else 1
            px, top, left, denom = decode_scaled(raw, denom, valid, backend=backend)
        ky, kx = self.scale_yx
        if self._resize_fast(px, top, left, denom, dst, valid, fill):
            return dst
        # dst pixel (i, j) -> source edge coordinate -> scaled-grid array index (centres at integers)
        sy, sx = 1.0 / (ky * denom), 1.0 / (kx * denom)
        cy = 0.5 * sy + self.window[0] / denom - top - 0.5
        cx = 0.5 * sx + self.window[1] / denom - left - 0.5
        if self.flip:  # dst column j shows unflipped column (out_w - 1 - j)
            m = np.array([[-sx, 0.0, (self.out_hw[1] - 1) * sx + cx], [0.0, sy, cy]])
        else:
            m = np.array([[sx, 0.0, cx], [0.0, sy, cy]])
        if px.shape[0] > 32767 or px.shape[1] > 32767:  # cv2.remap's limit: shrink first (only a huge PNG)
            raise PttError(f"image too large to warp ({px.shape[1]}x{px.shape[0]}): pack it with --max-side.")
        cv2.warpAffine(
            np.ascontiguousarray(px),
            m,
            (canvas_hw[1], canvas_hw[0]),
            dst=dst,
            flags=cv2.INTER_LINEAR | cv2.WARP_INVERSE_MAP,
            borderMode=cv2.BORDER_REPLICATE,  # the image's own edge, as torchvision's resize clamps there
        )
        self._fill_outside(dst, valid, fill)
        return dst

    def _resize_fast(
        self,
        px: np.ndarray,
        top: int,
        left: int,
        denom: int,
        dst: np.ndarray,
        valid: tuple[float, float, float, float],
        fill: int,
    ) -> bool:
        """When the window starts on a whole pixel of the decoded grid and lies inside the image (every
        shortest-side plan: the whole image), resample with ``cv2.resize`` given the exact scale factors (``fx``,
        ``fy``; OpenCV then maps output pixel ``i`` to ``(i + 0.5) / fx - 0.5``, the warp's own map) - about 3x
        cheaper than the warp - straight into ``dst`` where it fits, and flip there in place. False: not that case
        (the warp does it)."""
        import cv2

        if valid != self.window:
            return False
        y0, x0 = self.window[0] / denom - top, self.window[1] / denom - left
        y0i, x0i = round(y0), round(x0)
        if abs(y0 - y0i) > 1e-9 or abs(x0 - x0i) > 1e-9 or y0i < 0 or x0i < 0:
            return False
        ky, kx = self.scale_yx
        fy, fx = ky * denom, kx * denom  # output pixels per decoded pixel
        if min(fy, fx) <= 0.5:  # bilinear would alias (no DCT scale brought the shrink under 2x)
            return False
        oh, ow = self.out_hw
        # the decoded rows/columns the output reads: the last output row samples (oh - 0.5) / fy - 0.5 and the
        # row after it (the image's edge clamps); OpenCV's output is round(rows * fy) >= oh rows of which oh are kept
        rh, rw = _rows_read(oh, fy), _rows_read(ow, fx)
        region = px[y0i : y0i + rh, x0i : x0i + rw]
        rh, rw = region.shape[:2]
        full = (round(rh * fy), round(rw * fx))  # OpenCV's own output size (cvRound) for these factors
        if full[0] < oh or full[1] < ow:
            return False
        if full[0] <= dst.shape[0] and full[1] <= dst.shape[1]:
            view = dst[: full[0], : full[1]]  # the rows/columns past the output are padding: filled below
            out = cv2.resize(region, None, dst=view, fx=fx, fy=fy, interpolation=cv2.INTER_LINEAR)
            if out.shape != view.shape or not np.shares_memory(out, view):
                view[...] = out  # OpenCV made its own array after all (a size it rounded otherwise)
        else:  # no room for OpenCV's extra row/column in this slot
            dst[:oh, :ow] = cv2.resize(region, None, fx=fx, fy=fy, interpolation=cv2.INTER_LINEAR)[:oh, :ow]
        self._flip_and_pad(dst, fill)
        return True

    def _warp_planes(
        self, raw: Any, backend: str, dst: np.ndarray, valid: tuple[float, float, float, float], fill: int
    ) -> bool:
        """The whole image resized (a window from the image's top-left corner, inside it: every shortest-side
        plan): decode the JPEG's Y/Cb/Cr planes at the DCT scale, resample each plane to the output's size (a
        chroma plane by the scale factors times its subsampling), then convert to RGB on the output's pixels
        only, into ``dst`` (``data.decode_yuv``). False: not that case, or the planar decode declined (the RGB
        path does it)."""
        if valid != self.window or self.window[0] != 0 or self.window[1] != 0:
            return False
        denom = self.dct_denom()
        ky, kx = self.scale_yx
        fy, fx = ky * denom, kx * denom  # output pixels per decoded pixel, on every plane
        if min(fy, fx) <= 0.5:  # bilinear would alias (see _resize_fast)
            return False
        got = decode_planes(raw, denom, backend=backend)
        if got is None:
            return False
        planes, sub = got
        oh, ow = self.out_hw
        sy, sx = decode_yuv.SUBSAMPLING.get(
            sub, (1, 1)
        )  # luma pixels per chroma sample (greyscale: no chroma)
        outs = [_resample_plane(planes[0], fy, fx, (oh, ow))]
        outs += [_resample_plane(p, fy * sy, fx * sx, (oh, ow)) for p in planes[1:]]
        decode_yuv.planes_to_rgb(outs, sub if len(planes) == 1 else decode_yuv.TJSAMP_444, dst[:oh, :ow])
        self._flip_and_pad(dst, fill)
        return True

    def _flip_and_pad(self, dst: np.ndarray, fill: int) -> None:
        """Mirror the output in place when the plan flips; ``fill`` the slot past the output."""
        import cv2

        oh, ow = self.out_hw
        if self.flip:
            cv2.flip(dst[:oh, :ow], 1, dst=dst[:oh, :ow])  # in place: OpenCV swaps columns pairwise
        dst[oh:] = fill
        dst[:oh, ow:] = fill

    def _fill_outside(self, dst: np.ndarray, valid: tuple[float, float, float, float], fill: int) -> None:
        """Set ``fill`` where an output pixel's centre lies outside the image (padding, zoom-out) or outside the
        output (the batch's padding): the warp replicated the edge there."""
        oh, ow = self.out_hw
        ky, kx = self.scale_yx
        y0 = min(oh, max(0, math.ceil((valid[0] - self.window[0]) * ky - 0.5)))
        y1 = min(oh, max(y0, math.ceil((valid[0] + valid[2] - self.window[0]) * ky - 0.5)))
        x0 = min(ow, max(0, math.ceil((valid[1] - self.window[1]) * kx - 0.5)))
        x1 = min(ow, max(x0, math.ceil((valid[1] + valid[3] - self.window[1]) * kx - 0.5)))
        if self.flip:
            x0, x1 = ow - x1, ow - x0
        dst[:y0] = fill
        dst[y1:] = fill
        dst[:, :x0] = fill
        dst[:, x1:] = fill


def _rows_read(n_out: int, f: float) -> int:
    """How many source rows (or columns) a bilinear resample by ``f`` reads for ``n_out`` output rows: the last
    output row samples ``(n_out - 0.5) / f - 0.5`` and the row after it (the image's edge clamps)."""
    return math.floor((n_out - 0.5) / f - 0.5) + 2


def _resample_plane(plane: np.ndarray, fy: float, fx: float, shape: tuple[int, int]) -> np.ndarray:
    """``plane`` resampled bilinearly by ``fy`` x ``fx`` (output pixel ``i`` samples ``(i + 0.5) / f - 0.5``,
    the image's edge clamping), cut to ``shape``: the rows and columns it reads, padded past the plane's edge
    with copies of it where ``shape`` reaches further (the clamp, made explicit so OpenCV's output is large
    enough), then ``cv2.resize`` with the exact factors."""
    import cv2

    oh, ow = shape
    rh, rw = _rows_read(oh, fy), _rows_read(ow, fx)
    region = plane[:rh, :rw]
    if region.shape[0] < rh or region.shape[1] < rw:
        region = cv2.copyMakeBorder(
            region, 0, rh - region.shape[0], 0, rw - region.shape[1], cv2.BORDER_REPLICATE
        )
    out = cv2.resize(region, None, fx=fx, fy=fy, interpolation=cv2.INTER_LINEAR)
    if out.shape[0] < oh or out.shape[1] < ow:  # OpenCV rounds its size: never under the rows asked for
        raise PttError(
            f"resample of a {plane.shape} plane by {fy:.4f} x {fx:.4f} gave {out.shape}, need {shape}"
        )
    return out[:oh, :ow]
