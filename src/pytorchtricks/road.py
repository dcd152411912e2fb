"""The data road's entrance: ``data_source`` reads a path, a URL, a pack or a dataset root once for what it is, and
``open_data`` opens it as a dataset object.

``data_source`` returns a ``DataSource``: what the data is (``kind``, ``format``, ``task``), what one sample looks
like, why a verb refuses it (``refusal`` / ``check``) and how it opens (``open``). ``make_loader``,
``make_detection_loader``, tune, the data doctor and the CLI hand their ``--data`` string (or that object) here and
pass the object on; none of them looks at the path again (no second ``detection_layout``, ``is_url`` or manifest
read on the way to the decode). The readers are the shards' and the data
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
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from pytorchtricks.core import Option, PttError, Spelt

if TYPE_CHECKING:
    from pytorchtricks.data.detection import DetectionDataset
    from pytorchtricks.data.folder import JpegFolder
    from pytorchtricks.shards.dataset import Decode, ShardDataset
    from pytorchtricks.shards.stream import ShardStream, StreamConfig

__all__ = ["DataSource", "data_source", "open_data"]

TASKS = ("classification", "detection", "auto")
KINDS = ("pack", "detection_root", "folder")
_KINDS_TEXT = (
    "an ImageFolder tree (root/<class>/<image>.jpg), an ImageNet-style root (root/train + root/val), a folder made "
    "by `ptt pack`, or a pack's URL (s3://..., gs://..., https://...)"
)
_DETECTION_TEXT = "a COCO, YOLO or VOC root, a COCO JSON or a detection pack"
_SAMPLE = {
    "classification": "(image, class label)",
    "detection": "(image, target dict: boxes in pixels, labels, image_id, iscrowd, area)",
}
_LAYOUT_SIGN = {
    "coco": "annotations/*.json",
    "yolo": "images/ + labels/",
    "voc": "Annotations/ + JPEGImages/",
}


@dataclasses.dataclass(frozen=True)
class DataSource:
    """What a data path is, read once by ``data_source``.

    ``kind``: ``"pack"`` (a ``ptt pack`` folder or URL), ``"detection_root"`` (COCO / YOLO / VOC root, or a COCO
    JSON file) or ``"folder"`` (an ImageFolder tree, or one split of an ImageNet-style root). ``format``: the pack's
    (``ptt``, ``lmdb``, ``tar``), the root's (``coco``, ``yolo``, ``voc``) or ``imagefolder``. ``task``: what its
    samples are, ``classification`` or ``detection``. ``folder``: the class tree read (``ROOT/train`` of a split
    root; ``splits`` all of that root's, ``{"train": ROOT/train, ...}``); ``images``: the image folder of a COCO JSON; ``local``: a pack's local folder (a URL's node-cache copy).
    """

    path: str
    kind: str
    format: str
    task: str
    split: str | None = None
    remote: bool = False
    local: str | None = None
    folder: str | None = None
    images: str | None = None
    splits: Mapping[str, str] = dataclasses.field(default_factory=dict, compare=False)
    cache_dir: str | None = None
    cache_limit: int | str | None = None
    manifest: Mapping[str, Any] | None = dataclasses.field(default=None, compare=False, repr=False)

    @property
    def by_index(self) -> bool:
        """Whether its samples are read by index (a tar pack is read in order)."""
        return not (self.kind == "pack" and self.format == "tar")

    @property
    def sample(self) -> str:
        """One sample's shape, the same for every storage of a task."""
        return _SAMPLE[self.task]

    def describe(self) -> str:
        """One line for a report: what it is and where."""
        if self.kind == "pack":
            what = "detection pack" if self.task == "detection" else "pack"
            return f"{self.format} {what} {self.path}"
        if self.kind == "detection_root":
            if self.images is not None:
                return f"COCO {self.path} over {self.images}"
            return f"{self.format.upper()} {self.path}" + (f" (split {self.split})" if self.split else "")
        return f"image folder {self.folder}"

    def refusal(
        self, who: str, *, task: str = "auto", by_index: bool = False, packs: bool = True
    ) -> str | None:
        """Why ``who`` (a verb, in its user's words) cannot read this source, or None: ``task`` is the samples it
        takes (``auto``: either), ``by_index`` whether it reads samples by index, ``packs`` whether it reads packs.
        """
        if task not in TASKS:
            raise PttError(f"task must be classification, detection or auto, not {task!r}.")
        if task == "classification" and self.task == "detection":
            if self.kind == "pack":
                return (
                    f"{self.path} is a detection pack (boxes per image), not (image, class label) samples: {who} "
                    "reads classification data; open it with ptt.open_data(path, task='detection') and load it "
                    "with ptt.make_detection_loader."
                )
            return (
                f"{self.path!r} is a {self.format.upper()} detection root ({_LAYOUT_SIGN[self.format]}), not an "
                f"ImageFolder tree: {who} would read its folders as classes. Use ptt.open_detection("
                f"{self.path!r}) and ptt.make_detection_loader."
            )
        if task == "detection" and self.task == "classification":
            if self.kind == "pack":
                return f"{self.path} is a classification pack (no targets): load it with ptt.make_loader."
            return (
                f"{self.path} is not a detection root: {who} reads COCO (annotations/instances_*.json), YOLO "
                "(images/ + labels/) or Pascal VOC (Annotations/ + JPEGImages/), a COCO JSON file, or a detection "
                "pack (`ptt pack COCO_OR_YOLO_OR_VOC_ROOT DST`)."
            )
        if self.kind == "pack" and not packs:
            root = (
                "the root it was packed from" if self.task == "detection" else "the folder it was packed from"
            )
            return f"{self.path} is a pack; {who} reads files, not packs: pass {root}."
        if by_index and not self.by_index:
            return (
                f"{self.path} is a tar pack, read in order; {who} reads samples by index: re-pack it with "
                "`ptt pack SRC DST --format ptt` (or lmdb)."
            )
        if self.task == "detection" and self.kind == "pack" and self.format == "tar":
            return (
                f"{self.path} is a tar pack (sequential); detection reads ptt or lmdb packs (random access): re-pack "
                "with --format ptt, or read the tar with webdataset (its .json member holds the target)."
            )
        return None

    def check(
        self, who: str, *, task: str = "auto", by_index: bool = False, packs: bool = True
    ) -> DataSource:
        """``self`` when ``who`` can read it, else the ``PttError`` of ``refusal``."""
        why = self.refusal(who, task=task, by_index=by_index, packs=packs)
        if why is not None:
            raise PttError(why)
        return self

    def open(
        self,
        *,
        decode: Decode = "auto",
        stream: StreamConfig | None = None,
        on_error: str = "raise",
    ) -> JpegFolder | ShardDataset | ShardStream | DetectionDataset:
        """The dataset its layout is read with: a pack -> ``ShardDataset`` (ptt / lmdb) or ``ShardStream`` (tar,
        ``stream`` its order); a detection root -> ``DetectionDataset`` (``on_error`` is ``open_detection``'s); a
        folder -> ``JpegFolder``. ``decode`` is the pack readers' (``"auto"``, a backend, None for the stored
        bytes, or a callable)."""
        if self.kind == "pack":
            self.check("open_data")
            kw: dict[str, Any] = (
                {"cache_dir": self.cache_dir, "cache_limit": self.cache_limit} if self.remote else {}
            )
            if self.format == "tar":
                from pytorchtricks.shards.stream import ShardStream, StreamConfig

                cfg = dataclasses.replace(stream or StreamConfig(), decode=decode, **kw)
                return ShardStream(self.path, config=cfg)
            from pytorchtricks.shards.dataset import ShardDataset

            return ShardDataset(self.path, decode=decode, **kw)
        if self.kind == "detection_root":
            from pytorchtricks.data.detection import open_detection

            return open_detection(
                self.path, format=self.format, images=self.images, split=self.split, on_error=on_error
            )
        from pytorchtricks.data.folder import JpegFolder

        assert self.folder is not None
        try:
            return JpegFolder(self.folder, checked=True)
        except PttError as exc:
            raise PttError(
                f"{self.path!r} is not a pack (no manifest.json) and holds no ImageFolder tree ({exc}); pass "
                f"{_KINDS_TEXT}."
            ) from exc


def data_source(
    path: str | os.PathLike[str] | DataSource,
    *,
    task: str = "auto",
    split: str | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
    cache_limit: int | str | None = None,
) -> DataSource:
    """Read ``path`` once for what it is, recognised in this order:

    1. a pack - a URL, or a folder holding ``manifest.json`` (its manifest says the format and whether it holds
       boxes); a URL's manifest comes through the node cache ``cache_dir`` (at most ``cache_limit``);
    2. a detection root - COCO (``annotations/*.json``), YOLO (``images/`` + ``labels/``), Pascal VOC
       (``Annotations/`` + ``JPEGImages/``) or a COCO JSON file (over ``images/`` beside it when there is one);
       ``split`` picks a split of a root that has several (``open_detection``'s rule);
    3. an ImageNet-style root (``ROOT/train`` + ``ROOT/val``): its train split, or ``split``;
    4. an ImageFolder tree (``root/<class>/<image>``).

    ``task`` (``classification``, ``detection`` or ``auto``) is what the caller reads: a source of the other task
    is refused with the ``PttError`` that names what to pass instead. A ``DataSource`` passes through unchanged
    (checked against ``task``).
    """
    if task not in TASKS:
        raise PttError(f"task must be classification, detection or auto, not {task!r}.")
    if isinstance(path, DataSource):
        return path.check("open_data", task=task)
    from pytorchtricks.shards import layout
    from pytorchtricks.shards.remote import is_url

    p = os.fspath(path)
    remote = isinstance(path, str) and is_url(path)
    if remote or os.path.isfile(os.path.join(p, layout.MANIFEST)):
        if split is not None:
            raise PttError(
                Spelt(
                    "{p} is a pack: it holds the one split it was packed from; leave out {o}.",
                    p=p,
                    o=Option("split"),
                )
            )
        return _pack_source(p, remote, cache_dir, cache_limit).check("open_data", task=task)
    if not os.path.exists(p):
        want = _DETECTION_TEXT if task == "detection" else _KINDS_TEXT
        raise PttError(f"{p!r} does not exist; pass {want}.")
    from pytorchtricks.data.detection import detection_layout

    fmt = detection_layout(p)
    if fmt is not None:
        images = None
        beside = os.path.join(os.path.dirname(os.path.abspath(p)), "images")
        if os.path.isfile(p) and os.path.isdir(beside):  # ann.json with images/ beside it
            images = beside
        src = DataSource(p, "detection_root", fmt, "detection", split=split, images=images)
        return src.check("a classification reader (open_data(task='classification'))", task=task)
    if task == "detection":
        raise PttError(
            f"{p} is not a detection root: task='detection' reads COCO (annotations/instances_*.json), YOLO "
            "(images/ + labels/) or Pascal VOC (Annotations/ + JPEGImages/), a COCO JSON file, or a detection pack "
            "(`ptt pack COCO_OR_YOLO_OR_VOC_ROOT DST`)."
        )
    if not os.path.isdir(p):
        raise PttError(f"{p!r} is a file; pass {_KINDS_TEXT}.")
    from pytorchtricks.data.folder import split_folder, split_folders

    splits = split_folders(p)
    folder = split_folder(p, split, splits)
    return DataSource(p, "folder", "imagefolder", "classification", split=split, folder=folder, splits=splits)


def _pack_source(
    path: str, remote: bool, cache_dir: str | os.PathLike[str] | None, cache_limit: int | str | None
) -> DataSource:
    from pytorchtricks.shards import layout
    from pytorchtricks.shards.cache import open_pack

    local, _ = open_pack(path, cache_dir, cache_limit)  # a URL's manifest, fetched into the node cache
    manifest = layout.load_manifest(local)
    return DataSource(
        path,
        "pack",
        str(manifest["format"]),
        "detection" if "detection" in manifest else "classification",
        remote=remote,
        local=local,
        cache_dir=os.fspath(cache_dir) if cache_dir is not None else None,
        cache_limit=cache_limit,
        manifest=manifest,
    )


def open_data(
    path: str | os.PathLike[str] | DataSource,
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
    src = data_source(path, task=task, split=split, cache_dir=cache_dir, cache_limit=cache_limit)
    return src.open(decode=decode, stream=stream, on_error=on_error)
