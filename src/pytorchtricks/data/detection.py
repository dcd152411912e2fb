"""Detection datasets: COCO instances JSON, YOLO txt labels and Pascal VOC XML read into one sample type.

A sample is ``(jpeg_bytes, target)``: ``target["boxes"]`` float32 [K, 4] XYXY in pixels, ``labels`` int64 [K],
``image_id`` (int), ``iscrowd`` int64 [K], ``area`` float32 [K], and ``segmentation`` (the COCO polygons or RLE, one
per box) when the annotations have them. Images without boxes are kept. Labels are COCO's category ids as they are
(torchvision's ``CocoDetection`` convention); YOLO's class indices; for VOC the index of the class name in
``classes`` (given, or the sorted names found). ``dataset.categories`` maps label -> name in every format.

Conventions: COCO ``[x, y, w, h]`` -> ``[x, y, x + w, y + h]``; YOLO normalised ``cx cy w h`` times the image size;
VOC's 1-based inclusive ``xmin ymin xmax ymax`` -> ``[xmin - 1, ymin - 1, xmax, ymax]`` (Detectron2's reading).
A box that leaves the image by at most one pixel (rounding in the annotation tool) is clipped; further out, or with
a non-positive width or height, an unknown category, a missing image file or annotation JSON/XML that does not
parse is an ``AnnotationError`` naming the file and the annotation id - or, with ``on_error="skip"``, an entry of
``dataset.rejects`` (only that annotation is dropped; a missing image drops that image), nothing else lost.

EXIF orientation: pixels and boxes are in the stored frame, as torchvision does (``CocoDetection`` opens images
with ``PIL.Image.open``, which does not rotate; ``torchvision.io.decode_jpeg`` defaults to
``apply_exif_orientation=False``) and as the COCO annotations' ``width``/``height`` describe them. When a file's
stored size disagrees with its annotation, reading it raises ``AnnotationError`` - and says so when the annotation
matches the EXIF-rotated size (the annotations were then made on the rotated image: rotate the files with
``PIL.ImageOps.exif_transpose`` before use).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from pytorchtricks.core import PttError
from pytorchtricks.shards.jpeg import image_size

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

    def build(self, root: str, categories: dict[int, str], fmt: str) -> DetectionDataset:
        counts = np.array([len(b) for b in self.boxes], np.int64)
        offsets = np.zeros(len(counts) + 1, np.int64)
        np.cumsum(counts, out=offsets[1:])
        flat = [b for bs in self.boxes for b in bs]
        return DetectionDataset(
            root,
            self.files,
            np.asarray(self.ids, np.int64),
            np.asarray(self.sizes, np.int64).reshape(-1, 2),
            np.asarray(flat, np.float32).reshape(-1, 4),
            np.asarray([v for vs in self.labels for v in vs], np.int64),
            np.asarray([v for vs in self.crowd for v in vs], np.int64),
            np.asarray([v for vs in self.area for v in vs], np.float32),
            offsets,
            categories,
            {k: json.dumps(v) for k, v in self.segs.items()},
            self.rejects,
            fmt,
        )


class DetectionDataset(torch.utils.data.Dataset):  # type: ignore[type-arg]
    """Images and their boxes: ``ds[i]`` is ``(encoded bytes, target)`` (see the module docstring).

    Build with ``open_detection(root)`` or ``DetectionDataset.from_coco / from_yolo / from_voc``. Annotations live
    in flat numpy arrays (no per-image Python objects: DataLoader workers do not grow by copy-on-write).
    ``rejects``: what ``on_error="skip"`` left out, each ``{"file", "annotation", "image", "reason"}``.

    Example:
        >>> import tempfile, os, json; from PIL import Image
        >>> root = tempfile.mkdtemp(); os.makedirs(f"{root}/val"); os.makedirs(f"{root}/annotations")
        >>> Image.new("RGB", (64, 48)).save(f"{root}/val/a.jpg")
        >>> coco = {"images": [{"id": 7, "file_name": "a.jpg", "width": 64, "height": 48}],
        ...         "annotations": [{"id": 1, "image_id": 7, "category_id": 3, "bbox": [4, 5, 10, 20]}],
        ...         "categories": [{"id": 3, "name": "cat"}]}
        >>> _ = open(f"{root}/annotations/instances_val.json", "w").write(json.dumps(coco))
        >>> ds = open_detection(root, split="val")
        >>> raw, t = ds[0]; t["boxes"].tolist(), t["labels"].tolist(), ds.categories
        ([[4.0, 5.0, 14.0, 25.0]], [3], {3: 'cat'})
    """

    task = "detection"

    def __init__(
        self,
        root: str,
        files: list[str],
        image_ids: np.ndarray,
        sizes: np.ndarray,
        boxes: np.ndarray,
        labels: np.ndarray,
        iscrowd: np.ndarray,
        area: np.ndarray,
        offsets: np.ndarray,
        categories: dict[int, str],
        segmentation: dict[int, str],
        rejects: list[dict[str, Any]],
        format: str,
    ) -> None:
        self.root, self.format, self.categories, self.rejects = root, format, dict(categories), rejects
        # file names as one bytes blob + offsets: a list of 10M str would be 10M refcounted objects
        enc = [f.encode() for f in files]
        self._names = np.frombuffer(b"".join(enc), np.uint8) if enc else np.zeros(0, np.uint8)
        self._name_off = np.zeros(len(enc) + 1, np.int64)
        np.cumsum([len(e) for e in enc], out=self._name_off[1:])
        self.image_ids, self.sizes, self.boxes, self.labels = image_ids, sizes, boxes, labels
        self.iscrowd, self.area, self.offsets, self.segmentation = iscrowd, area, offsets, segmentation

    def __len__(self) -> int:
        return len(self.image_ids)

    def file(self, i: int) -> str:
        """Image ``i``'s path relative to ``root``."""
        return bytes(self._names[self._name_off[i] : self._name_off[i + 1]]).decode()

    def path(self, i: int) -> str:
        return os.path.join(self.root, self.file(i))

    def read(self, i: int) -> bytes:
        with open(self.path(i), "rb") as fh:
            return fh.read()

    def image_hw(self, i: int, raw: bytes | None = None) -> tuple[int, int]:
        """``(height, width)`` of image ``i``: from the annotation, else (YOLO) from the file's header."""
        h, w = (int(v) for v in self.sizes[i])
        if h > 0:
            return h, w
        got = image_size(raw if raw is not None else _head(self.path(i)))
        self.sizes[i] = got  # per process: a worker learns each size once
        return got

    def target(self, i: int, hw: tuple[int, int] | None = None) -> dict[str, Any]:
        """Image ``i``'s target (boxes in pixels; YOLO's normalised boxes scaled by ``hw`` or the header's size)."""
        lo, hi = int(self.offsets[i]), int(self.offsets[i + 1])
        boxes = self.boxes[lo:hi].copy()
        if self.sizes[i][0] <= 0:  # YOLO: normalised until the image size is known
            h, w = hw or self.image_hw(i)
            boxes *= np.array([w, h, w, h], np.float32)
        t: dict[str, Any] = {
            "boxes": torch.from_numpy(boxes),
            "labels": torch.from_numpy(self.labels[lo:hi].copy()),
            "image_id": int(self.image_ids[i]),
            "iscrowd": torch.from_numpy(self.iscrowd[lo:hi].copy()),
            "area": torch.from_numpy(self.area[lo:hi].copy()),
        }
        if self.sizes[i][0] <= 0:
            t["area"] = (t["boxes"][:, 2] - t["boxes"][:, 0]) * (t["boxes"][:, 3] - t["boxes"][:, 1])
        if i in self.segmentation:
            t["segmentation"] = json.loads(self.segmentation[i])
        return t

    def __getitem__(self, i: int) -> tuple[bytes, dict[str, Any]]:
        raw = self.read(i)
        hw = image_size(raw)
        want = tuple(int(v) for v in self.sizes[i])
        if want[0] > 0 and hw != want:
            raise AnnotationError(_size_mismatch(raw, hw, want), file=self.path(i))
        return raw, self.target(i, hw)

    def __iter__(self) -> Iterator[tuple[bytes, dict[str, Any]]]:
        return (self[i] for i in range(len(self)))

    def __repr__(self) -> str:
        return (
            f"DetectionDataset({self.format}, {len(self)} images, {len(self.boxes)} boxes, "
            f"{len(self.categories)} categories, root={self.root!r})"
        )

    # ---------------------------------------------------------------------------------------------- readers

    @classmethod
    def from_coco(
        cls, images: str | os.PathLike[str], annotations: str | os.PathLike[str], *, on_error: str = "raise"
    ) -> DetectionDataset:
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

    @classmethod
    def from_yolo(
        cls, root: str | os.PathLike[str], *, split: str | None = None, on_error: str = "raise"
    ) -> DetectionDataset:
        """``root/images[/split]/x.jpg`` with ``root/labels[/split]/x.txt`` lines ``class cx cy w h`` (normalised);
        class names from ``root/classes.txt`` or ``names:`` in ``root/data.yaml``. An image without a label file
        has no boxes."""
        root = os.fspath(root)
        img_dir = os.path.join(root, "images", split) if split else os.path.join(root, "images")
        lab_dir = os.path.join(root, "labels", split) if split else os.path.join(root, "labels")
        if not os.path.isdir(img_dir):
            raise PttError(
                f"{img_dir} is not a folder: a YOLO root holds images[/SPLIT]/ and labels[/SPLIT]/."
            )
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

    @classmethod
    def from_voc(
        cls,
        root: str | os.PathLike[str],
        *,
        split: str | None = None,
        classes: list[str] | None = None,
        on_error: str = "raise",
    ) -> DetectionDataset:
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
                hw = image_size(_head(os.path.join(root, rel)))
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
                    x1, y1, x2, y2 = (
                        float(bb.findtext(t) or "nan") for t in ("xmin", "ymin", "xmax", "ymax")
                    )
                except ValueError as exc:
                    b.bad(f"object {j} has no numeric bndbox ({exc})", path, j, rel)
                    continue
                xyxy = [x1 - 1, y1 - 1, x2, y2]
                b.add_box(k, xyxy, index[name], 0, (xyxy[2] - xyxy[0]) * (xyxy[3] - xyxy[1]), None, j, path)
        return b.build(root, dict(enumerate(names)), "voc")


def _head(path: str, n: int = 1 << 18) -> bytes:
    """The first bytes of a file: enough for a JPEG/PNG header (EXIF thumbnails can push SOF past 64 KB)."""
    with open(path, "rb") as fh:
        data = fh.read(n)
    try:
        image_size(data)
        return data
    except Exception:
        with open(path, "rb") as fh:
            return fh.read()


def _size_mismatch(raw: bytes, hw: tuple[int, int], want: tuple[int, ...]) -> str:
    msg = f"the file is {hw[1]}x{hw[0]} (WxH) but its annotation says {want[1]}x{want[0]}"
    if hw == (want[1], want[0]) and exif_orientation(raw) in (5, 6, 7, 8):
        msg += (
            "; the EXIF orientation rotates it to the annotated size: the boxes were drawn on the rotated image, "
            "pixels are read in the stored frame (as torchvision does) - rotate the files with "
            "PIL.ImageOps.exif_transpose first"
        )
    return msg


def exif_orientation(raw: bytes) -> int:
    """The EXIF orientation tag (1-8; 1 when absent or unreadable)."""
    import io

    from PIL import Image

    try:
        with Image.open(io.BytesIO(raw)) as img:
            return int(img.getexif().get(0x0112, 1))
    except Exception:
        return 1


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


def detection_layout(path: str | os.PathLike[str]) -> str | None:
    """``"coco"``, ``"yolo"`` or ``"voc"`` when ``path`` looks like that kind of root (or a COCO JSON), else None.

    Example:
        >>> import tempfile; detection_layout(tempfile.mkdtemp()) is None
        True
    """
    p = os.fspath(path)
    if os.path.isfile(p) and p.lower().endswith(".json"):
        return "coco"
    if not os.path.isdir(p):
        return None
    if os.path.isdir(os.path.join(p, "annotations")) and any(
        f.endswith(".json") for f in os.listdir(os.path.join(p, "annotations"))
    ):
        return "coco"
    if os.path.isdir(os.path.join(p, "Annotations")) and os.path.isdir(os.path.join(p, "JPEGImages")):
        return "voc"
    if os.path.isdir(os.path.join(p, "images")) and os.path.isdir(os.path.join(p, "labels")):
        return "yolo"
    return None


def open_detection(
    path: str | os.PathLike[str],
    *,
    format: str = "auto",
    split: str | None = None,
    images: str | os.PathLike[str] | None = None,
    on_error: str = "raise",
) -> DetectionDataset:
    """Open a detection root: COCO (``root/annotations/instances_<split>.json`` over ``root/<split>/``, or a JSON
    file with ``images=``), YOLO (``images/`` + ``labels/``) or Pascal VOC (``Annotations/`` + ``JPEGImages/``).

    Raises:
        PttError: not a detection root, or an ambiguous COCO split. AnnotationError: a bad annotation (see the
            module docstring) unless ``on_error="skip"``.
    """
    p = os.fspath(path)
    fmt = detection_layout(p) if format == "auto" else format
    if fmt == "coco":
        if os.path.isfile(p):
            img_dir = os.fspath(images) if images is not None else _coco_images_beside(p)
            return DetectionDataset.from_coco(img_dir, p, on_error=on_error)
        jsons = sorted(f for f in os.listdir(os.path.join(p, "annotations")) if f.startswith("instances_"))
        if split is None:
            if len(jsons) != 1:
                raise PttError(
                    f"{p} holds {len(jsons)} COCO instance files ({', '.join(jsons) or 'none'}); pass split= "
                    "(e.g. split='val2017')."
                )
            split = jsons[0][len("instances_") : -len(".json")]
        ann = os.path.join(p, "annotations", f"instances_{split}.json")
        img_dir = os.fspath(images) if images is not None else os.path.join(p, split)
        return DetectionDataset.from_coco(img_dir, ann, on_error=on_error)
    if fmt == "yolo":
        return DetectionDataset.from_yolo(p, split=split, on_error=on_error)
    if fmt == "voc":
        return DetectionDataset.from_voc(p, split=split, on_error=on_error)
    raise PttError(
        f"{p} is not a detection root: expected COCO (annotations/instances_*.json), YOLO (images/ + labels/) or "
        "Pascal VOC (Annotations/ + JPEGImages/); pass format='coco'|'yolo'|'voc'."
    )


_TV_DETECTION = ("CocoDetection", "VOCDetection", "Kitti", "WIDERFace", "VisionDatasetTVTensorWrapper")


def is_detection_dataset(dataset: Any) -> bool:
    """True for a dataset whose targets are boxes: ours (``task == "detection"``), torchvision's detection datasets
    (``CocoDetection``, ``VOCDetection``, ...) and their ``wrap_dataset_for_transforms_v2`` wrapper. By class only:
    nothing is read."""
    if getattr(dataset, "task", None) == "detection":
        return True
    return any(c.__name__ in _TV_DETECTION for c in type(dataset).__mro__)


def refuse_detection(dataset: Any, who: str) -> None:
    """Raise the one PttError that names the fix when ``who`` (a classification path) is given a detection dataset."""
    if is_detection_dataset(dataset):
        raise PttError(
            f"{who} takes (image, class label) samples; {type(dataset).__name__} is a detection dataset (boxes per "
            "image). Open the annotations with ptt.open_detection(root) and load them with "
            "ptt.make_detection_loader(dataset, batch_size, recipe) (padded uint8 batches, boxes that follow the "
            "resize/crop/flip); pack them with `ptt pack COCO_OR_YOLO_OR_VOC_ROOT DST`."
        )


def refuse_detection_root(path: str | os.PathLike[str], who: str) -> None:
    """Raise when ``path`` is a COCO / YOLO / VOC root that ``who`` would misread as an ImageFolder tree."""
    fmt = detection_layout(path)
    if fmt is not None:
        raise PttError(
            f"{os.fspath(path)!r} is a {fmt.upper()} detection root ({_LAYOUT_SIGN[fmt]}), not an ImageFolder tree: "
            f"{who} would read its folders as classes. Use ptt.open_detection({os.fspath(path)!r}) and "
            "ptt.make_detection_loader."
        )


_LAYOUT_SIGN = {
    "coco": "annotations/*.json",
    "yolo": "images/ + labels/",
    "voc": "Annotations/ + JPEGImages/",
}


def _coco_images_beside(ann_file: str) -> str:
    """``root/annotations/instances_<split>.json`` -> ``root/<split>`` when it exists, else the JSON's folder."""
    folder = os.path.dirname(os.path.abspath(ann_file))
    name = os.path.basename(ann_file)
    if name.startswith("instances_") and os.path.basename(folder) == "annotations":
        split = os.path.join(os.path.dirname(folder), name[len("instances_") : -len(".json")])
        if os.path.isdir(split):
            return split
    return folder


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
    cats = detection.get("categories", {})
    per_image = np.array([len(t.get("boxes") or []) for t in targets], np.int64)
    labels = [str(v) for t in targets for v in t.get("labels") or []]
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
        "images": len(targets),
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
