"""Detection batches: the epoch sampler with aspect-ratio groups, and the worker-side batch maker.

A batch is ``DetectionBatch(images, sizes, targets)``: ``images`` uint8 [N, 3, H, W] (NCHW shape, channels_last
storage, zero-copy from the worker's shared memory) padded at the bottom/right to the recipe's canvas (the largest
image rounded up to a multiple of 32, or the fixed size), ``sizes`` int64 [N, 2] the unpadded ``(h, w)`` of each
image, ``targets`` a list of dicts (``boxes`` in output pixels, ``labels``, ``image_id``, ``iscrowd``, ``area``
scaled with the boxes, ``segmentation`` when present, kept boxes only, and ``dropped``: how many boxes the recipe
removed - clipped to nothing, under 1 px, or centred outside an IoU crop). This is what torchvision's
``GeneralizedRCNNTransform`` builds on the device, minus the normalisation (do that on the device, in float).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, NamedTuple

import numpy as np
import torch

from pytorchtricks.core import PttError
from pytorchtricks.data.batches import BatchSlots, EpochBatches, batch_buffer, receive
from pytorchtricks.data.decode import image_size
from pytorchtricks.data.images import sample_rng
from pytorchtricks.data.recipes import DetectionRecipe


class DetectionBatch(NamedTuple):
    images: torch.Tensor
    sizes: torch.Tensor
    targets: list[dict[str, Any]]


def aspect_groups(hw: np.ndarray, k: int = 3) -> np.ndarray:
    """torchvision's ``create_aspect_ratio_groups(k=3)``: bins of w/h at ``2 ** linspace(-1, 1, 2k + 1)``.

    Example:
        >>> aspect_groups(np.array([[100, 200], [200, 100], [100, 100]])).tolist()
        [7, 1, 4]
    """
    bins = 2 ** np.linspace(-1, 1, 2 * k + 1)
    ratio = hw[:, 1] / np.maximum(hw[:, 0], 1)
    return np.digitize(ratio, bins).astype(np.int64)


class GroupedEpochBatches(EpochBatches):
    """Yields ``(epoch, indices)``: a seeded permutation per epoch, this rank's share (``rank::world``, equal
    shares under ``drop_last``), cut into batches - within an aspect group first when ``groups`` is given, the
    leftovers of every group then batched together in order, so each rank yields the same number of batches and
    every sample appears exactly once per epoch across ranks. The share, the length and the samples dropped are
    ``EpochBatches``' own."""

    def __init__(
        self,
        n: int,
        batch_size: int,
        shuffle: bool,
        drop_last: bool,
        seed: int,
        rank: int,
        world: int,
        groups: np.ndarray | None = None,
    ) -> None:
        super().__init__(n, batch_size, shuffle, drop_last, seed, rank, world)
        self.groups = groups

    def batches(self) -> list[np.ndarray]:
        idx, bs = self.indices(), self.batch_size
        if self.groups is None:
            out = [idx[s : s + bs] for s in range(0, len(idx), bs)]
        else:
            out, rest = [], []
            buckets: dict[int, list[int]] = {}
            for i in idx.tolist():  # in order: a group's batch is formed as soon as it is full
                b = buckets.setdefault(int(self.groups[i]), [])
                b.append(i)
                if len(b) == bs:
                    out.append(np.asarray(b, np.int64))
                    buckets[int(self.groups[i])] = []
            for g in sorted(buckets):
                rest += buckets[g]
            out += [np.asarray(rest[s : s + bs], np.int64) for s in range(0, len(rest), bs)]
        return out[: len(self)]

    def __iter__(self) -> Iterator[tuple[int, np.ndarray]]:
        for b in self.batches():
            yield self.epoch, b


def read_detection_item(dataset: Any, i: int) -> tuple[Any, dict[str, Any]]:
    """``(encoded bytes or pixels, target)`` of sample ``i``: a ``DetectionDataset``, any dataset returning
    ``(image, {"boxes": ..., "labels": ...})``, or a pack record ``(bytes, label, {"target": {...}})``."""
    item = dataset.read_raw(i) if hasattr(dataset, "read_raw") else dataset[i]  # a pack: the stored bytes
    if (
        isinstance(item, tuple | list)
        and len(item) == 3
        and isinstance(item[2], dict)
        and "target" in item[2]
    ):
        return item[0], target_from_json(item[2]["target"])
    if isinstance(item, tuple | list) and len(item) == 2 and isinstance(item[1], dict) and "boxes" in item[1]:
        return item[0], item[1]
    got = type(item[1]).__name__ if isinstance(item, tuple | list) and len(item) >= 2 else type(item).__name__
    raise PttError(
        f"dataset[{i}] is not a detection sample (image, target dict with 'boxes'); its target is a {got}. "
        "Open the annotations with ptt.open_detection(root) (COCO, YOLO or VOC) - torchvision's CocoDetection "
        "returns a list of annotation dicts per image, which the loader does not read."
    )


def target_to_json(t: dict[str, Any]) -> dict[str, Any]:
    """A target as JSON-safe data (lists): what a pack stores per record (never pickle)."""
    out: dict[str, Any] = {}
    for k, v in t.items():
        out[k] = v.tolist() if hasattr(v, "tolist") else v
    return out


def target_from_json(d: dict[str, Any]) -> dict[str, Any]:
    """The inverse of ``target_to_json``: tensors with the target's dtypes."""
    n = len(d.get("boxes") or [])
    t: dict[str, Any] = {
        "boxes": torch.tensor(d.get("boxes") or [], dtype=torch.float32).reshape(n, 4),
        "labels": torch.tensor(d.get("labels") or [], dtype=torch.int64).reshape(n),
        "image_id": int(d.get("image_id", -1)),
        "iscrowd": torch.tensor(d.get("iscrowd") or [0] * n, dtype=torch.int64).reshape(n),
        "area": torch.tensor(d.get("area") or [0.0] * n, dtype=torch.float32).reshape(n),
    }
    if "segmentation" in d:
        t["segmentation"] = d["segmentation"]
    return t


class DetectionBatcher:
    """Picklable: ``(dataset, epoch, indices, slots) -> DetectionBatch``; runs inside DataLoader workers, where the
    images land in one of the worker's reused shared-memory buffers (``slots``)."""

    def __init__(self, recipe: DetectionRecipe, seed: int, backend: str = "auto", scaled_decode: bool = True):
        self.recipe, self.seed, self.backend, self.scaled_decode = recipe, seed, backend, scaled_decode

    def __call__(
        self, dataset: Any, epoch: int, indices: np.ndarray, slots: BatchSlots | None = None
    ) -> DetectionBatch:
        idx = [int(i) for i in indices]
        brng = np.random.Generator(np.random.PCG64([self.seed, epoch, 1 << 40, *idx[:1]]))
        min_size = self.recipe.batch_min_size(brng)  # one short side per batch (multi-scale training)
        items, plans = [], []
        for i in idx:
            raw, target = read_detection_item(dataset, i)
            raw = _bytes_or_hwc(raw)
            hw = _hw(raw)
            boxes = np.asarray(target["boxes"], np.float32).reshape(-1, 4)
            plans.append(self.recipe.plan(hw, sample_rng(self.seed, epoch, i), min_size, boxes))
            items.append((raw, target, boxes))
        ch, cw = self.recipe.canvas_hw([g.out_hw for g in plans])
        shape = (len(idx), ch, cw, 3)
        out, slot = slots.acquire(shape) if slots is not None else (batch_buffer(shape), -1)
        buf = out.numpy()
        targets, sizes = [], []
        for k, ((raw, target, boxes), g) in enumerate(zip(items, plans, strict=True)):
            g.warp(
                raw, out=buf[k], fill=self.recipe.fill, backend=self.backend, scaled_decode=self.scaled_decode
            )
            targets.append(_follow(target, boxes, g))
            sizes.append(g.out_hw)
        out_hw = np.asarray(sizes, np.int64).reshape(-1, 2)
        if torch.utils.data.get_worker_info() is not None:
            sent, key = (slots.export(out, slot), slots.key) if slots is not None else (out, "")
            return _Wire(sent, out_hw, targets, key, slot)  # type: ignore[return-value]  # a DetectionBatch once unpickled
        return _from_wire(out, out_hw, targets)


class _Wire:
    """What a worker hands the main process: the images as one shared-memory tensor (one descriptor; or, for a
    memory-file slot, its place in the file: ``BatchSlots.export``), the sizes
    and the targets' small arrays pickled inline with the batch. As tensors, each of those would be a
    shared-memory file of its own and a descriptor passed over a socket: a batch of 4 targets is 18 of them, about
    6 ms of the main process's time per batch (measured: 6.0 ms vs 0.15 ms for the same arrays inline). The
    DataLoader's ``default_convert`` leaves this object alone; unpickling it in the main process makes the
    ``DetectionBatch`` (``_from_wire``: tensors over the unpickled arrays, no copy) and tells the worker's
    ``BatchSlots`` when the images' buffer may be reused."""

    def __init__(
        self, sent: Any, sizes: np.ndarray, targets: list[dict[str, Any]], key: str, slot: int
    ) -> None:
        self.sent, self.sizes, self.targets, self.key, self.slot = sent, sizes, targets, key, slot

    def __reduce__(self) -> tuple[Any, ...]:
        return (_from_wire, (self.sent, self.sizes, self.targets, self.key, self.slot))


def _from_wire(
    sent: Any, sizes: np.ndarray, targets: list[dict[str, Any]], key: str = "", slot: int = -1
) -> DetectionBatch:
    images = (receive(sent, key, slot) if key else sent).permute(0, 3, 1, 2)  # NHWC buffer -> NCHW view
    tensors = [
        {k: torch.from_numpy(v) if isinstance(v, np.ndarray) else v for k, v in t.items()} for t in targets
    ]
    return DetectionBatch(images, torch.from_numpy(sizes), tensors)


def _bytes_or_hwc(raw: Any) -> Any:
    """Encoded bytes stay bytes (the scaled decode reads them); a PIL image or a CHW/HWC uint8 tensor becomes an
    HxWx3 uint8 array (warped as it is, without a DCT scale)."""
    if isinstance(raw, bytes | bytearray | memoryview) or (isinstance(raw, np.ndarray) and raw.ndim == 1):
        return raw
    if hasattr(raw, "convert") and hasattr(raw, "size"):  # PIL
        return np.asarray(raw.convert("RGB"))
    if isinstance(raw, torch.Tensor):
        raw = raw.permute(1, 2, 0) if raw.ndim == 3 and raw.shape[0] in (1, 3) else raw
        raw = raw.numpy()
    arr = np.asarray(raw)
    if arr.dtype != np.uint8 or arr.ndim != 3:
        raise PttError(
            f"detection images must be encoded bytes or uint8 HxWx3 pixels, got {arr.dtype} {arr.shape}."
        )
    return np.ascontiguousarray(np.repeat(arr, 3, axis=2) if arr.shape[2] == 1 else arr)


def _hw(raw: Any) -> tuple[int, int]:
    if isinstance(raw, np.ndarray) and raw.ndim == 3:
        return int(raw.shape[0]), int(raw.shape[1])
    return image_size(raw)


def _follow(target: dict[str, Any], boxes: np.ndarray, g: Any) -> dict[str, Any]:
    """The target after geometry ``g``: boxes mapped, per-box fields kept for the kept boxes, area scaled."""
    new, keep = g.map_boxes(boxes)
    ky, kx = g.scale_yx
    zeros = np.zeros(len(boxes))
    t = {  # numpy here; tensors in the main process (``_from_wire``)
        "boxes": np.ascontiguousarray(new, np.float32),
        "labels": _array(target["labels"], np.int64)[keep],
        "image_id": target.get("image_id", -1),
        "iscrowd": _array(target.get("iscrowd", zeros), np.int64)[keep],
        "area": _array(target.get("area", zeros), np.float32)[keep] * np.float32(ky * kx),
        "dropped": len(boxes) - len(keep),
    }
    if "segmentation" in target:  # polygons stay in source pixels (the geometry maps them: g.map_points)
        segs = target["segmentation"]
        t["segmentation"] = [segs[j] for j in keep.tolist()] if isinstance(segs, list) else segs
    return t


def _array(values: Any, dtype: Any) -> np.ndarray:
    """A target field (a tensor, an array or a list) as a 1-D numpy array of ``dtype``."""
    if isinstance(values, torch.Tensor):
        values = values.detach().cpu().numpy()
    return np.asarray(values, dtype=dtype).reshape(-1)
