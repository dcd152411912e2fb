"""Work files of a distributed pack: each rank's processed images, in chunks, where rank 0 can read them.

``ptt pack SRC DST --distributed`` under torchrun splits the (permuted) file list into chunks of ``chunk_items(n)``
files; rank r decodes/resizes/encodes the chunks ``c`` with ``c % world == r`` (the costly part) and writes each
as one spool object ``DST/.pack-dist-<digest>/chunk-<c>.spool`` (a temp file renamed, or one atomic PUT on object
storage). After a barrier, rank 0 reads the chunks in order and writes shards, index and manifest through the
single-process code path, so the result is byte-identical to ``ptt pack`` on one machine. A chunk that exists is
complete: an interrupted job re-run with the same command (at any world size) skips them.

A spool is ``PTTSPOOL1\\n`` then per item one JSON header line ``{"i", "kind", "info", "bytes_in", "len"}`` and
``len`` payload bytes, then ``{"end": count}``: no pickle, nothing executable.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator
from typing import Any

from pytorchtricks.shards.errors import ShardError
from pytorchtricks.shards.remote import filesystem, is_url, join_url, scrub_url, with_retries

MAGIC = b"PTTSPOOL1\n"


def chunk_items(n: int) -> int:
    """Files per chunk for a listing of ``n`` files: a function of ``n`` only, so a resume at another world size
    finds the same chunks (8 to 4096 files; at most about 4096 chunks).

    Example:
        >>> chunk_items(100), chunk_items(10_000_000)
        (8, 2442)
    """
    return max(8, min(4096, -(-n // 4096)))


def spool_dir(dst: str, digest: str) -> str:
    name = f".pack-dist-{digest[:16]}"
    return join_url(dst, name) if is_url(dst) else os.path.join(dst, name)


def chunk_path(where: str, c: int) -> str:
    name = f"chunk-{c:06d}.spool"
    return join_url(where, name) if is_url(where) else os.path.join(where, name)


def exists(path: str) -> bool:
    if not is_url(path):
        return os.path.exists(path)
    fs, rpath = filesystem(path)
    fs.invalidate_cache()
    return bool(with_retries(lambda: fs.exists(rpath), "stat", path))


def write_chunk(path: str, results: Iterable[tuple[Any, ...]], tmp_dir: str) -> None:
    """Write one chunk's ``process_item`` results (in order) to ``path`` atomically."""
    os.makedirs(tmp_dir, exist_ok=True)
    local = path if not is_url(path) else os.path.join(tmp_dir, os.path.basename(path))
    tmp = f"{local}.tmp{os.getpid()}"
    n = 0
    with open(tmp, "wb") as fh:
        fh.write(MAGIC)
        for i, kind, payload, info, nbytes in results:
            data = b"" if payload is None else bytes(payload)
            head = {"i": int(i), "kind": kind, "info": info, "bytes_in": int(nbytes), "len": len(data)}
            fh.write(json.dumps(head).encode() + b"\n")
            fh.write(data)
            n += 1
        fh.write(json.dumps({"end": n}).encode() + b"\n")
    if not is_url(path):
        os.replace(tmp, path)
        return
    fs, rpath = filesystem(path)
    try:
        with_retries(lambda: fs.put_file(tmp, rpath), "upload", path)  # one PUT: all or nothing
    finally:
        os.remove(tmp)


def read_chunk(path: str) -> Iterator[tuple[Any, ...]]:
    """The results written by ``write_chunk``, as ``(i, kind, payload, info, bytes_in)``.

    Raises:
        ShardError: missing, truncated or not a spool (delete the spool folder and re-run).
    """
    if is_url(path):
        fs, rpath = filesystem(path)
        raw = with_retries(lambda: fs.cat_file(rpath), "read", path)
    else:
        try:
            with open(path, "rb") as fh:
                raw = fh.read()
        except OSError as exc:
            raise ShardError(f"spool chunk unreadable: {exc}", path=path) from exc
    where = scrub_url(path) if is_url(path) else path
    if not raw.startswith(MAGIC):
        raise ShardError("not a pack spool chunk (delete the .pack-dist-* folder and re-run)", path=where)
    pos, n = len(MAGIC), 0
    while True:
        end = raw.find(b"\n", pos)
        if end < 0:
            raise ShardError("spool chunk is truncated (delete it and re-run)", path=where)
        try:
            head = json.loads(raw[pos:end])
        except ValueError as exc:
            raise ShardError(f"spool chunk is corrupt: {exc}", path=where) from exc
        pos = end + 1
        if "end" in head:
            if head["end"] != n:
                raise ShardError("spool chunk is truncated (delete it and re-run)", path=where)
            return
        data = raw[pos : pos + head["len"]]
        pos += head["len"]
        n += 1
        payload = None if head["kind"] == "reject" else data
        yield head["i"], head["kind"], payload, head["info"], head["bytes_in"]


def remove_dir(where: str) -> None:
    """Delete a spool folder (after the pack is complete)."""
    if is_url(where):
        fs, rpath = filesystem(where)
        if fs.exists(rpath):
            with_retries(lambda: fs.rm(rpath, recursive=True), "delete", where)
        return
    import shutil

    shutil.rmtree(where, ignore_errors=True)
