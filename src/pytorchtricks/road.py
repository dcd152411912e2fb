"""``open_data``: the one place a path, a URL, a pack or a dataset root becomes a dataset object.

``make_loader``, ``make_detection_loader``, tune, the data doctor and the CLI hand their ``--data`` string here and
pass the object on; none of them re-reads folders with rules of its own. The readers are the shards' and the data
wing's own (``ShardDataset``, ``ShardStream``, ``JpegFolder``, ``open_detection``), imported when used, so
``import pytorchtricks`` stays cheap.

The data road's entrance, on its own floor above both wings it chooses between: ``data/`` (what a sample is: its
sources, decode, geometry, the folder and detection datasets) and ``shards/`` above it (the packs made from those
samples and read back through ``data``'s decoder). Neither of them may import this module. (A module named
``open_data`` would shadow the lazy ``ptt.open_data`` once imported, hence the road's own name.)
"""

from __future__ import annotations

import dataclasses
import os
from typing import TYPE_CHECKING, Any

from pytorchtricks.core import Option, PttError, Spelt

if TYPE_CHECKING:
    from pytorchtricks.data.detection import DetectionDataset
    from pytorchtricks.data.folder import JpegFolder
    from pytorchtricks.shards.dataset import Decode, ShardDataset
    from pytorchtricks.shards.stream import ShardStream, StreamConfig

__all__ = ["open_data"]

TASKS = ("classification", "detection", "auto")
_KINDS = (
    "an ImageFolder tree (root/<class>/<image>.jpg), an ImageNet-style root (root/train + root/val), a folder made "
    "by `ptt pack`, or a pack's URL (s3://..., gs://..., https://...)"
)


def open_data(
    path: str | os.PathLike[str],
    *,
    task: str = "classification",
    decode: Decode = "auto",
    split: str | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
    cache_limit: int | str | None = None,
    stream: StreamConfig | None = None,
    on_error: str = "raise",
) -> JpegFolder | ShardDataset | ShardStream | DetectionDataset:
    """Open ``path`` as the dataset its layout is read with, recognised in this order:

    1. a pack - a URL, or a folder holding ``manifest.json``: ``ptt`` / ``lmdb`` -> ``ShardDataset`` (random
       access), ``tar`` -> ``ShardStream`` (in order: ``stream``, a ``ptt.StreamConfig``, gives its shuffle, seed,
       rank, world size and the rest; ``decode`` and the cache are ``open_data``'s own and replace the config's).
       A URL's manifest and shards come through the node cache ``cache_dir`` (at most ``cache_limit``).
       ``decode`` is the readers' (``"auto"``, a backend, ``None`` for the stored bytes, or a callable).
    2. a detection root - COCO (``annotations/*.json``), YOLO (``images/`` + ``labels/``), Pascal VOC
       (``Annotations/`` + ``JPEGImages/``) or a COCO JSON file (over ``images/`` beside it when there is one):
       ``open_detection`` for ``task="detection"`` (``split`` picks a split of a root that has several - COCO's
       ``instances_<split>.json``, YOLO's ``images/<split>/``, VOC's ``ImageSets/Main/<split>.txt`` -, else its
       train split, said with a ``PttWarning``; ``on_error`` is ``open_detection``'s), refused for
       classification (its folders are not classes).
    3. an ImageNet-style root (``ROOT/train`` + ``ROOT/val``): ``JpegFolder`` of the train split, or of ``split`` -
       the returned dataset's ``root`` is ``ROOT/train``, not ``ROOT``; ``split_folders(ROOT)`` gives the others.
    4. an ImageFolder tree (``root/<class>/<image>``): ``JpegFolder``.

    For ``task="detection"`` only 1 (a detection pack) and 2 are read; ``task="auto"`` reads a detection pack or root
    as detection data, anything else as classification. Every refusal is a ``PttError`` that names what to pass
    instead.

    Example:
        >>> import tempfile, os
        >>> d = tempfile.mkdtemp(); os.makedirs(os.path.join(d, "train", "cat")); os.makedirs(os.path.join(d, "val"))
        >>> open(os.path.join(d, "train", "cat", "a.jpg"), "wb").write(b"x")
        1
        >>> ds = open_data(d); type(ds).__name__, os.path.relpath(ds.root, d), ds.classes
        ('JpegFolder', 'train', ['cat'])
    """
    from pytorchtricks.shards import layout
    from pytorchtricks.shards.remote import is_url

    if task not in TASKS:
        raise PttError(f"task must be classification, detection or auto, not {task!r}.")
    p = os.fspath(path)
    if (isinstance(path, str) and is_url(path)) or os.path.isfile(os.path.join(p, layout.MANIFEST)):
        if split is not None:
            raise PttError(
                Spelt(
                    "{p} is a pack: it holds the one split it was packed from; leave out {o}.",
                    p=p,
                    o=Option("split"),
                )
            )
        return _open_pack(p, task, decode, cache_dir, cache_limit, stream)
    if not os.path.exists(p):
        want = "a COCO, YOLO or VOC root, a COCO JSON or a detection pack" if task == "detection" else _KINDS
        raise PttError(f"{p!r} does not exist; pass {want}.")
    if task == "detection" or (task == "auto" and _detection_layout(p) is not None):
        return _open_detection_root(p, split, on_error)
    from pytorchtricks.data.detection import refuse_detection_root

    refuse_detection_root(p, "a classification reader (open_data(task='classification'))")
    if not os.path.isdir(p):
        raise PttError(f"{p!r} is a file; pass {_KINDS}.")
    from pytorchtricks.data.folder import JpegFolder, split_folder

    folder = split_folder(p, split)
    try:
        return JpegFolder(folder)
    except PttError as exc:
        raise PttError(
            f"{p!r} is not a pack (no manifest.json) and holds no ImageFolder tree ({exc}); pass {_KINDS}."
        ) from exc


def _open_pack(
    path: str,
    task: str,
    decode: Any,
    cache_dir: str | os.PathLike[str] | None,
    cache_limit: int | str | None,
    stream: StreamConfig | None,
) -> ShardDataset | ShardStream:
    """A pack folder or URL as the reader its format needs; its manifest says the format and whether it holds
    boxes (a detection pack) or class labels."""
    from pytorchtricks.shards import layout
    from pytorchtricks.shards.cache import open_pack
    from pytorchtricks.shards.dataset import ShardDataset
    from pytorchtricks.shards.remote import is_url

    local, _ = open_pack(path, cache_dir, cache_limit)  # a URL's manifest, fetched into the node cache
    manifest = layout.load_manifest(local)
    boxes = "detection" in manifest
    task = ("detection" if boxes else "classification") if task == "auto" else task
    if task == "detection" and not boxes:
        raise PttError(f"{path} is a classification pack (no targets): load it with ptt.make_loader.")
    if task == "classification" and boxes:
        raise PttError(
            f"{path} is a detection pack (boxes per image), not (image, class label) samples: open it with "
            "ptt.open_data(path, task='detection') and load it with ptt.make_detection_loader."
        )
    kw: dict[str, Any] = {"cache_dir": cache_dir, "cache_limit": cache_limit} if is_url(path) else {}
    if manifest["format"] == "tar":
        if boxes:
            raise PttError(
                f"{path} is a tar pack (sequential); detection reads ptt or lmdb packs (random access): re-pack "
                "with --format ptt, or read the tar with webdataset (its .json member holds the target)."
            )
        from pytorchtricks.shards.stream import ShardStream, StreamConfig

        return ShardStream(path, config=dataclasses.replace(stream or StreamConfig(), decode=decode, **kw))
    return ShardDataset(path, decode=decode, **kw)


def _detection_layout(path: str) -> str | None:
    from pytorchtricks.data.detection import detection_layout

    return detection_layout(path)


def _open_detection_root(path: str, split: str | None, on_error: str = "raise") -> DetectionDataset:
    """A COCO / YOLO / VOC root or a COCO JSON (over ``images/`` beside it, the common small layout, else where
    ``open_detection`` looks)."""
    from pytorchtricks.data.detection import detection_layout, open_detection

    if detection_layout(path) is None:
        raise PttError(
            f"{path} is not a detection root: task='detection' reads COCO (annotations/instances_*.json), YOLO "
            "(images/ + labels/) or Pascal VOC (Annotations/ + JPEGImages/), a COCO JSON file, or a detection pack "
            "(`ptt pack COCO_OR_YOLO_OR_VOC_ROOT DST`)."
        )
    beside = os.path.join(os.path.dirname(os.path.abspath(path)), "images")
    if os.path.isfile(path) and os.path.isdir(beside):  # ann.json with images/ beside it
        return open_detection(path, format="coco", images=beside, split=split, on_error=on_error)
    return open_detection(path, split=split, on_error=on_error)
