"""Build a deterministic set of distinct real-photo JPEGs from the Debian wallpaper packages (ImageFolder layout).

About fifty large wallpaper photos (``lomiri-wallpapers-*``, ``mate-backgrounds``, ``plasma-workspace-wallpapers``)
become thousands of distinct natural JPEGs: random crops (area 5-100%, aspect 3:4-4:3, random flip), resized to a
long side of 512-1024 px and re-encoded at quality 80-95, all drawn from a generator seeded by (seed, item index).
Classes are the source package: ``lomiri``, ``mate``, ``plasma``. Same seed and count -> the same files, byte for
byte, on the same Pillow/libjpeg build. Run ``make data`` (or ``python -m pytorchtricks.data.photoset DST``).
With ``min_mp`` the set is high-resolution instead: crops of at least that many megapixels kept at the photo's
native resolution (no resize), as a camera would deliver them - the seed's case (``ptt tune``'s default workload).
"""

from __future__ import annotations

import argparse
import glob
import hashlib
import io
import json
import os
import sys
from collections.abc import Sequence
from typing import Any

import numpy as np

from pytorchtricks.core import PttError

VERSION = 1
MARKER = ".photoset.json"
_SOURCE_GLOBS: tuple[tuple[str, str], ...] = (
    ("lomiri", "/usr/share/backgrounds/*.jpg"),
    ("mate", "/usr/share/backgrounds/mate/nature/*.jpg"),
    ("plasma", "/usr/share/wallpapers/*/contents/images/*.jpg"),
)
_WORK_LONG_SIDE = 2048  # sources are decoded once (DCT-scaled) to about this size, then cropped


def wallpaper_sources() -> list[tuple[str, str]]:
    """``[(class, path)]`` of the installed wallpaper photos, sorted; one file per plasma wallpaper (the largest)."""
    found: list[tuple[str, str]] = []
    for cls, pattern in _SOURCE_GLOBS:
        files = [f for f in sorted(glob.glob(pattern)) if not os.path.islink(f)]
        if cls == "plasma":  # one folder per wallpaper, the same photo at many sizes: keep the largest file
            best: dict[str, str] = {}
            for f in files:
                key = f.split("/contents/")[0]
                if key not in best or os.path.getsize(f) > os.path.getsize(best[key]):
                    best[key] = f
            files = sorted(best.values())
        found.extend((cls, f) for f in files if os.path.getsize(f) > 10_000)
    return found


def load_source(path: str, long_side: int | None = _WORK_LONG_SIDE) -> Any:
    """A wallpaper photo as an RGB PIL image, decoded DCT-scaled (``draft``) to the smallest scale whose long side is
    at least ``long_side`` (never upscaled); ``None``: the native resolution."""
    from PIL import Image

    img = Image.open(path)
    w, h = img.size
    f = 1.0 if long_side is None else long_side / max(w, h)
    if f < 1:
        img.draft("RGB", (int(w * f), int(h * f)))
    return img.convert("RGB")


def megapixels(path: str) -> float:
    """The photo's size in megapixels, from its header."""
    from PIL import Image

    with Image.open(path) as img:
        return img.size[0] * img.size[1] / 1e6


def _make_one(img: Any, seed: int, index: int, min_mp: float | None = None) -> bytes:
    from PIL import Image

    rng = np.random.default_rng([seed, index])
    w, h = img.size
    lo = 0.05 if min_mp is None else min(1.0, min_mp * 1e6 / (w * h))
    area = w * h * rng.uniform(lo, 1.0)
    aspect = float(np.exp(rng.uniform(np.log(3 / 4), np.log(4 / 3))))
    cw = int(min(w, max(32, round(np.sqrt(area * aspect)))))
    ch = int(min(h, max(32, round(np.sqrt(area / aspect)))))
    if min_mp is not None and cw * ch < min_mp * 1e6:  # the aspect clipped one side: widen the other
        cw, ch = (
            (min(w, -(-int(min_mp * 1e6) // ch)), ch) if cw < w else (cw, min(h, -(-int(min_mp * 1e6) // cw)))
        )
    left, top = int(rng.integers(0, w - cw + 1)), int(rng.integers(0, h - ch + 1))
    if min_mp is not None:  # native resolution: crop, flip, re-encode
        out = img.crop((left, top, left + cw, top + ch))
        if rng.random() < 0.5:
            out = out.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
        buf = io.BytesIO()
        out.save(buf, "JPEG", quality=int(rng.integers(85, 96)))
        return buf.getvalue()
    long_side = min(max(cw, ch), int(rng.integers(512, 1025)))
    scale = long_side / max(cw, ch)
    size = (max(16, round(cw * scale)), max(16, round(ch * scale)))
    out = img.resize(size, Image.Resampling.BILINEAR, box=(left, top, left + cw, top + ch), reducing_gap=3.0)
    if rng.random() < 0.5:
        out = out.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    buf = io.BytesIO()
    out.save(buf, "JPEG", quality=int(rng.integers(80, 96)))
    return buf.getvalue()


def write_atomic(path: str, data: bytes) -> None:
    """Write ``data`` to ``path`` through a temporary file and a rename: a reader never sees half a file."""
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "wb") as fh:
        fh.write(data)
    os.replace(tmp, path)


def _job(args: tuple[str, str, str, int, list[int], float | None]) -> list[tuple[int, str]]:
    dst, cls, src, seed, items, min_mp = args
    img = None
    out = []
    for i in items:
        path = os.path.join(dst, cls, f"{i:05d}.jpg")
        if os.path.exists(path):  # resumable: files are written atomically, so an existing one is complete
            with open(path, "rb") as fh:
                out.append((i, hashlib.sha256(fh.read()).hexdigest()))
            continue
        if img is None:
            img = load_source(src, None if min_mp is not None else _WORK_LONG_SIDE)
        data = _make_one(img, seed, i, min_mp)
        write_atomic(path, data)
        out.append((i, hashlib.sha256(data).hexdigest()))
    return out


def build_photo_set(
    dst: str | os.PathLike[str],
    count: int = 10_000,
    *,
    seed: int = 0,
    workers: int | None = None,
    max_sources: int | None = None,
    min_mp: float | None = None,
) -> dict[str, Any]:
    """Write ``count`` distinct JPEGs to ``dst/<class>/<index>.jpg``; returns the summary also saved in ``dst``.

    Skips the work when ``dst`` already holds a complete set with the same count, seed and version.
    ``max_sources`` uses only that many wallpapers (spread over the classes): a quick small set for tests.
    ``min_mp``: high-resolution crops of at least this many megapixels at native resolution, from the photos that
    have that many (a 2 MP set is a miniature of a camera-photo dataset).

    Raises:
        PttError: no wallpaper packages installed (``make system-deps``), or two outputs came out identical.
    """
    dst = os.fspath(dst)
    want: dict[str, Any] = {
        "version": VERSION,
        "count": int(count),
        "seed": int(seed),
        "max_sources": max_sources,
    }
    if min_mp is not None:
        want["min_mp"] = float(min_mp)
    marker = os.path.join(dst, MARKER)
    if os.path.exists(marker):
        with open(marker, encoding="utf-8") as fh:
            have = json.load(fh)
        if {k: have.get(k) for k in want} == want:
            return dict(have)
    sources = wallpaper_sources()
    if not sources:
        raise PttError(
            "no wallpaper photos found; install the Debian packages with `make system-deps` "
            "(lomiri-wallpapers-16.04 lomiri-wallpapers-20.04 mate-backgrounds plasma-workspace-wallpapers)."
        )
    if min_mp is not None:
        sources = [(c, p) for c, p in sources if megapixels(p) >= min_mp]
        if not sources:
            raise PttError(f"no installed wallpaper photo has {min_mp} megapixels; lower min_mp.")
    if max_sources is not None:  # round robin over the classes, so every class keeps some photos
        by_class: dict[str, list[tuple[str, str]]] = {}
        for c, p in sources:
            by_class.setdefault(c, []).append((c, p))
        rr = [g[k] for k in range(len(sources)) for g in by_class.values() if k < len(g)]
        sources = sorted(rr[: max(1, max_sources)])
    for cls in sorted({c for c, _ in sources}):
        os.makedirs(os.path.join(dst, cls), exist_ok=True)
    jobs = []
    for s, (cls, src) in enumerate(sources):
        items = list(range(s, count, len(sources)))
        if items:
            jobs.append((dst, cls, src, int(seed), items, min_mp))
    nproc = max(1, min(workers or os.cpu_count() or 1, len(jobs)))
    if nproc == 1:
        results = [r for j in jobs for r in _job(j)]
    else:
        import multiprocessing as mp

        with mp.get_context("spawn").Pool(nproc) as pool:
            results = [r for rs in pool.imap_unordered(_job, jobs) for r in rs]
    digests = dict(results)
    if len(set(digests.values())) != len(digests):
        raise PttError("two generated photos are identical; change --seed.")
    summary = {
        **want,
        "classes": sorted({c for c, _ in sources}),
        "sources": [
            os.path.basename(os.path.dirname(os.path.dirname(p))) if c == "plasma" else os.path.basename(p)
            for c, p in sources
        ],
        "digest": hashlib.sha256("".join(digests[i] for i in sorted(digests)).encode()).hexdigest(),
    }
    write_atomic(marker, json.dumps(summary, indent=1, sort_keys=True).encode())
    return summary


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("dst", help="output folder (ImageFolder layout)")
    p.add_argument("--count", type=int, default=10_000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--workers", type=int, default=None)
    args = p.parse_args(argv)
    try:
        s = build_photo_set(args.dst, args.count, seed=args.seed, workers=args.workers)
    except PttError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(
        f"{s['count']} photos from {len(s['sources'])} wallpapers in {args.dst} (digest {s['digest'][:16]})"
    )
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())


def coco_with_boxes(photos: str, ann: str, seed: int = 0) -> str:
    """Write ``ann``: a COCO instances JSON over the JPEGs under ``photos`` (relative file names), each given 1-8
    seeded boxes of 1/40 to 1/2 of each side, anywhere in the image, in 3 categories - detection data for tests,
    benchmarks and ``ptt tune --task detection``'s built-in set (the photos carry no boxes of their own). Kept when
    it exists; written atomically. Returns ``ann``."""
    import json

    import numpy as np

    from pytorchtricks.data.decode import image_size

    if os.path.exists(ann):
        return ann
    files = sorted(
        os.path.relpath(os.path.join(d, f), photos)
        for d, _, fs in os.walk(photos)
        for f in fs
        if f.endswith(".jpg")
    )
    rng = np.random.default_rng(seed)
    images: list[dict[str, Any]] = []
    anns: list[dict[str, Any]] = []
    for n, rel in enumerate(files):
        with open(os.path.join(photos, rel), "rb") as fh:
            h, w = image_size(fh.read(1 << 20))
        images.append({"id": n, "file_name": rel, "width": w, "height": h})
        for _ in range(int(rng.integers(1, 9))):
            bw, bh = float(rng.integers(w // 40, w // 2)), float(rng.integers(h // 40, h // 2))
            x, y = float(rng.integers(0, int(w - bw))), float(rng.integers(0, int(h - bh)))
            anns.append({"id": len(anns) + 1, "image_id": n, "category_id": 1 + len(anns) % 3,
                         "bbox": [x, y, bw, bh], "area": bw * bh, "iscrowd": 0})  # fmt: skip
    cats = [{"id": i, "name": c} for i, c in ((1, "a"), (2, "b"), (3, "c"))]
    os.makedirs(os.path.dirname(os.path.abspath(ann)), exist_ok=True)
    tmp = f"{ann}.tmp{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump({"images": images, "annotations": anns, "categories": cats}, fh)
    os.replace(tmp, ann)
    return ann
