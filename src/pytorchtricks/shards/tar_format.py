"""WebDataset-compatible tar shards: ``<key>.jpg`` + ``<key>.cls`` (+ ``<key>.json`` extras, ``<key>.npy`` raw).

A sample is the run of consecutive members sharing a key (the member path up to the first dot of its basename),
as in WebDataset, so ``webdataset.WebDataset`` reads our shards and ``iter_tar_samples`` reads shards written by
``webdataset.ShardWriter``. Headers are plain USTAR with mtime 0, uid/gid 0 and mode 0444: the same samples give
the same bytes. Members are never extracted: a member named ``../x.jpg`` is just a key string here.
"""

from __future__ import annotations

import io
import json
import os
import tarfile
from collections.abc import Iterator
from typing import Any

import numpy as np

from pytorchtricks.shards.errors import ShardError

DATA_EXTS = ("jpg", "jpeg", "png", "webp", "bmp", "npy", "img", "image")
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


def iter_tar_groups(path: str) -> Iterator[tuple[str, dict[str, bytes]]]:
    """Yield ``(key, {ext: bytes})`` per sample, in file order.

    Raises:
        ShardError: missing, truncated or corrupt tar, naming the file and the sample number.
    """
    n = 0
    key: str | None = None
    group: dict[str, bytes] = {}
    try:
        with open(path, "rb") as raw, tarfile.open(fileobj=raw, mode="r|") as tf:
            for m in tf:
                if not m.isfile():
                    continue
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
                group[ext] = data
    except ShardError:
        raise
    except FileNotFoundError as exc:
        raise ShardError("tar shard is missing", path=path) from exc
    except (tarfile.TarError, OSError, EOFError, ValueError, UnicodeDecodeError) as exc:
        raise ShardError(f"corrupt or truncated tar: {exc}", path=path, record=n) from exc
    if key is not None:
        yield key, group


def tar_sample(
    key: str, group: dict[str, bytes], *, path: str, index: int
) -> tuple[Any, int, dict[str, Any]]:
    """``(payload, label, extras)`` of one tar sample; ``extras`` holds ``__key__`` and any ``.json`` fields."""
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
    except (ValueError, UnicodeDecodeError, OSError) as exc:
        raise ShardError(f"malformed sample {key!r}: {exc}", path=path, record=index) from exc
    extras["__key__"] = key
    return payload, label, extras
