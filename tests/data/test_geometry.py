"""Property tests of the box maps: flip twice is the identity, crops keep boxes inside, a map then its inverse
returns the boxes; and the mechanism of the warp (padding filled, every pixel written)."""

from __future__ import annotations

import io

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pytorchtricks.core import PttError
from pytorchtricks.data.geometry import Geometry

sizes = st.tuples(st.integers(8, 4000), st.integers(8, 4000))


@st.composite
def boxes_in(draw, hw):
    h, w = hw
    k = draw(st.integers(0, 8))
    out = []
    for _ in range(k):
        x1 = draw(st.floats(0, w - 2, allow_nan=False))
        y1 = draw(st.floats(0, h - 2, allow_nan=False))
        x2 = draw(st.floats(x1 + 1, w, allow_nan=False))
        y2 = draw(st.floats(y1 + 1, h, allow_nan=False))
        out.append([x1, y1, x2, y2])
    return np.asarray(out, np.float64).reshape(-1, 4)


@st.composite
def scene(draw):
    hw = draw(sizes)
    boxes = draw(boxes_in(hw))
    t = draw(st.floats(-hw[0] / 2, hw[0] - 1))
    lf = draw(st.floats(-hw[1] / 2, hw[1] - 1))
    window = (t, lf, draw(st.floats(1, 2 * hw[0])), draw(st.floats(1, 2 * hw[1])))
    out = (draw(st.integers(1, 1500)), draw(st.integers(1, 1500)))
    return hw, boxes, window, out


@settings(max_examples=200, deadline=None)
@given(scene())
def test_flip_twice_is_the_identity(s):
    hw, boxes, window, out = s
    g = Geometry(hw, window, out, flip=True)
    x, y = g.map_points(boxes[:, 0], boxes[:, 1])
    back = out[1] - x  # a second flip of the output
    plain = Geometry(hw, window, out, flip=False).map_points(boxes[:, 0], boxes[:, 1])
    np.testing.assert_allclose(back, plain[0], atol=1e-6 * max(1.0, np.abs(plain[0]).max(initial=0)))
    np.testing.assert_allclose(y, plain[1])
    whole = Geometry(hw, (0.0, 0.0, float(hw[0]), float(hw[1])), hw, flip=True)
    once, keep = whole.map_boxes(boxes, min_size=0, min_area=0)
    twice, keep2 = whole.map_boxes(once, min_size=0, min_area=0)
    np.testing.assert_allclose(twice, boxes[keep][keep2].astype(np.float32), atol=1e-3)


@settings(max_examples=200, deadline=None)
@given(scene(), st.booleans(), st.booleans())
def test_crops_keep_boxes_inside_the_output(s, flip, centre):
    hw, boxes, window, out = s
    g = Geometry(hw, window, out, flip=flip, centre_rule=centre)
    mapped, keep = g.map_boxes(boxes)
    assert mapped.dtype == np.float32 and mapped.shape == (len(keep), 4)
    assert (mapped[:, 0] >= 0).all() and (mapped[:, 2] <= out[1]).all()
    assert (mapped[:, 1] >= 0).all() and (mapped[:, 3] <= out[0]).all()
    w, h = mapped[:, 2] - mapped[:, 0], mapped[:, 3] - mapped[:, 1]
    assert (w >= 1).all() and (h >= 1).all() and (w * h >= 1).all()
    assert len(set(keep.tolist())) == len(keep) and (np.diff(keep) > 0).all()  # kept in order, each once


@settings(max_examples=200, deadline=None)
@given(scene(), st.booleans())
def test_resize_then_inverse_returns_the_boxes(s, flip):
    hw, boxes, _, out = s
    g = Geometry(hw, (0.0, 0.0, float(hw[0]), float(hw[1])), out, flip=flip)
    mapped, keep = g.map_boxes(boxes, min_size=0, min_area=0)
    back = g.inverse_boxes(mapped)
    # float32 output boxes: relative error 6e-8 of the output coordinate, scaled back by source/output
    tol = 1e-6 * max(hw) * max(1.0, max(hw[0] / out[0], hw[1] / out[1]))
    np.testing.assert_allclose(back, boxes[keep], atol=max(tol, 1e-4))


def _jpeg(h: int, w: int) -> bytes:
    from PIL import Image

    rng = np.random.default_rng(0)
    arr = rng.integers(0, 255, (h // 8, w // 8, 3), dtype=np.uint8)
    img = Image.fromarray(arr).resize((w, h), Image.Resampling.BICUBIC)
    buf = io.BytesIO()
    img.save(buf, "JPEG", quality=92)
    return buf.getvalue()


def test_warp_fills_padding_and_zoom_out_border():
    raw = _jpeg(240, 320)
    g = Geometry((240, 320), (-60.0, -80.0, 360.0, 480.0), (180, 240))  # zoom-out: the image in the middle
    slot = np.full((192, 256, 3), 200, np.uint8)
    g.warp(raw, out=slot, fill=0)
    assert (slot[180:] == 0).all() and (slot[:, 240:] == 0).all()  # batch padding
    assert (slot[:29] == 0).all() and (slot[:, :39] == 0).all()  # zoom-out border (centres outside the image)
    assert slot[40:140, 50:190].mean() > 20  # the photo itself
    with pytest.raises(PttError, match="smaller"):
        g.warp(raw, out=np.zeros((100, 100, 3), np.uint8))
    with pytest.raises(PttError, match="degenerate"):
        Geometry((240, 320), (0.0, 0.0, 0.0, 10.0), (10, 10))


def test_png_input_follows_the_same_grid(monkeypatch):
    """A PNG has no DCT scaling: it is decoded whole and averaged to the 1/d grid, then warped like a JPEG decoded
    to RGB at 1/d. (Not like the JPEG's planar path: that one interpolates the chroma from its stored samples, half
    the output's resolution or more - this synthetic image changes colour every 16 px, the worst case for it; on
    photos the two paths agree to >= 35 dB, ``test_decode_yuv``.)"""
    from PIL import Image

    from pytorchtricks.data import geometry

    monkeypatch.setattr(geometry, "decode_planes", lambda *a, **k: None)

    rng = np.random.default_rng(1)
    arr = np.asarray(
        Image.fromarray(rng.integers(0, 255, (30, 40, 3), dtype=np.uint8)).resize(
            (640, 480), Image.Resampling.BICUBIC
        )
    )
    png, jpg = io.BytesIO(), io.BytesIO()
    Image.fromarray(arr).save(png, "PNG")
    Image.fromarray(arr).save(jpg, "JPEG", quality=95)
    g = Geometry((480, 640), (0.0, 0.0, 480.0, 640.0), (120, 160), flip=True)
    assert g.dct_denom() == 4
    a, b = g.warp(png.getvalue()), g.warp(jpg.getvalue())
    mse = ((a.astype(float) - b.astype(float)) ** 2).mean()
    assert 10 * np.log10(255**2 / mse) > 30
