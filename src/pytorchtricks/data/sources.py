"""What ``pack`` reads: an ImageFolder tree or a CSV/JSONL list, and the per-file work done once at pack time.

The per-file work (``process_item``) runs in worker processes: read, sniff, verify by decoding (strict: truncated
JPEGs fail), optionally resize with area interpolation and re-encode, or store the decoded uint8 array (``raw``).
A file that fails becomes a reject with a reason, never an exception that stops the pack.
"""

from __future__ import annotations

import csv
import io
import json
import operator
import os
import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from pytorchtricks.core import PttError

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".webp", ".bmp")


@dataclass(frozen=True)
class Source:
    """The listed input: ``paths[i]`` (absolute), ``rel[i]`` (as recorded), ``labels[i]``, ``extras[i]``, and the
    files and folders of the tree that are not packed, each ``{"path", "reason"}`` (they join the rejects)."""

    paths: list[str]
    rel: list[str]
    labels: list[int]
    extras: list[dict[str, Any]]
    classes: list[str]
    skipped: list[dict[str, str]] = field(
        default_factory=list
    )  # not packed, with why (hidden, outside a class)
    detection: dict[str, Any] | None = None  # a detection root: {"format", "categories"}; targets in extras


def list_source(src: str | os.PathLike[str], split: str | None = None) -> Source:
    """List an ImageFolder tree (``src/<class>/**/<image>``), a ``.csv``/``.jsonl`` list of path,label[,extras], or
    a detection root. ``split``: the split of a detection root that has several, as ``open_detection`` reads them
    (default: its train split).

    Raises:
        PttError: missing source, empty listing, or a list without ``path``/``label`` columns.
    """
    src = os.fspath(src)
    from pytorchtricks.data.detection import detection_layout

    if detection_layout(src) is not None:  # COCO / YOLO / VOC: never an ImageFolder of train2017/ val2017/
        return _list_detection(src, split)
    if split is not None:
        raise PttError(f"{src} is not a detection root: split picks the split of a COCO / YOLO / VOC root.")
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


@dataclass(frozen=True)
class ClassTree:
    """An ImageFolder tree as listed once: ``classes``, ``rel[i]`` (relative to the root) with ``labels[i]``, and
    what is not listed, each ``{"path", "reason"}``."""

    classes: list[str]
    rel: list[str]
    labels: list[int]
    skipped: list[dict[str, str]]


def walk_class_tree(root: str) -> ClassTree:
    """The one reader of ``root/<class>/**/<file>`` (``pack``'s source, ``JpegFolder``, calibration folders).

    Order is torchvision ImageFolder's (classes sorted; within a class, folders by path, files by name), so sample
    ``i`` is the same file as ``ImageFolder(root)[i]`` on a tree without hidden names. Hidden names (``.x``: macOS
    ``._`` files, ``.ipynb_checkpoints``) and folder symlinks (they could loop) are skipped with why, as are
    unreadable folders; files of any kind are listed (a non-image is the caller's to reject or filter).

    Example:
        >>> import tempfile, os
        >>> d = tempfile.mkdtemp()
        >>> for f in ("b/2.jpg", "a/x/1.jpg", "a/0.jpg", "a/.hidden.jpg"):
        ...     os.makedirs(os.path.dirname(os.path.join(d, f)), exist_ok=True)
        ...     _ = open(os.path.join(d, f), "wb").write(b"x")
        >>> t = walk_class_tree(d); (t.classes, t.rel, t.labels, [r["path"] for r in t.skipped])
        (['a', 'b'], ['a/0.jpg', 'a/x/1.jpg', 'b/2.jpg'], [0, 0, 1], ['a/.hidden.jpg'])
    """
    skipped: list[dict[str, str]] = []
    try:
        top = sorted(os.scandir(root), key=lambda e: e.name)
    except OSError as exc:
        raise PttError(
            f"cannot list {root!r}: {exc.strerror or exc}; fix its permissions and re-run."
        ) from exc
    from pytorchtricks.data.photoset import MARKER  # the photo-set builder's own summary: not a user file

    classes = []
    for e in top:
        if e.name == MARKER and e.is_file():
            continue
        if e.name.startswith("."):
            skipped.append(_skip(e.name + ("/" if e.is_dir() else ""), _HIDDEN))
        elif e.is_dir():
            classes.append(e.name)
        else:
            skipped.append(_skip(e.name, "not in a class folder (ImageFolder layout: SRC/<class>/<image>)"))
    rel: list[str] = []
    labels: list[int] = []
    for label, cls in enumerate(classes):
        # (folder relative to root, its file names): sorted by that path below, as ImageFolder's sorted(os.walk)
        folders: list[tuple[str, list[str]]] = []
        _scan_folder(root, cls, folders, skipped)
        for where, files in sorted(folders):
            # concatenation in C (map over the prefix's own __add__): os.path.relpath would cost microseconds
            rel.extend(map((where + os.sep).__add__, files))
            labels.extend([label] * len(files))
    skipped.sort(key=lambda r: r["path"])
    return ClassTree(classes, rel, labels, skipped)


_NAME = operator.attrgetter("name")


def _scan_folder(
    root: str, where: str, folders: list[tuple[str, list[str]]], skipped: list[dict[str, str]]
) -> None:
    """One ``os.scandir`` per folder and no stat per file (the entry's type comes with the listing): the cost of
    listing, as torchvision's ``os.walk``. Hidden names and folder symlinks are skipped with why."""
    try:
        with os.scandir(os.path.join(root, where)) as it:
            entries = list(it)
    except OSError as exc:
        skipped.append(
            _skip(where + "/", f"unreadable folder ({exc.strerror or exc}): fix its permissions and re-run")
        )
        return
    names = list(map(_NAME, entries))
    try:
        dirs = any(map(os.DirEntry.is_dir, entries))
    except OSError:  # an unreadable entry: the loop below lists it with why
        dirs = True
    if not dirs and "\0." not in "\0" + "\0".join(names):
        # the common case, a folder of files with no hidden name: sorted names, no per-entry Python (a class
        # folder of 10,000 files costs its listing, as torchvision's os.walk does, and no more)
        names.sort()
        folders.append((where, names))
        return
    entries.sort(key=_NAME)
    files, subdirs = [], []
    for e in entries:
        name = e.name
        try:
            is_dir = e.is_dir()
        except OSError:  # a dangling or unreadable entry: listed as a file (the reader rejects it with why)
            is_dir = False
        if name.startswith("."):
            skipped.append(_skip(where + os.sep + name + ("/" if is_dir else ""), _HIDDEN))
        elif not is_dir:
            files.append(name)
        elif e.is_symlink():
            skipped.append(_skip(where + os.sep + name, "symlink to a folder: not followed (it could loop)"))
        else:
            subdirs.append(name)
    folders.append((where, files))
    for d in subdirs:
        _scan_folder(root, where + os.sep + d, folders, skipped)


def _list_detection(src: str, split: str | None = None) -> Source:
    """A detection root (``data.detection.open_detection``): one record per image, label 0, and its target as JSON
    in the extras (``{"target": {"boxes", "labels", "image_id", "iscrowd", "area", "size": [h, w], ...}}``).
    Bad annotations join the rejects (``pack(strict=True)`` fails on the first one)."""
    from pytorchtricks.data.detection import open_detection
    from pytorchtricks.data.detection_pack import target_json

    ds = open_detection(src, split=split, on_error="skip")
    if len(ds) == 0:
        raise PttError(f"{src!r} lists no images.")
    paths = [ds.path(i) for i in range(len(ds))]
    rel = [
        os.path.relpath(p, os.path.dirname(os.path.abspath(src)) if os.path.isfile(src) else src)
        for p in paths
    ]
    extras = [{"target": target_json(ds, i)} for i in range(len(ds))]
    skipped = [
        {
            "path": str(r["image"] or r["file"]),
            "reason": f"{r['file']}: "
            + (f"annotation {r['annotation']}: " if r["annotation"] is not None else "")
            + r["reason"],
        }
        for r in ds.rejects
    ]
    cats = {str(k): v for k, v in sorted(ds.categories.items())}
    return Source(
        paths, rel, [0] * len(paths), extras, [], skipped, {"format": ds.format, "categories": cats}
    )


def _list_folder(root: str) -> Source:
    """Every file under ``root/<class>/`` (non-images and special files too: they end up in the rejects)."""
    tree = walk_class_tree(root)
    if not tree.rel:
        raise PttError(f"no files under {root!r}; expected {root}/<class>/<image>.jpg (ImageFolder layout).")
    paths = [os.path.join(root, r) for r in tree.rel]
    return Source(paths, tree.rel, tree.labels, [{} for _ in paths], tree.classes, tree.skipped)


_HIDDEN = "hidden (name starts with '.'): not packed"


def _skip(path: str, reason: str) -> dict[str, str]:
    return {"path": path, "reason": reason}


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


MAX_PIXELS = (
    178_956_970  # Pillow's decompression-bomb error limit (2 * Image.MAX_IMAGE_PIXELS): ~537 MB as RGB
)
MAX_FILE_BYTES = 1 << 30  # a larger "image" is read into memory whole: refuse it instead
_PASS_MODES = ("RGB", "L", "P", "RGBA", "LA", "PA", "1")  # every reader's decode -> RGB agrees with Pillow's


class _Reject(Exception):
    """A file that is not packed; the message is the reason listed in ``rejects``."""


def sniff_kind(data: bytes) -> str | None:
    if data[:3] == b"\xff\xd8\xff":
        return "jpeg"
    if data[:8] == b"\x89PNG\r\n\x1a\n":
        return "png"
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "webp"
    if data[:2] == b"BM":
        return "bmp"
    if data[:6] in (b"GIF87a", b"GIF89a"):
        return "gif"
    if data[:4] in (b"II*\x00", b"MM\x00*"):
        return "tiff"
    return None


def _read_regular(path: str) -> bytes:
    """The file's bytes, refusing FIFOs, devices and sockets (also behind symlinks) without blocking on them."""
    import stat

    try:
        st = os.stat(path)  # follows symlinks: a link to /dev/zero is a character device here
        if not stat.S_ISREG(st.st_mode):
            raise _Reject(f"not a regular file ({_file_type(st.st_mode)}): not opened")
        # O_NONBLOCK: if the path was swapped for a FIFO after the stat, open() still returns at once
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise _Reject(f"unreadable: {exc.strerror or exc}") from exc
    with os.fdopen(fd, "rb") as fh:
        st = os.fstat(fh.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise _Reject(f"not a regular file ({_file_type(st.st_mode)}): not opened")
        if st.st_size > MAX_FILE_BYTES:
            raise _Reject(f"file too large ({st.st_size} bytes, over {MAX_FILE_BYTES}): not an image to pack")
        try:
            return fh.read(MAX_FILE_BYTES + 1)
        except OSError as exc:
            raise _Reject(f"unreadable: {exc.strerror or exc}") from exc


def _file_type(mode: int) -> str:
    import stat

    for test, name in (
        (stat.S_ISFIFO, "FIFO"),
        (stat.S_ISCHR, "character device"),
        (stat.S_ISBLK, "block device"),
        (stat.S_ISSOCK, "socket"),
        (stat.S_ISDIR, "folder"),
    ):
        if test(mode):
            return name
    return "special file"


def _check_pixels(data: bytes, kind: str, budget: int) -> None:
    """Refuse an image whose header declares more than ``budget`` pixels, before anything is decoded."""
    import warnings

    from PIL import Image

    from pytorchtricks.data.decode import image_size

    try:
        if kind in ("jpeg", "png"):
            h, w = image_size(data)  # our own header parser: no Pillow limits involved
        else:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", Image.DecompressionBombWarning)
                w, h = Image.open(io.BytesIO(data)).size  # reads the header only
    except Image.DecompressionBombError as exc:
        raise _Reject(f"decompression bomb: {exc}") from exc
    except Exception as exc:
        raise _Reject(f"not decodable: {exc}") from exc
    if w * h > budget:
        raise _Reject(
            f"decompression bomb: the header declares {w}x{h} = {w * h / 1e6:.0f} MP, over the budget of "
            f"{budget / 1e6:.0f} MP ({budget} pixels; raise it with pack(max_pixels=...) if the image is real)"
        )


def _mode(data: bytes) -> str:
    import warnings

    from PIL import Image

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", Image.DecompressionBombWarning)  # the budget was checked already
        with Image.open(io.BytesIO(data)) as img:
            return str(img.mode)


def _to_rgb8(data: bytes) -> np.ndarray:
    """Decode the first frame to HxWx3 uint8 RGB: 16-bit grey scaled to 8 bits, palette/alpha/CMYK via Pillow."""
    import warnings

    from PIL import Image

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", Image.DecompressionBombWarning)  # the budget was checked already
        img: Any = Image.open(io.BytesIO(data))
        img.load()  # first frame of a GIF / multi-page TIFF
    mode = img.mode
    if mode.startswith("I;16") or (
        mode == "I" and img.format == "PNG"
    ):  # 16-bit grey (PNG "I" holds 0..65535)
        a = np.asarray(img).astype(np.int64)
        if a.min() < 0 or a.max() > 65535:
            raise _Reject(f"{mode} pixels outside 0..65535: convert the image to 8-bit first")
        g = ((a * 255 + 32767) // 65535).astype(np.uint8)  # 0 -> 0, 65535 -> 255, rounded
        return np.ascontiguousarray(np.repeat(g[..., None], 3, axis=2))
    if mode in ("I", "F") or mode.startswith(("I;", "F;")):
        raise _Reject(
            f"{img.format} with {mode} pixels (32-bit): no agreed 8-bit scale; convert it to 8-bit first"
        )
    try:
        return np.ascontiguousarray(np.asarray(img.convert("RGB")))
    except ValueError as exc:
        raise _Reject(f"{img.format} with {mode} pixels: cannot convert to RGB ({exc})") from exc


def target_hw(h: int, w: int, resize: int | None, max_side: int | None) -> tuple[int, int] | None:
    """The ``(height, width)`` an ``h`` x ``w`` image is stored at when packed with ``resize`` (short side) and
    ``max_side`` (long side), or None when it is stored as it is (a pack never enlarges).

    Example:
        >>> target_hw(480, 640, 256, None), target_hw(480, 640, None, 320), target_hw(100, 80, 256, None)
        ((256, 341), (240, 320), None)
    """
    from pytorchtricks.data.decode import short_side_hw

    hw = short_side_hw(h, w, resize, max_size=max_side, enlarge=False, rounding="round", scale_first=True)
    return None if hw == (h, w) else hw


def _strict_backend() -> str:
    from pytorchtricks.data.decode import backend_works

    return "simplejpeg" if backend_works("simplejpeg") else "pil"  # both fail on truncated JPEGs


def process_item(job: tuple[int, str, dict[str, Any]]) -> tuple[int, str, Any, Any, int]:
    """``(i, kind, payload, shape_or_reason, bytes_in)``; kind ``"reject"`` carries the reason in slot 4.

    Special files are refused before they are opened, and an image whose header declares more than
    ``opts["max_pixels"]`` (default ``MAX_PIXELS``) before it is decoded. JPEG/PNG/WebP/BMP in RGB, grey,
    palette or alpha modes are stored as they are; other modes (16-bit grey, CMYK, ...) and GIF/TIFF (first
    frame) are converted to 8-bit RGB and stored as PNG (lossless), or re-encoded/raw as asked.
    """
    i, path, opts = job
    nbytes = 0
    try:
        data = _read_regular(path)
        nbytes = len(data)
        kind = sniff_kind(data)
        if kind is None:
            raise _Reject("not an image (unknown signature)")
        _check_pixels(data, kind, int(opts.get("max_pixels") or MAX_PIXELS))
        return (i, *_encode(data, kind, opts), nbytes)
    except _Reject as exc:
        return i, "reject", None, _no_address(str(exc)), nbytes
    except Exception as exc:  # any decoder failure is a reject with its reason, never a crash mid-pack
        return i, "reject", None, _no_address(f"not decodable: {exc}"), nbytes


def _no_address(reason: str) -> str:
    """The reason without memory addresses (Pillow names its BytesIO "at 0x7f..."): same file, same pack bytes."""
    return re.sub(r" at 0x[0-9a-fA-F]+", "", reason)


def _encode(data: bytes, kind: str, opts: dict[str, Any]) -> tuple[str, Any, Any]:
    from PIL import Image

    from pytorchtricks.data.decode import decode_image, resize_array

    keep = kind in ("jpeg", "png", "webp", "bmp") and _mode(data) in _PASS_MODES
    # full decode: also the integrity check (the strict JPEG backend fails on truncated files)
    arr = decode_image(data, backend=_strict_backend()) if keep and kind == "jpeg" else _to_rgb8(data)
    h, w = arr.shape[:2]
    target = target_hw(h, w, opts.get("resize"), opts.get("max_side"))
    if target is not None:
        arr = resize_array(arr, target, area=True)
    if opts.get("raw"):
        if opts.get("format") == "tar":
            buf = io.BytesIO()
            np.save(buf, arr, allow_pickle=False)
            return "raw", buf.getvalue(), list(arr.shape)
        return "raw", arr.tobytes(), list(arr.shape)
    if target is not None or opts.get("quality") is not None:
        out = io.BytesIO()
        Image.fromarray(arr).save(out, "JPEG", quality=int(opts.get("quality") or 90))
        return "jpeg", out.getvalue(), None
    if keep:
        return kind, data, None
    out = io.BytesIO()
    Image.fromarray(arr).save(out, "PNG")  # lossless: the converted pixels exactly
    return "png", out.getvalue(), None
