"""The splits of a detection root, and which one a reader opens.

COCO: ``annotations/instances_<split>.json`` (over ``<split>/``); YOLO: ``images/<split>/`` (with ``labels/<split>/``)
when ``images/`` holds two or more split folders (``train``, ``val``, ``test``, ``valid``, ... with an optional
year); Pascal VOC: ``ImageSets/Main/<split>.txt`` (the per-class lists ``<class>_<split>.txt`` are not splits).

``choose_split``: the split asked for; else the only one; else the train split (``train``, ``train2017``: a root
with a train and a val split trains on the train split, said with a ``PttWarning`` that names the others); a root
with several splits and no single train split is refused, naming them. Messages that name the ``split`` option are
``Spelt``: ``split='val2017'`` in Python, ``--split val2017`` on the command line.
"""

from __future__ import annotations

import os
import re
import warnings

from pytorchtricks.core import Option, PttError, PttWarning, Spelt

__all__ = ["choose_split", "detection_splits"]

_TRAIN = re.compile(r"train[-_]?\d*", re.IGNORECASE)  # train, train2017, train_2012 (not trainval)
_SPLIT_LIKE = re.compile(r"(train|val|valid|validation|test|trainval|dev|minival)[-_]?\d*", re.IGNORECASE)
_SIGN = {"coco": "annotations/instances_{}.json", "yolo": "images/{}/", "voc": "ImageSets/Main/{}.txt"}


def detection_splits(root: str | os.PathLike[str], fmt: str) -> list[str]:
    """The split names of a ``fmt`` (``"coco"``, ``"yolo"``, ``"voc"``) root, sorted; ``[]`` when it holds one set
    of images (a YOLO root with ``images/*.jpg``, a VOC root without ``ImageSets/Main``).

    Example:
        >>> import tempfile, os
        >>> d = tempfile.mkdtemp(); os.makedirs(f"{d}/annotations")
        >>> for s in ("train2017", "val2017"):
        ...     _ = open(f"{d}/annotations/instances_{s}.json", "w").write("{}")
        >>> detection_splits(d, "coco")
        ['train2017', 'val2017']
    """
    p = os.fspath(root)
    if fmt == "coco":
        names = _listdir(os.path.join(p, "annotations"))
        return sorted(f[len("instances_") : -len(".json")] for f in names if _is_instances(f))
    if fmt == "yolo":
        img = os.path.join(p, "images")
        found = sorted(
            d for d in _listdir(img) if _SPLIT_LIKE.fullmatch(d) and os.path.isdir(os.path.join(img, d))
        )
        return found if len(found) >= 2 else []
    if fmt == "voc":
        names = _listdir(os.path.join(p, "ImageSets", "Main"))
        return sorted(
            f[:-4] for f in names if f.endswith(".txt") and "_" not in f[:-4] and not f.startswith(".")
        )
    return []


def choose_split(root: str | os.PathLike[str], fmt: str, split: str | None) -> str | None:
    """The split a reader opens (see the module docstring); None: the root holds one set of images, read whole.

    Raises:
        PttError: ``split`` is not one of the root's splits, or the root has several and none is the train split.
    """
    p, kind = os.fspath(root), fmt.upper()
    splits = detection_splits(p, fmt)
    if split is not None:
        if split in splits or (
            fmt == "yolo" and not splits and os.path.isdir(os.path.join(p, "images", split))
        ):
            return split
        if not splits:
            raise PttError(
                Spelt(
                    "{kind} root {root} holds one set of images, no {sign}: leave out {o}.",
                    kind=kind,
                    root=p,
                    sign=_SIGN[fmt].format("SPLIT"),
                    o=Option("split"),
                )
            )
        raise PttError(
            f"{kind} root {p} has no split {split!r} ({_SIGN[fmt].format(split)}); its splits: {', '.join(splits)}."
        )
    if len(splits) <= 1:
        return splits[0] if splits else None
    train = [s for s in splits if _TRAIN.fullmatch(s)]
    if len(train) != 1:
        raise PttError(
            Spelt(
                "{kind} root {root} holds {n} splits ({splits}) and {train}: pass {o} to choose one.",
                kind=kind,
                root=p,
                n=len(splits),
                splits=", ".join(splits),
                train="no train split" if not train else f"{len(train)} train splits",
                o=Option("split", (train or splits)[0]),
            )
        )
    _say_chosen(p, fmt, train[0], [s for s in splits if s != train[0]])
    return train[0]


def _say_chosen(root: str, fmt: str, chosen: str, others: list[str]) -> None:
    which = "the other" if len(others) == 1 else f"another ({', '.join(others)})"
    warnings.warn(
        Spelt(
            "{kind} root {root}: using split {chosen} ({sign}); {o} picks {which}",
            kind=fmt.upper(),
            root=root,
            chosen=chosen,
            sign=_SIGN[fmt].format(chosen),
            which=which,
            o=Option("split", others[0]),
        ),
        PttWarning,
        stacklevel=4,
    )


def _is_instances(name: str) -> bool:
    return name.startswith("instances_") and name.endswith(".json") and len(name) > len("instances_.json")


def _listdir(folder: str) -> list[str]:
    try:
        return os.listdir(folder)
    except OSError:
        return []
