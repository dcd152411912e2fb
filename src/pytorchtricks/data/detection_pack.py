"""Detection targets in packs: a target as JSON metadata, scaled with a pack-time resize, and the pack's summary."""

from __future__ import annotations

from typing import Any

import numpy as np

from pytorchtricks.data.detection import DetectionDataset


def target_json(ds: DetectionDataset, i: int) -> dict[str, Any]:
    """Image ``i``'s target as JSON-safe data, with its stored ``size`` ``[h, w]``: a pack's per-record metadata."""
    hw = ds.image_hw(i)
    t = ds.target(i, hw)
    out: dict[str, Any] = {k: (v.tolist() if hasattr(v, "tolist") else v) for k, v in t.items()}
    out["size"] = [int(hw[0]), int(hw[1])]
    return out


def scale_target_json(t: dict[str, Any], to_hw: tuple[int, int]) -> dict[str, Any]:
    """A JSON target (``target_json``) for its image resized from ``t["size"]`` to ``to_hw``: boxes, areas and
    polygons scaled per axis, exactly as the resize maps pixels (edges at integers).

    Example:
        >>> scale_target_json({"boxes": [[10, 20, 110, 220]], "area": [20000.0], "size": [400, 300]}, (200, 150))
        {'boxes': [[5.0, 10.0, 55.0, 110.0]], 'area': [5000.0], 'size': [200, 150]}
    """
    h0, w0 = t["size"]
    sy, sx = to_hw[0] / h0, to_hw[1] / w0
    out = dict(t)
    out["boxes"] = [[b[0] * sx, b[1] * sy, b[2] * sx, b[3] * sy] for b in t.get("boxes") or []]
    if "area" in t:
        out["area"] = [a * sx * sy for a in t["area"]]
    if isinstance(t.get("segmentation"), list):
        out["segmentation"] = [_scale_seg(g, sx, sy) for g in t["segmentation"]]
    out["size"] = [int(to_hw[0]), int(to_hw[1])]
    return out


def _scale_seg(seg: Any, sx: float, sy: float) -> Any:
    if isinstance(seg, list):  # polygons: [[x, y, x, y, ...], ...]
        return [[v * (sx if k % 2 == 0 else sy) for k, v in enumerate(poly)] for poly in seg]
    return (
        seg  # RLE (crowd masks) stays at the stored size: decode it and resize the mask (said in the guide)
    )


def scale_boxes_json(boxes: Any, from_hw: tuple[int, int], to_hw: tuple[int, int]) -> Any:
    """Pixel boxes ``[x, y, x2|w, y2|h]`` (a list's ``boxes`` column) scaled from one image size to another."""
    sy, sx = to_hw[0] / from_hw[0], to_hw[1] / from_hw[1]
    return [[b[0] * sx, b[1] * sy, b[2] * sx, b[3] * sy] for b in boxes]


def pack_summary(
    targets: list[dict[str, Any]], detection: dict[str, Any], sizes: list[tuple[int, int]]
) -> dict[str, Any]:
    """What ``ptt inspect`` shows of a detection pack: images, boxes, boxes per image, per class, image sizes
    (``sizes``: each image's ``(h, w)`` as stored)."""
    per_image = np.array([len(t.get("boxes") or []) for t in targets], np.int64)
    labels = [str(v) for t in targets for v in t.get("labels") or []]
    return box_summary(per_image, labels, detection, sizes)


def root_summary(ds: DetectionDataset, sizes: list[tuple[int, int]]) -> dict[str, Any]:
    """``pack_summary`` of a detection root as read (``ptt inspect ROOT``), from its flat tables."""
    cats = {str(k): v for k, v in sorted(ds.categories.items())}
    labels = [str(v) for v in ds.labels.tolist()]
    return box_summary(np.diff(ds.offsets), labels, {"format": ds.format, "categories": cats}, sizes)


def box_summary(
    per_image: np.ndarray, labels: list[str], detection: dict[str, Any], sizes: list[tuple[int, int]]
) -> dict[str, Any]:
    """The summary's figures from each image's box count, every box's label (as a string), the format and
    categories (``{"format", "categories": {label: name}}``) and each image's ``(h, w)``."""
    cats = detection.get("categories", {})
    per_class: dict[str, int] = {}
    for lab in labels:
        name = cats.get(lab, lab)
        per_class[name] = per_class.get(name, 0) + 1
    hw = np.array(sizes, np.int64).reshape(-1, 2)

    def stats(a: np.ndarray) -> dict[str, float]:
        if not len(a):
            return {}
        return {"min": int(a.min()), "median": float(np.median(a)), "max": int(a.max())}

    mp = hw[:, 0] * hw[:, 1] / 1e6 if len(hw) else np.zeros(0)
    return {
        "format": detection.get("format"),
        "categories": cats,
        "images": len(per_image),
        "boxes": int(per_image.sum()),
        "images_without_boxes": int((per_image == 0).sum()),
        "boxes_per_image": stats(per_image),
        "boxes_per_class": dict(sorted(per_class.items(), key=lambda kv: -kv[1])),
        "height": stats(hw[:, 0]),
        "width": stats(hw[:, 1]),
        "megapixels": {"min": float(mp.min()), "median": float(np.median(mp)), "max": float(mp.max())}
        if len(mp)
        else {},
    }
