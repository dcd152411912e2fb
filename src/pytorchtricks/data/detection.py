"""Detection datasets: COCO instances JSON, YOLO txt labels and Pascal VOC XML read into one sample type.

A sample is ``(jpeg_bytes, target)``: ``target["boxes"]`` float32 [K, 4] XYXY in pixels, ``labels`` int64 [K],
``image_id`` (int), ``iscrowd`` int64 [K], ``area`` float32 [K], and ``segmentation`` (the COCO polygons or RLE, one
per box) when the annotations have them. Images without boxes are kept. Labels are COCO's category ids as they are
(torchvision's ``CocoDetection`` convention); YOLO's class indices; for VOC the index of the class name in
``classes`` (given, or the sorted names found). ``dataset.categories`` maps label -> name in every format.

Conventions: COCO ``[x, y, w, h]`` -> ``[x, y, x + w, y + h]``; YOLO normalised ``cx cy w h`` times the image size;
VOC's 1-based inclusive ``xmin ymin xmax ymax`` -> ``[xmin - 1, ymin - 1, xmax, ymax]`` (Detectron2's reading).
A box that leaves the image by at most one pixel (rounding in the annotation tool) is clipped; further out, or with
a non-positive width or height, an unknown category, a missing image file, annotation JSON/XML that does not
parse, or a field of the wrong type (every field is type-checked: a string, a bool, a list of the wrong length, a
nested list, NaN or inf where a number belongs - ``data.annotations`` lists the fields per format) is an
``AnnotationError`` naming the file, the annotation id and the field - or, with ``on_error="skip"``, an entry of
``dataset.rejects`` (only that annotation is dropped; a missing image, or an image entry with a bad field, drops
that image), nothing else lost. Two COCO images sharing one ``id`` are refused naming both files; under skip both
are left out, with their annotations (which of them a box belongs to cannot be told), each listed.
A file that does not parse cannot be skipped.

EXIF orientation: pixels and boxes are in the stored frame, as torchvision does (``CocoDetection`` opens images
with ``PIL.Image.open``, which does not rotate; ``torchvision.io.decode_jpeg`` defaults to
``apply_exif_orientation=False``) and as the COCO annotations' ``width``/``height`` describe them. When a file's
stored size disagrees with its annotation, reading it raises ``AnnotationError`` - and says so when the annotation
matches the EXIF-rotated size (the annotations were then made on the rotated image: rotate the files with
``PIL.ImageOps.exif_transpose`` before use).
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

from pytorchtricks.core import Option, PttError, Spelt, config_first, options_of
from pytorchtricks.data.annotations import AnnotationError, header_bytes, read_coco, read_voc, read_yolo
from pytorchtricks.data.decode import image_size

__all__ = ["AnnotationError", "DetectionDataset", "DetectionTables", "detection_layout", "open_detection"]


@dataclasses.dataclass(frozen=True, eq=False)  # eq=False: arrays compare elementwise, tables by identity
class DetectionTables:
    """What a ``DetectionDataset`` holds, as one value: the flat annotation tables a reader builds
    (``data.annotations.read_coco`` / ``read_yolo`` / ``read_voc`` return these fields). Not options - the data -
    so every field is required: ``ptt.DetectionDataset(tables)``, or the same fields as keywords.

    ``files``: image paths relative to ``root``; ``sizes`` int64 [N, 2] (height, width; 0 when unknown, YOLO);
    ``boxes`` float32 [K, 4] XYXY (pixels; YOLO's normalised until the size is read); ``labels``, ``iscrowd``
    int64 [K]; ``area`` float32 [K]; image i's boxes are rows ``offsets[i]:offsets[i + 1]``; ``segmentation``:
    image index -> its boxes' polygons as JSON; ``rejects``: what ``on_error="skip"`` left out.

    Example:
        >>> t = ptt.DetectionTables(root="/data", files=["a.jpg"], image_ids=np.array([7]),
        ...     sizes=np.array([[48, 64]]), boxes=np.array([[4, 5, 14, 25]], np.float32), labels=np.array([3]),
        ...     iscrowd=np.array([0]), area=np.array([200], np.float32), offsets=np.array([0, 1]),
        ...     categories={3: "cat"}, segmentation={}, rejects=[], format="coco")
        >>> ds = ptt.DetectionDataset(t); len(ds), ds.target(0)["boxes"].tolist(), ds.file(0)
        (1, [[4.0, 5.0, 14.0, 25.0]], 'a.jpg')
    """

    root: str
    files: list[str]
    image_ids: np.ndarray
    sizes: np.ndarray
    boxes: np.ndarray
    labels: np.ndarray
    iscrowd: np.ndarray
    area: np.ndarray
    offsets: np.ndarray
    categories: dict[int, str]
    segmentation: dict[int, str]
    rejects: list[dict[str, Any]]
    format: str


class DetectionDataset(torch.utils.data.Dataset):  # type: ignore[type-arg]
    """Images and their boxes: ``ds[i]`` is ``(encoded bytes, target)`` (see the module docstring).

    Build with ``open_detection(root)`` or ``DetectionDataset.from_coco / from_yolo / from_voc``. Annotations live
    in flat numpy arrays (no per-image Python objects: DataLoader workers do not grow by copy-on-write): a
    ``DetectionTables``, given as one value or as its fields as keywords (not both).
    ``rejects``: what ``on_error="skip"`` left out, each ``{"file", "annotation", "image", "reason", "field"}``.

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
    split: str | None = (
        None  # the split of the root it was opened from (``open_detection``; None: it has one)
    )

    @options_of(DetectionTables)
    def __init__(self, tables: DetectionTables | None = None, **options: Any) -> None:
        t = config_first(tables, DetectionTables, options)  # the tables, or all of them as keywords
        self.root, self.format = t.root, t.format
        self.categories, self.rejects = dict(t.categories), t.rejects
        # file names as one bytes blob + offsets: a list of 10M str would be 10M refcounted objects
        enc = [f.encode() for f in t.files]
        self._names = np.frombuffer(b"".join(enc), np.uint8) if enc else np.zeros(0, np.uint8)
        self._name_off = np.zeros(len(enc) + 1, np.int64)
        np.cumsum([len(e) for e in enc], out=self._name_off[1:])
        self.image_ids, self.sizes, self.boxes, self.labels = t.image_ids, t.sizes, t.boxes, t.labels
        self.iscrowd, self.area = t.iscrowd, t.area
        self.offsets, self.segmentation = t.offsets, t.segmentation
        # YOLO's boxes stay normalised in the tables; image_hw fills ``sizes`` in as it learns them, so which images
        # are normalised is fixed here, once (reading it from ``sizes`` later left boxes normalised after image_hw)
        self._normalised = np.asarray(self.sizes).reshape(-1, 2)[:, 0] <= 0

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
        got = image_size(raw if raw is not None else header_bytes(self.path(i)))
        self.sizes[i] = got  # per process: a worker learns each size once
        return got

    def target(self, i: int, hw: tuple[int, int] | None = None) -> dict[str, Any]:
        """Image ``i``'s target (boxes in pixels; YOLO's normalised boxes scaled by ``hw`` or the header's size)."""
        lo, hi = int(self.offsets[i]), int(self.offsets[i + 1])
        boxes = self.boxes[lo:hi].copy()
        if self._normalised[i]:  # YOLO: normalised until the image size is known
            h, w = hw or self.image_hw(i)
            boxes *= np.array([w, h, w, h], np.float32)
        t: dict[str, Any] = {
            "boxes": torch.from_numpy(boxes),
            "labels": torch.from_numpy(self.labels[lo:hi].copy()),
            "image_id": int(self.image_ids[i]),
            "iscrowd": torch.from_numpy(self.iscrowd[lo:hi].copy()),
            "area": torch.from_numpy(self.area[lo:hi].copy()),
        }
        if self._normalised[i]:
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

    def content_digest(self) -> str:
        """SHA-256 of what the annotations say: the root, the format, every file name, image id, box, label and
        polygon, the categories - the same in every process (image sizes are left out: a YOLO dataset learns them
        from the files as it reads, so they differ between processes; the files' own checks catch a changed one).
        Not the pixels: pair it with the files' sizes and mtimes to key a cache of them."""
        import hashlib

        h = hashlib.sha256(f"detection:{os.path.abspath(self.root)}:{self.format}\n".encode())
        for arr in (self._names, self._name_off, self.image_ids, self.boxes, self.labels, self.iscrowd,
                    self.area, self.offsets):  # fmt: skip
            a = np.ascontiguousarray(arr)
            h.update(f"{a.dtype.str}{a.shape}:".encode())
            h.update(a.data)
        h.update(json.dumps(sorted(self.segmentation.items())).encode())
        h.update(json.dumps(sorted((int(k), v) for k, v in self.categories.items())).encode())
        return h.hexdigest()

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
        return cls(DetectionTables(**read_coco(images, annotations, on_error=on_error)))

    @classmethod
    def from_yolo(
        cls, root: str | os.PathLike[str], *, split: str | None = None, on_error: str = "raise"
    ) -> DetectionDataset:
        """``root/images[/split]/x.jpg`` with ``root/labels[/split]/x.txt`` lines ``class cx cy w h`` (normalised);
        class names from ``root/classes.txt`` or ``names:`` in ``root/data.yaml``. An image without a label file
        has no boxes."""
        return cls(DetectionTables(**read_yolo(root, split=split, on_error=on_error)))

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
        return cls(DetectionTables(**read_voc(root, split=split, classes=classes, on_error=on_error)))


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
    file with ``images=``), YOLO (``images[/<split>]/`` + ``labels[/<split>]/``) or Pascal VOC (``Annotations/`` +
    ``JPEGImages/``, ``ImageSets/Main/<split>.txt``).

    ``split``: which split of a root with several (``data.detection_splits``). Left out, a root with one split
    reads it, and a root with a train and other splits (``train2017`` + ``val2017``, the standard COCO layout) reads
    the train split and says so with a ``PttWarning`` naming the others.

    Raises:
        PttError: not a detection root, a split the root does not have, or several splits and none a train split.
            AnnotationError: a bad annotation (see the module docstring) unless ``on_error="skip"``.
    """
    from pytorchtricks.data.detection_splits import choose_split

    p = os.fspath(path)
    fmt = detection_layout(p) if format == "auto" else format
    if fmt == "coco":
        if os.path.isfile(p):
            if split is not None:
                raise PttError(
                    Spelt(
                        "{p} is one COCO annotation file, one split: leave out {o}.", p=p, o=Option("split")
                    )
                )
            img_dir = os.fspath(images) if images is not None else _coco_images_beside(p)
            return DetectionDataset.from_coco(img_dir, p, on_error=on_error)
        split = choose_split(p, "coco", split)
        if split is None:
            found = sorted(f for f in os.listdir(os.path.join(p, "annotations")) if f.endswith(".json"))
            raise PttError(
                f"{p}/annotations holds no COCO instances_<split>.json (found: {', '.join(found) or 'none'}): "
                "give the annotation file itself as the path."
            )
        ann = os.path.join(p, "annotations", f"instances_{split}.json")
        img_dir = os.fspath(images) if images is not None else os.path.join(p, split)
        ds = DetectionDataset.from_coco(img_dir, ann, on_error=on_error)
    elif fmt == "yolo":
        split = choose_split(p, "yolo", split)
        ds = DetectionDataset.from_yolo(p, split=split, on_error=on_error)
    elif fmt == "voc":
        split = choose_split(p, "voc", split)
        ds = DetectionDataset.from_voc(p, split=split, on_error=on_error)
    else:
        raise PttError(
            f"{p} is not a detection root: expected COCO (annotations/instances_*.json), YOLO (images/ + labels/) "
            "or Pascal VOC (Annotations/ + JPEGImages/); pass format='coco'|'yolo'|'voc'."
        )
    ds.split = split
    return ds


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
