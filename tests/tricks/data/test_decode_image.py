"""decode_image: every backend agrees with Pillow, DCT-scaled decode stays within a named error, crops are exact."""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

import pytorchtricks as ptt
from pytorchtricks.core import PttError
from pytorchtricks.data.decode import available_backends, dct_scale
from pytorchtricks.data.errors import DecodeError
from pytorchtricks.data.photoset import wallpaper_sources

BACKENDS = available_backends()


@pytest.fixture(scope="module")
def photo() -> bytes:
    """A 1024x768 real photo at q92 (odd offsets exercise the crop arithmetic)."""
    src = wallpaper_sources()
    if not src:
        pytest.skip("Debian wallpaper packages not installed (make system-deps)")
    img = Image.open(src[3][1])
    img.draft("RGB", (1100, 1100))
    img = img.convert("RGB").resize((1024, 768))
    buf = io.BytesIO()
    img.save(buf, "JPEG", quality=92)
    return buf.getvalue()


def _psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = float(np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2))
    return 10 * np.log10(255.0**2 / max(mse, 1e-12))


def test_backends_found():
    assert "pil" in BACKENDS and "pil-draft" in BACKENDS
    assert ptt.decode_image.__module__ == "pytorchtricks.data.decode"


@pytest.mark.parametrize("backend", BACKENDS)
def test_full_decode_matches_pillow(photo, backend):
    ref = ptt.decode_image(photo, backend="pil")
    got = ptt.decode_image(photo, backend=backend)
    assert got.shape == ref.shape == (768, 1024, 3) and got.dtype == np.uint8 and got.flags.c_contiguous
    assert _psnr(got, ref) > 40  # libjpeg-turbo builds differ only in IDCT/upsampling rounding


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("crop", [(0, 0, 768, 768), (101, 37, 600, 451), (500, 900, 250, 120)])
def test_scaled_decode_close_to_full_decode_then_resize(photo, backend, crop):
    """Named error bound: PSNR of DCT-scaled decode vs full decode + area resize, on a real photo."""
    full = ptt.decode_image(photo, backend="pil")
    t, lf, h, w = crop
    ref = ptt.decode_image(photo, backend="pil", crop=crop, size=(112, 96))
    np.testing.assert_array_equal(
        ptt.decode_image(photo, backend="pil", crop=crop), full[t : t + h, lf : lf + w]
    )
    got = ptt.decode_image(photo, size=(112, 96), crop=crop, backend=backend)
    assert got.shape == (112, 96, 3)
    assert _psnr(got, ref) > 26


def test_short_side_int_size(photo):
    out = ptt.decode_image(photo, size=224)
    assert out.shape == (224, round(1024 * 224 / 768), 3)
    assert ptt.decode_image(photo, size=100, crop=(0, 0, 300, 600)).shape == (100, 200, 3)


def test_dct_scale_choice():
    assert dct_scale((768, 768), (224, 224)) == 2  # 384 >= 224, 192 < 224
    assert dct_scale((1800, 1800), (224, 224)) == 8
    assert dct_scale((900, 1800), (224, 224)) == 4
    assert dct_scale((300, 300), (224, 224)) == 1
    assert dct_scale((768, 768), None) == 1


def test_draft_really_decodes_smaller(photo, monkeypatch):
    """Mechanism: pil-draft asks libjpeg for 1/4 size when the target allows it."""
    seen = []
    real = Image.Image.resize

    def spy(self, size, *a, **k):
        seen.append(self.size)
        return real(self, size, *a, **k)

    monkeypatch.setattr(Image.Image, "resize", spy)
    ptt.decode_image(photo, size=(150, 200), backend="pil-draft")  # 1/4 scale: 192 >= 150, 96 < 150
    ptt.decode_image(photo, size=(150, 200), backend="pil")
    assert seen == [(256, 192), (1024, 768)]


def test_image_size_reads_headers(photo):
    assert ptt.image_size(photo) == (768, 1024)
    assert ptt.image_size(memoryview(photo)) == (768, 1024)
    assert ptt.image_size(np.frombuffer(photo, np.uint8)) == (768, 1024)
    buf = io.BytesIO()
    Image.new("RGB", (33, 17)).save(buf, "PNG")
    assert ptt.image_size(buf.getvalue()) == (17, 33)
    buf = io.BytesIO()
    Image.new("RGB", (9, 5)).save(buf, "WEBP")
    assert ptt.image_size(buf.getvalue()) == (5, 9)
    with pytest.raises(DecodeError):
        ptt.image_size(photo[:100])


@pytest.mark.parametrize("backend", BACKENDS)
def test_png_and_grayscale_inputs(backend):
    arr = (np.arange(20 * 30 * 3) % 251).astype(np.uint8).reshape(20, 30, 3)
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, "PNG")
    np.testing.assert_array_equal(ptt.decode_image(buf.getvalue(), backend=backend), arr)
    buf = io.BytesIO()
    Image.fromarray(arr[..., 0]).save(buf, "JPEG", quality=95)
    out = ptt.decode_image(buf.getvalue(), backend=backend)
    assert out.shape == (20, 30, 3)


@pytest.mark.parametrize("backend", BACKENDS)
def test_corrupt_input_raises_decode_error(photo, backend):
    with pytest.raises(DecodeError):
        ptt.decode_image(b"\xff\xd8\xff" + bytes(50), backend=backend)
    with pytest.raises(DecodeError):
        ptt.decode_image(b"hello world", backend=backend)


def test_truncated_jpeg_is_an_error_for_strict_backends(photo):
    for backend in ("pil", "simplejpeg"):
        if backend in BACKENDS:
            with pytest.raises(DecodeError):
                ptt.decode_image(photo[: len(photo) // 2], backend=backend)


def test_misuse_errors(photo):
    with pytest.raises(PttError, match="outside"):
        ptt.decode_image(photo, crop=(700, 0, 100, 100))
    with pytest.raises(PttError, match="unknown decode backend"):
        ptt.decode_image(photo, backend="nvjpeg")
    with pytest.raises(PttError, match="size must"):
        ptt.decode_image(photo, size=(0, 10))
    with pytest.raises(PttError, match="bytes"):
        ptt.decode_image("not bytes")  # type: ignore[arg-type]


def test_bench_case_smoke():
    from pytorchtricks.tricks.data.decode_image import bench_case

    case = bench_case("smoke")
    a, b = case.baseline(), case.treated()
    assert len(a) == len(b) == case.items_per_call
    assert all(x.shape == y.shape == (224, 224, 3) for x, y in zip(a, b))
    assert min(_psnr(x, y) for x, y in zip(a, b)) > 26
