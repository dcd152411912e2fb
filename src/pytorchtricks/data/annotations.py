"""Annotation readers: COCO instances JSON, YOLO txt labels, Pascal VOC XML -> one set of flat arrays.

Each ``read_*`` returns the constructor arguments of ``data.detection.DetectionDataset`` (boxes XYXY in pixels -
YOLO's stay normalised until the image size is read -, labels, ids, crowd flags, areas, polygons as JSON, rejects).
Conventions and what counts as a bad annotation: see ``data.detection``.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from typing import Any

import numpy as np

from pytorchtricks.core import PttError
from pytorchtricks.data.decode import image_size

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".webp", ".bmp")
EDGE_TOLERANCE_PX = 1.0  # a box may leave the image by this much (then clipped): annotation tools round


class AnnotationError(PttError):
    """A bad annotation: ``file`` (the annotation or image file), ``annotation_id`` (None: the whole file, or an
    image entry) and ``field`` (the annotation's field at fault, e.g. ``"bbox"``; None: the annotation as a whole).
    ``skippable``: ``on_error="skip"`` would list it and read on (a file that does not parse cannot be skipped)."""

    def __init__(
        self,
        message: str,
        *,
        file: str,
        annotation_id: Any = None,
        field: str | None = None,
        skippable: bool = True,
    ) -> None:
        where = f"{file}" + (f": annotation {annotation_id}" if annotation_id is not None else "")
        fix = (
            "fix or remove it, or pass on_error='skip' to list it in dataset.rejects"
            if skippable
            else "fix it"
        )
        super().__init__(f"{where}: {message} ({fix})")
        self.file, self.annotation_id, self.reason, self.field = file, annotation_id, message, field


class _Bad(Exception):
    """One field of one entry is not what the format says (raised while an entry is read, turned into a reject or
    an ``AnnotationError`` by ``_Builder.bad``)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field, self.message = field, message


def _show(v: Any) -> str:
    """A value as a message quotes it: its repr, cut short."""
    import reprlib

    r = reprlib.Repr()
    r.maxlist, r.maxstring, r.maxother, r.maxlevel = 6, 40, 40, 3
    return r.repr(v)


def _int(v: Any, field: str, lo: int | None = None) -> int:
    """``v`` as an integer (a JSON int; a bool, a float, a string or a list is refused), at least ``lo``."""
    if type(v) is not int:
        raise _Bad(field, f"{field} {_show(v)} is not an integer")
    if lo is not None and v < lo:
        raise _Bad(field, f"{field} {v} is below {lo}")
    return v


def _size(v: Any, field: str) -> int:
    """An image side: a positive integer (an integral float such as ``640.0`` is read as one)."""
    if type(v) is float and math.isfinite(v) and v.is_integer():
        v = int(v)
    return _int(v, field, lo=1)


def _num(v: Any, field: str) -> float:
    """``v`` as a finite real number (a JSON int or float; a bool, a string, a list, NaN or inf is refused)."""
    if type(v) is not int and type(v) is not float:
        raise _Bad(field, f"{field} holds {_show(v)}, which is not a number")
    if not math.isfinite(v):
        raise _Bad(field, f"{field} holds {v}, which is not finite")
    return float(v)


def _text_num(text: str | None, field: str) -> float:
    """A number written as text (YOLO's fields, VOC's XML): finite, else ``_Bad`` naming ``field``."""
    try:
        v = float(text)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise _Bad(field, f"{field} {_show(text)} is not a number") from None
    if not math.isfinite(v):
        raise _Bad(field, f"{field} {_show(text)} is not finite")
    return v


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

    def bad(
        self,
        message: str,
        file: str,
        annotation_id: Any = None,
        image: str | None = None,
        field: str | None = None,
    ) -> None:
        if self.on_error == "raise":
            raise AnnotationError(message, file=file, annotation_id=annotation_id, field=field)
        self.rejects.append(
            {"file": file, "annotation": annotation_id, "image": image, "reason": message, "field": field}
        )

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
    """COCO instances JSON ``annotations`` over the image folder ``images`` (pycocotools' format).

    Every field is type-checked: an image entry's ``id`` (an integer), ``file_name`` (a name), ``width`` and
    ``height`` (positive integers; both left out: read from the file); a category's ``id``; an annotation's ``id``,
    ``image_id``, ``category_id`` (integers), ``bbox`` (four finite numbers), ``iscrowd`` (0 or 1), ``area`` (a finite
    number >= 0) and ``segmentation`` (polygons: lists of an even count of finite numbers; or RLE: ``counts`` and
    ``size``). A bool, a string, a list of the wrong length, a nested list, NaN or inf is an ``AnnotationError``
    naming the file, the annotation and the field; ``on_error="skip"`` lists it in ``rejects`` (with its
    ``field``) and keeps the rest.

    Two image entries with one ``id`` cannot be told apart (whose size is it, whose boxes are they?): an
    ``AnnotationError`` naming both files; ``on_error="skip"`` leaves out every image that shares the id, with
    their annotations, one reject per image. So does an image entry with a bad field, or a missing file.
    """
    images, ann_file = os.fspath(images), os.fspath(annotations)
    b = _Builder(on_error, ann_file)
    doc = _coco_json(ann_file)
    categories = _coco_categories(doc.get("categories") or [], b)
    where, gone = _coco_images(doc["images"], images, b)
    for n, a in enumerate(doc.get("annotations") or []):
        ref = a.get("id") if isinstance(a, dict) and type(a.get("id")) is int else f"annotations[{n}]"
        try:
            k, (xyxy, label, crowd, area, seg) = _coco_target(a, where, gone, categories)
        except _Bad as bad:
            if bad.field != "gone":  # a left-out image's boxes go with it (said once, for the image)
                iid = a.get("image_id") if isinstance(a, dict) else None
                img = b.files[where[iid]] if type(iid) is int and iid in where else None
                b.bad(bad.message, ann_file, ref, img, bad.field)
            continue
        b.add_box(k, xyxy, label, crowd, area, seg, ref, ann_file)
    return b.build(images, categories, "coco")


def _coco_json(ann_file: str) -> dict[str, Any]:
    try:
        with open(ann_file, encoding="utf-8") as fh:
            doc = json.load(fh)
    except OSError as exc:
        raise AnnotationError(
            f"cannot read the annotation file: {exc.strerror or exc}", file=ann_file, skippable=False
        ) from exc
    except ValueError as exc:  # UnicodeDecodeError too
        raise AnnotationError(f"not valid JSON ({exc})", file=ann_file, skippable=False) from exc
    if not isinstance(doc, dict) or not isinstance(doc.get("images"), list):
        raise AnnotationError("not a COCO instances file (no 'images' list)", file=ann_file, skippable=False)
    for key in ("annotations", "categories"):
        if doc.get(key) is not None and not isinstance(doc[key], list):
            raise AnnotationError(f"'{key}' is {_show(doc[key])}, not a list", file=ann_file, skippable=False)
    return doc


def _coco_categories(entries: Any, b: _Builder) -> dict[int, str]:
    """``id -> name`` of the categories; a bad entry is refused (or listed, and its boxes then say so)."""
    out: dict[int, str] = {}
    for n, c in enumerate(entries):
        try:
            if not isinstance(c, dict):
                raise _Bad("categories", f"categories[{n}] {_show(c)} is not an object")
            cid = _int(c.get("id"), "id")
            name = c.get("name", cid)
            if not isinstance(name, str | int) or isinstance(name, bool):
                raise _Bad("name", f"name {_show(name)} is not a name")
        except _Bad as bad:
            b.bad(f"categories[{n}]: {bad.message}", b.source_file, None, None, bad.field)
            continue
        out[cid] = str(name)
    return out


def _coco_images(entries: list[Any], folder: str, b: _Builder) -> tuple[dict[int, int], set[int]]:
    """Add the image entries; returns (image id -> index, ids left out: their boxes go with them)."""
    ids = [e.get("id") if isinstance(e, dict) and type(e.get("id")) is int else None for e in entries]
    shared: dict[int, list[str]] = {}
    for e, i in zip(entries, ids, strict=True):
        if i is not None:
            shared.setdefault(i, []).append(str(e.get("file_name")))
    present = _names_in(folder)
    where: dict[int, int] = {}
    gone: set[int] = set()
    for n, e in enumerate(entries):
        try:
            iid, name, hw = _coco_image(e, n, folder, present, shared)
        except _Bad as bad:
            named = (
                e.get("file_name") if isinstance(e, dict) and isinstance(e.get("file_name"), str) else None
            )
            b.bad(bad.message, b.source_file, None, named, bad.field)
            if ids[n] is not None:
                gone.add(ids[n])  # type: ignore[arg-type]
            continue
        where[iid] = b.add_image(name, iid, hw)
    return where, gone


def _coco_image(
    e: Any, n: int, folder: str, present: set[str] | None, shared: dict[int, list[str]]
) -> tuple[int, str, tuple[int, int]]:
    """(id, file name, (height, width)) of image entry ``n``, every field checked."""
    if not isinstance(e, dict):
        raise _Bad("images", f"images[{n}] {_show(e)} is not an object")
    iid = _int(e.get("id"), "id")
    name = e.get("file_name")
    if not isinstance(name, str) or not name:
        raise _Bad("file_name", f"image {iid}: file_name {_show(name)} is not a file name")
    if len(shared.get(iid, ())) > 1:
        others = " and ".join(repr(f) for f in shared[iid])
        raise _Bad(
            "id",
            f"image id {iid} is given to {len(shared[iid])} images, {others}: their annotations "
            "cannot be told apart",
        )
    if not _exists(folder, name, present):
        raise _Bad("file_name", f"image file {name!r} is missing under {folder}")
    if e.get("width") is None and e.get("height") is None:  # not given: the file's own header says
        try:
            return iid, name, image_size(header_bytes(os.path.join(folder, name)))
        except (OSError, PttError) as exc:
            raise _Bad(
                "file_name",
                f"image {iid} ({name}) has no width and height, and its file's are unreadable ({exc})",
            ) from None
    try:
        return iid, name, (_size(e.get("height"), "height"), _size(e.get("width"), "width"))
    except _Bad as bad:
        raise _Bad(bad.field, f"image {iid} ({name}): {bad.message}") from None


def _coco_target(
    a: Any, where: dict[int, int], gone: set[int], categories: dict[int, str]
) -> tuple[int, tuple[list[float], int, int, float, Any]]:
    """(image index, (box XYXY, label, iscrowd, area, segmentation)) of one annotation, every field checked;
    ``_Bad`` names the field (``"gone"``: its image was left out)."""
    if not isinstance(a, dict):
        raise _Bad("annotation", f"{_show(a)} is not an object")
    if "id" in a:
        _int(a["id"], "id")
    else:
        raise _Bad("id", "has no id")
    iid = _int(a.get("image_id"), "image_id")
    if iid not in where:
        if iid in gone:
            raise _Bad("gone", "")
        raise _Bad("image_id", f"refers to image_id {iid}, which is not listed")
    cat = _int(a.get("category_id"), "category_id")
    if cat not in categories:
        raise _Bad("category_id", f"unknown category_id {cat} (categories: {sorted(categories)[:10]})")
    bbox = a.get("bbox")
    if not isinstance(bbox, list) or len(bbox) != 4:
        raise _Bad("bbox", f"bbox {_show(bbox)} is not [x, y, width, height]")
    x, y, w, h = (_num(v, "bbox") for v in bbox)
    crowd = _int(a.get("iscrowd", 0), "iscrowd", lo=0)
    if crowd > 1:
        raise _Bad("iscrowd", f"iscrowd {crowd} is not 0 or 1")
    area = _num(a["area"], "area") if "area" in a else w * h
    if area < 0:
        raise _Bad("area", f"area {area} is negative")
    return where[iid], ([x, y, x + w, y + h], cat, crowd, area, _segmentation(a.get("segmentation")))


def _segmentation(seg: Any) -> Any:
    """COCO's ``segmentation``: polygons (lists of an even count of finite numbers) or RLE (``counts``: a string or
    a list of non-negative integers; ``size``: [height, width]); None when absent."""
    if seg is None:
        return None
    if isinstance(seg, dict):
        counts, size = seg.get("counts"), seg.get("size")
        if not isinstance(counts, str) and not (
            isinstance(counts, list) and all(type(c) is int and c >= 0 for c in counts)
        ):
            raise _Bad("segmentation", f"segmentation counts {_show(counts)} is not an RLE")
        if not isinstance(size, list) or len(size) != 2 or not all(type(v) is int and v > 0 for v in size):
            raise _Bad("segmentation", f"segmentation size {_show(size)} is not [height, width]")
        return seg
    if not isinstance(seg, list):
        raise _Bad("segmentation", f"segmentation {_show(seg)} is neither polygons nor an RLE")
    for poly in seg:
        if not isinstance(poly, list) or len(poly) % 2:
            raise _Bad("segmentation", f"polygon {_show(poly)} is not a flat list [x1, y1, x2, y2, ...]")
        if not all(type(v) is float or type(v) is int for v in poly) or not math.isfinite(sum(poly)):
            for v in poly:
                _num(v, "segmentation")
    return seg


def read_yolo(
    root: str | os.PathLike[str], *, split: str | None = None, on_error: str = "raise"
) -> dict[str, Any]:
    """``root/images[/split]/x.jpg`` with ``root/labels[/split]/x.txt`` lines ``class cx cy w h`` (normalised);
    class names from ``root/classes.txt`` or ``names:`` in ``root/data.yaml``. An image without a label file
    has no boxes. Each field is checked (``class`` a non-negative integer, the others finite numbers): a bad one
    is an ``AnnotationError`` naming the label file, the line and the field (``on_error="skip"``: listed, the
    line left out); a label file that cannot be read leaves its image out."""
    root = os.fspath(root)
    img_dir = os.path.join(root, "images", split) if split else os.path.join(root, "images")
    lab_dir = os.path.join(root, "labels", split) if split else os.path.join(root, "labels")
    if not os.path.isdir(img_dir):
        raise PttError(f"{img_dir} is not a folder: a YOLO root holds images[/SPLIT]/ and labels[/SPLIT]/.")
    b = _Builder(on_error, lab_dir)
    try:
        names = _yolo_names(root)
    except (OSError, ValueError) as exc:  # UnicodeDecodeError, a names: entry whose key is not an index
        raise AnnotationError(f"cannot read the class names ({exc})", file=root, skippable=False) from exc
    for n, rel in enumerate(_image_files(img_dir)):
        name = os.path.relpath(os.path.join(img_dir, rel), root)
        lab = os.path.join(lab_dir, os.path.splitext(rel)[0] + ".txt")
        try:
            lines = _label_lines(lab)
        except _Bad as bad:
            b.bad(bad.message, lab, None, name, bad.field)
            continue
        k = b.add_image(name, n, (0, 0))
        for ln, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                cls_id, xyxy = _yolo_line(line, names)
            except _Bad as bad:
                b.bad(f"line {ln}: {bad.message}", lab, ln, name, bad.field)
                continue
            b.add_box(k, xyxy, cls_id, 0, 0.0, None, ln, lab)
    if not names:
        names = {int(c): str(c) for c in sorted({v for vs in b.labels for v in vs})}
    return b.build(root, names, "yolo")


def _label_lines(path: str) -> list[str]:
    """A YOLO label file's lines (none when the image has no label file)."""
    if not os.path.exists(path):
        return []
    try:
        with open(path, encoding="utf-8") as fh:
            return fh.read().splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise _Bad("file", f"cannot read the label file as text ({exc})") from None


def _yolo_line(line: str, names: dict[int, str]) -> tuple[int, list[float]]:
    """(class, box XYXY in normalised units) of one ``class cx cy w h`` line, every field checked."""
    parts = line.split()
    if len(parts) != 5:
        raise _Bad("line", f"{len(parts)} fields, not 'class cx cy w h'")
    if not parts[0].isdigit():  # digits only: "1.0", "-1", "nan" are not a class index
        raise _Bad("class", f"class {parts[0]!r} is not a non-negative integer")
    cls_id = int(parts[0])
    cx, cy, w, h = (_text_num(v, f) for v, f in zip(parts[1:], ("cx", "cy", "w", "h"), strict=True))
    if names and cls_id not in names:
        raise _Bad("class", f"unknown class {cls_id} (names: {len(names)})")
    return cls_id, [cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2]


def read_voc(
    root: str | os.PathLike[str],
    *,
    split: str | None = None,
    classes: list[str] | None = None,
    on_error: str = "raise",
) -> dict[str, Any]:
    """``root/Annotations/*.xml`` over ``root/JPEGImages/``; ``split`` reads ``ImageSets/Main/<split>.txt``.
    Labels index ``classes`` (default: the sorted names found); ``difficult`` objects are kept as boxes. The numbers
    are checked: ``size`` (positive integers; absent or 0: read from the file) and each ``bndbox`` coordinate (a
    finite number): a bad one is an ``AnnotationError`` naming the XML file, the object and the field
    (``on_error="skip"``: listed, that object - for a bad size, that image - left out)."""
    import xml.etree.ElementTree as ET

    root = os.fspath(root)
    ann_dir = os.path.join(root, "Annotations")
    if split:
        with open(os.path.join(root, "ImageSets", "Main", f"{split}.txt"), encoding="utf-8") as fh:
            stems = [s.split()[0] for s in fh if s.strip()]
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
        try:
            hw = _voc_size(r, root, fname, present)
        except _Bad as bad:
            b.bad(bad.message, path, None, rel, bad.field)
            continue
        k = b.add_image(rel, n, hw)
        for j, o in enumerate(r.iter("object")):
            try:
                label, xyxy = _voc_object(o, index)
            except _Bad as bad:
                b.bad(f"object {j}: {bad.message}", path, j, rel, bad.field)
                continue
            b.add_box(k, xyxy, label, 0, (xyxy[2] - xyxy[0]) * (xyxy[3] - xyxy[1]), None, j, path)
    return b.build(root, dict(enumerate(names)), "voc")


def _voc_size(r: Any, root: str, fname: str, present: set[str] | None) -> tuple[int, int]:
    """(height, width) of a VOC annotation's image: its ``<size>`` (checked), else (absent or 0) the file's."""
    folder = os.path.join(root, "JPEGImages")
    if not _exists(folder, fname, present):
        raise _Bad("filename", f"image file {os.path.join('JPEGImages', fname)!r} is missing")
    size = r.find("size")
    hw = (0, 0)
    if size is not None:
        got = [_text_num(size.findtext(t) or "0", f"size/{t}") for t in ("height", "width")]
        for t, v in zip(("height", "width"), got, strict=True):
            if v < 0 or not v.is_integer():
                raise _Bad(f"size/{t}", f"size/{t} {size.findtext(t)!r} is not a positive integer")
        hw = (int(got[0]), int(got[1]))
    if hw[0] <= 0 or hw[1] <= 0:
        try:
            hw = image_size(header_bytes(os.path.join(folder, fname)))
        except (OSError, PttError) as exc:
            raise _Bad("size", f"has no size, and its file's is unreadable ({exc})") from None
    return hw


def _voc_object(o: Any, index: dict[str, int]) -> tuple[int, list[float]]:
    """(label, box XYXY in pixels) of one ``<object>``: VOC's 1-based inclusive corners, each checked."""
    name = (o.findtext("name") or "").strip()
    if name not in index:
        raise _Bad("name", f"unknown class {name!r}")
    bb = o.find("bndbox")
    if bb is None:
        raise _Bad("bndbox", "has no <bndbox>")
    x1, y1, x2, y2 = (_text_num(bb.findtext(t), f"bndbox/{t}") for t in ("xmin", "ymin", "xmax", "ymax"))
    return index[name], [x1 - 1, y1 - 1, x2, y2]


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
