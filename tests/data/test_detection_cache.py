"""cache_in_ram on detection data: each image decoded once at the training size (as `ptt pack --resize --max-side`
stores it), its target scaled with it and kept beside the pixels (JSON, checksummed), read by make_detection_loader;
refusals that name the fix."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import torch

import pytorchtricks as ptt
from pytorchtricks.core import PttError, PttWarning
from pytorchtricks.data.decode import decode_image, image_size
from pytorchtricks.data.detection import open_detection
from pytorchtricks.data.detection_loader import read_detection_item
from pytorchtricks.data.sources import target_hw
from pytorchtricks.tricks.data.cache_in_ram import CachedDataset, cache_in_ram

pytestmark = pytest.mark.filterwarnings("ignore::pytorchtricks.core.PttWarning")


def test_a_coco_root_is_cached_at_the_training_size_with_its_boxes_scaled(coco_root, tmp_path):
    src = open_detection(coco_root)
    cached = cache_in_ram(src, 300, cache_dir=str(tmp_path), max_size=480, num_workers=0)
    assert isinstance(cached, CachedDataset) and cached.task == "detection" and len(cached) == len(src)
    for i in range(len(src)):
        raw, want = src[i]
        h0, w0 = image_size(raw)
        hw = target_hw(h0, w0, 300, 480) or (h0, w0)
        arr, t = read_detection_item(cached, i)
        assert arr.shape == (*hw, 3) and min(hw) <= 300 and max(hw) <= 480
        np.testing.assert_array_equal(arr, decode_image(raw, size=hw))  # the same decode as a fresh one
        sx, sy = hw[1] / w0, hw[0] / h0
        scaled = want["boxes"].double() * torch.tensor([sx, sy, sx, sy], dtype=torch.float64)
        torch.testing.assert_close(t["boxes"], scaled.float(), rtol=0, atol=1e-4)
        assert torch.equal(t["labels"], want["labels"]) and t["image_id"] == want["image_id"]
        torch.testing.assert_close(t["area"], want["area"] * sx * sy, rtol=1e-5, atol=1e-3)
        if "segmentation" in want:  # polygons follow the pixels too
            x0 = want["segmentation"][0][0][0]  # box 0, its first polygon, its first x
            assert t["segmentation"][0][0][0] == pytest.approx(x0 * sx)
    # the same boxes as a pack resized the same way (one geometry for both)
    pk = ptt.pack(str(coco_root), str(tmp_path / "pk"), resize=300, max_side=480, workers=0, shuffle=False)
    assert pk["count"] == len(src)
    packed = ptt.open_data(str(tmp_path / "pk"), task="detection")
    for i in range(len(src)):
        _, ta = read_detection_item(cached, i)
        _, tb = read_detection_item(packed, i)
        assert ta["image_id"] == tb["image_id"]
        torch.testing.assert_close(ta["boxes"], tb["boxes"], rtol=0, atol=1e-4)
    # a second call finds the same arena; another max_size is another arena
    again = cache_in_ram(src, 300, cache_dir=str(tmp_path), max_size=480, num_workers=0)
    other = cache_in_ram(src, 300, cache_dir=str(tmp_path), max_size=400, num_workers=0)
    assert again.path == cached.path and other.path != cached.path


def test_make_detection_loader_reads_the_cache_and_boxes_follow_the_flip(coco_root, tmp_path):
    src = open_detection(coco_root)
    cached = cache_in_ram(src, 256, cache_dir=str(tmp_path), max_size=400, num_workers=0)
    recipe = ptt.DetectionRecipe.shortest_side(256, 400, flip=0.0)
    cfg = ptt.DetectionLoaderConfig(num_workers=2, shuffle=False, seed=3)
    from_cache = {int(t["image_id"]): (b, k) for b in ptt.make_detection_loader(cached, 2, recipe, cfg)
                  for k, t in enumerate(b.targets)}  # fmt: skip
    from_files = {int(t["image_id"]): (b, k) for b in ptt.make_detection_loader(src, 2, recipe, cfg)
                  for k, t in enumerate(b.targets)}  # fmt: skip
    assert set(from_cache) == set(from_files) == {int(src.image_ids[i]) for i in range(len(src))}
    for iid, (b, k) in from_cache.items():
        fb, fk = from_files[iid]
        (h, w), (fh, fw) = b.sizes[k].tolist(), fb.sizes[fk].tolist()
        assert (h, w) == (fh, fw)  # the cache holds the size the recipe makes: nothing resized again
        torch.testing.assert_close(b.targets[k]["boxes"], fb.targets[fk]["boxes"], rtol=0, atol=1e-3)
        diff = (b.images[k, :, :h, :w].float() - fb.images[fk, :, :h, :w].float()).abs().mean()
        assert diff < 2.0  # a decode then a 1:1 copy vs the scaled decode + resize of the same size


def test_a_detection_pack_is_cached_with_its_targets(coco_root, tmp_path):
    ptt.pack(str(coco_root), str(tmp_path / "pk"), workers=0, shuffle=False)
    packed = ptt.open_data(str(tmp_path / "pk"), task="detection")
    cached = cache_in_ram(packed, 200, cache_dir=str(tmp_path / "c"), num_workers=0)
    assert cached.task == "detection" and len(cached) == len(packed)
    for i in (0, len(packed) - 1):
        raw, t0 = read_detection_item(packed, i)
        arr, t = read_detection_item(cached, i)
        h0, w0 = image_size(raw)
        assert min(arr.shape[:2]) == min(200, h0, w0) and t["image_id"] == t0["image_id"]
        sx = arr.shape[1] / w0
        torch.testing.assert_close(t["boxes"][:, 0], t0["boxes"][:, 0] * sx, rtol=0, atol=1e-3)


def test_refusals_name_the_fix(coco_root, tmp_path):
    from torchvision.datasets import CocoDetection

    ann = coco_root / "annotations" / "instances_val.json"
    with pytest.raises(PttError, match=r"ptt.open_detection\(root\), then ptt.cache_in_ram"):
        cache_in_ram(CocoDetection(str(coco_root / "val"), str(ann)), 256, cache_dir=str(tmp_path))
    jpegs = [(open_detection(coco_root).read(0), 0)]
    with pytest.raises(PttError, match="max_size= caps a detection image's long side"):
        cache_in_ram(jpegs, 64, cache_dir=str(tmp_path), max_size=100)
    cached = cache_in_ram(open_detection(coco_root), 128, cache_dir=str(tmp_path), num_workers=0)
    with pytest.raises(PttError, match="is a detection dataset"):
        ptt.make_loader(cached, 2)  # a classification loader over boxes: refused, not read as labels


def test_a_damaged_target_file_is_caught_and_the_arena_rebuilt(coco_root, tmp_path):
    from pytorchtricks.tricks.data._arena import ArenaError

    src = open_detection(coco_root)
    cached = cache_in_ram(src, 128, cache_dir=str(tmp_path), num_workers=0)
    path = os.path.join(cached.path, "targets.json")
    with open(path, encoding="utf-8") as fh:
        body = json.load(fh)
    body[0]["boxes"] = [[0, 0, 1, 1]]
    os.chmod(path, 0o600)
    with open(path, "w", encoding="utf-8") as fh:
        json.dump(body, fh)
    os.chmod(path, 0o400)
    with pytest.raises(ArenaError, match=r"targets\.json does not match its checksum"):
        CachedDataset(cached.path)
    with pytest.warns(PttWarning, match="rebuilds the arena"):
        again = cache_in_ram(src, 128, cache_dir=str(tmp_path), num_workers=0)
    torch.testing.assert_close(
        read_detection_item(again, 0)[1]["boxes"], read_detection_item(cached, 0)[1]["boxes"]
    )


def test_the_arena_key_is_the_same_in_every_process_of_a_yolo_root(photo_set, writers, tmp_path):
    """A YOLO dataset learns its image sizes from the files as it reads them (per process); the arena's key must
    not change with that, or DDP ranks and workers would each build their own arena. A changed box changes it."""
    from pytorchtricks.tricks.data.cache_in_ram import _key

    writers.yolo(tmp_path / "y", photo_set)
    ds = open_detection(tmp_path / "y")
    before = _key(ds, 256, None, 400)
    ds.image_hw(0)  # learnt from the file's header, in this process only
    assert _key(ds, 256, None, 400) == before != _key(ds, 256, None, 500)
    ds.boxes[0, 0] += 0.01
    assert _key(ds, 256, None, 400) != before
