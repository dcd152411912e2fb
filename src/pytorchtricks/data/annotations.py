"""Annotation readers: COCO instances JSON, YOLO txt labels, Pascal VOC XML -> one set of flat arrays.

Each ``read_*`` returns the constructor arguments of ``data.detection.DetectionDataset`` (boxes XYXY in pixels -
YOLO's stay normalised until the image size is read -, labels, ids, crowd flags, areas, polygons as JSON, rejects).
Conventions and what counts as a bad annotation: see ``data.detection``.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any

import numpy as np

from pytorchtricks.core import PttError
from pytorchtricks.data.decode import image_size

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".webp", ".bmp")
EDGE_TOLERANCE_PX = 1.0  # a box may leave the image by this much (then clipped): annotation tools round


class AnnotationError(PttError):
    """A bad annotation: ``file`` (the annotation or image file) and ``annotation_id`` (None: the whole file)."""

    def __init__(self, message: str, *, file: str, annotation_id: Any = None) -> None:
        where = f"{file}" + (f": annotation {annotation_id}" if annotation_id is not None else "")
        super().__init__(
            f"{where}: {message} (fix or remove it, or pass on_error='skip' to list it in dataset.rejects)"
        )
        self.file, self.annotation_id, self.reason = file, annotation_id, message


@dataclass
class _Builder:
    """Collects images and boxes while a format is read; ``build`` packs them into flat numpy arrays."""

    on_error: str
    source_file: str

    def __post_init__(self) -> None:
        if self.on_error not in ("raise", "skip"):
            raise PttError(f"on_error must be 'raise' or 'skip', got {self.on_error!r}.")
        self.files: list[str] = []
        self.ids: list[int] = []
        self.sizes: list[tuple[int, int]] = []
        self.boxes: list[list[list[float]]] = []
        self.labels: list[list[int]] = []
        self.crowd: list[list[int]] = []
        self.area: list[list[float]] = []
        self.segs: dict[int, list[Any]] = {}
        self.rejects: list[dict[str, Any]] = []

    def bad(self, message: str, file: str, annotation_id: Any = None, image: str | None = None) -> None:
        if self.on_error == "raise":
            raise AnnotationError(message, file=file, annotation_id=annotation_id)
        self.rejects.append({"file": file, "annotation": annotation_id, "image": image, "reason": message})

    def add_image(self, file: str, image_id: int, hw: tuple[int, int]) -> int:
        self.files.append(file)
        self.ids.append(int(image_id))
        self.sizes.append(hw)
        for lst in (self.boxes, self.labels, self.crowd, self.area):
            lst.append([])
        return len(self.files) - 1

    def add_box(
        self, k: int, xyxy: list[float], label: int, crowd: int, area: float, seg: Any, ann_id: Any, file: str
    ) -> None:
        """Check one box against its image (size known: ``sizes[k]``, else normalised YOLO units) and add it."""
        x1, y1, x2, y2 = xyxy
        h, w = self.sizes[k]
        lim_w, lim_h, tol = (w, h, EDGE_TOLERANCE_PX) if h > 0 else (1.0, 1.0, 1e-6)
        if not all(np.isfinite(xyxy)):
            return self.bad(f"box {xyxy} is not finite", file, ann_id, self.files[k])
        if x2 <= x1 or y2 <= y1:
            return self.bad(
                f"box {xyxy} (XYXY) has a non-positive width or height", file, ann_id, self.files[k]
            )
        if x1 < -tol or y1 < -tol or x2 > lim_w + tol or y2 > lim_h + tol:
            return self.bad(
                f"box {[round(v, 3) for v in xyxy]} (XYXY) lies outside the {lim_w}x{lim_h} image",
                file,
                ann_id,
                self.files[k],
            )
        box = [
            min(max(x1, 0.0), lim_w),
            min(max(y1, 0.0), lim_h),
            min(max(x2, 0.0), lim_w),
            min(max(y2, 0.0), lim_h),
        ]
        self.boxes[k].append(box)
        self.labels[k].append(int(label))
        self.crowd[k].append(int(crowd))
        self.area[k].append(float(area))
        if seg is not None:
            self.segs.setdefault(k, [None] * (len(self.boxes[k]) - 1)).append(seg)
        elif k in self.segs:
            self.segs[k].append(None)
        return None

    def build(self, root: str, categories: dict[int, str], fmt: str) -> dict[str, Any]:
        counts = np.array([len(b) for b in self.boxes], np.int64)
        offsets = np.zeros(len(counts) + 1, np.int64)
        np.cumsum(counts, out=offsets[1:])
        flat = [b for bs in self.boxes for b in bs]
        return {
            "root": root,
            "files": self.files,
            "image_ids": np.asarray(self.ids, np.int64),
            "sizes": np.asarray(self.sizes, np.int64).reshape(-1, 2),
            "boxes": np.asarray(flat, np.float32).reshape(-1, 4),
            "labels": np.asarray([v for vs in self.labels for v in vs], np.int64),
            "iscrowd": np.asarray([v for vs in self.crowd for v in vs], np.int64),
            "area": np.asarray([v for vs in self.area for v in vs], np.float32),
            "offsets": offsets,
            "categories": categories,
            "segmentation": {k: json.dumps(v) for k, v in self.segs.items()},
            "rejects": self.rejects,
            "format": fmt,
        }


def read_coco(
    images: str | os.PathLike[str], annotations: str | os.PathLike[str], *, on_error: str = "raise"
) -> dict[str, Any]:
    """COCO instances JSON ``annotations`` over the image folder ``images`` (pycocotools' format)."""
    images, ann_file = os.fspath(images), os.fspath(annotations)
    b = _Builder(on_error, ann_file)
    try:
        with open(ann_file, encoding="utf-8") as fh:
            doc = json.load(fh)
    except OSError as exc:
        raise AnnotationError(
            f"cannot read the annotation file: {exc.strerror or exc}", file=ann_file
        ) from exc
    except ValueError as exc:
        raise AnnotationError(f"not valid JSON ({exc})", file=ann_file) from exc
    if not isinstance(doc, dict) or not isinstance(doc.get("images"), list):
        raise AnnotationError("not a COCO instances file (no 'images' list)", file=ann_file)
    categories = {int(c["id"]): str(c.get("name", c["id"])) for c in doc.get("categories") or []}
    present = _names_in(images)
    where: dict[int, int] = {}
    missing: set[int] = set()
    for im in doc["images"]:
        name = str(im.get("file_name", ""))
        if not _exists(images, name, present):
            b.bad(f"image file {name!r} is missing under {images}", ann_file, None, name)
            missing.add(int(im["id"]))
            continue
        hw = (int(im.get("height", 0)), int(im.get("width", 0)))
        where[int(im["id"])] = b.add_image(name, int(im["id"]), hw)
    for a in doc.get("annotations") or []:
        aid, iid = a.get("id"), a.get("image_id")
        k = where.get(int(iid)) if isinstance(iid, int) else None
        if k is None:
            if iid not in missing:  # a missing image's boxes go with it (said once, for the image)
                b.bad(f"refers to image_id {iid!r}, which is not listed", ann_file, aid)
            continue
        cat = a.get("category_id")
        if cat not in categories:
            b.bad(
                f"unknown category_id {cat!r} (categories: {sorted(categories)[:10]})",
                ann_file,
                aid,
                b.files[k],
            )
            continue
        bbox = a.get("bbox")
        if not isinstance(bbox, list) or len(bbox) != 4:
            b.bad(f"bbox {bbox!r} is not [x, y, width, height]", ann_file, aid, b.files[k])
            continue
        x, y, w, h = (float(v) for v in bbox)
        area = float(a.get("area", w * h))
        b.add_box(
            k,
            [x, y, x + w, y + h],
            int(cat),
            int(a.get("iscrowd", 0)),
            area,
            a.get("segmentation"),
            aid,
            ann_file,
        )
    return b.build(images, categories, "coco")


def read_yolo(
    root: str | os.PathLike[str], *, split: str | None = None, on_error: str = "raise"
) -> dict[str, Any]:
    """``root/images[/split]/x.jpg`` with ``root/labels[/split]/x.txt`` lines ``class cx cy w h`` (normalised);
    class names from ``root/classes.txt`` or ``names:`` in ``root/data.yaml``. An image without a label file
    has no boxes."""
    root = os.fspath(root)
    img_dir = os.path.join(root, "images", split) if split else os.path.join(root, "images")
    lab_dir = os.path.join(root, "labels", split) if split else os.path.join(root, "labels")
    if not os.path.isdir(img_dir):
        raise PttError(f"{img_dir} is not a folder: a YOLO root holds images[/SPLIT]/ and labels[/SPLIT]/.")
    b = _Builder(on_error, lab_dir)
    names = _yolo_names(root)
    for n, rel in enumerate(_image_files(img_dir)):
        k = b.add_image(os.path.relpath(os.path.join(img_dir, rel), root), n, (0, 0))
        lab = os.path.join(lab_dir, os.path.splitext(rel)[0] + ".txt")
        if not os.path.exists(lab):
            continue
        with open(lab, encoding="utf-8") as fh:
            lines = fh.read().splitlines()
        for ln, line in enumerate(lines, 1):
            if not line.strip():
                continue
            parts = line.split()
            try:
                cls_id, cx, cy, w, h = int(parts[0]), *(float(v) for v in parts[1:5])
                if len(parts) != 5:
                    raise ValueError(f"{len(parts)} fields")
            except (ValueError, IndexError) as exc:
                b.bad(f"line {ln} is not 'class cx cy w h' ({exc})", lab, ln, b.files[k])
                continue
            if names and cls_id not in names:
                b.bad(f"unknown class {cls_id} (names: {len(names)})", lab, ln, b.files[k])
                continue
            b.add_box(k, [cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2], cls_id, 0, 0.0, None, ln, lab)
    if not names:
        names = {int(c): str(c) for c in sorted({v for vs in b.labels for v in vs})}
    return b.build(root, names, "yolo")


def read_voc(
    root: str | os.PathLike[str],
    *,
    split: str | None = None,
    classes: list[str] | None = None,
    on_error: str = "raise",
) -> dict[str, Any]:
    """``root/Annotations/*.xml`` over ``root/JPEGImages/``; ``split`` reads ``ImageSets/Main/<split>.txt``.
    Labels index ``classes`` (default: the sorted names found); ``difficult`` objects are kept as boxes."""
    import xml.etree.ElementTree as ET

    root = os.fspath(root)
    ann_dir = os.path.join(root, "Annotations")
    if split:
        with open(os.path.join(root, "ImageSets", "Main", f"{split}.txt"), encoding="utf-8") as fh:
            stems = [s.strip() for s in fh if s.strip()]
    else:
        stems = sorted(os.path.splitext(f)[0] for f in os.listdir(ann_dir) if f.endswith(".xml"))
    b = _Builder(on_error, ann_dir)
    parsed = []
    for stem in stems:
        path = os.path.join(ann_dir, stem + ".xml")
        try:
            parsed.append((path, ET.parse(path).getroot()))
        except (OSError, ET.ParseError) as exc:
            b.bad(f"cannot parse the XML ({exc})", path)
    found = sorted({(o.findtext("name") or "").strip() for _, r in parsed for o in r.iter("object")})
    names = list(classes) if classes is not None else found
    index = {n: i for i, n in enumerate(names)}
    present = _names_in(os.path.join(root, "JPEGImages"))
    for n, (path, r) in enumerate(parsed):
        fname = (r.findtext("filename") or "").strip() or os.path.basename(path)[:-4] + ".jpg"
        rel = os.path.join("JPEGImages", fname)
        if not _exists(os.path.join(root, "JPEGImages"), fname, present):
            b.bad(f"image file {rel!r} is missing", path, None, rel)
            continue
        size = r.find("size")
        hw = (
            (int(size.findtext("height") or 0), int(size.findtext("width") or 0))
            if size is not None
            else (0, 0)
        )
        if hw[0] <= 0:
            hw = image_size(header_bytes(os.path.join(root, rel)))
        k = b.add_image(rel, n, hw)
        for j, o in enumerate(r.iter("object")):
            name = (o.findtext("name") or "").strip()
            bb = o.find("bndbox")
            if name not in index:
                b.bad(f"unknown class {name!r}", path, j, rel)
                continue
            try:
                if bb is None:
                    raise ValueError("no <bndbox>")
                x1, y1, x2, y2 = (float(bb.findtext(t) or "nan") for t in ("xmin", "ymin", "xmax", "ymax"))
            except ValueError as exc:
                b.bad(f"object {j} has no numeric bndbox ({exc})", path, j, rel)
                continue
            xyxy = [x1 - 1, y1 - 1, x2, y2]
            b.add_box(k, xyxy, index[name], 0, (xyxy[2] - xyxy[0]) * (xyxy[3] - xyxy[1]), None, j, path)
    return b.build(root, dict(enumerate(names)), "voc")


def header_bytes(path: str, n: int = 1 << 18) -> bytes:
    """The first bytes of a file: enough for a JPEG/PNG header (EXIF thumbnails can push SOF past 64 KB)."""
    with open(path, "rb") as fh:
        data = fh.read(n)
    try:
        image_size(data)
        return data
    except Exception:
        with open(path, "rb") as fh:
            return fh.read()


def _names_in(folder: str) -> set[str] | None:
    try:
        return {e.name for e in os.scandir(folder)}
    except OSError:
        return None


def _exists(folder: str, name: str, present: set[str] | None) -> bool:
    if present is not None and "/" not in name and os.sep not in name:
        return name in present
    return bool(name) and os.path.isfile(os.path.join(folder, name))


def _image_files(folder: str) -> list[str]:
    out = []
    for dirpath, dirs, files in os.walk(folder):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        out += [
            os.path.relpath(os.path.join(dirpath, f), folder)
            for f in files
            if f.lower().endswith(IMAGE_EXTENSIONS) and not f.startswith(".")
        ]
    return sorted(out)


def _yolo_names(root: str) -> dict[int, str]:
    txt = os.path.join(root, "classes.txt")
    if os.path.exists(txt):
        with open(txt, encoding="utf-8") as fh:
            return {i: s.strip() for i, s in enumerate(fh.read().splitlines()) if s.strip()}
    yml = os.path.join(root, "data.yaml")
    if not os.path.exists(yml):
        return {}
    with open(yml, encoding="utf-8") as fh:
        lines = fh.read().splitlines()
    for n, line in enumerate(lines):
        if line.split("#")[0].strip().startswith("names:"):
            rest = line.split(":", 1)[1].strip()
            if rest.startswith("["):  # names: [a, b, c]
                return {i: s.strip().strip("'\"") for i, s in enumerate(rest.strip("[]").split(","))}
            out = {}  # names:\n  0: a\n  1: b   (or "- a" list items)
            for j, item in enumerate(lines[n + 1 :]):
                if not item.startswith((" ", "\t")) or not item.strip():
                    break
                key, _, val = item.strip().partition(":")
                if item.strip().startswith("-"):
                    out[j] = item.strip()[1:].strip().strip("'\"")
                else:
                    out[int(key)] = val.strip().strip("'\"")
            return out
    return {}
