"""Where a pack keeps its files, the manifest, and the numpy index (``index.npy``) for random access.

``DST/manifest.json`` (written last: its presence means the pack is complete), ``DST/index.npy`` (ptt and lmdb: one
structured row per sample - shard, offset, length, label, crc - loaded with ``mmap_mode="r"``, never pickled),
``DST/shard-000000.ptt`` | ``shard-000000.tar`` | ``DST/data.lmdb/``, and ``DST/.pack-journal.json`` while packing.
"""

from __future__ import annotations

import json
import os
import stat
from typing import Any, BinaryIO

import numpy as np

from pytorchtricks.core import PttError
from pytorchtricks.data.errors import ShardError

VERSION = 1
MANIFEST = "manifest.json"
INDEX = "index.npy"
JOURNAL = ".pack-journal.json"
LMDB_DIR = "data.lmdb"
TARGETS = "targets.npz"  # a ptt detection pack's targets as flat columns (``shards.targets.write_targets``)
_UNITS = {
    "": 1,
    "B": 1,
    "KB": 1000,
    "MB": 1000**2,
    "GB": 1000**3,
    "KIB": 1024,
    "MIB": 1024**2,
    "GIB": 1024**3,
    "K": 1024,  # a bare K/M/G is binary, as in `docker --memory 1.5g` and GPU cards' "24G"
    "M": 1024**2,
    "G": 1024**3,
}


def parse_bytes(text: str | int) -> int:
    """``"64MB"`` -> 64000000, ``"1MiB"`` -> 1048576, ``"1.5G"`` -> 1.5 GiB (a bare K/M/G is binary), ``4096``.

    Example:
        >>> parse_bytes("64MB"), parse_bytes("1MiB"), parse_bytes(10), parse_bytes("1.5G") == 3 * 2**29
        (64000000, 1048576, 10, True)
    """
    if isinstance(text, int):
        return text
    t = text.strip().upper().replace(" ", "")
    num = t.rstrip("KMGIB")
    unit = t[len(num) :]
    try:
        return int(float(num) * _UNITS[unit])
    except (KeyError, ValueError) as exc:
        raise PttError(f"cannot read size {text!r}; write e.g. 64MB, 512KiB, 1.5G or 24GiB.") from exc


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
        name in (MANIFEST, INDEX, JOURNAL, LMDB_DIR, LMDB_DIR + ".tmp", TARGETS)
        or (name.startswith("shard-") and (".ptt" in name or ".tar" in name))
        or (name.startswith((MANIFEST, INDEX, JOURNAL, TARGETS)) and ".tmp" in name)
    )


def open_regular(path: str) -> BinaryIO:
    """Open ``path`` for reading only if it is a regular file (after symlinks).

    A FIFO would block ``open`` forever, ``/dev/zero`` never ends and a directory raises ``IsADirectoryError``:
    opening non-blocking and checking ``fstat`` refuses all three without a race between check and open.

    Raises:
        ShardError: missing, not a regular file, or unreadable, naming ``path``.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError as exc:
        raise ShardError("file is missing (restore it or re-run `ptt pack`)", path=path) from exc
    except OSError as exc:
        raise ShardError(f"cannot open: {exc}", path=path) from exc
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ShardError(
                "not a regular file (a directory, FIFO or device stands where a pack file should be): "
                "restore the file or re-run `ptt pack`",
                path=path,
            )
        if hasattr(os, "set_blocking"):
            os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def file_sha256(path: str) -> str:
    """SHA-256 of a regular file, read in 1 MiB chunks (a directory, FIFO or device is a ``ShardError``)."""
    import hashlib

    h = hashlib.sha256()
    with open_regular(path) as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def regular_size(path: str) -> int:
    """Size in bytes of the regular file ``path`` (``ShardError`` when missing or not a regular file)."""
    with open_regular(path) as fh:
        return os.fstat(fh.fileno()).st_size


def _is_count(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x >= 0


def _safe_name(name: Any) -> bool:
    return (
        isinstance(name, str)
        and name not in ("", ".", "..")
        and "/" not in name
        and "\\" not in name
        and "\0" not in name
    )


def check_manifest(m: Any, path: str) -> dict[str, Any]:
    """``m`` if it has the shape ``ptt pack`` writes, with counts that add up; else a ``ShardError``."""

    def bad(what: str) -> ShardError:
        return ShardError(
            f"{what}: the manifest is corrupt or was not written by ptt pack (re-pack)", path=path
        )

    if not isinstance(m, dict) or m.get("format") not in ("ptt", "tar", "lmdb") or "shards" not in m:
        raise bad("manifest lacks format/shards")
    if not _is_count(m.get("count")):
        raise bad(f"count {m.get('count')!r} is not a non-negative integer")
    classes = m.get("classes", [])
    if not isinstance(classes, list) or not all(isinstance(c, str) for c in classes):
        raise bad("classes is not a list of names")
    m.setdefault("classes", classes)
    cc = m.get("class_counts", [])
    if not isinstance(cc, list) or not all(_is_count(c) for c in cc):
        raise bad("class_counts is not a list of non-negative integers")
    m.setdefault("class_counts", cc)
    shards = m["shards"]
    if not isinstance(shards, list):
        raise bad("shards is not a list")
    for k, s in enumerate(shards):
        if not isinstance(s, dict) or not _safe_name(s.get("name")):
            raise bad(f"shard entry {k} has no plain file name")
        if not _is_count(s.get("count")) or not _is_count(s.get("bytes", 0)):
            raise bad(f"shard entry {k} ({s.get('name')!r}) has a bad count or byte size")
        sha = s.get("sha256")
        if sha is not None and not (isinstance(sha, str) and len(sha) == 64):
            raise bad(f"shard entry {k} ({s['name']!r}) has a bad sha256")
    if m["format"] == "lmdb" and (len(shards) != 1 or shards[0]["name"] != LMDB_DIR):
        raise bad(f"an LMDB pack lists exactly one shard, {LMDB_DIR!r}")
    total = sum(s["count"] for s in shards)
    if total != m["count"]:
        raise bad(f"the shards hold {total} samples in all, the manifest count says {m['count']}")
    if len(set(s["name"] for s in shards)) != len(shards):
        raise bad("a shard is listed twice")
    for key in ("rejects", "options"):
        if key in m and not isinstance(m[key], list if key == "rejects" else dict):
            raise bad(f"{key} has the wrong type")
    return m


def read_manifest_if_complete(dst: str) -> dict[str, Any] | None:
    path = os.path.join(dst, MANIFEST)
    if not os.path.exists(path):
        return None
    return load_manifest(dst)


def load_manifest(dst: str) -> dict[str, Any]:
    """The manifest of a complete pack, checked for shape and for counts that add up.

    Raises:
        ShardError: no manifest (not a pack, or packing did not finish), malformed JSON or fields.
    """
    path = os.path.join(os.fspath(dst), MANIFEST)
    if not os.path.lexists(path):
        raise ShardError(
            "no manifest.json: not a pack, or packing did not finish (re-run `ptt pack` to complete it)",
            path=path,
        )
    with open_regular(path) as fh:
        try:
            m = json.loads(fh.read())
        except (OSError, ValueError, RecursionError) as exc:  # RecursionError: deeply nested JSON
            raise ShardError(f"unreadable manifest: {exc}", path=path) from exc
    return check_manifest(m, path)


def save_index(dst: str, index: np.ndarray) -> None:
    """Write ``index.npy`` atomically (the rows come from the format: ``ptt_format.ptt_index``,
    ``lmdb_format.lmdb_index``)."""
    path = os.path.join(dst, INDEX)
    tmp = f"{path}.tmp{os.getpid()}.npy"
    np.save(tmp, index, allow_pickle=False)
    os.replace(tmp, path)


def load_index(dst: str, count: int) -> np.ndarray:
    """The memmapped index; checked against the manifest's count. Never unpickles (``allow_pickle=False``)."""
    path = os.path.join(dst, INDEX)
    if not os.path.lexists(path):
        raise ShardError("index.npy is missing (re-run `ptt pack`)", path=path)
    with open_regular(path) as fh:  # refuses a FIFO, a directory or a device before numpy opens it
        if os.fstat(fh.fileno()).st_size == 0:
            raise ShardError("index.npy is empty (re-run `ptt pack`)", path=path)
    try:
        index = np.load(path, mmap_mode="r", allow_pickle=False)
    except Exception as exc:  # a corrupt .npy header raises anything from tokenize.TokenError to EOFError
        raise ShardError(
            f"unreadable index ({type(exc).__name__}: {exc}); re-run `ptt pack`", path=path
        ) from exc
    if not isinstance(index, np.ndarray) or index.dtype != INDEX_DTYPE or index.shape != (count,):
        raise ShardError(
            f"index has {getattr(index, 'shape', '?')} rows of {getattr(index, 'dtype', '?')}, manifest says "
            f"{count}: index and shards do not match",
            path=path,
        )
    return index


_CHECK_BLOCK = 1 << 16  # index rows checked at a time: a few hundred KB, within a core's L2


def check_index(dst: str, manifest: dict[str, Any], index: np.ndarray) -> None:
    """Cheap open-time cross-checks of ``index.npy`` against the manifest (shard tables: ``ptt_format.check_ptt_shard``).

    ptt rows must name the listed shards in order, with the manifest's per-shard counts; the labels must give
    the manifest's class histogram.

    Raises:
        ShardError: any mismatch, naming the file.
    """
    ipath = os.path.join(dst, INDEX)
    shards = manifest["shards"]
    counts = np.asarray([s["count"] for s in shards], dtype=np.int64)
    classes, cc = manifest["classes"], manifest["class_counts"]
    by_class = bool(classes) and len(cc) == len(classes)
    ptt = manifest["format"] == "ptt"
    # In blocks of rows that stay in the core's cache, so the cost per row is the same at 10K rows and at 10M.
    # ptt rows name their shard: non-decreasing with each shard's count is exactly the manifest's order.
    seen_shards = np.zeros(len(shards), np.int64)
    seen_labels = np.zeros(len(classes) if by_class else 0, np.int64)
    last, rows_ok, labels_ok = 0, ptt, by_class  # each check stops at its first bad block; the other goes on
    for start in range(0, len(index), _CHECK_BLOCK):
        block = index[start : start + _CHECK_BLOCK]  # never empty
        if rows_ok:
            s = np.asarray(block["shard"], dtype=np.int64)
            rows_ok = bool(s[0] >= last and s[-1] < len(shards) and (s[1:] >= s[:-1]).all())
            if rows_ok:
                seen_shards += np.bincount(s, minlength=len(shards))
                last = int(s[-1])
        if labels_ok:
            lab = np.asarray(block["label"], dtype=np.int64)
            labels_ok = bool(lab.min() >= 0 and lab.max() < len(classes))
            if labels_ok:
                seen_labels += np.bincount(lab, minlength=len(classes))
    if ptt and (not rows_ok or not np.array_equal(seen_shards, counts)):
        raise ShardError(
            "index rows do not match the manifest's shards: index and shards do not match", path=ipath
        )
    if by_class and (not labels_ok or seen_labels.tolist() != cc):
        raise ShardError(
            "index labels do not give the manifest's class counts: the index is corrupt (re-run `ptt pack`)",
            path=ipath,
        )
