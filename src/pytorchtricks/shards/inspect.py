"""``inspect_shards``: counts, class histogram, sizes, and a full integrity check (sha256, CRC32, optional decode)."""

from __future__ import annotations

import os
from typing import Any

from pytorchtricks.core import PttError
from pytorchtricks.data.errors import DecodeError, ShardError
from pytorchtricks.shards import layout


def verify_shards(dst: str, manifest: dict[str, Any] | None = None, *, decode: bool = False) -> list[str]:
    """Check every shard's sha256 and every record (CRC32, metadata; ``decode=True`` also decodes images).

    Returns the problems found (empty when the pack is intact); never raises for a bad shard.
    """
    m = manifest or layout.load_manifest(dst)
    problems: list[str] = []
    for s in m["shards"]:
        path = (
            os.path.join(dst, s["name"], "data.mdb")
            if m["format"] == "lmdb"
            else os.path.join(dst, s["name"])
        )
        if not os.path.lexists(path):
            problems.append(f"{path}: missing")
            continue
        try:
            digest = layout.file_sha256(path)
        except ShardError as exc:
            problems.append(str(exc))
            continue
        except OSError as exc:
            problems.append(f"{path}: unreadable: {exc}")
            continue
        size = os.path.getsize(path)
        if s.get("bytes") is not None and size != s["bytes"]:
            problems.append(f"{path}: {size} bytes, the manifest says {s['bytes']} (truncated or replaced)")
        elif s.get("sha256") is not None and digest != s["sha256"]:
            problems.append(f"{path}: sha256 differs from the manifest (corrupt or replaced)")
    entry = (m.get("detection") or {}).get("targets")
    if entry is not None:  # a detection pack's targets.npz: its checksum and columns
        from pytorchtricks.shards.targets import read_targets

        try:
            read_targets(dst, entry)
        except ShardError as exc:
            problems.append(str(exc))
    if problems:
        return problems
    from pytorchtricks.data.decode import decode_image

    def check(payload: Any, where: str, i: int) -> None:
        if decode and not hasattr(payload, "shape"):
            try:
                decode_image(payload)
            except DecodeError as exc:
                problems.append(f"{where}, record {i}: does not decode: {exc}")

    try:
        if m["format"] == "tar":
            from pytorchtricks.shards.tar_format import iter_tar_groups, tar_sample

            first = 0
            for s in m["shards"]:
                path = os.path.join(dst, s["name"])
                n = 0
                key0 = s.get("first_key", first)  # listed by a --distributed (chunk-aligned) pack
                for j, (key, group) in enumerate(iter_tar_groups(path)):
                    if key != f"{key0 + j:09d}":
                        problems.append(f"{path}, record {j}: key {key!r}, expected key {key0 + j}")
                        break
                    payload, _, _ = tar_sample(key, group, path=path, index=j, require_crc=True)
                    check(payload, path, j)
                    n += 1
                if n != s["count"]:
                    problems.append(f"{path}: {n} samples in the tar, the manifest says {s['count']}")
                first += s["count"]
        elif m["format"] == "ptt":
            _verify_ptt(dst, m, check)
        else:
            from pytorchtricks.shards.dataset import ShardDataset

            ds = ShardDataset(dst, decode=None)
            for i in range(len(ds)):
                payload, _, _ = ds.read_raw(i)
                check(payload, dst, i)
    except ShardError as exc:
        problems.append(str(exc))
    return problems


def _verify_ptt(dst: str, m: dict[str, Any], check: Any) -> None:
    """Every record of a ptt pack, shard by shard: the memmapped index is read one shard's rows at a time (no
    per-sample Python object, nothing O(N) held), each shard's table checked against them, then each record's
    CRC32, metadata and label. Raises the first ``ShardError``."""
    import numpy as np

    from pytorchtricks.shards.ptt_format import MappedShard, check_ptt_shard
    from pytorchtricks.shards.record import decode_record

    index = layout.load_index(dst, m["count"])
    layout.check_index(dst, m, index)
    first = 0
    for s in m["shards"]:
        path = os.path.join(dst, s["name"])
        rows = index[first : first + s["count"]]
        check_ptt_shard(path, s, rows, first)
        mm = MappedShard(path)
        cols = [
            np.asarray(rows[f]).tolist() for f in ("offset", "length", "crc", "label")
        ]  # one shard's worth
        for j, (off, length, crc, label) in enumerate(zip(*cols, strict=True)):
            rec = mm.slice(off, length, first + j)
            payload, _, _ = decode_record(rec, path=path, index=first + j, crc=crc, label=label)
            check(payload, path, first + j)
        first += s["count"]


def inspect_shards(
    path: str | os.PathLike[str],
    *,
    verify: bool = True,
    decode: bool = False,
    cache_dir: str | os.PathLike[str] | None = None,
    cache_limit: int | str | None = None,
) -> dict[str, Any]:
    """Summary of a pack: format, counts, class histogram, bytes, overhead, rejects, and integrity problems.

    ``path`` may be a URL (``s3://bucket/pack``): the manifest is read from storage; with ``verify`` every shard
    is downloaded through the node cache (``cache_dir``) and its sha256 checked, and with an unbounded cache the
    records too (CRC32, and the decode with ``decode``).

    Example:
        >>> import tempfile, os; from PIL import Image
        >>> src = tempfile.mkdtemp(); os.makedirs(f"{src}/a")
        >>> Image.new("RGB", (8, 8)).save(f"{src}/a/x.png")
        >>> dst = tempfile.mkdtemp() + "/p"; _ = ptt.pack(src, dst, workers=0)
        >>> r = ptt.inspect_shards(dst); r["count"], r["problems"]
        (1, [])
    """
    from pytorchtricks.shards.cache import open_pack
    from pytorchtricks.shards.remote import scrub_url

    dst, remote = open_pack(path if isinstance(path, str) else os.fspath(path), cache_dir, cache_limit)
    m = layout.load_manifest(dst)
    problems: list[str] | None = None
    if remote is not None and verify:
        problems, pins = [], []
        try:
            for s in range(len(m["shards"])):
                try:
                    pin = remote.pin(s)
                except ShardError as exc:
                    problems.append(str(exc))
                    continue
                if remote.cache.limit is None:
                    pins.append(pin)  # held so the record-level check below finds every shard
                else:
                    pin.release()
            if not problems and remote.cache.limit is None:
                problems = verify_shards(dst, m, decode=decode)
        finally:
            for pin in pins:
                pin.release()
    elif verify:
        problems = verify_shards(dst, m, decode=decode)
    payload = m.get("payload_bytes", 0)
    out = m.get("bytes_out", 0)
    payload = payload if isinstance(payload, int) else 0
    out = out if isinstance(out, int) else 0
    report = {
        "path": scrub_url(str(path)) if remote is not None else dst,
        "format": m["format"],
        "count": m["count"],
        "shards": len(m["shards"]),
        "classes": dict(zip(m["classes"], m["class_counts"], strict=False)),
        "bytes_in": m.get("bytes_in"),
        "payload_bytes": payload,
        "bytes_out": out,
        "overhead": (out - payload) / payload if payload else None,
        "rejects": m.get("rejects", []),
        "options": m.get("options", {}),
        "problems": problems,
    }
    if m["format"] == "tar":
        report["pattern"] = m.get("pattern")
    if "detection" in m:  # a detection pack: images, boxes per image / class, image sizes (as stored)
        report["detection"] = m["detection"]
    return report


def inspect_detection_root(
    path: str | os.PathLike[str], *, split: str | None = None, verify: bool = True, decode: bool = False
) -> dict[str, Any]:
    """What ``ptt inspect`` shows of a COCO / YOLO / VOC root before it is packed: the split read (``split``, default
    its train split), its images, boxes per image and class, image sizes, the bad annotations a pack would leave
    out (``rejects``, each ``{"file", "annotation", "image", "reason", "field"}``), and with ``verify`` the images whose file
    is missing, unreadable or of another size than its annotation says (``decode``: or that do not decode).

    Example:
        >>> import tempfile, os, json; from PIL import Image
        >>> root = tempfile.mkdtemp(); os.makedirs(f"{root}/val"); os.makedirs(f"{root}/annotations")
        >>> Image.new("RGB", (64, 48)).save(f"{root}/val/a.jpg")
        >>> coco = {"images": [{"id": 7, "file_name": "a.jpg", "width": 64, "height": 48}],
        ...         "annotations": [{"id": 1, "image_id": 7, "category_id": 3, "bbox": [4, 5, 10, 200]}],
        ...         "categories": [{"id": 3, "name": "cat"}]}
        >>> _ = open(f"{root}/annotations/instances_val.json", "w").write(json.dumps(coco))
        >>> r = inspect_detection_root(root); r["split"], r["count"], len(r["rejects"]), r["problems"]
        ('val', 1, 1, [])
    """
    from pytorchtricks.data.detection import open_detection
    from pytorchtricks.data.detection_pack import root_summary
    from pytorchtricks.data.detection_splits import detection_splits

    ds = open_detection(path, split=split, on_error="skip")
    problems: list[str] | None = [] if verify else None
    sizes = [_image_hw(ds, i, problems, decode) for i in range(len(ds))]
    return {
        "path": os.fspath(path),
        "format": ds.format,
        "split": ds.split,
        "splits": detection_splits(path, ds.format) if os.path.isdir(path) else [],
        "count": len(ds),
        "rejects": ds.rejects,
        "detection": root_summary(ds, sizes),
        "problems": problems,
    }


def _image_hw(ds: Any, i: int, problems: list[str] | None, decode: bool) -> tuple[int, int]:
    """Image ``i``'s ``(h, w)``: the annotation's (its file's header when it has none); with ``problems`` (verify)
    the header is read and checked against the annotation, and with ``decode`` the image decoded."""
    from pytorchtricks.data.annotations import header_bytes
    from pytorchtricks.data.decode import decode_image, image_size

    want = tuple(int(v) for v in ds.sizes[i])
    if problems is None and want[0] > 0:
        return want  # type: ignore[return-value]
    try:
        raw = ds.read(i) if decode else header_bytes(ds.path(i))
        hw = image_size(raw)
        if decode:
            decode_image(raw)
    except (OSError, PttError, ValueError) as exc:
        if problems is None:
            raise
        problems.append(f"{ds.path(i)}: {exc}")
        return want if want[0] > 0 else (0, 0)  # type: ignore[return-value]
    if problems is not None and want[0] > 0 and hw != want:
        problems.append(
            f"{ds.path(i)}: the file is {hw[1]}x{hw[0]} (WxH) but its annotation says {want[1]}x{want[0]}"
        )
    return hw
