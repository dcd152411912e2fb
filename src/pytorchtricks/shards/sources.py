"""What ``pack`` reads: an ImageFolder tree or a CSV/JSONL list, and the per-file work done once at pack time.

The per-file work (``process_item``) runs in worker processes: read, sniff, verify by decoding (strict: truncated
JPEGs fail), optionally resize with area interpolation and re-encode, or store the decoded uint8 array (``raw``).
A file that fails becomes a reject with a reason, never an exception that stops the pack.
"""

from __future__ import annotations

import csv
import io
import json
import os
from dataclasses import dataclass
from typing import Any

import numpy as np

from pytorchtricks.core import PttError

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".webp", ".bmp")


@dataclass(frozen=True)
class Source:
    """The listed input: ``paths[i]`` (absolute), ``rel[i]`` (as recorded), ``labels[i]``, ``extras[i]``."""

    paths: list[str]
    rel: list[str]
    labels: list[int]
    extras: list[dict[str, Any]]
    classes: list[str]


def list_source(src: str | os.PathLike[str]) -> Source:
    """List an ImageFolder tree (``src/<class>/**/<image>``) or a ``.csv``/``.jsonl`` list of path,label[,extras].

    Raises:
        PttError: missing source, empty listing, or a list without ``path``/``label`` columns.
    """
    src = os.fspath(src)
    if os.path.isdir(src):
        return _list_folder(src)
    if not os.path.isfile(src):
        raise PttError(f"source {src!r} does not exist; pass an ImageFolder folder or a .csv/.jsonl list.")
    if src.lower().endswith(".csv"):
        with open(src, newline="", encoding="utf-8") as fh:
            rows: list[dict[str, Any]] = list(csv.DictReader(fh))
    elif src.lower().endswith((".jsonl", ".ndjson")):
        rows = []
        with open(src, encoding="utf-8") as fh:
            for n, line in enumerate(fh, 1):
                if line.strip():
                    try:
                        rows.append(json.loads(line))
                    except ValueError as exc:
                        raise PttError(f"{src}:{n}: not a JSON object ({exc}); one object per line.") from exc
    else:
        raise PttError(f"source list {src!r} must end in .csv or .jsonl (columns path,label[,extra fields]).")
    return _list_rows(src, rows)


def _list_folder(root: str) -> Source:
    classes = sorted(e.name for e in os.scandir(root) if e.is_dir() and not e.name.startswith("."))
    paths, rel, labels = [], [], []
    for label, cls in enumerate(classes):
        for dirpath, dirs, files in os.walk(os.path.join(root, cls)):
            dirs.sort()
            for f in sorted(files):
                if not f.startswith("."):  # non-images are listed too, and end up in the rejects
                    p = os.path.join(dirpath, f)
                    paths.append(p)
                    rel.append(os.path.relpath(p, root))
                    labels.append(label)
    if not paths:
        raise PttError(f"no files under {root!r}; expected {root}/<class>/<image>.jpg (ImageFolder layout).")
    return Source(paths, rel, labels, [{} for _ in paths], classes)


def _list_rows(src: str, rows: list[dict[str, Any]]) -> Source:
    if not rows:
        raise PttError(f"{src!r} lists no samples.")
    if not all(isinstance(r, dict) and "path" in r and "label" in r for r in rows):
        raise PttError(f"every row of {src!r} needs 'path' and 'label' (CSV: a header line path,label,...).")
    base = os.path.dirname(os.path.abspath(src))
    raw_labels = [r["label"] for r in rows]
    try:
        ints = [int(x) for x in raw_labels]
        classes = [str(i) for i in range(max(ints) + 1)] if min(ints) >= 0 else []
        labels = ints
    except (TypeError, ValueError):
        classes = sorted({str(x) for x in raw_labels})
        pos = {c: i for i, c in enumerate(classes)}
        labels = [pos[str(x)] for x in raw_labels]
    paths = [os.path.join(base, str(r["path"])) for r in rows]
    rel = [str(r["path"]) for r in rows]
    extras = [{k: v for k, v in r.items() if k not in ("path", "label")} for r in rows]
    return Source(paths, rel, labels, extras, classes)


# --------------------------------------------------------------------------------------------- per-file work


def sniff_kind(data: bytes) -> str | None:
    if data[:3] == b"\xff\xd8\xff":
        return "jpeg"
    if data[:8] == b"\x89PNG\r\n\x1a\n":
        return "png"
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "webp"
    if data[:2] == b"BM":
        return "bmp"
    return None


def _target_hw(h: int, w: int, resize: int | None, max_side: int | None) -> tuple[int, int] | None:
    scale = 1.0
    if resize is not None and min(h, w) > resize:
        scale = min(scale, resize / min(h, w))
    if max_side is not None and max(h, w) > max_side:
        scale = min(scale, max_side / max(h, w))
    if scale >= 1.0:
        return None
    if resize is not None and scale == resize / min(h, w):  # the short side lands exactly on `resize`
        return (resize, max(1, round(w * scale))) if h <= w else (max(1, round(h * scale)), resize)
    return max(1, round(h * scale)), max(1, round(w * scale))


def _strict_backend() -> str:
    from pytorchtricks.shards.jpeg import backend_works

    return "simplejpeg" if backend_works("simplejpeg") else "pil"  # both fail on truncated JPEGs


def process_item(job: tuple[int, str, dict[str, Any]]) -> tuple[int, str, Any, Any, int]:
    """``(i, kind, payload, shape_or_reason, bytes_in)``; kind ``"reject"`` carries the reason in slot 4."""
    from pytorchtricks.shards.jpeg import _resize, decode_image, image_size

    i, path, opts = job
    try:
        with open(path, "rb") as fh:
            data = fh.read()
    except OSError as exc:
        return i, "reject", None, f"unreadable: {exc.strerror or exc}", 0
    kind = sniff_kind(data)
    if kind is None:
        return i, "reject", None, "not an image (unknown signature)", len(data)
    try:
        backend = _strict_backend() if kind == "jpeg" else "pil"
        h, w = image_size(data)
        target = _target_hw(h, w, opts.get("resize"), opts.get("max_side"))
        arr = decode_image(data, backend=backend)  # full decode: also the integrity check
        if target is not None:
            arr = _resize(arr, target, area=True)
        if opts.get("raw"):
            if opts.get("format") == "tar":
                buf = io.BytesIO()
                np.save(buf, arr, allow_pickle=False)
                return i, "raw", buf.getvalue(), list(arr.shape), len(data)
            return i, "raw", arr.tobytes(), list(arr.shape), len(data)
        if target is not None or opts.get("quality") is not None:
            from PIL import Image

            out = io.BytesIO()
            Image.fromarray(arr).save(out, "JPEG", quality=int(opts.get("quality") or 90))
            return i, "jpeg", out.getvalue(), None, len(data)
        return i, kind, data, None, len(data)
    except Exception as exc:  # any decoder failure is a reject with its reason, never a crash mid-pack
        return i, "reject", None, f"not decodable: {exc}", len(data)
