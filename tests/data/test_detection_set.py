"""The learnable detection set: the same parameters give the same bytes, every box is the tight box of its pasted
item's alpha, and the COCO and YOLO layouts open (ptt, pycocotools) with the same boxes and Fashion-MNIST classes."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import pytorchtricks as ptt
from pytorchtricks import fashion_mnist
from pytorchtricks.core import PttError
from pytorchtricks.data.detection_set import BOX_ALPHA, build_detection_set, item_alpha, main
from pytorchtricks.data.photoset import wallpaper_sources

SMALL: dict[str, Any] = {"train": 6, "val": 3, "long_side": 256, "objects": (2, 6), "seed": 3}


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    if not wallpaper_sources():
        pytest.skip("Debian wallpaper packages not installed (make system-deps)")
    if not fashion_mnist.available():
        pytest.skip("Fashion-MNIST not installed (apt-get install dataset-fashion-mnist)")
    root = tmp_path_factory.mktemp("dset") / "set"
    return root, build_detection_set(root, workers=1, **SMALL)


def _hashes(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def _coco(root: Path, split: str) -> dict[str, Any]:
    return dict(json.loads((root / "coco" / "annotations" / f"instances_{split}.json").read_text()))


def test_same_parameters_same_bytes_other_seed_other_set(built, tmp_path):
    root, summary = built
    again = tmp_path / "again"
    args = ["--train", "6", "--val", "3", "--long-side", "256", "--objects", "2", "6", "--seed", "3"]
    assert (
        main([str(again), *args, "--workers", "2"]) == 0
    )  # the command line, in two processes: the same set
    first = _hashes(root)
    assert len(first) == 1 + 2 * 9 + 9 + 2 + 1  # marker, JPEGs in both layouts, labels, two JSONs, data.yaml
    assert _hashes(again) == first
    assert summary["config"]["seed"] == 3 and summary["config"]["long_side"] == 256
    other = build_detection_set(tmp_path / "other", workers=1, **{**SMALL, "seed": 4, "train": 2, "val": 1})
    assert other["digest"] != summary["digest"]


def test_a_complete_set_is_kept_and_another_is_refused(built, tmp_path):
    root, summary = built
    stamp = {p: p.stat().st_mtime_ns for p in root.rglob("*.jpg")}
    assert build_detection_set(root, workers=1, **SMALL) == summary  # skipped: the marker matches
    assert {p: p.stat().st_mtime_ns for p in root.rglob("*.jpg")} == stamp
    with pytest.raises(PttError, match="other parameters"):
        build_detection_set(root, workers=1, **{**SMALL, "seed": 5})
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("not a set")
    with pytest.raises(PttError, match="not a detection set"):
        build_detection_set(tmp_path / "mine", workers=1, **SMALL)
    assert not [p for p in os.listdir(root.parent) if ".partial" in p]  # no temporary folder left behind


def test_every_box_is_the_tight_box_of_its_pasted_alpha(built):
    root, summary = built
    pools = {s: fashion_mnist.load_uint8(s) for s in ("train", "test")}
    n = 0
    for split in ("train", "val"):
        coco = _coco(root, split)
        sizes = {im["id"]: (im["width"], im["height"]) for im in coco["images"]}
        assert len(sizes) == SMALL[split]
        for a in coco["annotations"]:
            w, h = sizes[a["image_id"]]
            x, y, bw, bh = a["bbox"]
            assert min(x, y) >= 0 and bw > 0 and bh > 0 and x + bw <= w and y + bh <= h
            p = a["paste"]
            assert p["fmnist_split"] == ("train" if split == "train" else "test")
            items, labels = pools[p["fmnist_split"]]
            assert a["category_id"] == int(labels[p["item"]]) + 1
            _, alpha = item_alpha(items[p["item"]], p["size"], bool(p["flip"]))
            inside = alpha > BOX_ALPHA
            # the box in the paste window's frame: above the threshold on each edge, nothing above it outside
            x0, y0 = x - p["x"], y - p["y"]
            assert min(x0, y0) >= 0 and x0 + bw <= p["size"] and y0 + bh <= p["size"]
            box = np.zeros_like(inside)
            box[y0 : y0 + bh, x0 : x0 + bw] = True
            assert not (inside & ~box).any()
            for edge in (inside[y0, x0 : x0 + bw], inside[y0 + bh - 1, x0 : x0 + bw],
                         inside[y0 : y0 + bh, x0], inside[y0 : y0 + bh, x0 + bw - 1]):  # fmt: skip
                assert edge.any()
            assert a["area"] == int(inside.sum())
            n += 1
    assert n == summary["splits"]["train"]["objects"] + summary["splits"]["val"]["objects"] >= 2 * 9


def test_the_item_is_in_the_pixels(built):
    """Where an item's alpha is ~1 the image shows the item's colour, not the photo: the last pasted object of each
    image (nothing covers it) differs from its surroundings just outside its box."""
    from PIL import Image

    root, _ = built
    coco = _coco(root, "train")
    items, _ = fashion_mnist.load_uint8("train")
    checked = 0
    for im in coco["images"]:
        last = [a for a in coco["annotations"] if a["image_id"] == im["id"]][-1]
        px = np.asarray(Image.open(root / "coco" / "train" / im["file_name"]), np.float32)
        p = last["paste"]
        _, alpha = item_alpha(items[p["item"]], p["size"], bool(p["flip"]))
        window = px[p["y"] : p["y"] + p["size"], p["x"] : p["x"] + p["size"]]
        solid, clear = alpha > 0.99, alpha < 0.01
        if solid.sum() < 20 or clear.sum() < 20:
            continue
        lum = window @ np.array([0.299, 0.587, 0.114], np.float32)
        assert abs(float(lum[solid].mean()) - float(lum[clear].mean())) > 10  # visible on its background
        checked += 1
    assert checked >= 3


def test_coco_and_yolo_open_with_the_same_boxes_and_classes(built):
    from pycocotools.coco import COCO

    root, summary = built
    assert summary["classes"] == list(fashion_mnist.CLASSES)
    for split in ("train", "val"):
        coco = ptt.open_detection(root / "coco", split=split)
        yolo = ptt.open_detection(root / "yolo", split=split)
        assert coco.split == yolo.split == split and len(coco) == len(yolo) == SMALL[split]
        assert coco.categories == {k + 1: n for k, n in enumerate(fashion_mnist.CLASSES)}
        assert yolo.categories == dict(enumerate(fashion_mnist.CLASSES))
        by_name = {Path(yolo.file(i)).name: i for i in range(len(yolo))}
        for i in range(len(coco)):
            raw, tc = coco[i]
            raw_y, ty = yolo[by_name[Path(coco.file(i)).name]]
            assert raw == raw_y
            assert ty["labels"].tolist() == (tc["labels"] - 1).tolist()
            assert set(ty["labels"].tolist()) <= set(range(10))
            np.testing.assert_allclose(ty["boxes"].numpy(), tc["boxes"].numpy(), rtol=0, atol=1e-3)
        api = COCO(str(root / "coco" / "annotations" / f"instances_{split}.json"))
        assert sorted(api.getCatIds()) == list(range(1, 11))
        assert len(api.getImgIds()) == SMALL[split]
        assert len(api.getAnnIds()) == summary["splits"][split]["objects"]


@pytest.mark.parametrize(
    "bad",
    [{"train": 0}, {"objects": (3, 2)}, {"object_size": (0.2, 1.5)}, {"quality": 0}, {"long_side": 32}],
)
def test_bad_parameters_say_what_to_give(bad, tmp_path):
    with pytest.raises(PttError, match=r"give|use"):
        build_detection_set(tmp_path / "x", **bad)
    assert not (tmp_path / "x").exists()
