"""What an accelerated Ultralytics dataset reads: photos through our DCT-scaled decode at the size its ``load_image``
asks for, a detection pack written for ``imgsz``, and ``cache='ram'`` as our node-shared arena.

No Ultralytics code here: ``dataset_class(base)`` subclasses the dataset class Ultralytics hands us at run time and
overrides five of its methods (``get_img_files``, ``get_labels``, ``cache_labels``, ``load_image``, ``cache_images``
with its RAM check); everything else - its labels, mosaic, mixup, affine, HSV, letterbox, collate - is its own.
The sizes follow its documented rule for ``load_image``: the long side to ``imgsz`` (``ceil`` of the scaled sides,
capped at ``imgsz``), or the short side (``resize_short``), or stretched to a fixed ``(h, w)`` (``rect_mode=False``);
its images are BGR, ours are made BGR once, at the output's size.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import threading
import warnings
from pathlib import Path
from typing import Any

import numpy as np

from pytorchtricks.core import PttError, cache_root
from pytorchtricks.data.decode import dct_scale, decode_scaled, image_size, is_jpeg
from pytorchtricks.data.geometry import Geometry
from pytorchtricks.data.jpeg_scans import first_passes

__all__ = [
    "MATCHES",
    "PackLabels",
    "dataset_class",
    "exif_rotated",
    "is_detection_pack",
    "read_resized",
    "yolo_hw",
]

_CLASSES: dict[Any, Any] = {}
_Base: Any = (
    object  # PttReads' base: a mixin whose ``super()`` is Ultralytics' class (typed Any for the checker)
)
_LOCK = threading.Lock()


def yolo_hw(
    h0: int,
    w0: int,
    imgsz: int | tuple[int, int] | list[int],
    rect_mode: bool = True,
    resize_short: bool = False,
) -> tuple[int, int]:
    """The ``(h, w)`` Ultralytics' ``load_image`` resizes an ``h0`` x ``w0`` image to.

    Example:
        >>> yolo_hw(3000, 4000, 640), yolo_hw(480, 640, 640), yolo_hw(3000, 4000, 640, resize_short=True)
        ((480, 640), (480, 640), (640, 854))
    """
    shape = (int(imgsz[0]), int(imgsz[1])) if isinstance(imgsz, tuple | list) else (int(imgsz), int(imgsz))
    size = max(shape)
    if not rect_mode:
        return shape
    if resize_short:
        r = size / min(h0, w0)
        if r == 1:
            return h0, w0
        return (size, math.ceil(w0 * r)) if h0 < w0 else (math.ceil(h0 * r), size)
    r = size / max(h0, w0)
    if r == 1:
        return h0, w0
    return min(math.ceil(h0 * r), size), min(math.ceil(w0 * r), size)


def exif_orientation(raw: bytes | memoryview) -> int:
    """A JPEG's EXIF orientation (1: as stored; 5-8: a quarter turn, height and width swap); 0 when unreadable."""
    head = bytes(raw[: 1 << 16])
    if b"Exif\x00\x00" not in head:
        return 1
    import io

    from PIL import Image

    try:
        return int(Image.open(io.BytesIO(bytes(raw))).getexif().get(0x0112, 1))
    except Exception:  # unreadable EXIF: the stock decode judges the file
        return 0


def exif_rotated(raw: bytes | memoryview) -> bool:
    """True when a JPEG's EXIF orientation is not 1: OpenCV's decode turns such a photo upright, ours does not."""
    return exif_orientation(raw) != 1


MATCHES = ("stock", "speed")


def read_resized(
    raw: bytes | memoryview, hw: tuple[int, int] | None = None, *, imgsz: Any = None, match: str = "stock"
) -> np.ndarray | None:
    """``raw`` (a JPEG) decoded at a DCT scale and resized to ``hw`` (or ``yolo_hw`` of ``imgsz``), as BGR uint8
    HxWx3; ``None`` when it is not ours to read (not a JPEG, or EXIF-rotated: the stock decode reads it).

    ``match="stock"``: one DCT scale finer than the largest the size allows, then a bilinear resize as theirs, so
    the 2-4x shrink left aliases as their full-size bilinear one does (>= 35 dB PSNR against it on >= 8 MP photos);
    ``"speed"``: the largest scale and the planar path (``data.geometry``: the planes resampled to ``hw``, RGB made
    there) - fewer pixels decoded, closer to an area-averaged downscale than to their aliased one. Either way a
    progressive JPEG decoded at scale 1/2 or smaller is read without its refinement scans (``data.jpeg_scans``:
    every coefficient at its first-pass precision; the entropy decoding of those scans was most of its time).
    """
    if match not in MATCHES:
        raise PttError(f"match={match!r}: use one of {', '.join(MATCHES)}.")
    if not is_jpeg(raw) or exif_rotated(raw):
        return None
    import cv2

    h0, w0 = image_size(raw)
    if hw is None:
        hw = yolo_hw(h0, w0, imgsz)
    denom = dct_scale((h0, w0), hw) if match == "speed" else max(1, dct_scale((h0, w0), hw) // 2)
    if denom >= 2:  # a progressive JPEG's refinement scans: not decoded (data.jpeg_scans)
        raw = first_passes(raw) or raw
    if match == "speed":
        out = Geometry((h0, w0), (0.0, 0.0, float(h0), float(w0)), hw).warp(raw)
    else:
        px = decode_scaled(raw, denom)[0]
        out = cv2.resize(px, (hw[1], hw[0]), interpolation=cv2.INTER_LINEAR)
    return cv2.cvtColor(out, cv2.COLOR_RGB2BGR, dst=out)


def decode_to(raw: bytes, hw: tuple[int, int], match: str = "stock") -> np.ndarray:
    """``read_resized``, or for what it leaves (not a JPEG, EXIF-rotated) OpenCV's own decode and bilinear resize,
    as the stock loader does: BGR uint8 ``hw`` x 3."""
    got = read_resized(raw, hw, match=match)
    if got is not None:
        return got
    import cv2

    im = cv2.imdecode(np.frombuffer(raw, np.uint8), cv2.IMREAD_COLOR)
    if im is None:
        raise PttError(f"cannot decode an image of {len(raw)} bytes: not a format OpenCV reads.")
    return cv2.resize(im, (hw[1], hw[0]), interpolation=cv2.INTER_LINEAR)


def is_detection_pack(path: Any) -> bool:
    """``path`` is a ``ptt pack`` folder of a detection root (its manifest says so)."""
    if not isinstance(path, str | os.PathLike):
        return False
    manifest = os.path.join(os.fspath(path), "manifest.json")
    if not os.path.isfile(manifest):
        return False
    with open(manifest, encoding="utf-8") as fh:
        return "detection" in json.load(fh)


class PackLabels:
    """A detection pack read as Ultralytics' label dicts: records ordered as the root listed its images (the
    records' ``image_id``), boxes normalised ``xywh`` of the stored image, classes as stored (YOLO's class index).
    Read from the pack's ``targets.npz``; a pack written before it is read from its records' metadata once and kept
    under ``core.cache_root("ultralytics")`` by the manifest's digest."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        from pytorchtricks.shards.dataset import ShardDataset

        self.path = os.path.abspath(os.fspath(path))
        with open(os.path.join(self.path, "manifest.json"), encoding="utf-8") as fh:
            self.manifest = json.load(fh)
        det = self.manifest["detection"]
        if det.get("format") != "yolo":
            raise PttError(
                f"{self.path} packs a {det.get('format')} root; Ultralytics reads YOLO class indices: pack the YOLO "
                "root (images/ + labels/) with `ptt pack ROOT OUT --split train --max-side IMGSZ`."
            )
        self.dataset = ShardDataset(self.path, decode=None)
        self._ids: np.ndarray | None = None
        self.max_side = self.manifest.get("options", {}).get("max_side")
        self.order, self.labels = self._load()

    def _load(self) -> tuple[np.ndarray, list[dict[str, Any]]]:
        entry = self.manifest["detection"].get("targets")
        if entry is not None:  # the pack's targets.npz: one file, every target
            from pytorchtricks.shards.targets import read_targets

            cols = read_targets(self.path, entry)
            if len(cols["image_id"]) != len(self.dataset):
                raise PttError(
                    f"{self.path}: targets.npz lists {len(cols['image_id'])} records of {len(self.dataset)}"
                )
            return self._labels(cols)
        key = hashlib.sha256(f"{self.path}:{self.manifest.get('digest')}".encode()).hexdigest()[:16]
        memo = os.path.join(cache_root("ultralytics"), f"pack-labels-{key}.json")
        if os.path.isfile(memo):
            with open(memo, encoding="utf-8") as fh:
                rows = json.load(fh)
        else:  # a pack written before targets.npz: the records' metadata (no image bytes read), once per pack
            rows = []
            for i, e in enumerate(self.dataset.read_extras()):
                t = e["target"]
                rows.append([i, int(t["image_id"]), t["size"], t.get("boxes") or [], t.get("labels") or []])
            os.makedirs(os.path.dirname(memo), exist_ok=True)
            tmp = f"{memo}.tmp{os.getpid()}"
            with open(tmp, "w", encoding="utf-8") as fh:
                fh.write(json.dumps(rows))  # dumps: the C encoder (json.dump streams through the Python one)
            os.replace(tmp, memo)
        counts = np.array([len(r[3]) for r in rows], np.int64)
        return self._labels(
            {
                "image_id": np.array([r[1] for r in rows], np.int64),
                "size": np.array([r[2] for r in rows], np.int64).reshape(-1, 2),
                "count": counts,
                "boxes": np.array([x for r in rows for x in r[3]], np.float64).reshape(-1, 4),
                "labels": np.array([x for r in rows for x in r[4]], np.int64),
            }
        )

    def _labels(self, cols: dict[str, np.ndarray]) -> tuple[np.ndarray, list[dict[str, Any]]]:
        """The records in the order the root listed its images (``image_id``) and Ultralytics' label dicts of
        ``cols`` (``shards.targets`` columns, record order), computed for all boxes at once (a per-image numpy
        call costs about a second per 100,000 images). Keeps the image ids and stored sizes, by record."""
        counts, b, hw = cols["count"], cols["boxes"], cols["size"].astype(np.float64)
        if int(counts.sum()) != len(b) or len(cols["labels"]) != len(b):
            raise PttError(f"{self.path}: the targets' boxes, labels and counts disagree: re-run `ptt pack`.")
        h, w = np.repeat(hw[:, 0], counts), np.repeat(hw[:, 1], counts)
        xywh = np.stack([(b[:, 0] + b[:, 2]) / 2 / w, (b[:, 1] + b[:, 3]) / 2 / h, (b[:, 2] - b[:, 0]) / w,
                         (b[:, 3] - b[:, 1]) / h], 1).astype(np.float32)  # fmt: skip
        cls = cols["labels"].astype(np.float32).reshape(-1, 1)
        starts = np.concatenate([[0], np.cumsum(counts)])
        order = np.argsort(cols["image_id"], kind="stable")
        ids, sizes = cols["image_id"].tolist(), cols["size"].tolist()
        labels: list[dict[str, Any]] = [
            {
                "im_file": self.file(ids[k]),
                "shape": (sizes[k][0], sizes[k][1]),
                "cls": cls[starts[k] : starts[k + 1]],
                "bboxes": xywh[starts[k] : starts[k + 1]],
                "segments": [],
                "keypoints": None,
                "normalized": True,
                "bbox_format": "xywh",
            }
            for k in order.tolist()
        ]
        self.image_ids, self.sizes = cols["image_id"], cols["size"]
        return order.astype(np.int64), labels

    def file(self, image_id: int) -> str:
        """The name a record goes by in Ultralytics' ``im_files`` (inside the pack folder: never opened)."""
        return f"{self.path}/{image_id:09d}.jpg"

    def record(self, name: str) -> int:
        """The record of the image Ultralytics' ``im_files`` names ``name`` (``file``'s name: its dataset may
        reorder its images, as ``rect`` does, so position ``i`` is not the pack's ``i``-th)."""
        try:
            image_id = int(os.path.basename(name).split(".", 1)[0])
        except ValueError:
            raise PttError(f"{name!r} is not a name of the pack {self.path}") from None
        if self._ids is None:
            self._ids = self.image_ids[self.order]  # ascending: the order the labels were listed in
        k = int(np.searchsorted(self._ids, image_id))
        if k >= len(self._ids) or self._ids[k] != image_id:
            raise PttError(f"image {image_id} is not in the pack {self.path}")
        return int(self.order[k])

    def read(self, name: str) -> bytes:
        """The image named ``name`` as stored: the JPEG written at pack time."""
        return bytes(self.dataset.read_raw(self.record(name))[0])

    def stored_hw(self, name: str) -> tuple[int, int]:
        """The stored size of the image named ``name``."""
        h, w = self.sizes[self.record(name)]
        return int(h), int(w)


class _Photos:
    """The images a dataset reads, decoded at its sizes (BGR): what ``cache_in_ram`` writes into the arena."""

    def __init__(self, files: list[str], hws: list[tuple[int, int]], pack: str | None, match: str) -> None:
        self.files, self.hws, self.pack, self.match = np.array(files), np.array(hws, np.int64), pack, match
        self._labels: PackLabels | None = None

    def __len__(self) -> int:
        return len(self.files)

    def raw(self, i: int) -> bytes:
        if self.pack is not None:
            if self._labels is None:
                self._labels = PackLabels(self.pack)
            return self._labels.read(str(self.files[i]))
        with open(str(self.files[i]), "rb") as fh:
            return fh.read()

    def __getitem__(self, i: int) -> tuple[np.ndarray, int]:
        hw = (int(self.hws[i][0]), int(self.hws[i][1]))
        return decode_to(self.raw(i), hw, self.match), 0

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_labels": None}


class _ArenaImages:
    """The arena seen as Ultralytics' ``ims``: ``ims[i]`` a private copy of image ``i`` (its transforms may write
    into what ``load_image`` returns; the arena is mapped read-only and shared by every process)."""

    def __init__(self, cached: Any) -> None:
        self.cached = cached

    def __len__(self) -> int:
        return len(self.cached)

    def __getitem__(self, i: int) -> np.ndarray:
        return np.array(self.cached.read_raw(int(i))[0])


def _digest(files: list[str], hws: list[tuple[int, int]], pack: str | None, match: str) -> str:
    """The arena's key: the files (path, size, mtime) or the pack's manifest digest, with every image's size."""
    h = hashlib.sha256(f"ultralytics-bgr-v1:{match}\n".encode())
    if pack is not None:
        with open(os.path.join(pack, "manifest.json"), "rb") as fh:
            h.update(fh.read())
    else:
        for f in files:
            st = os.stat(f)
            h.update(f"{os.path.abspath(f)}:{st.st_size}:{st.st_mtime_ns}\n".encode())
    h.update(np.asarray(hws, np.int64).tobytes())
    return h.hexdigest()


def dataset_class(base: Any, *, log: Any = None) -> Any:
    """``base`` (Ultralytics' ``YOLODataset``, or a subclass of it) with our reads: made once per class."""
    with _LOCK:
        made = _CLASSES.get(base)
        if made is None:
            made = _CLASSES[base] = _make(base, log)
    return made


class PttReads(_Base):  # type: ignore[misc]
    """What an accelerated dataset overrides, put in front of Ultralytics' dataset class by ``dataset_class``
    (``super()`` is then theirs): its reads through pytorchtricks (``ptt.ultralytics.accelerate``)."""

    ims: Any  # Ultralytics' own attributes, set by its __init__ (annotated here for the type checker only)
    im_hw0: Any
    im_hw: Any
    cache: Any
    _ptt_pack: PackLabels | None = None
    _ptt_match: str = (
        "stock"  # set on the class while a trainer builds with it (ultralytics._dataset_class_swapped)
    )
    _ptt_log: Any = None  # Ultralytics' LOGGER, where the dataset says what it reads
    _ptt_base: Any = None  # the class this one was made from (pickling)

    def _ptt_say(self, msg: str) -> None:
        if self._ptt_log is not None:
            self._ptt_log.info(msg)

    def get_img_files(self, img_path: Any) -> list[str]:
        self._ptt_match = type(self)._ptt_match  # the instance keeps what it was built with
        if is_detection_pack(img_path):
            self._ptt_pack = PackLabels(img_path)
            self._ptt_check_pack()
            files = [lb["im_file"] for lb in self._ptt_pack.labels]
            self._ptt_say(
                f"{self.prefix}ptt: reading the pack {self._ptt_pack.path} ({len(files)} images, labels in it)"
            )
            return files
        return list(super().get_img_files(img_path))

    def _ptt_check_pack(self) -> None:
        pack = self._ptt_pack
        assert pack is not None
        size = max(self.imgsz) if isinstance(self.imgsz, tuple | list) else int(self.imgsz)
        if pack.max_side is not None and int(pack.max_side) < size:
            raise PttError(
                f"the pack {pack.path} stores images with the long side at most {pack.max_side} px, but the "
                f"trainer's imgsz is {size}: repack with `ptt pack ROOT OUT --max-side {size}` (or train at "
                f"imgsz={pack.max_side})."
            )
        if self.fraction != 1.0:
            raise PttError(
                "fraction= is not read from a pack: pack the images you train on, or drop fraction."
            )

    def get_labels(self) -> list[dict[str, Any]]:
        if self._ptt_pack is not None:  # the dataset's own from here: not pickled twice to each worker
            labels, self._ptt_pack.labels = self._ptt_pack.labels, []
            return labels
        return list(super().get_labels())

    def _ptt_label_cache(self, path: Path) -> Path:
        key = hashlib.sha256(str(Path(path).resolve()).encode()).hexdigest()[:16]
        return Path(cache_root("ultralytics", "labels")) / f"{key}-{Path(path).name}"

    def _load_or_scan_cache(self, cache_path: Path, cache_hash: str) -> Any:
        ours = self._ptt_label_cache(
            cache_path
        )  # theirs beside the labels is read when it is there, never written
        use = ours if ours.exists() or not Path(cache_path).exists() else Path(cache_path)
        return super()._load_or_scan_cache(use, cache_hash)

    def cache_labels(self, path: Path = Path("./labels.cache")) -> dict[str, Any]:
        ours = (
            self._ptt_label_cache(path) if Path(path).parent != self._ptt_label_cache(path).parent else path
        )
        ours.parent.mkdir(parents=True, exist_ok=True)
        return dict(super().cache_labels(ours))

    def _ptt_raw(self, i: int) -> bytes:
        if self._ptt_pack is not None:
            return self._ptt_pack.read(self.im_files[i])
        with open(self.im_files[i], "rb") as fh:
            return fh.read()

    def load_image(self, i: int, rect_mode: bool = True, resize_short: bool = False) -> Any:
        if self.ims[i] is not None or self.channels != 3:
            return super().load_image(i, rect_mode, resize_short)
        raw = self._ptt_raw(i)
        if self._ptt_pack is None and (not is_jpeg(raw) or exif_rotated(raw)):
            return super().load_image(i, rect_mode, resize_short)  # the stock decode: upright, any format
        h0, w0 = image_size(raw)
        im = decode_to(raw, yolo_hw(h0, w0, self.imgsz, rect_mode, resize_short), self._ptt_match)
        if self.augment and self.cache != "ram":  # the mosaic's buffer of recent images, as theirs keeps it
            self.ims[i], self.im_hw0[i], self.im_hw[i] = im, (h0, w0), im.shape[:2]
            self.buffer.append(i)
            if 1 < len(self.buffer) >= self.max_buffer_length:
                j = self.buffer.pop(0)
                self.ims[j], self.im_hw0[j], self.im_hw[j] = None, None, None
        return im, (h0, w0), im.shape[:2]

    def check_cache_ram(self, safety_margin: float = 1.0) -> bool:
        return True  # cache_in_ram's own admission check (RAM and /dev/shm) decides, in cache_images

    def cache_images(self) -> None:
        if self.cache != "ram" or self.channels != 3:
            super().cache_images()
            return
        from pytorchtricks.tricks.data.cache_in_ram import cache_in_ram

        sizes0 = [self._ptt_hw0(i) for i in range(self.ni)]
        hws = [yolo_hw(h, w, self.imgsz) for h, w in sizes0]
        pack = self._ptt_pack.path if self._ptt_pack is not None else None
        photos = _Photos(list(self.im_files), hws, pack, self._ptt_match)
        with warnings.catch_warnings(record=True) as said:
            warnings.simplefilter("always")
            cached = cache_in_ram(photos, None, key=_digest(list(self.im_files), hws, pack, self._ptt_match))
        for w in said:
            self._ptt_say(f"{self.prefix}ptt: {w.message}")
        if cached is photos:  # refused: its warning said why; the stock loader reads the files
            self.cache = None
            return
        self.ims = _ArenaImages(cached)
        self.im_hw0, self.im_hw = sizes0, [tuple(x) for x in hws]
        self._ptt_say(
            f"{self.prefix}ptt: cache='ram' is the node-shared arena {cached.path} ({cached.nbytes / 2**30:.2f} GB)"
        )

    def _ptt_hw0(self, i: int) -> tuple[int, int]:
        """Image ``i``'s size as the stock decode sees it (upright: EXIF quarter turns swap the header's)."""
        if self._ptt_pack is not None:  # (its labels' "shape" is gone once rect has sorted by it)
            return self._ptt_pack.stored_hw(self.im_files[i])
        with open(self.im_files[i], "rb") as fh:
            head = fh.read(1 << 16)
        try:
            h, w = image_size(head)
        except Exception:
            with open(self.im_files[i], "rb") as fh:
                head = fh.read()
            h, w = image_size(head)
        return (w, h) if is_jpeg(head) and exif_orientation(head) in (5, 6, 7, 8) else (h, w)

    def __reduce_ex__(self, protocol: Any) -> Any:  # a class made at run time pickles by its base's name
        base = self._ptt_base
        return (_restore, (base.__module__, base.__qualname__), self.__dict__)


def _make(base: Any, log: Any) -> Any:
    """``PttReads`` in front of ``base``: Ultralytics' methods under ours, named ``Ptt<base>``."""
    return type(f"Ptt{base.__name__}", (PttReads, base), {"_ptt_log": log, "_ptt_base": base})


def _restore(module: str, qualname: str) -> Any:
    """An empty instance of ``dataset_class`` of the class ``module.qualname`` (unpickling in a worker)."""
    import importlib

    obj: Any = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    cls = dataset_class(obj)
    return cls.__new__(cls)
