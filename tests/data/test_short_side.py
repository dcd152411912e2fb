"""One short-side rule (``data.decode.short_side_hw``): its five callers give what their own formulas gave.

Each reference below is the caller's formula as it stood before the rule had one home, copied verbatim; the grid
covers squares, portraits, landscapes, 1-pixel strips, sizes above and below the image and the half-pixel ties
where the float order matters (``147 * 1 / 98`` is 1.5 exactly, ``147 * (1 / 98)`` is not).
"""

from __future__ import annotations

import itertools

import pytest

from pytorchtricks.data.decode import _target, short_side_hw
from pytorchtricks.data.images import eval_geometry
from pytorchtricks.data.recipes import shortest_side_size
from pytorchtricks.data.sources import target_hw
from pytorchtricks.tricks.data.cache_in_ram import _stored_hw

SIDES = (1, 2, 3, 7, 20, 55, 98, 147, 224, 255, 256, 257, 333, 480, 500, 640, 784, 1127, 1333, 3000, 4000)
SIZES = (1, 8, 22, 29, 128, 224, 256, 300, 480, 800, 1024)
CAPS = (None, 1, 100, 333, 640, 1000, 1333)
GRID = list(itertools.product(SIDES, SIDES))


def old_target_hw(h, w, resize, max_side):  # data.sources.target_hw: a pack's stored size
    scale = 1.0
    if resize is not None and min(h, w) > resize:
        scale = min(scale, resize / min(h, w))
    if max_side is not None and max(h, w) > max_side:
        scale = min(scale, max_side / max(h, w))
    if scale >= 1.0:
        return None
    if resize is not None and scale == resize / min(h, w):
        return (resize, max(1, round(w * scale))) if h <= w else (max(1, round(h * scale)), resize)
    return max(1, round(h * scale)), max(1, round(w * scale))


def old_shortest_side_size(h, w, min_size, max_size):  # data.recipes: torchvision's RandomShortestSize
    r = min_size / min(h, w)
    if max_size is not None:
        r = min(r, max_size / max(h, w))
    return max(1, int(h * r)), max(1, int(w * r))


def old_decode_target(s, ch, cw):  # data.decode._target with an int size
    if ch <= cw:
        return s, max(1, round(cw * s / ch))
    return max(1, round(ch * s / cw)), s


def old_cache_short_side(h, w, size):  # tricks.data.cache_in_ram._short_side: a classification image
    if size is None or min(h, w) <= size:
        return h, w
    s = size / min(h, w)
    return max(size, round(h * s)), max(size, round(w * s))


def old_eval_resize(height, width, resize):  # data.images.eval_geometry: torchvision's Resize(resize)
    long = int(resize * max(height, width) / min(height, width))
    return (resize, long) if height <= width else (long, resize)


@pytest.mark.parametrize("resize", (None, *SIZES))
def test_pack_size_is_the_old_formula(resize):
    for (h, w), cap in itertools.product(GRID, CAPS):
        assert target_hw(h, w, resize, cap) == old_target_hw(h, w, resize, cap), (h, w, resize, cap)


@pytest.mark.parametrize("min_size", SIZES)
def test_shortest_side_size_is_the_old_formula(min_size):
    for (h, w), cap in itertools.product(GRID, CAPS):
        assert shortest_side_size(h, w, min_size, cap) == old_shortest_side_size(h, w, min_size, cap)


@pytest.mark.parametrize("size", SIZES)
def test_decode_target_is_the_old_formula(size):
    for h, w in GRID:
        assert _target(size, h, w) == old_decode_target(size, h, w), (h, w, size)


@pytest.mark.parametrize("size", (None, *SIZES))
def test_cache_size_is_the_old_formula(size):
    for (h, w), cap in itertools.product(GRID, CAPS):
        assert _stored_hw(h, w, size, cap, False) == old_cache_short_side(h, w, size), (h, w, size)
        assert _stored_hw(h, w, size, cap, True) == (old_target_hw(h, w, size, cap) or (h, w)), (
            h,
            w,
            size,
            cap,
        )


@pytest.mark.parametrize("resize", SIZES)
def test_eval_resize_is_the_old_formula(resize):
    for h, w in GRID:
        assert eval_geometry(h, w, resize, (1, 1))[0] == old_eval_resize(h, w, resize), (h, w, resize)


def test_the_float_order_is_a_named_choice():
    """The ties the grid holds: one division rounds 1.5 up to 2, the float scale sees 1.4999999999999998."""
    assert old_decode_target(1, 98, 147) == (1, 2) and old_cache_short_side(98, 147, 1) == (1, 1)
    one = short_side_hw(98, 147, 1, enlarge=True, rounding="round", scale_first=False)
    scaled = short_side_hw(98, 147, 1, enlarge=False, rounding="round", scale_first=True)
    assert (one, scaled) == ((1, 2), (1, 1))


def test_no_size_and_no_cap_keeps_the_image():
    assert short_side_hw(480, 640, None, enlarge=True, rounding="floor", scale_first=True) == (480, 640)
    assert short_side_hw(480, 640, 800, enlarge=False, rounding="round", scale_first=True) == (480, 640)
