"""The on-disk arena of ``cache_in_ram``: its format, checks, build lock, the dataset that maps it, listing / removing.

Not a trick (leading underscore). An arena is one folder ``<cache_dir>/<key>/`` holding ``arena.u8`` (every image's
pixels, back to back), ``index.npy`` (offset, height, width, label per image) and ``index.json`` (format, count,
size, bytes, source, the content digest the key was cut from, a CRC32 per 4 MiB block of ``arena.u8``, the SHA-256
of ``index.npy``, and a SHA-256 of the JSON itself). A build holds ``<cache_dir>/<key>.lock`` (``fcntl.flock``: the
kernel releases it when the holder dies, however it dies), writes ``<key>.tmp<pid>/`` and renames it into place, so
a folder of that name is a build in progress (its process alive) or abandoned (killed before the rename).

Nothing is served unchecked: an arena folder and its files must be owned by this user and writable by nobody else
(another user could plant one in a shared folder), and its metadata, index and pixels must match their checksums.
Arenas outlive the process by design (later runs and other ranks reuse them): ``list_arenas`` and ``remove_arenas``
are how they are found and freed.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import io
import json
import math
import os
import re
import shutil
import stat
import time
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from pytorchtricks.core import PttError

RAM_DIR = "/dev/shm"
DEFAULT_DIR = os.path.join(RAM_DIR, "ptt-cache")
FORMAT = "ptt-arena-2"
FILES = ("arena.u8", "index.npy", "index.json")
EXTRAS = (
    "targets.json",
)  # a detection arena: each image's target (boxes in the stored pixels), JSON, never pickle
BLOCK_BYTES = 4 << 20  # one CRC32 per 4 MiB: 12,800 numbers for 50 GiB; zlib.crc32 runs ~3 GB/s on one core
FULL_CHECK_BYTES = 2 << 30  # "auto" checks every block up to 2 GiB (under a second), a sample above
SAMPLE_BLOCKS = 64  # blocks a sampled check reads (the first, the last, the rest at random): ~256 MiB
POLL_S = 0.1  # how often a waiter retries the build lock: a dead builder is noticed within this
_TMP = re.compile(r"^(?P<key>[0-9a-f]{16})\.tmp(?P<pid>\d+)(?:\.\d+)?$")  # see build_lock and discard

ArenaState = Literal["ready", "building", "abandoned"]
Verify = Literal["auto", "full", "sample", "none"]


class ArenaError(PttError):
    """An arena that must not be served: damaged, incomplete, of another format, or not this user's own."""


def check_private(path: str, *, folder: bool) -> None:
    """Raise ``ArenaError`` unless ``path`` is a real folder/file (no symlink) owned by this user, and no other
    user (group or world) may write it: such a file could be swapped by someone else under a reader's feet."""
    try:
        st = os.lstat(path)
    except OSError as exc:
        raise ArenaError(f"{path} is missing ({exc.strerror})") from exc
    kind_ok = stat.S_ISDIR(st.st_mode) if folder else stat.S_ISREG(st.st_mode)
    if not kind_ok:
        raise ArenaError(f"{path} is not a plain {'folder' if folder else 'file'} (a symlink or device?)")
    if st.st_uid != os.getuid():
        raise ArenaError(f"{path} is owned by uid {st.st_uid}, not by this user (uid {os.getuid()})")
    if st.st_mode & 0o022:
        raise ArenaError(f"{path} is writable by group or others (mode {stat.S_IMODE(st.st_mode):o})")


def _meta_check(meta: dict[str, Any]) -> str:
    body = {k: v for k, v in meta.items() if k != "check"}
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


class ArenaWriter:
    """Write an arena into the folder ``tmp`` image by image; ``finish`` writes the index and metadata last."""

    def __init__(self, tmp: str, count: int) -> None:
        self.tmp, self.count = tmp, count
        self.index = np.zeros((count, 4), dtype=np.int64)  # columns: offset, height, width, label
        self.offset, self._crc, self._in_block = 0, 0, 0
        self.crcs: list[int] = []
        self._fh = open(os.path.join(tmp, "arena.u8"), "wb")  # noqa: SIM115 - closed by finish / close

    def add(self, i: int, arr: np.ndarray, label: int) -> None:
        arr = np.ascontiguousarray(arr, dtype=np.uint8)
        self.add_batch(i, arr.reshape(-1), np.asarray([arr.shape[:2]]), np.asarray([label]))

    def add_batch(self, i: int, pixels: np.ndarray, shapes: np.ndarray, labels: np.ndarray) -> None:
        """Images ``i, i + 1, ...``: their HxWx3 pixels back to back in ``pixels``, ``shapes`` [k, 2] (h, w)."""
        data = np.ascontiguousarray(pixels, dtype=np.uint8).reshape(-1).data  # 1-D bytes, no copy
        sizes = shapes[:, 0].astype(np.int64) * shapes[:, 1] * 3
        if int(sizes.sum()) != len(data):
            raise ValueError(
                f"images {i}..: shapes give {int(sizes.sum())} bytes, the buffer holds {len(data)}"
            )
        k = len(labels)
        self.index[i : i + k, 0] = self.offset + np.concatenate([[0], np.cumsum(sizes)[:-1]])
        self.index[i : i + k, 1:3] = shapes
        self.index[i : i + k, 3] = labels
        self._fh.write(data)  # one write per batch
        self.offset += len(data)
        while len(data):  # the running CRC32 of each 4 MiB block; a batch may straddle blocks
            take = min(len(data), BLOCK_BYTES - self._in_block)
            self._crc, self._in_block, data = (
                zlib.crc32(data[:take], self._crc),
                self._in_block + take,
                data[take:],
            )
            if self._in_block == BLOCK_BYTES:
                self.crcs.append(self._crc)
                self._crc, self._in_block = 0, 0

    def close(self) -> None:
        self._fh.close()

    def finish(
        self, size: int | None, source: str, content: str, extras: dict[str, bytes] | None = None
    ) -> None:
        """Write the index and the metadata (last); ``extras``: more files of the arena by name (a detection
        arena's ``targets.json``), each checked against the SHA-256 the metadata stores for it."""
        self.close()
        for name, body in (extras or {}).items():
            if name not in EXTRAS:
                raise ValueError(f"{name}: an arena's extra files are {EXTRAS}")
            with open(os.path.join(self.tmp, name), "wb") as fh:
                fh.write(body)
        if self._in_block:
            self.crcs.append(self._crc)
        buf = io.BytesIO()
        np.save(buf, self.index, allow_pickle=False)
        with open(os.path.join(self.tmp, "index.npy"), "wb") as fh:
            fh.write(buf.getvalue())
        meta: dict[str, Any] = {
            "format": FORMAT,
            "count": self.count,
            "size": size,
            "nbytes": self.offset,
            "source": source,
            "content": content,
            "block_bytes": BLOCK_BYTES,
            "block_crc32": self.crcs,
            "index_sha256": hashlib.sha256(buf.getvalue()).hexdigest(),
        }
        if extras:
            meta["extras"] = {name: hashlib.sha256(body).hexdigest() for name, body in extras.items()}
        meta["check"] = _meta_check(meta)
        with open(os.path.join(self.tmp, "index.json"), "w", encoding="utf-8") as fh:
            json.dump(meta, fh)
        # read-only, this user only, whatever the umask (002 would make them group-writable, then never trusted)
        for name in (*FILES, *(extras or {})):
            os.chmod(os.path.join(self.tmp, name), 0o400)


def _load_meta(path: str) -> dict[str, Any]:
    try:
        with open(os.path.join(path, "index.json"), "rb") as fh:
            meta = json.loads(fh.read(64 << 20))
    except (OSError, ValueError) as exc:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise ArenaError(f"{path}/index.json is unreadable ({exc})") from exc
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        found = meta.get("format") if isinstance(meta, dict) else type(meta).__name__
        raise ArenaError(f"{path}/index.json is not a {FORMAT} arena (format {found!r})")
    if meta.get("check") != _meta_check(meta):
        raise ArenaError(f"{path}/index.json does not match its own checksum (edited or damaged)")
    ints = ("count", "nbytes", "block_bytes")
    if (
        not all(type(meta.get(k)) is int and meta[k] >= 0 for k in ints)
        or meta["block_bytes"] == 0
        or not isinstance(meta.get("block_crc32"), list)
        or not all(type(c) is int for c in meta["block_crc32"])
        or not all(isinstance(meta.get(k), str) for k in ("index_sha256", "content", "source"))
    ):
        raise ArenaError(f"{path}/index.json lacks fields of {FORMAT} or holds wrong types (damaged)")
    extras = meta.get("extras", {})
    if not isinstance(extras, dict) or not all(k in EXTRAS and isinstance(v, str) for k, v in extras.items()):
        raise ArenaError(f"{path}/index.json lists extra files that are not {FORMAT}'s (damaged)")
    return meta


class CachedDataset:
    """Map-style view of a built arena: ``read_raw(i) -> (HxWx3 uint8 view, label, {})``; pickles by path. A
    detection arena (``task == "detection"``) also holds each image's target, boxes in the stored pixels
    (``targets.json``, checked against its SHA-256): ``read_raw(i)[2]`` is ``{"target": ...}``.

    Opening checks before anything is served, and raises ``ArenaError`` (a ``PttError``) naming what is wrong:
    the folder and its files are this user's own and writable by no one else; ``index.json`` parses, is of this
    format and matches its own SHA-256; ``index.npy`` matches the SHA-256 stored there; every image lies inside
    ``arena.u8``, whose size is the recorded one (a truncated file is caught here); ``content``, when given, is the
    digest the arena was built for. ``verify`` then chooses how much of the pixels is read against the per-4 MiB
    CRC32s: ``"full"`` every block (~3 GB/s per core, in threads), ``"sample"`` the first, the last and 62 random
    blocks (a different draw each open, so repeated opens cover the arena), ``"auto"`` full up to 2 GiB (under a
    second) and sampled above (a full check of a 50 GiB arena would cost every rank of every run tens of seconds),
    ``"none"`` only the checks above (the builder, which computed the CRCs from the bytes it wrote).
    """

    def __init__(self, path: str, *, verify: Verify = "auto", content: str | None = None) -> None:
        self.path = path = os.path.abspath(path)
        check_private(path, folder=True)
        for name in FILES:
            check_private(os.path.join(path, name), folder=False)
        self.meta = meta = _load_meta(path)
        if content is not None and meta.get("content") != content:
            raise ArenaError(f"{path} holds other data (content digest {str(meta.get('content'))[:16]}...)")
        idx = self._load_index(meta)
        self.targets: list[dict[str, Any]] | None = self._load_targets(meta)
        self.task = "detection" if self.targets is not None else "classification"
        self._arena: np.ndarray | None = None
        self.offsets, self.heights, self.widths = idx[:, 0], idx[:, 1], idx[:, 2]
        self.labels = idx[:, 3].copy()
        if verify != "none":
            self.verify(full=verify == "full" or (verify == "auto" and self.nbytes <= FULL_CHECK_BYTES))

    def _load_index(self, meta: dict[str, Any]) -> np.ndarray:
        try:
            with open(os.path.join(self.path, "index.npy"), "rb") as fh:
                raw = fh.read()
            if hashlib.sha256(raw).hexdigest() != meta["index_sha256"]:
                raise ArenaError(f"{self.path}/index.npy does not match its checksum (damaged)")
            idx = np.load(io.BytesIO(raw), allow_pickle=False)  # never unpickle: a plain int64 array
            count, nbytes = int(meta["count"]), int(meta["nbytes"])
            size_on_disk = os.stat(os.path.join(self.path, "arena.u8")).st_size
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ArenaError(f"{self.path}: unreadable index or metadata ({exc})") from exc
        if idx.dtype != np.int64 or idx.shape != (count, 4):
            raise ArenaError(
                f"{self.path}/index.npy has {idx.shape} {idx.dtype}, expected ({count}, 4) int64"
            )
        if size_on_disk != nbytes:
            raise ArenaError(
                f"{self.path}/arena.u8 holds {size_on_disk} bytes, its index says {nbytes} (truncated?)"
            )
        ends = idx[:, 0] + idx[:, 1] * idx[:, 2] * 3
        if count and (idx[:, :3].min() < 0 or ends.max() > nbytes):
            raise ArenaError(f"{self.path}/index.npy points outside arena.u8 (damaged)")
        return idx

    def _load_targets(self, meta: dict[str, Any]) -> list[dict[str, Any]] | None:
        """A detection arena's targets (one JSON object per image), checked against their SHA-256; else None."""
        want = meta.get("extras", {}).get("targets.json")
        if want is None:
            return None
        path = os.path.join(self.path, "targets.json")
        check_private(path, folder=False)
        try:
            with open(path, "rb") as fh:
                raw = fh.read()
        except OSError as exc:
            raise ArenaError(f"{path} is unreadable ({exc.strerror})") from exc
        if hashlib.sha256(raw).hexdigest() != want:
            raise ArenaError(f"{path} does not match its checksum (damaged)")
        try:
            targets = json.loads(raw)
        except ValueError as exc:
            raise ArenaError(f"{path} is not JSON ({exc})") from exc
        if not isinstance(targets, list) or len(targets) != int(meta["count"]):
            raise ArenaError(f"{path} does not hold one target per image (damaged)")
        return targets

    def verify(self, *, full: bool = True) -> None:
        """Read every block (``full``) or a sample of blocks of ``arena.u8`` against the stored CRC32s."""
        from concurrent.futures import ThreadPoolExecutor

        crcs, block = list(self.meta["block_crc32"]), int(self.meta["block_bytes"])
        if len(crcs) != math.ceil(self.nbytes / block):
            raise ArenaError(
                f"{self.path}/index.json lists {len(crcs)} block checksums for {self.nbytes} bytes"
            )
        picks = list(range(len(crcs)))
        if not full and len(picks) > SAMPLE_BLOCKS:
            rng = np.random.default_rng()
            middle = rng.choice(np.arange(1, len(crcs) - 1), SAMPLE_BLOCKS - 2, replace=False)
            picks = [0, *sorted(int(b) for b in middle), len(crcs) - 1]
        data = self._map()

        def bad(b: int) -> bool:  # zlib.crc32 releases the GIL on large buffers: threads share the work
            return zlib.crc32(data[b * block : (b + 1) * block].data) != int(crcs[b])

        workers = min(8, len(os.sched_getaffinity(0)), max(1, len(picks)))
        with ThreadPoolExecutor(workers) as pool:
            damaged = [b for b, is_bad in zip(picks, pool.map(bad, picks), strict=True) if is_bad]
        if damaged:
            raise ArenaError(
                f"{self.path}/arena.u8 is damaged: {len(damaged)} of {len(picks)} checked blocks of {block} bytes "
                f"fail their CRC32 (first: block {damaged[0]})"
            )

    @property
    def nbytes(self) -> int:
        return int(self.meta["nbytes"])

    def _map(self) -> np.ndarray:
        if self._arena is None:  # opened lazily: each worker maps the same file, sharing its pages
            if self.nbytes == 0:  # mmap refuses an empty file
                self._arena = np.zeros(0, dtype=np.uint8)
            else:
                self._arena = np.memmap(os.path.join(self.path, "arena.u8"), dtype=np.uint8, mode="r")
        return self._arena

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_arena"] = None
        return state

    def __len__(self) -> int:
        return len(self.labels)

    def read_raw(self, i: int) -> tuple[np.ndarray, int, dict[str, Any]]:
        """``(HxWx3 uint8 view, label, extras)``; a detection arena's extras hold ``{"target": ...}`` (JSON, boxes
        in the stored pixels), as a detection pack's records do."""
        o, h, w = int(self.offsets[i]), int(self.heights[i]), int(self.widths[i])
        extras = {"target": self.targets[i]} if self.targets is not None else {}
        return self._map()[o : o + h * w * 3].reshape(h, w, 3), int(self.labels[i]), extras

    def __getitem__(self, i: int) -> tuple[np.ndarray, Any]:
        """``(pixels, label)``; a detection arena: ``(pixels, target)`` with the target's tensors."""
        arr, label, extras = self.read_raw(i)
        if "target" in extras:
            from pytorchtricks.data.detection_loader import target_from_json

            return arr, target_from_json(extras["target"])
        return arr, label


def private_root(cache_dir: str) -> str:
    """``cache_dir`` when it is a folder of this user's that no one else may write, else a private sibling
    ``<cache_dir>-<uid>`` (created mode 700): in a folder others can write (``/dev/shm`` is mode 1777, a shared
    ``ptt-cache`` may be another user's) anyone could plant an arena, a lock or a build folder.

    Raises:
        PttError: the private sibling exists but is not this user's own, or cannot be created.
    """
    with contextlib.suppress(OSError):  # not creatable here (another user's parent): the sibling below
        os.makedirs(cache_dir, mode=0o700, exist_ok=True)
    try:
        check_private(cache_dir, folder=True)
        return cache_dir
    except ArenaError as exc:
        why = str(exc)
    mine = f"{cache_dir.rstrip(os.sep)}-{os.getuid()}"
    try:
        os.makedirs(mine, mode=0o700, exist_ok=True)
        check_private(mine, folder=True)
    except (OSError, ArenaError) as exc:
        raise PttError(
            f"cache_in_ram will not use {cache_dir}: {why}, so another user could plant or alter arenas there; "
            f"its private alternative {mine} is not usable either ({exc}). Pass cache_dir= a folder you own that "
            "no one else can write (chmod go-w), or remove the foreign one."
        ) from exc
    return mine


def discard(path: str) -> None:
    """Move a damaged or foreign arena out of its name at once (a rename), then delete what this user may."""
    for n in range(1000):
        aside = os.path.join(os.path.dirname(path), f"{os.path.basename(path)}.tmp{os.getpid()}.{n}")
        try:
            os.rename(path, aside)
        except FileNotFoundError:  # removed meanwhile
            return
        except OSError:  # that aside name is taken (an earlier discard it could not delete): try the next
            continue
        shutil.rmtree(aside, ignore_errors=True)  # what is left (another user's files) lists as abandoned
        return
    raise PttError(f"could not move {path} aside; remove it by hand (rm -r) and run again.")


def _holder(path: str) -> str:
    with contextlib.suppress(OSError, ValueError), open(path, encoding="ascii") as fh:
        return f"process {int(fh.read(32))}"
    return "another process"


@contextlib.contextmanager
def build_lock(root: str, key: str, wait_s: float) -> Iterator[None]:
    """Hold the build lock of arena ``key``: ``flock`` on ``<root>/<key>.lock``, waiting up to ``wait_s`` seconds.

    The kernel drops an ``flock`` when its holder dies (SIGKILL, OOM), so a waiter takes over within ``POLL_S``.
    The holder deletes the file before releasing it; a waiter that then locks the deleted file sees that the path
    no longer names its file and tries again, so two processes never both hold the lock of one key.

    Raises:
        PttError: a live process held the lock for all of ``wait_s``.
    """
    path = os.path.join(root, f"{key}.lock")
    for _ in range(max(1, math.ceil(wait_s / POLL_S)) + 1):  # counted pauses: no clock is read
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            time.sleep(POLL_S)  # a pause, not a clock read
            continue
        try:
            held, now = os.fstat(fd), os.stat(path)
            current = (held.st_dev, held.st_ino) == (now.st_dev, now.st_ino)
        except FileNotFoundError:
            current = False
        if not current:  # locked a file its holder had already deleted
            os.close(fd)
            continue
        try:
            os.ftruncate(fd, 0)
            os.write(fd, str(os.getpid()).encode())  # read by waiters' error message only
            yield
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
            os.close(fd)
        return
    raise PttError(
        f"waited {wait_s:.0f} s for {_holder(path)} to build the cache {os.path.join(root, key)} (it holds "
        f"{path}). Let it finish and run again, raise wait_s=, or stop that process (a dead one releases the lock)."
    )


def clear_builds(root: str, key: str) -> None:
    """Delete every build folder of ``key``: called under its build lock, so each is a dead builder's leftover."""
    for e in os.scandir(root):
        m = _TMP.match(e.name)
        if m is not None and m.group("key") == key and e.is_dir(follow_symlinks=False):
            shutil.rmtree(e.path, ignore_errors=True)


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
        if not isinstance(meta, dict) or not str(meta.get("format", "")).startswith("ptt-arena-"):
            return None  # earlier formats are listed too: they hold space until removed (never served)
        try:
            count, size, source = int(meta.get("count", 0)), meta.get("size"), str(meta.get("source", ""))
        except (TypeError, ValueError):
            count, size, source = 0, None, ""
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
                    f"{path!r} is not a cache_in_ram arena (no ptt-arena index.json); nothing was removed. "
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
