"""The on-disk arena of ``cache_in_ram``: its format, the dataset that maps it, and listing / removing arenas.

Not a trick (leading underscore). An arena is one folder ``<cache_dir>/<key>/`` holding ``arena.u8`` (every image's
pixels, back to back), ``index.npy`` (offset, height, width, label per image) and ``index.json`` (format, count,
size, bytes, source). A build writes ``<key>.tmp<pid>/`` and renames it into place, so a folder of that name is a
build in progress (its process alive) or abandoned (killed before the rename). Arenas outlive the process by design
(later runs and other ranks reuse them): ``list_arenas`` and ``remove_arenas`` are how they are found and freed.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from pytorchtricks.core import PttError

RAM_DIR = "/dev/shm"
DEFAULT_DIR = os.path.join(RAM_DIR, "ptt-cache")
FORMAT = "ptt-arena-1"
_TMP = re.compile(r"^(?P<key>[0-9a-f]{16})\.tmp(?P<pid>\d+)$")  # see cache_in_ram._build

ArenaState = Literal["ready", "building", "abandoned"]


class CachedDataset:
    """Map-style view of a built arena: ``read_raw(i) -> (HxWx3 uint8 view, label, {})``; pickles by path."""

    def __init__(self, path: str) -> None:
        self.path = path
        with open(os.path.join(path, "index.json"), encoding="utf-8") as fh:
            self.meta = json.load(fh)
        self._arena: np.ndarray | None = None
        idx = np.load(os.path.join(path, "index.npy"))  # columns: offset, height, width, label
        self.offsets, self.heights, self.widths = idx[:, 0], idx[:, 1], idx[:, 2]
        self.labels = idx[:, 3].copy()

    @property
    def nbytes(self) -> int:
        return int(self.meta["nbytes"])

    def _map(self) -> np.ndarray:
        if self._arena is None:  # opened lazily: each worker maps the same file, sharing its pages
            self._arena = np.memmap(os.path.join(self.path, "arena.u8"), dtype=np.uint8, mode="r")
        return self._arena

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_arena"] = None
        return state

    def __len__(self) -> int:
        return len(self.labels)

    def read_raw(self, i: int) -> tuple[np.ndarray, int, dict[str, Any]]:
        o, h, w = int(self.offsets[i]), int(self.heights[i]), int(self.widths[i])
        return self._map()[o : o + h * w * 3].reshape(h, w, 3), int(self.labels[i]), {}

    def __getitem__(self, i: int) -> tuple[np.ndarray, int]:
        arr, label, _ = self.read_raw(i)
        return arr, label


@dataclass(frozen=True)
class ArenaInfo:
    """One arena on disk, as ``list_arenas`` finds it.

    Attributes:
        path: its folder.
        nbytes: bytes of its files: what removing it frees (RAM, when it lives in ``/dev/shm``).
        images: how many images it holds (0 while building or when abandoned).
        size: the short side its images were resized to (None: stored size).
        created: when it was written, POSIX seconds (its index's modification time).
        state: ``"ready"`` (complete), ``"building"`` (its process is alive) or ``"abandoned"`` (a build that died).
        source: what was cached (dataset type, its path or root, its length, or the ``key=`` given).
        pid: the building process of a ``building`` / ``abandoned`` arena, else None.
    """

    path: str
    nbytes: int
    images: int
    size: int | None
    created: float
    state: ArenaState
    source: str = ""
    pid: int | None = None


def in_ram(path: str) -> bool:
    """True when ``path`` lies on ``/dev/shm`` (tmpfs): its bytes are RAM until removed."""
    return os.path.realpath(path).startswith(RAM_DIR + os.sep) or os.path.realpath(path) == RAM_DIR


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)  # signal 0: only asks whether the process exists
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by another user
        return True
    return True


def _folder_bytes(path: str) -> int:
    total = 0
    for dirpath, _, files in os.walk(path):
        for f in files:
            try:
                total += os.lstat(os.path.join(dirpath, f)).st_size
            except FileNotFoundError:  # removed meanwhile (a build renaming, another remove)
                continue
    return total


def arena_info(path: str | os.PathLike[str]) -> ArenaInfo | None:
    """``ArenaInfo`` of the folder ``path`` when it is an arena (ready, building or abandoned), else None."""
    path = os.path.abspath(os.fspath(path))
    index = os.path.join(path, "index.json")
    m = _TMP.match(os.path.basename(path))
    if m is None:
        try:
            with open(index, encoding="utf-8") as fh:
                meta = json.load(fh)
            created = os.stat(index).st_mtime
        except (OSError, ValueError):
            return None
        if not isinstance(meta, dict) or meta.get("format") != FORMAT:
            return None
        count, size, source = int(meta.get("count", 0)), meta.get("size"), str(meta.get("source", ""))
        return ArenaInfo(path, _folder_bytes(path), count, size, created, "ready", source)
    if not os.path.isdir(path):
        return None
    pid = int(m.group("pid"))
    state: ArenaState = "building" if _alive(pid) else "abandoned"
    return ArenaInfo(path, _folder_bytes(path), 0, None, os.stat(path).st_mtime, state, "", pid)


def list_arenas(cache_dir: str | os.PathLike[str] | None = None) -> list[ArenaInfo]:
    """Every arena in ``cache_dir`` (default ``/dev/shm/ptt-cache``), oldest first; ``[]`` when there is none.

    Abandoned builds (a process killed mid-build) are listed too: they hold space until removed.

    Example:
        >>> import tempfile
        >>> d = tempfile.mkdtemp()
        >>> c = ptt.cache_in_ram([(torch.zeros(3, 8, 8, dtype=torch.uint8), 0)], 4, cache_dir=d, num_workers=0)
        >>> [(a.state, a.images, a.size, a.path == c.path) for a in ptt.list_arenas(d)]
        [('ready', 1, 4, True)]
    """
    root = os.fspath(cache_dir) if cache_dir is not None else DEFAULT_DIR
    if not os.path.isdir(root):
        return []
    found = [arena_info(e.path) for e in os.scandir(root) if e.is_dir(follow_symlinks=False)]
    return sorted((a for a in found if a is not None), key=lambda a: (a.created, a.path))


def remove_arenas(
    arenas: Literal["all"]
    | str
    | os.PathLike[str]
    | ArenaInfo
    | Iterable[str | os.PathLike[str] | ArenaInfo],
    *,
    cache_dir: str | os.PathLike[str] | None = None,
) -> list[ArenaInfo]:
    """Delete arenas and return what was removed; ``"all"`` removes every ready or abandoned one in ``cache_dir``.

    Paths are checked before anything is deleted: a folder that is not an arena, or a build whose process is still
    running, raises ``PttError`` and removes nothing (``"all"`` skips running builds). A process that still maps a
    removed arena keeps reading it; its RAM is freed when the last such process exits.

    Example:
        >>> import tempfile
        >>> d = tempfile.mkdtemp()
        >>> c = ptt.cache_in_ram([(torch.zeros(3, 8, 8, dtype=torch.uint8), 0)], 4, cache_dir=d, num_workers=0)
        >>> [a.path == c.path for a in ptt.remove_arenas("all", cache_dir=d)], ptt.list_arenas(d)
        ([True], [])
    """
    if isinstance(arenas, str) and arenas == "all":
        targets = [a for a in list_arenas(cache_dir) if a.state != "building"]
    else:
        given = [arenas] if isinstance(arenas, str | os.PathLike | ArenaInfo) else list(arenas)
        targets = []
        for item in given:
            path = item.path if isinstance(item, ArenaInfo) else os.fspath(item)
            info = arena_info(path)
            if info is None:
                raise PttError(
                    f"{path!r} is not a cache_in_ram arena (no {FORMAT} index.json); nothing was removed. "
                    "ptt.list_arenas(cache_dir) lists the arenas."
                )
            if info.state == "building":
                raise PttError(
                    f"{path} is being built by process {info.pid}; nothing was removed. Wait for the build, or "
                    "stop that process first."
                )
            targets.append(info)
    removed = []
    for info in targets:
        doomed = info.path
        if info.state == "ready":  # renamed first: no process sees a half-deleted arena as complete
            doomed = os.path.join(
                os.path.dirname(info.path), f"{os.path.basename(info.path)}.tmp{os.getpid()}"
            )
            try:
                os.replace(info.path, doomed)
            except FileNotFoundError:  # removed meanwhile by someone else
                continue
        shutil.rmtree(doomed, ignore_errors=True)
        removed.append(info)
    return removed
