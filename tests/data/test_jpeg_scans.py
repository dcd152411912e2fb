"""data.jpeg_scans.first_passes: a progressive JPEG cut before its first refinement scan is a valid JPEG of the same
size whose decode at scale 1/2 or smaller stays close to the whole file's (each coefficient within 2**Al
quantization steps), on the installed wallpaper photos; what it cannot cut it leaves (None), and no input makes it
raise."""

from __future__ import annotations

import io
import math

import numpy as np
import pytest
from PIL import Image

from pytorchtricks.data.decode import decode_scaled, image_size
from pytorchtricks.data.jpeg_scans import first_passes
from pytorchtricks.data.photoset import wallpaper_sources


def _psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = float(np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2))
    return math.inf if mse == 0 else 10 * math.log10(255.0**2 / mse)


def _progressive_photos() -> list[bytes]:
    out = []
    for _, p in wallpaper_sources():
        if p.lower().endswith((".jpg", ".jpeg")):
            with open(p, "rb") as fh:
                raw = fh.read()
            if b"\xff\xc2" in raw[:65536] and image_size(raw)[0] * image_size(raw)[1] >= 4_000_000:
                out.append(raw)
    if not out:
        pytest.skip("no progressive wallpaper JPEG of >= 4 MP installed (make system-deps)")
    return out[:6]


@pytest.mark.slow
def test_the_first_passes_decode_close_to_the_whole_file_at_half_scale_and_below():
    got = []
    for raw in _progressive_photos():
        cut = first_passes(raw)
        assert cut is not None and len(cut) < 0.8 * len(raw)
        assert image_size(cut) == image_size(raw)
        for denom in (2, 4, 8):
            a, b = decode_scaled(raw, denom)[0], decode_scaled(cut, denom)[0]
            assert a.shape == b.shape
            got.append(_psnr(a, b))
    # the dropped bits are rounding noise of each coefficient: 35 dB is the integration's bar against the stock
    # load (tests/test_ultralytics.py); against the same decode of the whole file it holds with room
    assert min(got) >= 35.0, got
    assert float(np.median(got)) >= 40.0, got


def _jpeg(progressive: bool, size: tuple[int, int] = (96, 64)) -> bytes:
    rng = np.random.default_rng(3)
    px = rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(px).save(buf, "JPEG", quality=90, progressive=progressive)
    return buf.getvalue()


def test_a_baseline_jpeg_and_other_bytes_are_left_whole():
    assert first_passes(_jpeg(False)) is None
    png = io.BytesIO()
    Image.new("RGB", (8, 8)).save(png, "PNG")
    assert first_passes(png.getvalue()) is None
    assert first_passes(b"") is None and first_passes(b"\xff\xd8") is None


def test_a_cut_file_opens_anywhere_with_the_same_size_and_colour():
    raw = _jpeg(True)
    cut = first_passes(raw)
    assert cut is not None and cut.endswith(b"\xff\xd9")
    a, b = Image.open(io.BytesIO(raw)), Image.open(io.BytesIO(cut))
    assert a.size == b.size
    assert (
        _psnr(np.asarray(a.convert("RGB")), np.asarray(b.convert("RGB"))) > 20
    )  # noise image: every bit matters


def test_no_damaged_file_makes_it_raise():
    raw = _jpeg(True)
    rng = np.random.default_rng(0)
    for k in range(300):
        b = bytearray(raw[: int(rng.integers(0, len(raw)))] if k % 2 else raw)
        for _ in range(int(rng.integers(1, 4))):
            if b:
                b[int(rng.integers(0, len(b)))] = int(rng.integers(0, 256))
        out = first_passes(bytes(b))
        assert out is None or (out.startswith(b"\xff\xd8") and out.endswith(b"\xff\xd9"))
