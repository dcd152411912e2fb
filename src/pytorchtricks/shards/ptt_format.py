"""The native ``.ptt`` shard: a JSON header, an offset/CRC/label table, then the records back to back.

Layout (little-endian)::

    b"PTTSHRD1"  u32 header_len  header JSON  (zero pad to 8)
    u64 offsets[n + 1]   u32 crc[n]   i64 label[n]        (offsets are absolute file positions)
    records ...

The dataset index (``index.npy``) repeats (shard, offset, length, label, crc) per sample, so a reader needs one
memmapped array lookup and one slice of a memmapped shard per sample.
"""

from __future__ import annotations

import json
import mmap
import os
import struct
from collections.abc import Iterator
from typing import Any

import numpy as np

from pytorchtricks.data.errors import ShardError
from pytorchtricks.shards import layout
from pytorchtricks.shards.layout import INDEX_DTYPE, open_regular
from pytorchtricks.shards.record import crc32, decode_meta

MAGIC = b"PTTSHRD1"
_HDR = struct.Struct("<8sI")
MAX_HEADER_BYTES = 16 << 20


def _pad8(n: int) -> int:
    return (8 - n % 8) % 8


def write_ptt_shard(path: str, records: list[bytes], labels: list[int], header: dict[str, Any]) -> None:
    """Write one shard atomically (temp file + ``os.replace``)."""
    n = len(records)
    hdr = json.dumps({**header, "count": n, "version": 1}, sort_keys=True, separators=(",", ":")).encode()
    head = _HDR.pack(MAGIC, len(hdr)) + hdr
    head += b"\0" * _pad8(len(head))
    start = len(head) + 8 * (n + 1) + 4 * n + 8 * n
    offsets = np.empty(n + 1, dtype="<u8")
    offsets[0] = start
    if n:
        offsets[1:] = start + np.cumsum([len(r) for r in records])
    crcs = np.asarray([crc32(r) for r in records], dtype="<u4")
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "wb") as fh:
        fh.write(head)
        fh.write(offsets.tobytes())
        fh.write(crcs.tobytes())
        fh.write(np.asarray(labels, dtype="<i8").tobytes())
        for r in records:
            fh.write(r)
    os.replace(tmp, path)


def read_ptt_table(path: str) -> tuple[dict[str, Any], np.ndarray, np.ndarray, np.ndarray]:
    """``(header, offsets[n+1], crc[n], label[n])`` of a shard, validated against the file size.

    Raises:
        ShardError: missing, truncated or malformed shard.
    """
    try:
        with open_regular(path) as fh:
            size = os.fstat(fh.fileno()).st_size
            fixed = fh.read(_HDR.size)
            if len(fixed) < _HDR.size or fixed[:8] != MAGIC:
                raise ShardError("not a .ptt shard (bad magic) or truncated", path=path)
            _, hlen = _HDR.unpack(fixed)
            if hlen > MAX_HEADER_BYTES or _HDR.size + hlen > size:
                raise ShardError(
                    f"header length {hlen} exceeds the file ({size} bytes): truncated", path=path
                )
            header = json.loads(fh.read(hlen))
            if not isinstance(header, dict):
                raise ShardError("header is not a JSON object", path=path)
            n = header.get("count")
            if not isinstance(n, int) or isinstance(n, bool) or n < 0:
                raise ShardError(f"header count {n!r} is not a non-negative integer", path=path)
            fh.seek(_HDR.size + hlen + _pad8(_HDR.size + hlen))
            table_bytes = 8 * (n + 1) + 12 * n
            if fh.tell() + table_bytes > size:
                raise ShardError(
                    f"table of {n} records exceeds the file ({size} bytes): truncated", path=path
                )
            raw = fh.read(table_bytes)
    except (OSError, ValueError, UnicodeDecodeError, RecursionError) as exc:  # RecursionError: nested JSON
        raise ShardError(f"unreadable shard header: {exc}", path=path) from exc
    if len(raw) != table_bytes:
        raise ShardError("the shard changed size while being read", path=path)
    offsets = np.frombuffer(raw, dtype="<u8", count=n + 1)
    crcs = np.frombuffer(raw, dtype="<u4", count=n, offset=8 * (n + 1))
    labels = np.frombuffer(raw, dtype="<i8", count=n, offset=8 * (n + 1) + 4 * n)
    table_end = _HDR.size + hlen + _pad8(_HDR.size + hlen) + table_bytes
    if (n and np.any(offsets[1:] < offsets[:-1])) or int(offsets[0]) != table_end or int(offsets[-1]) != size:
        raise ShardError(f"offset table does not match the file size {size}: truncated or corrupt", path=path)
    return header, offsets, crcs, labels


class MappedShard:
    """A read-only memory map of one shard file; slices are zero-copy memoryviews."""

    def __init__(self, path: str) -> None:
        self.path = path
        with open_regular(path) as fh:  # a FIFO, a directory or /dev/zero is refused, never mapped
            try:
                self.size = os.fstat(fh.fileno()).st_size
                self._mm = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) if self.size else None
            except (OSError, ValueError) as exc:
                raise ShardError(f"cannot map shard: {exc}", path=path) from exc

    def slice(self, offset: int, length: int, record: int) -> memoryview:
        if self._mm is None or offset < 0 or length < 0 or offset + length > self.size:
            raise ShardError(
                f"record [{offset}, {offset + length}) lies beyond the end of the file ({self.size} bytes): "
                "the shard is truncated or does not match the index",
                path=self.path,
                record=record,
            )
        return memoryview(self._mm)[offset : offset + length]


def ptt_index(dst: str, manifest: dict[str, Any]) -> np.ndarray:
    """The rows of ``index.npy`` for a ptt pack, from its shards' tables (``layout.save_index`` writes them)."""
    parts = []
    for sid, s in enumerate(manifest["shards"]):
        _, offsets, crcs, labels = read_ptt_table(os.path.join(dst, s["name"]))
        part = np.zeros(len(labels), dtype=INDEX_DTYPE)
        part["shard"] = sid
        part["offset"] = offsets[:-1]
        part["length"] = np.diff(offsets)
        part["label"] = labels
        part["crc"] = crcs
        parts.append(part)
    return np.concatenate(parts) if parts else np.zeros(0, dtype=INDEX_DTYPE)


def check_ptt_shard(path: str, entry: dict[str, Any], rows: np.ndarray, record: int) -> None:
    """Check one ptt shard before its first read in a process: size as listed, its table equal to its index rows.

    Done lazily (first touch of the shard), so a pack with one bad shard still opens and the other shards read;
    ``record`` is the sample being read, named in the error.

    Raises:
        ShardError: truncated, replaced or swapped shard, or a table that differs from the index.
    """
    size = layout.regular_size(path)
    if entry.get("bytes") is not None and size != entry["bytes"]:
        raise ShardError(
            f"shard is {size} bytes, the manifest says {entry['bytes']}: truncated, replaced or swapped "
            "(restore it or re-run `ptt pack`)",
            path=path,
            record=record,
        )
    try:
        _, offsets, crcs, labels = read_ptt_table(path)
    except ShardError as exc:
        raise ShardError(exc.reason, path=path, record=record) from exc
    if (
        len(crcs) != len(rows)
        or not np.array_equal(rows["offset"], offsets[:-1])
        or not np.array_equal(rows["length"], np.diff(offsets))
        or not np.array_equal(rows["crc"], crcs)
        or not np.array_equal(rows["label"], labels)
    ):
        raise ShardError(
            f"shard table differs from its {len(rows)} index rows: index and shards do not match "
            "(re-run `ptt pack`)",
            path=path,
            record=record,
        )


def read_metas(dst: str, index: np.ndarray, shards: Any) -> Iterator[dict[str, Any]]:
    """Each record's metadata (``record.decode_meta``: label, kind, extras), in index order, without its payload:
    a ``pread`` of each record's first bytes with readahead off (a cold pack costs about a page per record, not
    the whole pack). Not CRC-checked: the CRC covers the whole record, which a payload read checks."""
    c_shard, c_offset, c_length, c_label = (
        index[f].view(np.ndarray) for f in ("shard", "offset", "length", "label")
    )
    first = 0
    for sid, entry in enumerate(shards):
        lo, hi = first, first + int(entry["count"])
        first = hi
        if hi <= lo:
            continue
        path = os.path.join(dst, entry["name"])
        if int(c_shard[lo]) != sid or int(c_shard[hi - 1]) != sid:
            raise ShardError(f"index rows {lo}-{hi - 1} do not name shard {sid}", path=path, record=lo)
        with open_regular(path) as fh:
            fd = fh.fileno()
            if hasattr(os, "posix_fadvise"):
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
            for i in range(lo, hi):
                off, n = int(c_offset[i]), int(c_length[i])
                head = os.pread(fd, min(n, 1024), off)
                want = 4 + int.from_bytes(head[:4], "little") if len(head) >= 4 else 0
                if want > len(head):
                    head = os.pread(fd, min(n, want), off)
                yield decode_meta(head, path=path, index=i, label=int(c_label[i]), total=n)[0]
