"""WebDataset-compatible tar shards: ``<key>.jpg`` + ``<key>.cls`` (+ ``<key>.json`` extras, ``<key>.npy`` raw).

A sample is the run of consecutive members sharing a key (the member path up to the first dot of its basename),
as in WebDataset, so ``webdataset.WebDataset`` reads our shards and ``iter_tar_samples`` reads shards written by
``webdataset.ShardWriter``. Headers are plain USTAR with mtime 0, uid/gid 0 and mode 0444: the same samples give
the same bytes. Members are never extracted: a member named ``../x.jpg`` is just a key string here.

Each sample we write ends with ``<key>.crc32``: JSON ``{ext: crc32}`` of its other members, checked on every read
(WebDataset passes it through as one more field). Foreign tars without it are read, but called unverified.
"""

from __future__ import annotations

import io
import json
import os
import tarfile
from collections.abc import Iterator
from typing import Any

import numpy as np

from pytorchtricks.data.errors import ShardError
from pytorchtricks.shards.layout import open_regular
from pytorchtricks.shards.record import crc32

DATA_EXTS = ("jpg", "jpeg", "png", "webp", "bmp", "npy", "img", "image")
CRC_EXT = "crc32"
EXT_OF_KIND = {"jpeg": "jpg", "png": "png", "webp": "webp", "bmp": "bmp", "gif": "gif", "tiff": "tiff"}


def _member(name: str, data: bytes) -> tuple[tarfile.TarInfo, io.BytesIO]:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mtime = 0
    info.mode = 0o444
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info, io.BytesIO(data)


def tar_sample_members(
    key: str, payload: bytes, kind: str, label: int, extras: dict[str, Any]
) -> list[tuple[str, bytes]]:
    """Members of one sample. ``payload`` of kind ``raw`` is already ``.npy`` bytes."""
    ext = "npy" if kind == "raw" else EXT_OF_KIND.get(kind, kind)
    out = [(f"{key}.{ext}", payload), (f"{key}.cls", str(int(label)).encode())]
    if extras:
        out.append((f"{key}.json", json.dumps(extras, sort_keys=True, separators=(",", ":")).encode()))
    sums = {name.rsplit("/", 1)[-1].partition(".")[2].lower(): crc32(data) for name, data in out}
    out.append((f"{key}.{CRC_EXT}", json.dumps(sums, sort_keys=True, separators=(",", ":")).encode()))
    return out


def write_tar_shard(path: str, members: list[tuple[str, bytes]]) -> None:
    """Write one tar shard atomically (temp file + ``os.replace``)."""
    tmp = f"{path}.tmp{os.getpid()}"
    with tarfile.open(tmp, "w", format=tarfile.USTAR_FORMAT) as tf:
        for name, data in members:
            info, fh = _member(name, data)
            tf.addfile(info, fh)
    os.replace(tmp, path)


def split_key(name: str) -> tuple[str, str]:
    """WebDataset's rule: ``a/b.seg.png`` -> (``a/b``, ``seg.png``)."""
    d, base = os.path.split(name)
    stem, _, ext = base.partition(".")
    return (f"{d}/{stem}" if d else stem), ext.lower()


def _check_tail(raw: Any, offset: int, path: str, n: int) -> None:
    """tarfile stops silently at a corrupt header after the first: past the last member only zeros may follow.

    At least one zero block must: a file cut at a member boundary reads as a shorter, valid-looking tar.
    """
    raw.seek(offset)
    pos = offset
    for chunk in iter(lambda: raw.read(1 << 16), b""):
        if chunk.count(0) != len(chunk):
            at = pos + len(chunk) - len(chunk.lstrip(b"\0"))
            raise ShardError(
                f"corrupt tar header at byte {offset} (non-zero data at byte {at} after the last readable "
                "member): the shard is damaged, restore or re-pack it",
                path=path,
                record=n,
            )
        pos += len(chunk)
    if pos - offset < 512:  # every tar writer ends the archive with zero blocks; none means a cut file
        raise ShardError(
            f"the tar ends at byte {pos} without its end-of-archive blocks: truncated (restore or re-pack it)",
            path=path,
            record=n,
        )


def iter_tar_groups(path: str) -> Iterator[tuple[str, dict[str, bytes]]]:
    """Yield ``(key, {ext: bytes})`` per sample, in file order.

    Raises:
        ShardError: missing, truncated or corrupt tar (a bad header anywhere, not only the first), a member
            repeated within a sample, or a FIFO/directory/device in place of the file; names the file and sample.
    """
    n = 0
    key: str | None = None
    group: dict[str, bytes] = {}
    with open_regular(path) as raw:
        size = os.fstat(raw.fileno()).st_size
        try:
            with tarfile.open(fileobj=raw, mode="r:") as tf:
                for m in tf:
                    if not m.isfile():
                        continue
                    if m.offset_data + m.size > size:  # checked before the read allocates m.size bytes
                        raise ShardError(
                            f"member {m.name!r} declares {m.size} bytes at byte {m.offset_data}, past the end of "
                            f"the {size}-byte file: truncated or corrupt (restore or re-pack it)",
                            path=path,
                            record=n,
                        )
                    k, ext = split_key(m.name)
                    if k != key and key is not None:
                        yield key, group
                        n += 1
                        group = {}
                    key = k
                    fh = tf.extractfile(m)
                    data = fh.read() if fh is not None else b""
                    if len(data) != m.size:
                        raise ShardError(f"member {m.name!r} is truncated", path=path, record=n)
                    if ext in group:
                        raise ShardError(
                            f"member {m.name!r} appears twice in one sample", path=path, record=n
                        )
                    group[ext] = data
                _check_tail(raw, tf.offset, path, n)
        except ShardError:
            raise
        except (tarfile.TarError, OSError, EOFError, ValueError, UnicodeDecodeError, OverflowError) as exc:
            raise ShardError(f"corrupt or truncated tar: {exc}", path=path, record=n) from exc
    if key is not None:
        yield key, group


def check_sample_crc(key: str, group: dict[str, bytes], *, path: str, index: int, required: bool) -> bool:
    """Verify the sample's ``.crc32`` member; ``False`` when it has none and none is ``required`` (foreign tars).

    Raises:
        ShardError: a checksum mismatch, a malformed checksum member, or none where one is ``required``.
    """
    if CRC_EXT not in group:
        if required:
            raise ShardError(
                f"sample {key!r} has no .{CRC_EXT} checksum member: the shard is damaged or was not written by "
                "this version of ptt pack, which stores one per sample (pack the source again into a new folder: `ptt "
                "pack SRC NEW_DST --format tar`; or read these tars unverified as foreign ones: ShardStream([paths]))",
                path=path,
                record=index,
            )
        return False
    try:
        sums = json.loads(group[CRC_EXT])
        if not isinstance(sums, dict):
            raise ValueError("not an object")
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise ShardError(
            f"malformed .{CRC_EXT} member of sample {key!r}: {exc}", path=path, record=index
        ) from exc
    have = {e for e in group if e != CRC_EXT}
    if set(sums) != have:
        raise ShardError(
            f"sample {key!r} holds members {sorted(have)}, its checksums list {sorted(sums)}: a member is "
            "missing or foreign",
            path=path,
            record=index,
        )
    for ext in sorted(have):
        if sums[ext] != crc32(group[ext]):
            raise ShardError(
                f"CRC32 mismatch in member {key}.{ext}: the shard is corrupt (re-pack or restore it)",
                path=path,
                record=index,
            )
    return True


def tar_sample(
    key: str, group: dict[str, bytes], *, path: str, index: int, require_crc: bool = False
) -> tuple[Any, int, dict[str, Any]]:
    """``(payload, label, extras)`` of one tar sample; ``extras`` holds ``__key__`` and any ``.json`` fields.

    The ``.crc32`` member is verified when present, and must be present with ``require_crc`` (our packs).
    """
    check_sample_crc(key, group, path=path, index=index, required=require_crc)
    ext = next((e for e in DATA_EXTS if e in group), None)
    if ext is None:
        raise ShardError(
            f"sample {key!r} has no image member (one of {', '.join(DATA_EXTS)})", path=path, record=index
        )
    payload: Any = group[ext]
    try:
        if ext == "npy":
            payload = np.load(io.BytesIO(payload), allow_pickle=False)
        label = int(group["cls"].decode().strip()) if "cls" in group else -1
        extras: dict[str, Any] = {}
        if "json" in group:
            extras = json.loads(group["json"])
            if not isinstance(extras, dict):
                extras = {"json": extras}
    except Exception as exc:  # np.load of a corrupt .npy raises ValueError, EOFError, tokenize errors...
        raise ShardError(
            f"malformed sample {key!r}: {type(exc).__name__}: {exc}", path=path, record=index
        ) from exc
    extras["__key__"] = key
    return payload, label, extras
