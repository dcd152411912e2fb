"""LMDB packs: one key per sample (``b"%09d"``) holding ``u32 crc | record``, plus ``__meta__`` (JSON).

Written into ``data.lmdb.tmp/`` one transaction per shard-sized chunk, each committing its progress
(``__progress__``) with the data, so a killed pack resumes after the last commit; then rewritten canonically
(``LmdbWriter._canonical_txn``) and renamed to ``data.lmdb/``. Readers open the environment lazily inside each
process with ``lock=False, readahead=False, meminit=False``.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
import threading
from typing import Any

import numpy as np

from pytorchtricks.core import require
from pytorchtricks.data.errors import ShardError
from pytorchtricks.shards import layout
from pytorchtricks.shards.record import crc32

_U32 = struct.Struct("<I")
_MAP_SIZE = 1 << 40  # address space only; the file grows with the data (its meta page records it: fixed)
_CANONICAL = "canonical"  # data.lmdb.tmp/canonical/: the final file being written, renamed to data.lmdb/
# Record bytes per transaction of the canonical write: bounds its memory (LMDB keeps a write transaction's pages in
# RAM). Part of the file's layout (the transactions it took, the pages they freed): changing it changes the bytes.
_CANONICAL_TXN_BYTES = 64 << 20
META_KEY = b"__meta__"
PROGRESS_KEY = b"__progress__"


def sample_key(i: int) -> bytes:
    return b"%09d" % i


_META_PAGES_MIN_BYTES = 2 * 4096  # LMDB's two meta pages at the smallest page size
_READ_ENVS: dict[
    tuple[str, int], tuple[tuple[int, ...], Any]
] = {}  # (real path, pid) -> (file identity, env)
_READ_ENVS_LOCK = threading.Lock()


def _data_identity(path: str) -> tuple[int, tuple[int, ...]]:
    """``(size, identity)`` of ``path/data.mdb``, refusing what would make LMDB fault (SIGBUS) or hang."""
    data = os.path.join(path, "data.mdb")
    if not os.path.isdir(path):
        raise ShardError("the LMDB folder is missing or not a folder (re-run `ptt pack`)", path=path)
    with layout.open_regular(data) as fh:  # a FIFO, a directory or /dev/zero in place of data.mdb: refused
        st = os.fstat(fh.fileno())
    if st.st_size < _META_PAGES_MIN_BYTES:
        raise ShardError(
            f"data.mdb is {st.st_size} bytes, shorter than LMDB's two meta pages: truncated (restore or re-pack)",
            path=data,
        )
    return st.st_size, (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def _open_read_env(path: str, size: int) -> Any:
    lmdb = require("lmdb", "data")
    data = os.path.join(path, "data.mdb")
    try:
        env = lmdb.open(path, readonly=True, lock=False, readahead=False, meminit=False, subdir=True)
    except lmdb.Error as exc:
        raise ShardError(f"cannot open LMDB: {exc}", path=path) from exc
    try:  # both read only the meta page (pread), never a mapped data page
        need = (int(env.info()["last_pgno"]) + 1) * int(env.stat()["psize"])
    except lmdb.Error as exc:
        env.close()
        raise ShardError(f"cannot read the LMDB meta page: {exc}", path=data) from exc
    if size < need:  # a page past the end of the file would be touched through the map: SIGBUS, not an error
        env.close()
        raise ShardError(
            f"data.mdb is {size} bytes, its meta page says {need}: truncated (restore it or re-run `ptt pack`)",
            path=data,
        )
    return env


def open_env(path: str, *, write: bool = False) -> Any:
    """The LMDB environment at ``path``; read-only ones are opened once per process and shared.

    LMDB refuses a second open of the same files in one process (and a forked child inherits the parent's
    open set), so readers share one env per ``(real path, pid)``; a child closes what it inherited and opens
    its own. The file is checked against the size the meta page implies before any page is touched.

    Raises:
        ShardError: missing, truncated or unreadable LMDB, naming the folder or ``data.mdb``.
    """
    if write:
        lmdb = require("lmdb", "data")
        return lmdb.open(path, map_size=_MAP_SIZE, subdir=True, sync=True, metasync=True)
    real, pid = os.path.realpath(path), os.getpid()
    size, ident = _data_identity(path)
    with _READ_ENVS_LOCK:
        for key in [k for k in _READ_ENVS if k[0] == real and (k[1] != pid or _READ_ENVS[k][0] != ident)]:
            _, stale = _READ_ENVS.pop(key)  # inherited through fork, or the files were replaced
            try:
                stale.close()
            except Exception:  # closing a stale handle must not hide the open below
                pass
        hit = _READ_ENVS.get((real, pid))
        if hit is not None:
            return hit[1]
        env = _open_read_env(path, size)
        _READ_ENVS[(real, pid)] = (ident, env)
        return env


class LmdbWriter:
    """Writes ``data.lmdb/`` for ``pack`` so that a kill at any point resumes to the same bytes.

    What a re-run finds, and does:

    - ``data.lmdb.tmp/`` holding ``__progress__``: the chunks committed so far (each chunk commits with its
      progress in one transaction); packing continues after the last one.
    - ``data.lmdb.tmp/`` holding ``__meta__`` with this digest (sealed: every chunk in) and the caller's finished
      chunk list: only the compacted copy and its rename are redone.
    - ``data.lmdb/`` whose ``__meta__`` carries this digest, and the finished chunk list: already done.
    - anything else (another pack's digest, a ``data.lmdb/`` without its chunk list): removed, packing restarts.

    The final ``data.lmdb/`` is written canonically, so its bytes depend on the records alone, not on which run
    committed which chunk: LMDB's pages carry their history (a page reused in the same process keeps the old bytes
    in its free space, a value's last overflow page its tail), and a compacting copy (``mdb_env_copy2``) copies
    whole pages, so a resumed pack came out other bytes than an uninterrupted one. Every pack, resumed or not, writes
    ``data.lmdb.tmp/canonical/`` from the sealed temp environment: the records in key order (``MDB_APPEND``) then
    ``__meta__``, in transactions of ``_CANONICAL_TXN_BYTES``, each in a freshly opened environment (no lock file,
    fixed map size) - so the file after each commit is a function of the records, and a killed canonical write
    continues after its last commit to the same bytes. Then ``data.mdb`` is fsynced and the folder renamed.
    """

    def __init__(self, dst: str, digest: str, finished: list[dict[str, Any]] | None = None) -> None:
        import shutil

        self.dst = dst
        self.tmp = os.path.join(dst, layout.LMDB_DIR + ".tmp")
        self.final = os.path.join(dst, layout.LMDB_DIR)
        self.digest = digest
        self.env: Any = None
        self.sealed = self.done = False
        self.chunks: list[dict[str, Any]] = []
        if finished is not None and self._meta_digest(self.final) == digest:
            self.chunks, self.done = [dict(c) for c in finished], True
            shutil.rmtree(self.tmp, ignore_errors=True)  # a kill after the rename, before this removal
            return
        if os.path.lexists(self.final):  # another pack's, or one whose chunk list is gone: rebuilt below
            self._remove(self.final)
        os.makedirs(self.tmp, exist_ok=True)
        self.env = open_env(self.tmp, write=True)
        with self.env.begin() as txn:
            raw, meta = txn.get(PROGRESS_KEY), txn.get(META_KEY)
        state = json.loads(raw) if raw else {}
        if meta and finished is not None and json.loads(meta).get("digest") == digest:
            self.chunks, self.sealed = [dict(c) for c in finished], True
        elif state.get("digest") == digest:
            self.chunks = state.get("chunks", [])
        elif raw or meta:  # an older, different pack: start over
            self.env.close()
            shutil.rmtree(self.tmp)
            os.makedirs(self.tmp)
            self.env = open_env(self.tmp, write=True)

    def committed_chunks(self) -> list[dict[str, Any]]:
        return list(self.chunks)

    def write_chunk(self, first: int, records: list[bytes], entry: dict[str, Any]) -> None:
        if self.sealed or self.done:
            raise RuntimeError("LmdbWriter: every chunk is already written (a bug in pack, not in the input)")
        chunks = [*self.chunks, dict(entry)]
        with self.env.begin(write=True) as txn:
            for j, rec in enumerate(records):
                txn.put(sample_key(first + j), _U32.pack(crc32(rec)) + rec)
            # the journal entry itself is completed by the caller; store what resuming needs
            txn.put(
                PROGRESS_KEY, json.dumps({"digest": self.digest, "chunks": chunks}, sort_keys=True).encode()
            )
        self.chunks = chunks

    def finalize(self, count: int, classes: list[str]) -> dict[str, Any]:
        """Seal the temp environment, write it canonically to ``data.lmdb/``; the caller has saved its chunk list
        first (after the seal the progress key is gone and the chunk list lives only there). Returns the file's
        manifest entry, its sha256 read from the final ``data.mdb``."""
        import shutil

        if not self.done:
            if not self.sealed:
                with self.env.begin(write=True) as txn:
                    txn.delete(PROGRESS_KEY)
                    meta = {
                        "count": count,
                        "classes": classes,
                        "version": layout.VERSION,
                        "digest": self.digest,
                    }
                    txn.put(META_KEY, json.dumps(meta, sort_keys=True).encode())
                self.sealed = True
            self.env.sync(True)
            # inside the temp folder: a kill leaves nothing else behind
            part = os.path.join(self.tmp, _CANONICAL)
            while not self._canonical_txn(part, count):
                pass
            self.env.close()
            self.env = None
            self._fsync(os.path.join(part, "data.mdb"))
            os.replace(part, self.final)
            self._fsync(self.dst)
            shutil.rmtree(self.tmp)
            self.done = True
        data = os.path.join(self.final, "data.mdb")
        h = hashlib.sha256()
        with open(data, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                h.update(chunk)
        return {
            "name": layout.LMDB_DIR,
            "count": count,
            "bytes": os.path.getsize(data),
            "sha256": h.hexdigest(),
        }

    def _canonical_txn(self, part: str, count: int) -> bool:
        """One transaction of the canonical write into ``part``: the records after the last one there, up to
        ``_CANONICAL_TXN_BYTES`` of them, and ``__meta__`` after the last record. Returns True once ``part`` holds
        ``__meta__`` (complete: this transaction wrote it, or an earlier run did).

        The environment is opened for this transaction alone: LMDB reuses the pages a process freed without
        clearing them, so a transaction's bytes follow from the file it starts on only when no transaction ran
        before it in the same process - and then a re-run after a kill cannot be told from an uninterrupted run.
        """
        lmdb = require("lmdb", "data")
        start = self._canonical_next(part, count)
        if start is None:
            return True
        env = lmdb.open(part, map_size=_MAP_SIZE, subdir=True, lock=False, sync=True, metasync=True)
        try:
            with env.begin(write=True) as txn, self.env.begin(buffers=True) as src:
                size = 0
                while start < count and size < _CANONICAL_TXN_BYTES:
                    key = sample_key(start)
                    val = src.get(key)
                    if val is None:
                        raise ShardError("record missing from the sealed LMDB", path=self.tmp, record=start)
                    txn.put(key, val, append=True)  # in key order: pages filled left to right, none split
                    size += len(val)
                    start += 1
                if start == count:
                    meta = src.get(META_KEY)
                    if meta is None:
                        raise ShardError("the sealed LMDB has no __meta__ (re-run `ptt pack`)", path=self.tmp)
                    txn.put(META_KEY, meta, append=True)  # b"__meta__" sorts after every b"%09d" key
                    return True
        finally:
            env.close()
        return False

    @staticmethod
    def _canonical_next(part: str, count: int) -> int | None:
        """The next record the canonical write in ``part`` takes (None: complete). A ``part`` that is not an LMDB
        of this pack's keys with every page in its file (damaged) is removed: the write starts over."""
        import shutil

        lmdb = require("lmdb", "data")
        if not os.path.exists(os.path.join(part, "data.mdb")):
            shutil.rmtree(part, ignore_errors=True)
            return 0
        try:
            env = lmdb.open(part, readonly=True, lock=False, subdir=True)
            try:
                need = (int(env.info()["last_pgno"]) + 1) * int(env.stat()["psize"])
                if os.path.getsize(os.path.join(part, "data.mdb")) < need:
                    raise ValueError("data.mdb is shorter than its meta page says")
                with env.begin() as txn, txn.cursor() as cur:
                    last = cur.key() if cur.last() else None
            finally:
                env.close()
            if last == META_KEY:
                return None
            if last is None:
                return 0
            if len(last) == 9 and last.isdigit() and int(last) < count:
                return int(last) + 1
        except (lmdb.Error, OSError, ValueError):
            pass
        shutil.rmtree(part, ignore_errors=True)
        return 0

    def close(self) -> None:
        """Release the environment (the pack failed or was interrupted; what was committed stays)."""
        if self.env is not None:
            self.env.close()
            self.env = None

    @staticmethod
    def _meta_digest(path: str) -> str | None:
        """The pack digest recorded in a finished ``data.lmdb/`` (None: absent, not LMDB, or no digest)."""
        if not os.path.isfile(os.path.join(path, "data.mdb")):
            return None
        try:
            env = open_env(path)  # the process-wide shared reader: not closed here
            with env.begin() as txn:
                meta = txn.get(META_KEY)
            return json.loads(meta).get("digest") if meta else None
        except Exception:  # a damaged copy (ShardError, lmdb.Error, bad JSON): rebuilt, never trusted
            return None

    @staticmethod
    def _remove(path: str) -> None:
        import shutil

        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path)
        else:
            os.remove(path)

    @staticmethod
    def _fsync(path: str) -> None:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def lmdb_index(path: str, count: int) -> np.ndarray:
    """Index rows (shard 0, offset 0) with length, label and crc read from every record (CRC-checked)."""
    from pytorchtricks.shards.record import decode_record

    lmdb = require("lmdb", "data")
    index = np.zeros(count, dtype=layout.INDEX_DTYPE)
    env = open_env(path)  # shared: not closed here
    try:
        with env.begin(buffers=True) as txn:
            for i in range(count):
                val = txn.get(sample_key(i))
                if val is None:
                    raise ShardError("record is missing", path=path, record=i)
                if len(val) < 4:
                    raise ShardError(f"record too short ({len(val)} bytes)", path=path, record=i)
                (crc,) = _U32.unpack_from(val, 0)
                _, label, _ = decode_record(memoryview(val)[4:], path=path, index=i, crc=crc)
                index[i] = (0, 0, len(val) - 4, label, crc)
    except lmdb.Error as exc:
        raise ShardError(f"corrupt LMDB: {exc}", path=path) from exc
    return index


def lmdb_get(env: Any, i: int, path: str) -> memoryview:
    """``u32 crc | record`` bytes of sample ``i`` (a copy: nothing points into the map afterwards).

    Raises:
        ShardError: the record is missing, shorter than its CRC, or LMDB reports corruption.
    """
    lmdb = require("lmdb", "data")
    try:
        with env.begin(buffers=True) as txn:
            val = txn.get(sample_key(i))
            if val is None:
                raise ShardError("record is missing from the LMDB", path=path, record=i)
            out = memoryview(bytes(val))
    except lmdb.Error as exc:
        raise ShardError(f"corrupt LMDB: {exc}", path=path, record=i) from exc
    if len(out) < 4:
        raise ShardError(f"record too short ({len(out)} bytes)", path=path, record=i)
    return out
