"""The targets of a pack's records: a detection sample's boxes in the stored image's pixels, and the manifest's
``detection`` summary. One step for both pack paths (``writer``'s single process, ``chunked``'s ranks)."""

from __future__ import annotations

import hashlib
import io
import os
import zipfile
from typing import Any

import numpy as np

from pytorchtricks.data.decode import image_size
from pytorchtricks.data.detection_pack import pack_summary, scale_boxes_json, scale_target_json
from pytorchtricks.data.errors import ShardError
from pytorchtricks.data.sources import target_hw
from pytorchtricks.shards import layout


def boxes_follow(
    extras: dict[str, Any], payload: Any, kind: str, info: Any, path: str, resize: tuple[Any, Any]
) -> dict[str, Any]:
    """The extras with their boxes in the stored image's pixels (scaled when the pack resized it).

    A detection ``target`` carries its annotated ``size``; the stored size must be that or what ``--resize`` /
    ``--max-side`` make of it (else ``ValueError``: the file and its annotation disagree). A list's ``boxes`` column
    (pixels, ``[x, y, x2|w, y2|h]``) is scaled by the stored size over the file's own header size."""
    stored = (int(info[0]), int(info[1])) if kind == "raw" else image_size(payload)
    if "target" in extras:
        t = extras["target"]
        h0, w0 = t["size"]
        if stored == (h0, w0):
            return extras
        if stored != (target_hw(h0, w0, *resize) or (h0, w0)):
            raise ValueError(
                f"the stored image is {stored[1]}x{stored[0]} (WxH) but its annotation says {w0}x{h0}: "
                "the file and the annotation disagree (EXIF rotation?)"
            )
        return {**extras, "target": scale_target_json(t, stored)}
    if resize == (None, None):
        return extras
    with open(path, "rb") as fh:
        head = fh.read(1 << 20)
    orig = image_size(head)
    if orig == stored:
        return extras
    return {**extras, "boxes": scale_boxes_json(extras["boxes"], orig, stored), "size": list(stored)}


def manifest_summary(source: Any, rejects: list[dict[str, Any]], options: dict[str, Any]) -> dict[str, Any]:
    """The manifest's ``detection`` entry of a pack of ``source`` (a detection root's listing): the kept images'
    targets at their stored sizes (what ``resize`` / ``max_side`` made of them), summed by ``pack_summary``."""
    rejected = {r["path"] for r in rejects}
    kept = [e["target"] for r, e in zip(source.rel, source.extras, strict=True) if r not in rejected]
    r = (options.get("resize"), options.get("max_side"))
    sizes = [target_hw(t["size"][0], t["size"][1], *r) or tuple(t["size"]) for t in kept]
    return pack_summary(kept, source.detection, sizes)


TARGET_COLUMNS = ("image_id", "size", "count", "boxes", "labels")


def write_targets(dst: str, index: np.ndarray, shards: Any) -> dict[str, Any]:
    """``targets.npz`` of a ptt detection pack at ``dst``: every record's target as flat columns in record order
    (``image_id`` [N], stored ``size`` [N, 2], box ``count`` [N], ``boxes`` [M, 4] xyxy in stored pixels,
    ``labels`` [M]), read from the records just written; written atomically. Returns the manifest's entry
    (file, sha256, bytes): a reader that needs every target at once (Ultralytics' labels) reads one file instead
    of every record."""
    from pytorchtricks.shards.ptt_format import read_metas

    ids: list[int] = []
    sizes: list[Any] = []
    counts: list[int] = []
    boxes: list[Any] = []
    labels: list[Any] = []
    for i, meta in enumerate(read_metas(dst, index, shards)):
        t = (meta.get("extras") or {}).get("target")
        if not isinstance(t, dict):
            raise ShardError("a detection pack's record holds no target", path=dst, record=i)
        b, lab = t.get("boxes") or [], t.get("labels") or []
        if len(b) != len(lab):
            raise ShardError(
                f"the record's target holds {len(b)} boxes and {len(lab)} labels", path=dst, record=i
            )
        ids.append(int(t["image_id"]))
        sizes.append(t["size"])
        counts.append(len(b))
        boxes += b
        labels += lab
    cols = {
        "image_id": np.array(ids, np.int64),
        "size": np.array(sizes, np.int64).reshape(-1, 2),
        "count": np.array(counts, np.int64),
        "boxes": np.array(boxes, np.float64).reshape(-1, 4),
        "labels": np.array(labels, np.int64),
    }
    path = os.path.join(dst, layout.TARGETS)
    tmp = f"{path}.tmp{os.getpid()}.npz"
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_STORED) as z:  # what np.savez writes, with fixed dates:
        for name, col in cols.items():  # the same targets give the same bytes (and checksum) on every run
            buf = io.BytesIO()
            np.save(buf, col, allow_pickle=False)
            z.writestr(zipfile.ZipInfo(f"{name}.npy", date_time=(1980, 1, 1, 0, 0, 0)), buf.getvalue())
    with open(tmp, "rb") as fh:
        digest = hashlib.file_digest(fh, "sha256").hexdigest()
    size = os.path.getsize(tmp)
    os.replace(tmp, path)
    return {"file": layout.TARGETS, "sha256": digest, "bytes": size}


def read_targets(dst: str, entry: dict[str, Any]) -> dict[str, np.ndarray]:
    """The columns of ``write_targets`` (``entry``: the manifest's ``detection.targets``), checked against the
    manifest's checksum; arrays only (``allow_pickle=False``).

    Raises:
        ShardError: the file is missing, or differs from what the pack wrote.
    """
    path = os.path.join(dst, str(entry.get("file", layout.TARGETS)))
    with layout.open_regular(path) as fh:
        data = fh.read()
    if hashlib.sha256(data).hexdigest() != entry.get("sha256"):
        raise ShardError("differs from the manifest's checksum: restore it or re-run `ptt pack`", path=path)
    with np.load(io.BytesIO(data), allow_pickle=False) as z:
        cols = {k: z[k] for k in TARGET_COLUMNS}
    n, m = len(cols["image_id"]), int(cols["count"].sum())
    if (
        cols["size"].shape != (n, 2)
        or len(cols["count"]) != n
        or cols["boxes"].shape != (m, 4)
        or len(cols["labels"]) != m
    ):
        raise ShardError("its columns do not agree in length: re-run `ptt pack`", path=path)
    return cols
