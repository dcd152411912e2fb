"""Where a pack keeps its files, the manifest, and the numpy index (``index.npy``) for random access.

``DST/manifest.json`` (written last: its presence means the pack is complete), ``DST/index.npy`` (ptt and lmdb: one
structured row per sample - shard, offset, length, label, crc - loaded with ``mmap_mode="r"``, never pickled),
``DST/shard-000000.ptt`` | ``shard-000000.tar`` | ``DST/data.lmdb/``, and ``DST/.pack-journal.json`` while packing.
"""

from __future__ import annotations

import json
import os
from typing import Any

import numpy as np

from pytorchtricks.shards.errors import ShardError

VERSION = 1
MANIFEST = "manifest.json"
INDEX = "index.npy"
JOURNAL = ".pack-journal.json"
LMDB_DIR = "data.lmdb"
INDEX_DTYPE = np.dtype(
    [("shard", "<u4"), ("offset", "<u8"), ("length", "<u8"), ("label", "<i8"), ("crc", "<u4")]
)


def shard_name(fmt: str, n: int) -> str:
    return f"shard-{n:06d}.{fmt}"


def brace_pattern(n: int) -> str:
    """WebDataset's brace notation for ``n`` tar shards.

    Example:
        >>> brace_pattern(3)
        'shard-{000000..000002}.tar'
    """
    return "shard-{000000.." + f"{n - 1:06d}" + "}.tar"


def is_pack_file(name: str) -> bool:
    return (
        name in (MANIFEST, INDEX, JOURNAL, LMDB_DIR, LMDB_DIR + ".tmp")
        or (name.startswith("shard-") and (".ptt" in name or ".tar" in name))
        or (name.startswith((MANIFEST, INDEX, JOURNAL)) and ".tmp" in name)
    )


def read_manifest_if_complete(dst: str) -> dict[str, Any] | None:
    path = os.path.join(dst, MANIFEST)
    if not os.path.exists(path):
        return None
    return load_manifest(dst)


def load_manifest(dst: str) -> dict[str, Any]:
    """The manifest of a complete pack.

    Raises:
        ShardError: no manifest (not a pack, or packing did not finish) or malformed JSON.
    """
    path = os.path.join(os.fspath(dst), MANIFEST)
    try:
        with open(path, encoding="utf-8") as fh:
            m = json.load(fh)
    except FileNotFoundError as exc:
        raise ShardError(
            "no manifest.json: not a pack, or packing did not finish (re-run `ptt pack` to complete it)",
            path=path,
        ) from exc
    except (OSError, ValueError) as exc:
        raise ShardError(f"unreadable manifest: {exc}", path=path) from exc
    if not isinstance(m, dict) or m.get("format") not in ("ptt", "tar", "lmdb") or "shards" not in m:
        raise ShardError("manifest lacks format/shards: not written by ptt pack", path=path)
    return m


def write_index(dst: str, fmt: str, manifest: dict[str, Any]) -> None:
    """Build ``index.npy`` from the shard tables (ptt) or the LMDB records (lmdb); written atomically."""
    if fmt == "ptt":
        from pytorchtricks.shards.ptt_format import read_ptt_table

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
        index = np.concatenate(parts) if parts else np.zeros(0, dtype=INDEX_DTYPE)
    else:
        from pytorchtricks.shards.lmdb_format import lmdb_index

        index = lmdb_index(os.path.join(dst, LMDB_DIR), manifest["count"])
    path = os.path.join(dst, INDEX)
    tmp = f"{path}.tmp{os.getpid()}.npy"
    np.save(tmp, index, allow_pickle=False)
    os.replace(tmp, path)


def load_index(dst: str, count: int) -> np.ndarray:
    """The memmapped index; checked against the manifest's count."""
    path = os.path.join(dst, INDEX)
    try:
        index = np.load(path, mmap_mode="r", allow_pickle=False)
    except FileNotFoundError as exc:
        raise ShardError("index.npy is missing (re-run `ptt pack`)", path=path) from exc
    except (OSError, ValueError) as exc:
        raise ShardError(f"unreadable index: {exc}", path=path) from exc
    if index.dtype != INDEX_DTYPE or index.shape != (count,):
        raise ShardError(
            f"index has {index.shape} rows of {index.dtype}, manifest says {count}: index and shards do not match",
            path=path,
        )
    return index
