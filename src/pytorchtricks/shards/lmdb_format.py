"""LMDB packs: one key per sample (``b"%09d"``) holding ``u32 crc | record``, plus ``__meta__`` (JSON).

Written into ``data.lmdb.tmp/`` one transaction per shard-sized chunk, each committing its progress
(``__progress__``) with the data, so a killed pack resumes after the last commit; renamed to ``data.lmdb/`` at the
end. Readers open the environment lazily inside each process with ``lock=False, readahead=False, meminit=False``.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
from typing import Any

import numpy as np

from pytorchtricks.core import require
from pytorchtricks.shards import layout
from pytorchtricks.shards.errors import ShardError
from pytorchtricks.shards.record import crc32

_U32 = struct.Struct("<I")
_MAP_SIZE = 1 << 40  # address space only; the file grows with the data
META_KEY = b"__meta__"
PROGRESS_KEY = b"__progress__"


def sample_key(i: int) -> bytes:
    return b"%09d" % i


def open_env(path: str, *, write: bool = False) -> Any:
    lmdb = require("lmdb", "data")
    if write:
        return lmdb.open(path, map_size=_MAP_SIZE, subdir=True, sync=True, metasync=True)
    try:
        return lmdb.open(path, readonly=True, lock=False, readahead=False, meminit=False, subdir=True)
    except lmdb.Error as exc:
        raise ShardError(f"cannot open LMDB: {exc}", path=path) from exc


class LmdbWriter:
    def __init__(self, dst: str, digest: str) -> None:
        self.dst = dst
        self.tmp = os.path.join(dst, layout.LMDB_DIR + ".tmp")
        self.digest = digest
        os.makedirs(self.tmp, exist_ok=True)
        self.env = open_env(self.tmp, write=True)
        with self.env.begin() as txn:
            raw = txn.get(PROGRESS_KEY)
        state = json.loads(raw) if raw else {}
        if state.get("digest") != digest and raw:  # an older, different pack: start over
            self.env.close()
            import shutil

            shutil.rmtree(self.tmp)
            os.makedirs(self.tmp)
            self.env = open_env(self.tmp, write=True)
            state = {}
        self.chunks: list[dict[str, Any]] = state.get("chunks", [])

    def committed_chunks(self) -> list[dict[str, Any]]:
        return list(self.chunks)

    def write_chunk(self, first: int, records: list[bytes], entry: dict[str, Any]) -> None:
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
        with self.env.begin(write=True) as txn:
            txn.delete(PROGRESS_KEY)
            meta = {"count": count, "classes": classes, "version": layout.VERSION}
            txn.put(META_KEY, json.dumps(meta, sort_keys=True).encode())
        self.env.sync(True)
        self.env.close()
        lock = os.path.join(self.tmp, "lock.mdb")
        if os.path.exists(lock):
            os.remove(lock)
        final = os.path.join(self.dst, layout.LMDB_DIR)
        os.replace(self.tmp, final)
        data = os.path.join(final, "data.mdb")
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


def lmdb_index(path: str, count: int) -> np.ndarray:
    """Index rows (shard 0, offset 0) with length, label and crc read from every record."""
    from pytorchtricks.shards.record import decode_record

    index = np.zeros(count, dtype=layout.INDEX_DTYPE)
    env = open_env(path)
    try:
        with env.begin(buffers=True) as txn:
            for i in range(count):
                val = txn.get(sample_key(i))
                if val is None:
                    raise ShardError("record is missing", path=path, record=i)
                (crc,) = _U32.unpack_from(val, 0)
                _, label, _ = decode_record(memoryview(val)[4:], path=path, index=i, crc=crc)
                index[i] = (0, 0, len(val) - 4, label, crc)
    finally:
        env.close()
    return index


def lmdb_get(env: Any, i: int, path: str) -> memoryview:
    """``(record, crc)`` bytes of sample ``i``."""
    with env.begin(buffers=True) as txn:
        val = txn.get(sample_key(i))
        if val is None:
            raise ShardError("record is missing from the LMDB", path=path, record=i)
        return memoryview(bytes(val))
