"""``JpegFolder``: an ImageFolder tree read as encoded bytes, with a numpy-backed index (no copy-on-write growth).

Not a trick: the plain-files input of ``make_loader``, the data doctor and the benchmark, when no shards exist.
``split_folders`` recognises an ImageNet-style root (``ROOT/train`` + ``ROOT/val``), whose splits are not classes.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import numpy as np

from pytorchtricks.core import Option, PttError, Spelt
from pytorchtricks.data.sources import (
    IMAGE_EXTENSIONS,
    walk_class_tree,
)  # one reader, on the formats' floor

# folder name (lower case) -> split; the first found wins when a root has several names for one split
SPLIT_NAMES = {"train": "train", "val": "val", "valid": "val", "validation": "val", "test": "test"}


def _subdirs(path: str) -> list[os.DirEntry[str]]:
    return sorted((e for e in os.scandir(path) if e.is_dir()), key=lambda e: e.name)


def split_folders(root: str | os.PathLike[str]) -> dict[str, str]:
    """The split folders of an ImageNet-style root, ``{"train": ROOT/train, "val": ROOT/val, ...}``, else ``{}``.

    ImageNet-style: ``ROOT/train`` holds class folders and a sibling names another split (``val``, ``valid``,
    ``validation`` -> ``"val"``; ``test`` -> ``"test"``; case ignored). Each split is then its own ImageFolder
    tree: ``JpegFolder(split_folders(ROOT)["train"])``. A class tree (``ROOT/<class>/<image>``) gives ``{}``.

    Example:
        >>> import tempfile, os
        >>> d = tempfile.mkdtemp()
        >>> for sub in ("train/cat", "train/dog", "val/cat"):
        ...     os.makedirs(os.path.join(d, sub))
        >>> {k: os.path.relpath(v, d) for k, v in split_folders(d).items()}
        {'train': 'train', 'val': 'val'}
    """
    root = os.fspath(root)
    if not os.path.isdir(root):
        return {}
    found: dict[str, str] = {}
    for e in _subdirs(root):
        split = SPLIT_NAMES.get(e.name.lower())
        if split is not None and split not in found:
            found[split] = e.path
    if "train" not in found or len(found) < 2 or not _subdirs(found["train"]):
        return {}
    return found


def split_folder(
    root: str | os.PathLike[str], split: str | None = None, splits: Mapping[str, str] | None = None
) -> str:
    """The folder of an ImageNet-style root's ``split`` (``train`` when None; ``valid`` and ``validation`` are
    ``val``), or ``root`` itself when it is one class tree and no split is asked for.

    Example:
        >>> import tempfile, os
        >>> d = tempfile.mkdtemp()
        >>> for sub in ("train/cat", "val/cat"):
        ...     os.makedirs(os.path.join(d, sub))
        >>> os.path.relpath(split_folder(d, "val"), d), os.path.relpath(split_folder(d), d)
        ('val', 'train')

    ``splits``: ``split_folders(root)`` when the caller has read it already.
    """
    root = os.fspath(root)
    splits = split_folders(root) if splits is None else splits
    if split is None:
        return splits.get("train", root)
    key = SPLIT_NAMES.get(split.lower(), split)
    if key in splits:
        return splits[key]
    if not splits:
        raise PttError(
            Spelt(
                "{p} is one ImageFolder tree, not a root of splits (train/ + val/): leave out {o}.",
                p=root,
                o=Option("split"),
            )
        )
    raise PttError(f"{root} has no split {split!r}; its splits: {', '.join(sorted(splits))}.")


_SUFFIXES = tuple(e.encode() for e in IMAGE_EXTENSIONS)


def _images(paths: np.ndarray) -> np.ndarray:
    """Which of the fixed-width bytes ``paths`` end in an image extension, any case: vectorised (numpy's string
    ufuncs), the lower-case suffixes first and only what is left lower-cased - one pass in the common case."""
    keep = np.zeros(len(paths), dtype=bool)
    rest: slice | np.ndarray
    for lowered in (False, True):
        for ext in _SUFFIXES:
            if not keep.any():  # nothing matched yet: the whole array, no gather
                rest, names = slice(None), paths
            else:
                rest = np.flatnonzero(~keep)
                if not len(rest):
                    return keep
                names = paths[rest]
            keep[rest] = np.char.endswith(np.char.lower(names) if lowered else names, ext)
    return keep


class JpegFolder:
    """Map-style dataset over ``root/<class>/<file>``; ``read_raw(i) -> (bytes, label, {})``.

    Paths live in one numpy byte-string array, not a Python list: DataLoader workers touching it do not copy pages.
    The files are ``walk_class_tree``'s (ImageFolder's order; hidden names such as macOS ``._x.jpg`` and
    ``.ipynb_checkpoints`` skipped, where ImageFolder would read them) with an image extension.

    Example:
        >>> import tempfile, os
        >>> d = tempfile.mkdtemp(); os.makedirs(os.path.join(d, "cat"))
        >>> open(os.path.join(d, "cat", "a.jpg"), "wb").write(b"x")
        1
        >>> ds = JpegFolder(d); (len(ds), ds.classes)
        (1, ['cat'])
    """

    def __init__(self, root: str | os.PathLike[str], *, checked: bool = False) -> None:
        root = os.fspath(root)
        if not os.path.isdir(root):
            raise PttError(f"{root!r} is not a folder; pass an ImageFolder tree (one sub-folder per class).")
        splits: dict[str, str] = {}
        if not checked:  # data_source read the layout already (``checked``: it is one class tree)
            from pytorchtricks.data.detection import refuse_detection_root

            refuse_detection_root(root, "JpegFolder")  # train2017/ and val2017/ would become two classes
            splits = split_folders(root)
        if splits:  # the splits would silently become classes: train = 0, val = 1, each holding every class
            names = ", ".join(os.path.basename(p) for p in splits.values())
            raise PttError(
                f"{root!r} holds dataset splits ({names}), not classes: pass one split, "
                f"JpegFolder({splits['train']!r}) for training"
                + "".join(f", JpegFolder({p!r}) for {k}" for k, p in splits.items() if k != "train")
                + "; ptt.split_folders(root) returns them."
            )
        self.root = root
        tree = walk_class_tree(root)
        self.classes = tree.classes
        # one join + split in C, not one bytes object per name: fixed-width bytes, one buffer
        joined = np.array("\0".join(tree.rel).encode("utf-8", "surrogateescape").split(b"\0"))
        keep = _images(joined)
        if not keep.any():
            raise PttError(f"no images under {root!r}; expected {root}/<class>/<image>.jpg.")
        self._paths = joined if keep.all() else joined[keep]
        labels = np.asarray(tree.labels, dtype=np.int64)
        self.labels = labels if keep.all() else labels[keep]

    def __len__(self) -> int:
        return len(self.labels)

    @property
    def rel_paths(self) -> np.ndarray:
        """Each sample's path relative to ``root``, as one fixed-width bytes array (``np.bytes_``)."""
        return self._paths

    def path(self, i: int) -> str:
        return os.path.join(self.root, self._paths[i].decode("utf-8", "surrogateescape"))

    def read_raw(self, i: int) -> tuple[bytes, int, dict[str, Any]]:
        with open(self.path(i), "rb") as fh:
            return fh.read(), int(self.labels[i]), {}

    def __getitem__(self, i: int) -> tuple[bytes, int]:
        raw, label, _ = self.read_raw(i)
        return raw, label
