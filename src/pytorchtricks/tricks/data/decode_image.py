"""Decode JPEGs at 1/2, 1/4 or 1/8 size in the DCT domain when the crop and target size allow it.

Why: full-size decode is the biggest CPU cost of an image pipeline, and most of it is thrown away by the resize
that follows. libjpeg can reconstruct the 8x8 DCT blocks at reduced resolution, skipping most of the inverse DCT
and colour conversion; choosing the scale from the crop (RandomResizedCrop box) and the target keeps the scaled
crop at least as large as the output, so nothing visible is lost. With a crop that is a real sub-window, the
default backend (``roi``) also decodes only the crop's window: libjpeg-turbo skips the inverse DCT, upsampling and
colour conversion outside it and stops after its last row (the rows above it are still entropy-decoded); the
crop's pixels are identical to a whole-image decode at the same scale.
When: any JPEG input whose decoded size is larger than what the model sees (224 px crops of 500-1000 px photos).
Caveats: the scaled image differs from full decode + resize by a few grey levels (a different low-pass); EXIF
orientation is ignored by every backend; non-JPEG inputs decode at full size through Pillow. The window path
compiles a small C shim at first use (needs a C compiler and the libjpeg-turbo headers, ``make system-deps``);
without them, and for progressive JPEGs or odd subsamplings, the whole image is decoded (counted in
``data.decode.decode_stats()``; the data doctor reports it).
See also: pack, make_loader, 预处理提速 / 解码加速.
"""

from __future__ import annotations

import io
from typing import Any

import numpy as np

from pytorchtricks.core import BenchCase, TrickInfo
from pytorchtricks.data.decode import (
    available_backends,
    decode_image,
    fallback_backend,
    image_size,
    resize_array,
)

__all__ = ["decode_image", "image_size"]

TRICK = TrickInfo(gains=("speed",), phase=("train", "infer"), exact=False, needs=("data",))


def _sample_jpegs(n: int, side: int) -> list[bytes]:
    """Real-photo JPEGs: crops of an installed wallpaper when present, else a smooth synthetic scene."""
    from PIL import Image

    from pytorchtricks.data.photoset import wallpaper_sources

    src = wallpaper_sources()
    rng = np.random.default_rng(0)
    img: Any
    if src:
        img = Image.open(src[0][1])
        img.draft("RGB", (side * 2, side * 2))
        img = img.convert("RGB")
    else:  # smooth gradients + noise compress like a photo more than flat colour does
        y, x = np.mgrid[0 : side * 2, 0 : side * 2]
        arr = np.stack([x % 256, y % 256, (x + y) % 256], -1) + rng.integers(0, 24, (side * 2, side * 2, 3))
        img = Image.fromarray(arr.clip(0, 255).astype(np.uint8))
    out = []
    for _ in range(n):
        left = int(rng.integers(0, max(1, img.size[0] - side)))
        top = int(rng.integers(0, max(1, img.size[1] - side * 3 // 4)))
        crop = img.crop((left, top, left + side, top + side * 3 // 4))
        buf = io.BytesIO()
        crop.save(buf, "JPEG", quality=90)
        out.append(buf.getvalue())
    return out


def bench_case(size: str = "smoke", device: str = "cpu") -> BenchCase:
    """Full decode (then crop + resize) vs DCT-scaled decode of a centre crop to 224x224, same backend."""
    n, side = (8, 640) if size == "smoke" else (64, 1024)
    jpegs = _sample_jpegs(n, side)
    backend = available_backends()[0]
    # roi would decode only the crop even unscaled: the whole-image peer uses the backend roi falls back to
    whole = fallback_backend() if backend == "roi" else backend
    boxes = []
    for data in jpegs:
        h, w = image_size(data)
        s = min(h, w)
        boxes.append(((h - s) // 2, (w - s) // 2, s, s))

    def same_backend_full() -> list[np.ndarray]:  # isolates DCT scaling from the choice of library
        return [
            resize_array(decode_image(d, crop=b, backend=whole), (224, 224)) for d, b in zip(jpegs, boxes)
        ]

    def scaled() -> list[np.ndarray]:
        return [decode_image(d, size=(224, 224), crop=b, backend=backend) for d, b in zip(jpegs, boxes)]

    def full_resized() -> list[np.ndarray]:
        return [decode_image(d, size=(224, 224), crop=b, backend="pil") for d, b in zip(jpegs, boxes)]

    return BenchCase(
        baseline=full_resized,
        treated=scaled,
        items_per_call=n,
        unit="images",
        device="cpu",
        description=f"{n} JPEGs {side}x{side * 3 // 4} q90 -> 224x224 centre crop; baseline Pillow full decode + "
        f"resize, treated DCT-scaled decode ({backend})",
        peers={f"{whole}_full_decode": same_backend_full},
    )
