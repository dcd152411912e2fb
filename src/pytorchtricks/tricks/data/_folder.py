"""``JpegFolder``: an ImageFolder tree read as encoded bytes, with a numpy-backed index (no copy-on-write growth).

Not a trick: the plain-files input of ``make_loader``, the data doctor and the benchmark, when no shards exist.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from pytorchtricks.core import PttError

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".webp")


class JpegFolder:
    """Map-style dataset over ``root/<class>/<file>``; ``read_raw(i) -> (bytes, label, {})``.

    Paths live in one numpy byte-string array, not a Python list: DataLoader workers touching it do not copy pages.

    Example:
        >>> import tempfile, os
        >>> d = tempfile.mkdtemp(); os.makedirs(os.path.join(d, "cat"))
        >>> open(os.path.join(d, "cat", "a.jpg"), "wb").write(b"x")
        1
        >>> ds = JpegFolder(d); (len(ds), ds.classes)
        (1, ['cat'])
    """

    def __init__(self, root: str | os.PathLike[str]) -> None:
        root = os.fspath(root)
        if not os.path.isdir(root):
            raise PttError(f"{root!r} is not a folder; pass an ImageFolder tree (one sub-folder per class).")
        self.root = root
        self.classes = sorted(e.name for e in os.scandir(root) if e.is_dir())
        paths: list[str] = []
        labels: list[int] = []
        for label, cls in enumerate(self.classes):
            for dirpath, _, files in sorted(os.walk(os.path.join(root, cls))):
                for f in sorted(files):
                    if f.lower().endswith(IMAGE_EXTENSIONS):
                        paths.append(os.path.relpath(os.path.join(dirpath, f), root))
                        labels.append(label)
        if not paths:
            raise PttError(f"no images under {root!r}; expected {root}/<class>/<image>.jpg.")
        self._paths = np.array([p.encode() for p in paths])  # fixed-width bytes: one buffer
        self.labels = np.asarray(labels, dtype=np.int64)

    def __len__(self) -> int:
        return len(self.labels)

    def path(self, i: int) -> str:
        return os.path.join(self.root, self._paths[i].decode())

    def read_raw(self, i: int) -> tuple[bytes, int, dict[str, Any]]:
        with open(self.path(i), "rb") as fh:
            return fh.read(), int(self.labels[i]), {}

    def __getitem__(self, i: int) -> tuple[bytes, int]:
        raw, label, _ = self.read_raw(i)
        return raw, label
