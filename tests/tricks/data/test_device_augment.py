"""device_augment: seeded, geometry exact (boxes inside the image, crop = slice, flip = mirror), misuse errors."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pytorchtricks.core import NoEffectWarning, PttError
from pytorchtricks.data.images import rrc_box
from pytorchtricks.tricks.data.device_augment import (
    batch_cutout,
    batch_flip,
    batch_normalize,
    batch_random_resized_crop,
    batch_translate,
    crop_boxes,
    device_augment,
)


def _batch(n=6, h=20, w=28, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (n, 3, h, w), dtype=torch.uint8, generator=g)


def _gen(seed):
    return torch.Generator().manual_seed(seed)


def test_seeded_same_seed_same_batch_other_seed_differs():
    x = _batch()
    kw = dict(crop=16, translate=2, cutout=6)
    a = device_augment(x, generator=_gen(7), **kw)
    b = device_augment(x, generator=_gen(7), **kw)
    c = device_augment(x, generator=_gen(8), **kw)
    assert torch.equal(a, b) and not torch.equal(a, c)
    assert a.dtype == torch.uint8 and a.shape == (6, 3, 16, 16)


@pytest.mark.parametrize("hw", [(5, 300), (300, 5), (17, 23), (1, 1), (224, 224)])
def test_crop_boxes_always_inside_the_image(hw):
    h, w = hw
    boxes = crop_boxes(500, h, w, generator=_gen(0))
    top, left, bh, bw = boxes.unbind(1)
    assert (top >= 0).all() and (left >= 0).all() and (bh >= 1).all() and (bw >= 1).all()
    assert (top + bh <= h).all() and (left + bw <= w).all()
    rng = np.random.default_rng(0)
    for _ in range(200):  # the per-sample (numpy) sampler of make_loader obeys the same bounds
        t, lf, bh2, bw2 = rrc_box(h, w, (0.08, 1.0), (3 / 4, 4 / 3), rng)
        assert t >= 0 and t + bh2 <= h and lf >= 0 and lf + bw2 <= w and bh2 >= 1 and bw2 >= 1


def test_crop_boxes_follow_scale_and_ratio_when_they_fit():
    boxes = crop_boxes(2000, 400, 400, scale=(0.25, 0.5), generator=_gen(1)).double()
    area = boxes[:, 2] * boxes[:, 3] / 400**2
    aspect = boxes[:, 3] / boxes[:, 2]
    assert area.min() > 0.23 and area.max() < 0.52  # rounding to whole pixels
    assert aspect.min() > 0.74 and aspect.max() < 1.35


def test_resized_crop_of_a_box_is_exactly_the_slice():
    x = _batch()
    boxes = torch.tensor([[2, 3, 10, 12]] * 6)
    out = batch_random_resized_crop(x, (10, 12), boxes=boxes)  # same size: sampling at pixel centres
    assert torch.equal(out, x[:, :, 2:12, 3:15])
    whole = batch_random_resized_crop(x, (20, 28), boxes=torch.tensor([[0, 0, 20, 28]] * 6))
    assert torch.equal(whole, x)


def test_flip_is_an_exact_mirror():
    x = _batch()
    assert torch.equal(batch_flip(x, p=1.0), x.flip(-1))
    assert torch.equal(batch_flip(x, p=0.0), x)
    out = batch_flip(_batch(200), generator=_gen(3))
    src = _batch(200)
    mirrored = torch.tensor([torch.equal(o, s.flip(-1)) for o, s in zip(out, src)])
    same = torch.tensor([torch.equal(o, s) for o, s in zip(out, src)])
    assert bool((mirrored | same).all()) and 60 < int(mirrored.sum()) < 140


def test_translate_is_a_shifted_window_of_the_padded_image():
    x = _batch()
    assert torch.equal(batch_translate(x, 0), x)
    out = batch_translate(x, 3, generator=_gen(4), mode="constant")
    padded = torch.nn.functional.pad(x, (3, 3, 3, 3))
    for k in range(6):
        hits = [
            (dy, dx)
            for dy in range(7)
            for dx in range(7)
            if torch.equal(out[k], padded[k, :, dy : dy + 20, dx : dx + 28])
        ]
        assert hits, "each output must be some 20x28 window of the padded image"


def test_cutout_zeroes_at_most_one_square_and_keeps_the_rest():
    x = torch.full((8, 3, 16, 16), 9, dtype=torch.uint8)
    out = batch_cutout(x, 5, generator=_gen(5))
    zeros = (out == 0).all(1).sum((1, 2))
    assert (zeros <= 25).all() and (zeros >= 9).all()  # a clipped 5x5 square keeps at least 3x3 inside
    assert ((out == 0) | (out == 9)).all()


def test_normalize_matches_the_formula():
    x = _batch()
    out = batch_normalize(x, [10.0, 20.0, 30.0], [2.0, 4.0, 8.0])
    ref = (x.float() - torch.tensor([10.0, 20.0, 30.0]).view(1, 3, 1, 1)) / torch.tensor(
        [2.0, 4.0, 8.0]
    ).view(1, 3, 1, 1)
    torch.testing.assert_close(out, ref)


def test_misuse_and_no_effect():
    with pytest.raises(PttError, match=r"\[N, C, H, W\]"):
        device_augment(torch.zeros(3, 8, 8, dtype=torch.uint8))
    with pytest.raises(PttError, match="pad"):
        batch_translate(_batch(), -1)
    with pytest.warns(NoEffectWarning):
        device_augment(_batch(), flip=False)


@pytest.mark.gpu
def test_cuda_matches_its_own_seed_and_geometry():
    x = _batch().cuda()
    a = device_augment(x, crop=16, translate=2, generator=torch.Generator("cuda").manual_seed(0))
    b = device_augment(x, crop=16, translate=2, generator=torch.Generator("cuda").manual_seed(0))
    assert a.is_cuda and torch.equal(a, b)
    assert torch.equal(batch_flip(x, p=1.0).cpu(), x.cpu().flip(-1))
