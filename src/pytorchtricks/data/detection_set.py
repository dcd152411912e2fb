"""Build a learnable detection set: Fashion-MNIST items pasted on crops of the Debian wallpaper photos.

The boxes of ``photoset.coco_with_boxes`` are rectangles with nothing inside them to learn; here each object is a
real thing with a shape and a class. A background is a seeded crop of one of the 2-24 MP wallpaper photos (area
30-100%, aspect 3:4-4:3, random flip), decoded DCT-scaled and resized to ``long_side`` (or kept at native
resolution). On it go 1-8 Fashion-MNIST items (10 classes; the train split's items in the train images, the test
split's in the val images), each scaled to a square of ``object_size`` times the image's short side, flipped at
random, tinted (dark on a bright background, bright on a dark one) and blended with an alpha taken from the item:
``smoothstep`` of its grey value, so the garment's silhouette is the object and its dark square is not. A placement
whose box overlaps an earlier one by more than ``max_iou`` is drawn again (20 tries, then the object is left out).
A box is the tight box of the scaled alpha above ``BOX_ALPHA`` (whole pixels, XYXY), not the paste square.

Layouts, one root: ``coco/annotations/instances_{train,val}.json`` over ``coco/{train,val}/`` (category ids 1-10 =
Fashion-MNIST label + 1; each annotation's ``paste`` field says which item went where) and ``yolo/images/<split>/``
+ ``yolo/labels/<split>/`` + ``yolo/data.yaml`` (classes 0-9; its images are hard links to the COCO ones where the
file system allows). ``ptt-set.json`` at the root holds the parameters and a digest of every file; it is written
last, and the set is built in a temporary folder renamed into place, so a root with it is complete. The same
parameters and seed give the same files, byte for byte, on the same Pillow/libjpeg build: every random draw comes
from a generator seeded by (seed, image index). Run ``make detection-set`` or
``python -m pytorchtricks.data.detection_set DST``.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import shutil
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from pytorchtricks.core import PttError, config_first, options_of
from pytorchtricks.data.detection_set_render import (
    ALPHA_HI,
    ALPHA_LO,
    BOX_ALPHA,
    DetectionSetConfig,
    item_alpha,
    render_images,
)
from pytorchtricks.data.photoset import megapixels, wallpaper_sources, write_atomic

__all__ = ["BOX_ALPHA", "MARKER", "DetectionSetConfig", "build_detection_set", "item_alpha"]

VERSION = 1
MARKER = "ptt-set.json"
SPLITS = ("train", "val")


def _sources(cfg: DetectionSetConfig) -> list[tuple[str, str]]:
    found = wallpaper_sources()
    if not found:
        raise PttError(
            "no wallpaper photos found; install the Debian packages with `make system-deps` "
            "(lomiri-wallpapers-16.04 lomiri-wallpapers-20.04 mate-backgrounds plasma-workspace-wallpapers)."
        )
    found = [(c, p) for c, p in found if megapixels(p) >= cfg.min_mp]
    if not found:
        raise PttError(f"no installed wallpaper photo has {cfg.min_mp} megapixels; lower min_mp.")
    return found


def _source_name(cls: str, path: str) -> str:
    return (
        os.path.basename(os.path.dirname(os.path.dirname(path)))
        if cls == "plasma"
        else os.path.basename(path)
    )


@options_of(DetectionSetConfig)
def build_detection_set(
    dst: str | os.PathLike[str],
    config: DetectionSetConfig | None = None,
    *,
    workers: int | None = None,
    progress: Callable[[int, int], None] | None = None,
    **options: Any,
) -> dict[str, Any]:
    """Write a detection set to ``dst`` (COCO under ``dst/coco``, YOLO under ``dst/yolo``; see the module
    docstring) and return its summary, the ``ptt-set.json`` also saved there. The options are
    ``DetectionSetConfig``'s, given as one ``config`` or as keywords. ``workers``: processes (default: the CPUs,
    at most one per photo); ``progress(done, total)`` is called as images are finished.

    Skips the work when ``dst`` already holds a set built with the same parameters.

    Raises:
        PttError: ``dst`` holds something else (a set with other parameters, or files not from this builder), bad
            parameters, no wallpaper packages (``make system-deps``) or no Fashion-MNIST
            (``apt-get install dataset-fashion-mnist``).
    """
    cfg = config_first(config, DetectionSetConfig, options)
    dst = os.path.abspath(os.fspath(dst))
    want = {"version": VERSION, "config": json.loads(json.dumps(dataclasses.asdict(cfg)))}
    have = _existing(dst)
    if have is not None:
        if {k: have.get(k) for k in want} == want:
            return have
        raise PttError(
            f"{dst} holds a detection set built with other parameters ({have.get('config')}): "
            "remove it or choose another folder."
        )
    from pytorchtricks import fashion_mnist

    if not fashion_mnist.available():
        raise PttError("Fashion-MNIST not found; install it with `apt-get install dataset-fashion-mnist`.")
    sources = _sources(cfg)
    total = cfg.train + cfg.val
    jobs = [(p, cfg, list(range(s, total, len(sources)))) for s, (_, p) in enumerate(sources) if s < total]
    tmp = f"{dst}.partial{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        for split in SPLITS:
            os.makedirs(os.path.join(tmp, "coco", split))
        found = _run(jobs, tmp, cfg, workers, progress)
        summary = {**want, **_write_layouts(tmp, cfg, found)}
        summary["sources"] = [_source_name(c, p) for c, p in sources[: len(jobs)]]
        summary["digest"] = _digest(tmp)
        write_atomic(os.path.join(tmp, MARKER), json.dumps(summary, indent=1, sort_keys=True).encode())
        if os.path.isdir(dst):
            os.rmdir(dst)  # empty (checked by _existing)
        os.rename(tmp, dst)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return summary


def _existing(dst: str) -> dict[str, Any] | None:
    """The summary of a complete set at ``dst``; None when ``dst`` is absent or empty."""
    marker = os.path.join(dst, MARKER)
    if os.path.isfile(marker):
        with open(marker, encoding="utf-8") as fh:
            return dict(json.load(fh))
    if os.path.exists(dst) and (not os.path.isdir(dst) or os.listdir(dst)):
        raise PttError(
            f"{dst} exists and is not a detection set (no {MARKER}): remove it or choose another folder."
        )
    return None


def _run(
    jobs: list[tuple[str, DetectionSetConfig, list[int]]],
    tmp: str,
    cfg: DetectionSetConfig,
    workers: int | None,
    progress: Callable[[int, int], None] | None,
) -> dict[int, list[dict[str, Any]]]:
    """Render every image, write its JPEG under ``tmp/coco/<split>/``; the objects of each image index."""
    total, done = cfg.train + cfg.val, 0
    found: dict[int, list[dict[str, Any]]] = {}
    nproc = max(1, min(workers or os.cpu_count() or 1, len(jobs)))
    results: Iterator[list[tuple[int, bytes, list[dict[str, Any]]]]]
    if nproc == 1:
        results = map(render_images, jobs)
    else:
        import multiprocessing as mp

        pool = mp.get_context("spawn").Pool(nproc)
        results = pool.imap_unordered(render_images, jobs)
    try:
        for group in results:
            for g, data, objs in group:
                split, name = _file(g, cfg)
                with open(os.path.join(tmp, "coco", split, name), "wb") as fh:
                    fh.write(data)
                found[g] = objs
            done += len(group)
            if progress is not None:
                progress(done, total)
    finally:
        if nproc > 1:
            pool.terminate()
    return found


def _file(g: int, cfg: DetectionSetConfig) -> tuple[str, str]:
    split, j = ("train", g) if g < cfg.train else ("val", g - cfg.train)
    return split, f"{j:06d}.jpg"


def _write_layouts(
    tmp: str, cfg: DetectionSetConfig, found: dict[int, list[dict[str, Any]]]
) -> dict[str, Any]:
    """COCO JSONs and the YOLO tree over the written JPEGs; the per-split counts for the summary."""
    from pytorchtricks.data.decode import image_size
    from pytorchtricks.fashion_mnist import CLASSES

    cats = [{"id": k + 1, "name": n, "supercategory": "fashion-mnist"} for k, n in enumerate(CLASSES)]
    yolo = os.path.join(tmp, "yolo")
    counts: dict[str, Any] = {}
    for split in SPLITS:
        for sub in ("images", "labels"):
            os.makedirs(os.path.join(yolo, sub, split))
        images: list[dict[str, Any]] = []
        anns: list[dict[str, Any]] = []
        per_class = [0] * len(CLASSES)
        for g in sorted(found):
            s, name = _file(g, cfg)
            if s != split:
                continue
            jpg = os.path.join(tmp, "coco", split, name)
            with open(jpg, "rb") as fh:
                h, w = image_size(fh.read())
            images.append({"id": g + 1, "file_name": name, "width": w, "height": h})
            lines = []
            for o in found[g]:
                x0, y0, x1, y1 = o["box"]
                per_class[o["label"]] += 1
                paste = {k: o[k] for k in ("fmnist_split", "item", "x", "y", "size", "flip")}
                anns.append({"id": len(anns) + 1, "image_id": g + 1, "category_id": o["label"] + 1,
                             "bbox": [x0, y0, x1 - x0, y1 - y0], "area": o["area"], "iscrowd": 0,
                             "paste": paste})  # fmt: skip
                cx, cy, bw, bh = (x0 + x1) / 2 / w, (y0 + y1) / 2 / h, (x1 - x0) / w, (y1 - y0) / h
                lines.append(f"{o['label']} {cx:.8f} {cy:.8f} {bw:.8f} {bh:.8f}\n")
            _link(jpg, os.path.join(yolo, "images", split, name))
            with open(os.path.join(yolo, "labels", split, name[:-4] + ".txt"), "w", encoding="utf-8") as fh:
                fh.write("".join(lines))
        os.makedirs(os.path.join(tmp, "coco", "annotations"), exist_ok=True)
        coco = {"info": {"description": "ptt detection set (pytorchtricks.data.detection_set)"},
                "images": images, "annotations": anns, "categories": cats}  # fmt: skip
        with open(
            os.path.join(tmp, "coco", "annotations", f"instances_{split}.json"), "w", encoding="utf-8"
        ) as fh:
            json.dump(coco, fh, separators=(",", ":"))
        counts[split] = {"images": len(images), "objects": len(anns), "per_class": per_class}
    names = "".join(f"  {k}: {json.dumps(n)}\n" for k, n in enumerate(CLASSES))
    with open(os.path.join(yolo, "data.yaml"), "w", encoding="utf-8") as fh:
        fh.write(f"# {MARKER} at the set's root holds the builder's parameters\n")
        fh.write(f"train: images/train\nval: images/val\nnc: {len(CLASSES)}\nnames:\n{names}")
    import PIL

    return {
        "splits": counts,
        "classes": list(CLASSES),
        "layouts": {"coco": "coco", "yolo": "yolo"},
        "objects_from": {"train": "fashion-mnist train", "val": "fashion-mnist test"},
        "alpha": {"grey_ramp": [ALPHA_LO, ALPHA_HI], "box_alpha": BOX_ALPHA},
        "pillow": PIL.__version__,
    }


def _link(src: str, dst: str) -> None:
    try:
        os.link(src, dst)
    except OSError:  # a file system without hard links: a copy, the same bytes
        shutil.copyfile(src, dst)


def _digest(root: str) -> str:
    """SHA-256 over every file's relative path and content, in path order."""
    h = hashlib.sha256()
    for d, subdirs, files in sorted(os.walk(root)):
        subdirs.sort()
        for f in sorted(files):
            with open(os.path.join(d, f), "rb") as fh:
                h.update(f"{os.path.relpath(os.path.join(d, f), root)}\0".encode())
                h.update(hashlib.sha256(fh.read()).digest())
    return h.hexdigest()


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    d = DetectionSetConfig()
    p.add_argument("dst", help="output folder (COCO under dst/coco, YOLO under dst/yolo)")
    p.add_argument("--train", type=int, default=d.train, help="train images (default %(default)s)")
    p.add_argument("--val", type=int, default=d.val, help="val images (default %(default)s)")
    p.add_argument("--long-side", default=str(d.long_side), help="image long side in px, or 'native'")
    p.add_argument("--objects", type=int, nargs=2, default=d.objects, metavar=("MIN", "MAX"))
    p.add_argument("--object-size", type=float, nargs=2, default=d.object_size, metavar=("MIN", "MAX"),
                   help="item side as a fraction of the image's short side")  # fmt: skip
    p.add_argument("--max-iou", type=float, default=d.max_iou)
    p.add_argument("--min-mp", type=float, default=d.min_mp, help="photos of at least this many megapixels")
    p.add_argument("--quality", type=int, default=d.quality, help="JPEG quality")
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--workers", type=int, default=None)
    args = p.parse_args(argv)
    try:
        long_side = None if args.long_side == "native" else int(args.long_side)
    except ValueError:
        p.error(f"--long-side {args.long_side!r}: give pixels (e.g. 640) or 'native'")
    from rich.progress import Progress

    try:
        with Progress(transient=True) as bar:
            task = bar.add_task("detection set", total=args.train + args.val)
            cfg = DetectionSetConfig(args.train, args.val, long_side, tuple(args.objects),
                                     tuple(args.object_size), args.max_iou, args.min_mp, args.quality,
                                     args.seed)  # fmt: skip
            s = build_detection_set(args.dst, cfg, workers=args.workers,
                                    progress=lambda done, _: bar.update(task, completed=done))  # fmt: skip
    except PttError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    n = s["splits"]
    print(
        f"{n['train']['images']} train + {n['val']['images']} val images, "
        f"{n['train']['objects']} + {n['val']['objects']} objects in {args.dst} (digest {s['digest'][:16]})"
    )
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
