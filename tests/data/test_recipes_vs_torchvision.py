"""Every detection recipe against torchvision.transforms.v2 with the same random parameters, on real photos.

The reference decodes the whole JPEG with Pillow and runs v2's own transforms (``transform(inpt, params)`` with our
drawn parameters) on ``tv_tensors.Image`` + ``tv_tensors.BoundingBoxes``, then ``SanitizeBoundingBoxes``. Ours plans
a ``Geometry`` from the header, decodes at a DCT scale (and only the window, for crops) and warps once. Boxes must
agree within 1e-3 px (v2 truncates sizes with ``int``, as we do: no rounding slack needed), pixels >= 30 dB PSNR.
"""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch

from pytorchtricks.data.recipes import DetectionRecipe, iou_crop_params, lsj_params, zoom_out_params

tv = pytest.importorskip("torchvision")
from torchvision import tv_tensors  # noqa: E402
from torchvision.transforms import v2  # noqa: E402
from torchvision.transforms.v2 import functional as F  # noqa: E402

SEEDS = range(3)


def _psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = float(((a.astype(np.float64) - b.astype(np.float64)) ** 2).mean())
    return 99.0 if mse == 0 else 10 * np.log10(255.0**2 / mse)


def _inputs(p):
    from PIL import Image

    arr = np.array(Image.open(io.BytesIO(p["jpeg"])).convert("RGB"))  # the full decode
    h, w = p["hw"]
    img = tv_tensors.Image(torch.from_numpy(arr).permute(2, 0, 1))
    boxes = tv_tensors.BoundingBoxes(torch.from_numpy(p["boxes"]), format="XYXY", canvas_size=(h, w))
    return img, boxes, torch.from_numpy(p["labels"])


def _sanitize(img, boxes, labels):
    # clamp first: v2's resize can leave an edge box at 320.00003 on a 320 px canvas (float32 arithmetic), which
    # SanitizeBoundingBoxes then drops as out of bounds; a box on the image edge is valid
    boxes = F.clamp_bounding_boxes(boxes)
    out = v2.SanitizeBoundingBoxes(min_size=1)({"image": img, "boxes": boxes, "labels": labels})
    return out["image"], out["boxes"], out["labels"]


def _ours(recipe: DetectionRecipe, p, seed: int, min_size: int):
    g = recipe.plan(p["hw"], np.random.default_rng(seed), min_size, p["boxes"])
    canvas = recipe.canvas_hw([g.out_hw])
    out = np.full((*canvas, 3), 7, np.uint8)  # garbage first: the warp must write every pixel
    g.warp(p["jpeg"], out=out, fill=recipe.fill)
    boxes, keep = g.map_boxes(p["boxes"])
    return g, out, boxes, p["labels"][keep]


def _check(g, ours_img, ours_boxes, ours_labels, ref_img, ref_boxes, ref_labels, canvas):
    ref = np.zeros((*canvas, 3), np.uint8)
    r = ref_img.permute(1, 2, 0).numpy()
    ref[: r.shape[0], : r.shape[1]] = r
    assert r.shape[:2] == g.out_hw
    assert ours_labels.tolist() == ref_labels.tolist()
    np.testing.assert_allclose(ours_boxes, ref_boxes.numpy(), atol=1e-3, rtol=0)
    assert _psnr(ours_img, ref) >= 30.0, _psnr(ours_img, ref)
    return _psnr(ours_img, ref)


@pytest.mark.parametrize("planes", [True, False], ids=["planar-decode", "rgb-decode"])
@pytest.mark.parametrize("min_size, max_size", [(300, 500), (480, 600), (200, None)])
def test_shortest_side_and_flip_match_v2(photo_set, monkeypatch, min_size, max_size, planes):
    """Both whole-image paths: the planar decode (``data.decode_yuv``, where libturbojpeg is installed) and the
    decode to RGB."""
    from pytorchtricks.data import decode_yuv, geometry

    if planes and not decode_yuv.available():
        pytest.skip("libturbojpeg not installed (make system-deps)")
    if not planes:
        monkeypatch.setattr(geometry, "decode_planes", lambda *a, **k: None)
    recipe = DetectionRecipe.shortest_side(min_size, max_size)
    for p in photo_set:
        for seed in SEEDS:
            g, img, boxes, labels = _ours(recipe, p, seed, min_size)
            ref_img, ref_boxes, ref_labels = _inputs(p)
            rs = v2.RandomShortestSize(min_size, max_size)
            params = rs.make_params([ref_img])  # torchvision's own size arithmetic ...
            rs_params = {"size": shortest(p["hw"], min_size, max_size)}
            assert tuple(params["size"]) == rs_params["size"] == g.out_hw  # ... gives our output size
            ref_img, ref_boxes = rs.transform(ref_img, params), rs.transform(ref_boxes, params)
            if np.random.default_rng(seed).random() < 0.5:
                ref_img, ref_boxes = F.horizontal_flip(ref_img), F.horizontal_flip(ref_boxes)
            _check(
                g,
                img,
                boxes,
                labels,
                *_sanitize(ref_img, ref_boxes, ref_labels),
                recipe.canvas_hw([g.out_hw]),
            )


def shortest(hw, s, m):
    from pytorchtricks.data.recipes import shortest_side_size

    return shortest_side_size(hw[0], hw[1], s, m)


def test_lsj_matches_v2_scale_jitter_fixed_crop_flip(photo_set):
    recipe = DetectionRecipe.lsj(512)
    for p in photo_set:
        for seed in range(4):
            g, img, boxes, labels = _ours(recipe, p, seed, 512)
            rng = np.random.default_rng(seed)
            (nh, nw), (t, lf, ch, cw) = lsj_params(*p["hw"], 512, (0.1, 2.0), rng)
            flip = rng.random() < 0.5
            ref_img, ref_boxes, ref_labels = _inputs(p)
            sj = v2.ScaleJitter((512, 512))
            ref_img, ref_boxes = (
                sj.transform(ref_img, {"size": (nh, nw)}),
                sj.transform(ref_boxes, {"size": (nh, nw)}),
            )
            # the references' FixedSizeCrop: crop, then pad bottom/right to the fixed size
            ref_img, ref_boxes = F.crop(ref_img, t, lf, ch, cw), F.crop(ref_boxes, t, lf, ch, cw)
            if flip:
                ref_img, ref_boxes = F.horizontal_flip(ref_img), F.horizontal_flip(ref_boxes)
            _check(g, img, boxes, labels, *_sanitize(ref_img, ref_boxes, ref_labels), (512, 512))


def test_ssd_zoom_out_iou_crop_flip_resize_match_v2(photo_set):
    recipe = DetectionRecipe.ssd(300)
    seen = {"zoom": 0, "crop": 0}
    for p in photo_set:
        for seed in range(6):
            g, img, boxes, labels = _ours(recipe, p, seed, 300)
            rng = np.random.default_rng(seed)
            h, w = p["hw"]
            zo = zoom_out_params(h, w, (1.0, 4.0), rng)
            ref_img, ref_boxes, ref_labels = _inputs(p)
            zt, zl, ch, cw = (0, 0, h, w) if zo is None else zo
            if zo is not None:
                seen["zoom"] += 1
                pad = {"padding": [zl, zt, cw - w - zl, ch - h - zt]}
                zoom = v2.RandomZoomOut(fill=0)
                ref_img, ref_boxes = zoom.transform(ref_img, pad), zoom.transform(ref_boxes, pad)
            crop = iou_crop_params(ch, cw, ref_boxes.numpy().astype(np.float64), rng)
            if crop is not None:
                seen["crop"] += 1
                t, lf, nh, nw = crop
                b = ref_boxes.as_subclass(torch.Tensor)
                cx, cy = (b[:, 0] + b[:, 2]) / 2, (b[:, 1] + b[:, 3]) / 2
                inside = (lf < cx) & (cx < lf + nw) & (t < cy) & (cy < t + nh)
                params = {"top": t, "left": lf, "height": nh, "width": nw, "is_within_crop_area": inside}
                iou = v2.RandomIoUCrop()
                ref_img, ref_boxes = iou.transform(ref_img, params), iou.transform(ref_boxes, params)
            ref_img, ref_boxes = (
                F.resize(ref_img, [300, 300], antialias=True),
                F.resize(ref_boxes, [300, 300]),
            )
            if rng.random() < 0.5:
                ref_img, ref_boxes = F.horizontal_flip(ref_img), F.horizontal_flip(ref_boxes)
            _check(g, img, boxes, labels, *_sanitize(ref_img, ref_boxes, ref_labels), (300, 300))
    assert seen["zoom"] and seen["crop"]  # both branches were exercised


def test_scaled_decode_is_used_and_reads_only_the_window(photo_set):
    from pytorchtricks.data.decode import decode_stats, reset_decode_stats

    p = photo_set[0]
    g = DetectionRecipe.shortest_side(200, None).plan(p["hw"], np.random.default_rng(0), 200)
    assert g.dct_denom() >= 2
    reset_decode_stats()
    g.warp(p["jpeg"])
    assert decode_stats()["decoded_px"] <= (p["hw"][0] // 2 + 1) * (p["hw"][1] // 2 + 1)
    crop = DetectionRecipe.lsj(512, jitter=(1.5, 2.0)).plan(p["hw"], np.random.default_rng(1), 512)
    reset_decode_stats()
    crop.warp(p["jpeg"])
    stats = decode_stats()
    if stats["window"]:  # the window path is there (the shim builds): fewer pixels than the whole image
        assert stats["decoded_px"] < p["hw"][0] * p["hw"][1]
