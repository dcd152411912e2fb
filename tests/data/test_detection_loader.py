"""make_detection_loader: padded uint8 batches whose boxes follow the images, exactly-once across DDP ranks with
aspect grouping, the same batches whatever the worker count; classification paths refuse detection datasets."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import pytorchtricks as ptt
from pytorchtricks.data.detection import open_detection
from pytorchtricks.data.detection_loader import DetectionBatch, GroupedEpochBatches, aspect_groups


def _cfg(**kw):
    return ptt.DetectionLoaderConfig(**{"num_workers": 0, **kw})


def test_batches_are_padded_uint8_with_sizes_and_following_boxes(coco_root):
    ds = open_detection(coco_root)
    recipe = ptt.DetectionRecipe.shortest_side(240, 400)
    loader = ptt.make_detection_loader(ds, 3, recipe, _cfg(shuffle=False, drop_last=False))
    seen = 0
    for b in loader:
        n, c, h, w = b.images.shape
        assert b.images.dtype == torch.uint8 and c == 3 and h % 32 == 0 and w % 32 == 0
        assert b.sizes.shape == (n, 2) and (b.sizes[:, 0] <= h).all() and (b.sizes[:, 1] <= w).all()
        assert (b.sizes.min(dim=1).values == 240).any() or (b.sizes.max(dim=1).values == 400).any()
        for k, t in enumerate(b.targets):
            sh, sw = b.sizes[k].tolist()
            assert (b.images[k, :, sh:, :] == 0).all() and (b.images[k, :, :, sw:] == 0).all()  # padding
            bx = t["boxes"]
            assert (
                bx.dtype == torch.float32 and t["labels"].dtype == torch.int64 and len(bx) == len(t["labels"])
            )
            if len(bx):
                assert (bx[:, 2] <= sw).all() and (bx[:, 3] <= sh).all() and (bx[:, :2] >= 0).all()
            i = int(ds.image_ids.tolist().index(t["image_id"]))
            assert len(bx) + t["dropped"] == len(ds[i][1]["boxes"])
            seen += 1
    assert seen == len(ds)


def test_the_same_batches_whatever_the_worker_count(coco_root):
    ds = open_detection(coco_root)
    recipe = ptt.DetectionRecipe.shortest_side((160, 192, 224), 400)
    a = list(ptt.make_detection_loader(ds, 2, recipe, _cfg(seed=5)))
    b = list(ptt.make_detection_loader(ds, 2, recipe, _cfg(seed=5, num_workers=2, persistent_workers=False)))
    assert len(a) == len(b) > 0
    for x, y in zip(a, b, strict=True):
        assert torch.equal(x.images, y.images) and torch.equal(x.sizes, y.sizes)
        assert [t["image_id"] for t in x.targets] == [t["image_id"] for t in y.targets]
        assert isinstance(y, DetectionBatch) and y.sizes.dtype == torch.int64  # unpickled from the wire
        for s, u in zip(x.targets, y.targets, strict=True):
            for k in ("boxes", "labels", "iscrowd", "area"):  # arrays inline from the workers, tensors here
                assert isinstance(u[k], torch.Tensor) and u[k].dtype == s[k].dtype and torch.equal(s[k], u[k])
            assert s["dropped"] == u["dropped"]
    # multi-scale: one short side per batch (the long side may cap it)
    for x in a:
        short = x.sizes.min(dim=1).values.tolist()
        assert (
            len({s for s, lng in zip(short, x.sizes.max(dim=1).values.tolist(), strict=True) if lng < 400})
            <= 1
        )


def _inode(images: torch.Tensor) -> int:
    """The shared-memory file under a batch received from a worker."""
    import os

    fd, _ = images.untyped_storage()._share_fd_cpu_()
    return os.fstat(fd).st_ino


def test_workers_reuse_a_batch_buffer_only_once_the_main_process_freed_it(coco_root):
    ds = open_detection(coco_root)
    recipe = ptt.DetectionRecipe.shortest_side(160, 256, flip=0.0)  # the same pixels every epoch
    ref = [b.images.clone() for b in ptt.make_detection_loader(ds, 1, recipe, _cfg(shuffle=False))]
    cfg = _cfg(shuffle=False, num_workers=2, prefetch_factor=1)  # 3 buffers per worker, 6 batches per epoch
    loader = ptt.make_detection_loader(ds, 1, recipe, cfg)
    held = held_view = None
    files = []
    for _ in range(3):
        for k, b in enumerate(loader):
            assert torch.equal(b.images, ref[k])  # nothing overwrote a batch before it arrived
            files.append(_inode(b.images))
            if held is None:  # kept by the user, through a view only, for the rest of the run
                held, held_view = b.images.clone(), b.images[0, :, 2:40].numpy()
            del b
    assert held_view is not None and torch.equal(torch.from_numpy(held_view), held[0, :, 2:40])
    assert len(files) == 3 * len(ref) and len(set(files)) < len(files)  # buffers were reused...
    assert files.count(files[0]) == 1  # ...but never the one the user still holds


@pytest.mark.parametrize("drop_last", [False, True])
def test_ddp_ranks_see_every_image_exactly_once_with_aspect_groups(drop_last):
    rng = np.random.default_rng(0)
    hw = rng.integers(100, 2000, (103, 2))
    groups = aspect_groups(hw)
    assert len(set(groups.tolist())) > 2
    world = 3
    for epoch in range(2):
        seen, counts = [], []
        for rank in range(world):
            s = GroupedEpochBatches(103, 4, True, drop_last, 7, rank, world, groups)
            s.epoch = epoch
            batches = [b for _, b in s]
            assert len(batches) == len(s)
            counts.append(len(batches))
            seen += [int(i) for b in batches for i in b]
        assert len(seen) == len(set(seen))  # never twice
        if drop_last:
            assert (
                len(set(counts)) == 1
                and len(seen) == 103 - GroupedEpochBatches(103, 4, True, True, 7, 0, 3).dropped()
            )
        else:
            assert sorted(seen) == list(range(103))
    one = GroupedEpochBatches(103, 4, True, False, 7, 0, 1, groups)
    full = [b for _, b in one][:-3]
    mixed = sum(len(set(groups[b].tolist())) > 1 for b in full)
    assert mixed <= len(set(groups.tolist()))  # grouped: only the leftover batches mix groups


def test_recipes_by_name_and_fixed_canvases(coco_root):
    ds = open_detection(coco_root)
    lsj = next(iter(ptt.make_detection_loader(ds, 2, ptt.DetectionRecipe.lsj(256), _cfg())))
    assert tuple(lsj.images.shape[2:]) == (256, 256)
    ssd = next(iter(ptt.make_detection_loader(ds, 2, "ssd", _cfg())))
    assert tuple(ssd.images.shape[2:]) == (300, 300) and ssd.sizes.tolist() == [[300, 300]] * 2
    with pytest.raises(ptt.PttError, match="unknown recipe"):
        ptt.make_detection_loader(ds, 2, "mosaic", _cfg())


def test_classification_paths_refuse_detection_datasets(coco_root, tmp_path):
    from torchvision.datasets import CocoDetection

    tv_coco = CocoDetection.__new__(
        CocoDetection
    )  # its __init__ needs pycocotools; the class is what is checked
    for d in (tv_coco, open_detection(coco_root)):
        with pytest.raises(ptt.PttError, match="make_detection_loader"):
            ptt.make_loader(d, 2, num_workers=0)
    # cache_in_ram caches our detection datasets (tests/data/test_detection_cache.py); torchvision's it refuses
    with pytest.raises(ptt.PttError, match="make_detection_loader"):
        ptt.cache_in_ram(tv_coco, cache_dir=tmp_path)
    with pytest.raises(ptt.PttError, match="COCO detection root"):
        ptt.make_loader(str(coco_root), 2, num_workers=0)
    # a plain list with CocoDetection-style targets (a list of annotation dicts per image)
    raw = open_detection(coco_root)[0][0]
    listy = [(raw, [{"bbox": [1, 2, 3, 4], "category_id": 1}])] * 2
    with pytest.raises(ptt.PttError, match="detection"):
        next(iter(ptt.make_loader(listy, 2, num_workers=0)))
    with pytest.raises(ptt.PttError, match="open_detection"):
        next(iter(ptt.make_detection_loader(listy, 2, "shortest_side", _cfg(group_by_aspect=False))))


def test_loader_ranks_split_the_images_exactly_once(coco_root):
    ds = open_detection(coco_root)
    recipe = ptt.DetectionRecipe.shortest_side(160, 256)
    seen = []
    for rank in range(2):
        cfg = _cfg(rank=rank, world_size=2, drop_last=False, seed=3)
        seen += [t["image_id"] for b in ptt.make_detection_loader(ds, 2, recipe, cfg) for t in b.targets]
    assert sorted(seen) == sorted(ds.image_ids.tolist())


def test_decoded_images_are_warped_too(coco_root):
    """A dataset of PIL images or CHW tensors (no bytes to scale-decode) gets the same geometry and boxes."""
    import io

    from PIL import Image

    ds = open_detection(coco_root)
    raw, t = ds[0]
    pil = Image.open(io.BytesIO(raw))
    chw = torch.from_numpy(np.array(pil.convert("RGB"))).permute(2, 0, 1)
    recipe = ptt.DetectionRecipe.shortest_side(200, 300, flip=0.0)
    cfg = _cfg(shuffle=False, group_by_aspect=False)
    got = [next(iter(ptt.make_detection_loader([(x, t)], 1, recipe, cfg))) for x in (raw, pil, chw)]
    for b in got[1:]:
        assert torch.equal(b.sizes, got[0].sizes) and torch.equal(
            b.targets[0]["boxes"], got[0].targets[0]["boxes"]
        )
        diff = (b.images.float() - got[0].images.float()).abs().mean()
        assert diff < 3  # full decode + area-free bilinear vs DCT-scaled decode: close, not equal
