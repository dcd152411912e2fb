"""The Ultralytics benchmark's sets: YOLO roots over the Debian wallpaper photos (2-24 MP), linked, never copied.

- ``photo_root``: ``images/train`` holds ``copies`` symbolic links to each photo of at least 2 MP (the same photo
  under several names, as a set larger than Ultralytics' mosaic buffer needs), ``labels/train`` one seeded label
  file per link (1-5 boxes, 3 classes, YOLO's normalised cx cy w h), a ``data.yaml``.
- ``linked_root``: the same at ``n`` images (100K) for the time to the first batch: links to the photos and to the
  photo root's label files, so the label scan reads real headers and real label files.

Built once under ``/tmp``; a root whose ``ptt-bench-set.json`` records the same parameters is reused.
"""

from __future__ import annotations

import json
import os
from typing import Any

import numpy as np

MIN_MP = 2.0
NAMES = {0: "cat", 1: "dog", 2: "tree"}


def photos(min_mp: float = MIN_MP) -> list[tuple[str, float]]:
    """``[(path, megapixels)]`` of the installed wallpaper JPEGs of at least ``min_mp`` megapixels, sorted."""
    from pytorchtricks.data.photoset import megapixels, wallpaper_sources

    found = [p for _, p in wallpaper_sources() if p.lower().endswith((".jpg", ".jpeg"))]
    out = [(p, megapixels(p)) for p in found]
    return sorted((p, mp) for p, mp in out if mp >= min_mp)


def _fresh(root: str, params: dict[str, Any]) -> bool:
    try:
        with open(os.path.join(root, "ptt-bench-set.json")) as f:
            return bool(json.load(f) == params)
    except (OSError, ValueError):
        return False


def _data_yaml(root: str) -> None:
    names = "".join(f"  {k}: {v}\n" for k, v in NAMES.items())
    with open(os.path.join(root, "data.yaml"), "w") as f:
        f.write(f"path: {root}\ntrain: images/train\nval: images/train\nnames:\n{names}")


def _labels(rng: np.random.Generator) -> str:
    lines = []
    for _ in range(int(rng.integers(1, 6))):
        bw, bh = rng.uniform(0.05, 0.5), rng.uniform(0.05, 0.5)
        cx, cy = rng.uniform(bw / 2, 1 - bw / 2), rng.uniform(bh / 2, 1 - bh / 2)
        lines.append(f"{int(rng.integers(0, len(NAMES)))} {cx:.6f} {cy:.6f} {bw:.6f} {bh:.6f}")
    return "\n".join(lines) + "\n"


def photo_root(root: str, copies: int, seed: int = 47) -> str:
    """A YOLO root of ``copies`` links to each >= 2 MP photo with seeded boxes; returns its ``data.yaml``."""
    srcs = photos()
    params = {"kind": "photos", "copies": copies, "seed": seed, "photos": [p for p, _ in srcs]}
    if not _fresh(root, params):
        rng = np.random.default_rng(seed)
        for sub in ("images/train", "labels/train"):
            os.makedirs(os.path.join(root, sub), exist_ok=True)
        for c in range(copies):
            for k, (src, _) in enumerate(srcs):
                name = f"p{k:02d}c{c:03d}"
                link = os.path.join(root, "images/train", name + ".jpg")
                if os.path.lexists(link):
                    os.remove(link)
                os.symlink(src, link)
                with open(os.path.join(root, "labels/train", name + ".txt"), "w") as f:
                    f.write(_labels(rng))
        _data_yaml(root)
        with open(os.path.join(root, "ptt-bench-set.json"), "w") as f:
            json.dump(params, f)
    return os.path.join(root, "data.yaml")


def linked_root(root: str, n: int, source_root: str) -> str:
    """A YOLO root of ``n`` images: links to ``source_root``'s images and label files in turn; returns its
    ``data.yaml``. Ultralytics' labels cache (``labels/train.cache``) is left to the caller."""
    src_imgs = sorted(os.listdir(os.path.join(source_root, "images/train")))
    params = {"kind": "linked", "n": n, "source": source_root, "sources": len(src_imgs)}
    if not _fresh(root, params):
        for sub in ("images/train", "labels/train"):
            os.makedirs(os.path.join(root, sub), exist_ok=True)
        for i in range(n):
            stem = src_imgs[i % len(src_imgs)][: -len(".jpg")]
            for sub, ext in (("images/train", ".jpg"), ("labels/train", ".txt")):
                target = os.path.realpath(os.path.join(source_root, sub, stem + ext))
                link = os.path.join(root, sub, f"{i:06d}{ext}")
                if os.path.lexists(link):
                    os.remove(link)
                os.symlink(target, link)
            if (i + 1) % 20000 == 0:
                print(f"linked {i + 1}/{n} images", flush=True)
        _data_yaml(root)
        with open(os.path.join(root, "ptt-bench-set.json"), "w") as f:
            json.dump(params, f)
    return os.path.join(root, "data.yaml")


def shrunk_root(root: str, source_root: str, long_side: int) -> str:
    """``source_root`` with every photo re-encoded at ``long_side`` (JPEG quality 95) and its label files linked:
    the source of the 100K-record pack (packing 100K full-size decodes is hours on 2 cores; a pack written for
    imgsz stores images of this size either way, so its index, labels and records read alike)."""
    from PIL import Image

    src_imgs = sorted(os.listdir(os.path.join(source_root, "images/train")))
    params = {"kind": "shrunk", "source": source_root, "long_side": long_side, "sources": len(src_imgs)}
    if not _fresh(root, params):
        for sub in ("images/train", "labels/train"):
            os.makedirs(os.path.join(root, sub), exist_ok=True)
        for name in src_imgs:
            stem = name[: -len(".jpg")]
            with Image.open(os.path.join(source_root, "images/train", name)) as im:
                im = im.convert("RGB")
                im.thumbnail((long_side, long_side), Image.Resampling.BILINEAR)
                im.save(os.path.join(root, "images/train", name), "JPEG", quality=95)
            link = os.path.join(root, "labels/train", stem + ".txt")
            if os.path.lexists(link):
                os.remove(link)
            os.symlink(os.path.realpath(os.path.join(source_root, "labels/train", stem + ".txt")), link)
        _data_yaml(root)
        with open(os.path.join(root, "ptt-bench-set.json"), "w") as f:
            json.dump(params, f)
    return os.path.join(root, "data.yaml")
