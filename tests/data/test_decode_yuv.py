"""The planar path (``data.decode_yuv``): a whole-image resize decodes the JPEG's Y/Cb/Cr planes at the DCT scale,
resamples each plane to the output's size and converts to RGB there. Against the RGB path (decode to RGB at the
same scale, then resample) on real photos: the two differ only in how the chroma is interpolated (the colour
conversion is affine, so it commutes with the resample up to a rounding per step), so a greyscale JPEG - no
chroma - must come out bit-identical, and colour ones close (>= 35 dB). Against torchvision v2 (>= 30 dB, and
within 6 dB of the RGB path: the chroma's interpolation is the only difference) on both paths here and in
``test_recipes_vs_torchvision``."""

from __future__ import annotations

import io

import numpy as np
import pytest

from pytorchtricks.core import PttError
from pytorchtricks.data import decode_yuv, geometry
from pytorchtricks.data.decode import DecodeError, decode_planes, decode_stats, reset_decode_stats
from pytorchtricks.data.recipes import DetectionRecipe

pytestmark = pytest.mark.skipif(
    not decode_yuv.available(), reason="libturbojpeg not installed (make system-deps)"
)


def _psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = float(((a.astype(np.float64) - b.astype(np.float64)) ** 2).mean())
    return 99.0 if mse == 0 else 10 * np.log10(255.0**2 / mse)


def _encode(jpeg: bytes, mode: str, subsampling: int) -> bytes:
    from PIL import Image

    img = Image.open(io.BytesIO(jpeg)).convert(mode)
    buf = io.BytesIO()
    img.save(buf, "JPEG", quality=90, subsampling=subsampling)
    return buf.getvalue()


def _both(
    monkeypatch, g: geometry.Geometry, raw: bytes, canvas: tuple[int, int]
) -> tuple[np.ndarray, np.ndarray]:
    """(planar, RGB) outputs of ``g`` in garbage-filled slots of ``canvas``."""
    reset_decode_stats()
    planar = g.warp(raw, out=np.full((*canvas, 3), 7, np.uint8))
    assert decode_stats()["planes"] == 1, decode_stats()
    with monkeypatch.context() as m:
        m.setattr(geometry, "decode_planes", lambda *a, **k: None)
        rgb = g.warp(raw, out=np.full((*canvas, 3), 7, np.uint8))
    return planar, rgb


@pytest.mark.parametrize("mode, subsampling", [("RGB", 2), ("RGB", 1), ("RGB", 0), ("L", 0)])
def test_planes_match_the_rgb_path_on_real_photos(photo_set, monkeypatch, mode, subsampling):
    """4:2:0, 4:2:2, 4:4:4 and greyscale; odd and even output sizes, flipped or not, in a wider slot."""
    worst = 99.0
    for k, p in enumerate(photo_set):
        raw = _encode(p["jpeg"], mode, subsampling)
        for min_size in (301, 200):  # 1/2 and 1/4 of the 1200 px photos: odd and even sizes
            g = DetectionRecipe.shortest_side(min_size, None).plan(
                p["hw"], np.random.default_rng(k), min_size
            )
            assert g.dct_denom() >= 2
            canvas = (g.out_hw[0] + 33, g.out_hw[1] + 17)
            planar, rgb = _both(monkeypatch, g, raw, canvas)
            oh, ow = g.out_hw
            assert (planar[oh:] == 0).all() and (planar[:oh, ow:] == 0).all()  # the slot's padding is filled
            if mode == "L":  # no chroma: resample-then-replicate is replicate-then-resample, bit for bit
                np.testing.assert_array_equal(planar, rgb)
            worst = min(worst, _psnr(planar[:oh, :ow], rgb[:oh, :ow]))
    assert worst >= 35.0, worst


def test_planar_flip_is_the_mirror_image(photo_set, monkeypatch):
    p = photo_set[0]
    base = DetectionRecipe.shortest_side(301, None).plan(p["hw"], np.random.default_rng(0), 301)
    plain = geometry.Geometry(base.src_hw, base.window, base.out_hw, flip=False)
    mirrored = geometry.Geometry(base.src_hw, base.window, base.out_hw, flip=True)
    a, b = plain.warp(p["jpeg"]), mirrored.warp(p["jpeg"])
    np.testing.assert_array_equal(b, a[:, ::-1])


def test_crops_and_pixels_take_the_other_paths(photo_set):
    """A crop window (LSJ) and decoded pixels (a RAM cache) never decode planes."""
    p = photo_set[0]
    reset_decode_stats()
    DetectionRecipe.lsj(512, jitter=(1.5, 2.0)).plan(p["hw"], np.random.default_rng(1), 512).warp(p["jpeg"])
    g = DetectionRecipe.shortest_side(300, None).plan(p["hw"], np.random.default_rng(0), 300)
    pixels = np.zeros((*p["hw"], 3), np.uint8)
    g.warp(pixels)
    assert decode_stats()["planes"] == 0


def test_without_libturbojpeg_the_rgb_path_gives_the_same_output_as_before(photo_set, monkeypatch):
    p = photo_set[2]
    g = DetectionRecipe.shortest_side(300, None).plan(p["hw"], np.random.default_rng(0), 300)
    with monkeypatch.context() as m:
        m.setattr(geometry, "decode_planes", lambda *a, **k: None)
        expected = g.warp(p["jpeg"])
    monkeypatch.setattr(decode_yuv, "available", lambda: False)
    reset_decode_stats()
    np.testing.assert_array_equal(g.warp(p["jpeg"]), expected)
    assert decode_stats()["planes"] == 0 and decode_stats()["images"] == 1


def test_a_damaged_file_is_reported_by_the_rgb_decode(photo_set):
    """A truncated JPEG: TurboJPEG's warning declines the planar path (counted), and the RGB decode reports the
    file as it always has (or decodes what libjpeg recovers)."""
    p = photo_set[0]
    raw = p["jpeg"][: len(p["jpeg"]) // 3]
    reset_decode_stats()
    assert decode_planes(raw, 2) is None
    assert decode_stats()["fallback"] == {"planes": 1}
    g = DetectionRecipe.shortest_side(300, None).plan(p["hw"], np.random.default_rng(0), 300)
    try:
        out = g.warp(raw)
    except (DecodeError, PttError) as exc:
        assert "decode" in str(exc).lower()
    else:
        assert out.shape == (*g.out_hw, 3)
    assert decode_stats()["planes"] == 0


def test_an_rgb_colour_space_jpeg_keeps_the_rgb_decode(photo_set, monkeypatch):
    """A JPEG stored as RGB (no YCbCr transform): its planes are R, G, B - converting them as Y/Cb/Cr would give
    wrong colours, so the planar path declines it and the output is the RGB path's, bit for bit."""
    from PIL import Image

    p = photo_set[0]
    buf = io.BytesIO()
    Image.open(io.BytesIO(p["jpeg"])).save(buf, "JPEG", quality=90, keep_rgb=True)
    raw = buf.getvalue()
    reset_decode_stats()
    assert decode_planes(raw, 2) is None
    assert decode_stats()["fallback"] == {"planes": 1}
    g = DetectionRecipe.shortest_side(300, None).plan(p["hw"], np.random.default_rng(0), 300)
    with monkeypatch.context() as m:
        m.setattr(geometry, "decode_planes", lambda *a, **k: None)
        expected = g.warp(raw)
    np.testing.assert_array_equal(g.warp(raw), expected)


def test_decode_planes_declines_what_it_does_not_read():
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (64, 48), (200, 10, 10)).save(buf, "PNG")
    assert decode_planes(buf.getvalue(), 2) is None  # not a JPEG
    buf = io.BytesIO()
    Image.new("RGB", (64, 48), (200, 10, 10)).save(buf, "JPEG")
    assert decode_planes(buf.getvalue(), 2, backend="simplejpeg") is None  # a backend the user chose
    planes, sub = decode_planes(buf.getvalue(), 2)
    assert [q.shape for q in planes] == [(24, 32), (12, 16), (12, 16)]
    with pytest.raises(PttError, match="denom"):
        decode_planes(buf.getvalue(), 3)
    with pytest.raises(decode_yuv.YuvRefused, match="plane 0"):
        decode_yuv.planes_to_rgb(planes, sub, np.zeros((10, 10, 3), np.uint8))
