"""A detection batch built one stage at a time, as ``make_detection_loader``'s workers build it (``DetectionBatcher``):
what ``ptt doctor data`` times on detection data.

Stages, as the classification doctor names them: ``read`` (the file's bytes and its target), ``augment`` (the
geometry planned from the header: the batch's short side, the image's resize, crop and flip, and the boxes that
follow), ``decode`` (the JPEG decoded at the DCT scale the output needs and warped into its slot of the padded
batch), ``collate`` (the padded canvas and the batch tensor), ``host_to_device``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from pytorchtricks.clock import Stopwatch, now_s
from pytorchtricks.data.recipes import DetectionRecipe

__all__ = ["STAGES", "time_detection_batches"]

STAGES = ("read", "decode", "augment", "collate", "host_to_device")


def time_detection_batches(
    dataset: Any, batch_size: int, batches: int, recipe: DetectionRecipe, device: torch.device
) -> tuple[dict[str, float], float, dict[str, Any]]:
    """(seconds per batch by stage, the measured total per batch, what the decoder produced): ``batches`` batches
    of ``batch_size`` built in this process, as a loader worker builds them."""
    from pytorchtricks.data.decode import decode_stats, decoded_since

    before = decode_stats()
    order = np.random.default_rng(0).permutation(len(dataset))[: batch_size * batches]
    sw = Stopwatch(device)
    t0 = now_s()
    for b in range(batches):
        _one_batch(dataset, order[b * batch_size : (b + 1) * batch_size], recipe, sw, device)
    total = now_s() - t0
    decoded = decoded_since(before)
    return {k: sw.totals_s.get(k, 0.0) / batches for k in STAGES}, total / batches, decoded


def _one_batch(
    dataset: Any, idx: np.ndarray, rec: DetectionRecipe, sw: Stopwatch, device: torch.device
) -> None:
    """One batch as ``DetectionBatcher`` builds it (seed 0, epoch 0), each part under its stage's clock."""
    from pytorchtricks.data.detection_loader import _bytes_or_hwc, _follow, _hw, read_detection_item
    from pytorchtricks.data.images import sample_rng

    with sw.stage("augment"):
        brng = np.random.Generator(np.random.PCG64([0, 0, 1 << 40, *idx[:1].tolist()]))
        min_size = rec.batch_min_size(brng)
    items, plans = [], []
    for i in idx.tolist():
        with sw.stage("read"):
            raw, target = read_detection_item(dataset, i)
            raw = _bytes_or_hwc(raw)
        with sw.stage("augment"):
            boxes = np.asarray(target["boxes"], np.float32).reshape(-1, 4)
            plans.append(rec.plan(_hw(raw), sample_rng(0, 0, i), min_size, boxes))
        items.append((raw, target, boxes))
    with sw.stage("collate"):
        ch, cw = rec.canvas_hw([g.out_hw for g in plans])
        out = torch.empty((len(items), ch, cw, 3), dtype=torch.uint8)
        buf = out.numpy()
    for k, ((raw, target, boxes), g) in enumerate(zip(items, plans, strict=True)):
        with sw.stage("decode"):
            g.warp(raw, out=buf[k], fill=rec.fill)
        with sw.stage("augment"):
            _follow(target, boxes, g)
    with sw.stage("collate"):
        images = out.permute(0, 3, 1, 2)
    with sw.stage("host_to_device", synchronize=True):
        images.to(device)
