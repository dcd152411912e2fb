"""The node-shared shard cache, and packs at a URL read through it.

One folder per node (``cache_dir``; default ``core.cache_root("shards")``: ``$PTT_CACHE_DIR/shards``, else
``~/.cache/pytorchtricks/shards``) is shared by every rank and DataLoader worker on it. A shard is downloaded once per node: the first reader takes the shard's
file lock, downloads to a temp file (its size reserved up front, so concurrent readers see the space taken), checks
size and sha256 against the manifest and renames it into place; the others wait on the lock and find it there. A
reader pins the shard it reads (a shared ``flock``); when the cache would pass ``cache_limit`` bytes, the least
recently used shards that nobody pins are deleted. A corrupt download is fetched once more, then it is a
``ShardError`` naming the shard and the URL. Counters (bytes downloaded, hits, misses, evictions, peak bytes) are
kept per node in the cache folder: ``NodeCache(dir).stats()``.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import threading
import urllib.parse
import warnings
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from pytorchtricks.core import PttError, PttWarning, cache_root
from pytorchtricks.data.errors import ShardError
from pytorchtricks.shards import layout
from pytorchtricks.shards.remote import fetch_bytes, filesystem, is_url, join_url, scrub_url, with_retries


def default_cache_dir() -> str:
    """The node's shard cache: ``shards/`` under the library's one cache folder (``core.cache_root``)."""
    return cache_root("shards")


@contextlib.contextmanager
def _flock(path: str, mode: int) -> Iterator[int]:
    fd = os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o644)
    try:
        fcntl.flock(fd, mode)
        yield fd
    finally:
        os.close(fd)  # closing the descriptor drops the lock


class Pin:
    """A shard held in the cache (a shared lock on it): not evicted until ``release()``."""

    def __init__(self, path: str, fd: int | None) -> None:
        self.path, self._fd = path, fd

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


class NodeCache:
    """A folder of downloaded shards shared by every process on the node; LRU-bounded by ``limit`` bytes.

    Example:
        >>> import tempfile; src = tempfile.mkdtemp(); open(f"{src}/a.bin", "wb").write(b"x" * 10)
        10
        >>> c = NodeCache(tempfile.mkdtemp(), limit=100)
        >>> pin = c.acquire("p/a.bin", f"file://{src}/a.bin", size=10); open(pin.path, "rb").read()
        b'xxxxxxxxxx'
        >>> pin.release(); c.stats()["downloaded_bytes"], c.stats()["misses"]
        (10, 1)
    """

    def __init__(self, cache_dir: str | os.PathLike[str] | None = None, limit: int | None = None) -> None:
        self.root = os.path.abspath(os.fspath(cache_dir or default_cache_dir()))
        if limit is not None and int(limit) < 1:
            raise PttError(f"cache_limit must be a positive number of bytes, got {limit}.")
        self.limit = None if limit is None else int(limit)
        self._locks = os.path.join(self.root, ".locks")
        try:
            os.makedirs(self._locks, exist_ok=True)
        except OSError as exc:
            raise PttError(f"cannot create the shard cache {self.root}: {exc} (pass cache_dir=)") from exc
        self._warned = False

    def _lockfile(self, rel: str, kind: str) -> str:
        return os.path.join(self._locks, rel.replace("/", "%") + "." + kind)

    # ------------------------------------------------------------------ bookkeeping (under the cache lock)

    def _update_stats(self, **add: int) -> None:
        path = os.path.join(self._locks, "stats.json")
        try:
            with open(path, encoding="utf-8") as fh:
                stats = json.load(fh)
        except (OSError, ValueError):
            stats = {}
        for k, v in add.items():
            if k == "peak_bytes":
                stats[k] = max(int(stats.get(k, 0)), v)
            else:
                stats[k] = int(stats.get(k, 0)) + v
        tmp = f"{path}.tmp{os.getpid()}.{threading.get_ident()}"
        with open(tmp, "w", encoding="utf-8") as fh:
            json.dump(stats, fh)
        os.replace(tmp, path)

    def stats(self) -> dict[str, int]:
        """Node totals: ``downloaded_bytes``, ``downloads``, ``hits``, ``misses``, ``evictions``, ``peak_bytes``."""
        out = dict.fromkeys(("downloaded_bytes", "downloads", "hits", "misses", "evictions", "peak_bytes"), 0)
        with _flock(os.path.join(self._locks, "cache.lock"), fcntl.LOCK_SH):
            try:
                with open(os.path.join(self._locks, "stats.json"), encoding="utf-8") as fh:
                    out.update(json.load(fh))
            except (OSError, ValueError):
                pass
        return out

    def _files(self) -> list[tuple[float, int, str]]:
        """(mtime, bytes, rel) of every cached file and reservation, the lock folder excluded."""
        out = []
        for dirpath, dirnames, files in os.walk(self.root):
            if dirpath == self.root:
                dirnames[:] = [d for d in dirnames if d != ".locks"]
            for f in files:
                p = os.path.join(dirpath, f)
                try:
                    st = os.stat(p)
                except FileNotFoundError:
                    continue
                out.append((st.st_mtime, st.st_size, os.path.relpath(p, self.root)))
        return out

    def _evictable(self, rel: str) -> bool:
        return os.path.basename(rel).startswith("shard-") and ".part" not in rel

    def _make_room(self, need: int, keep: str) -> int:
        """Delete unpinned LRU shards until ``need`` more bytes fit; returns the bytes held afterwards."""
        files = self._files()
        total = sum(b for _, b, _ in files)
        if self.limit is None:
            return total + need
        for _, size, rel in sorted(files):
            if total + need <= self.limit:
                break
            if rel == keep or not self._evictable(rel):
                continue
            fd = os.open(self._lockfile(rel, "use"), os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0))
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue  # another reader has it open
            try:
                os.remove(os.path.join(self.root, rel))
                total -= size
                self._update_stats(evictions=1)
            except FileNotFoundError:
                pass
            finally:
                os.close(fd)
        if total + need > self.limit and not self._warned:
            self._warned = True
            warnings.warn(
                f"shard cache {self.root} holds {total} bytes in shards being read, {need} more needed: over "
                f"cache_limit={self.limit}. Raise cache_limit to a few shards per reader (rank x worker).",
                PttWarning,
                stacklevel=4,
            )
        return total + need

    # ------------------------------------------------------------------ the one entry point

    def acquire(self, rel: str, url: str, *, sha256: str | None = None, size: int | None = None) -> Pin:
        """The local path of ``url`` cached as ``rel``, downloaded once per node, pinned until released.

        Raises:
            ShardError: not found, access denied, transient errors past the retries, or a checksum that fails twice.
        """
        path = os.path.join(self.root, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        pin_fd = os.open(self._lockfile(rel, "use"), os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0))
        fcntl.flock(pin_fd, fcntl.LOCK_SH)  # held before looking: an evictor cannot delete it under us
        try:
            if self._hit(path):
                return Pin(path, pin_fd)
            with _flock(self._lockfile(rel, "dl"), fcntl.LOCK_EX):  # one download per node
                if self._hit(path):
                    return Pin(path, pin_fd)
                self._download(rel, url, path, sha256, size)
            return Pin(path, pin_fd)
        except BaseException:
            os.close(pin_fd)
            raise

    def _hit(self, path: str) -> bool:
        if not os.path.exists(path):
            return False
        with contextlib.suppress(OSError):
            os.utime(path)  # the LRU clock is the file's mtime
        with _flock(os.path.join(self._locks, "cache.lock"), fcntl.LOCK_EX):
            self._update_stats(hits=1)
        return True

    def _download(self, rel: str, url: str, path: str, sha256: str | None, size: int | None) -> None:
        fs, rpath = filesystem(url)
        if size is None:
            size = int(with_retries(lambda: fs.info(rpath)["size"], "stat", url))
        tmp = f"{path}.part{os.getpid()}"
        for attempt in (1, 2):
            with _flock(os.path.join(self._locks, "cache.lock"), fcntl.LOCK_EX):
                held = self._make_room(size, keep=rel)
                with open(tmp, "wb") as fh:  # the reservation: counted at full size by every process
                    fh.truncate(size)
                self._update_stats(misses=1 if attempt == 1 else 0, peak_bytes=held)
            try:
                with_retries(lambda: self._copy(fs, rpath, tmp), "download", url)
                got = os.path.getsize(tmp)
                bad = got != size or (sha256 is not None and layout.file_sha256(tmp) != sha256)
                with _flock(os.path.join(self._locks, "cache.lock"), fcntl.LOCK_EX):
                    self._update_stats(downloaded_bytes=got, downloads=1)
                if not bad:
                    os.replace(tmp, path)
                    return
            finally:
                with contextlib.suppress(FileNotFoundError):
                    os.remove(tmp)
        raise ShardError(
            f"downloaded twice, its {'sha256' if sha256 else 'size'} differs from the manifest both times: the "
            "object in storage is corrupt or was replaced (re-upload it or re-run `ptt pack`)",
            path=f"{rel} ({scrub_url(url)})",
        )

    @staticmethod
    def _copy(fs: Any, rpath: str, tmp: str) -> None:
        with fs.open(rpath, "rb", block_size=8 << 20) as src, open(tmp, "r+b") as dst:
            while chunk := src.read(8 << 20):
                dst.write(chunk)
            dst.truncate()


class Prefetcher:
    """Pins for the shards one reader needs, fetched ``ahead`` shards ahead in background threads.

    ``open(s)`` blocks until shard ``s`` is local and returns its path; ``close(s)`` releases it. ``plan`` is the
    order in which the reader will first touch shards; ``open`` of a shard starts the downloads of the next ones.
    """

    def __init__(self, fetch: Callable[[int], Pin], plan: list[int], ahead: int) -> None:
        self._fetch, self._plan, self._ahead = fetch, plan, max(0, int(ahead))
        self._where = {s: k for k, s in enumerate(plan)}
        self._futures: dict[int, Future[Pin]] = {}
        self._started: set[int] = (
            set()
        )  # prefetched once: a shard closed early is fetched again only when opened
        self._pool = ThreadPoolExecutor(max(1, self._ahead), thread_name_prefix="ptt-prefetch")

    def _start(self, s: int) -> None:
        if s not in self._futures:
            self._started.add(s)
            self._futures[s] = self._pool.submit(self._fetch, s)

    def open(self, s: int) -> str:
        k = self._where.get(s)
        self._start(s)
        if k is not None:
            for nxt in self._plan[k + 1 : k + 1 + self._ahead]:
                if nxt not in self._started:
                    self._start(nxt)
        return self._futures[s].result().path

    @property
    def open_count(self) -> int:
        return len(self._futures)

    def close(self, s: int) -> None:
        fut = self._futures.pop(s, None)
        if fut is not None:
            fut.result().release()

    def shutdown(self) -> None:
        for s, fut in list(self._futures.items()):
            self._futures.pop(s)
            fut.cancel()
            if not fut.cancelled():
                with contextlib.suppress(Exception):
                    fut.result().release()
        self._pool.shutdown(wait=True)


class RemotePack:
    """A pack folder at a URL, seen through the node cache: ``local`` is a pack folder (manifest, index) whose
    shards arrive on demand (``pin(s)``).

    The cache folder of a pack is keyed by the URL and the manifest's digest, so a re-packed URL never reads the
    old pack's cached shards.
    """

    def __init__(
        self, url: str, cache_dir: str | os.PathLike[str] | None = None, cache_limit: int | str | None = None
    ) -> None:
        self.url = url.rstrip("/")
        self.cache = NodeCache(cache_dir, None if cache_limit is None else layout.parse_bytes(cache_limit))
        where = join_url(self.url, layout.MANIFEST)
        raw = fetch_bytes(where)
        try:
            manifest = json.loads(raw)
        except (ValueError, RecursionError) as exc:
            raise ShardError(f"unreadable manifest: {exc}", path=scrub_url(where)) from exc
        self.manifest = layout.check_manifest(manifest, scrub_url(where))
        if self.manifest["format"] == "lmdb":
            raise PttError(
                f"{scrub_url(self.url)} is an LMDB pack, one database file that cannot be read in parts: pack "
                "for object storage with --format ptt or tar."
            )
        ident = hashlib.sha256(scrub_url(self.url).encode()).hexdigest()[:12]
        digest = str(self.manifest.get("digest") or hashlib.sha256(raw).hexdigest())[:12]
        self.key = f"{ident}-{digest}"
        self.local = os.path.join(self.cache.root, self.key)
        os.makedirs(self.local, exist_ok=True)
        mpath = os.path.join(self.local, layout.MANIFEST)
        if not os.path.exists(mpath):
            tmp = f"{mpath}.tmp{os.getpid()}.{threading.get_ident()}"
            with open(tmp, "wb") as fh:
                fh.write(raw)
            os.replace(tmp, mpath)
        self._index_pin: Pin | None = None
        if self.manifest["format"] == "ptt":  # the index is never evicted (not a shard): pinned for show
            self._index_pin = self.cache.acquire(
                f"{self.key}/{layout.INDEX}", join_url(self.url, layout.INDEX)
            )
            self._index_pin.release()

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_index_pin"] = None
        return state

    def shard_url(self, s: int) -> str:
        return join_url(self.url, self.manifest["shards"][s]["name"])

    def pin(self, s: int) -> Pin:
        """Shard ``s`` local and pinned (downloaded once per node, sha256-checked)."""
        entry = self.manifest["shards"][s]
        return self.cache.acquire(
            f"{self.key}/{entry['name']}",
            self.shard_url(s),
            sha256=entry.get("sha256"),
            size=entry.get("bytes"),
        )


def open_pack(
    path: str | os.PathLike[str], cache_dir: str | os.PathLike[str] | None, cache_limit: int | str | None
) -> tuple[str, RemotePack | None]:
    """``(local pack folder, RemotePack or None)``: a ``file://`` URL is its local path, no cache."""
    if not isinstance(path, str) or not is_url(path):
        return os.fspath(path), None
    p = path
    if p.lower().startswith("file://"):
        return urllib.parse.unquote(urllib.parse.urlsplit(p).path), None
    remote = RemotePack(p, cache_dir, cache_limit)
    return remote.local, remote
