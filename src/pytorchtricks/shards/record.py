"""One sample as bytes: ``u32 meta_len | meta JSON | payload``, checked by a CRC32 kept beside it.

``meta`` holds the label, the payload kind (``jpeg``, ``png``, ... or ``raw`` for a uint8 HWC array with its
``shape``) and the sample's extras. JSON only: nothing in a shard is ever unpickled.
"""

from __future__ import annotations

import json
import struct
import zlib
from typing import Any

import numpy as np

from pytorchtricks.data.errors import ShardError

_U32 = struct.Struct("<I")
ENCODED_KINDS = ("jpeg", "png", "webp", "bmp", "gif", "tiff")


try:  # ISA-L computes the same CRC-32 (zlib polynomial) about 50x faster than zlib's table code
    from isal.isal_zlib import crc32 as _crc32
except ImportError:  # pragma: no cover - isal is in the `data` extra
    _crc32 = zlib.crc32


def crc32(data: Any) -> int:
    return _crc32(data) & 0xFFFFFFFF


def encode_record(
    payload: bytes, *, label: int, kind: str, extras: dict[str, Any], shape: Any = None
) -> bytes:
    meta: dict[str, Any] = {"label": int(label), "kind": kind}
    if extras:
        meta["extras"] = extras
    if shape is not None:
        meta["shape"] = [int(s) for s in shape]
    m = json.dumps(meta, sort_keys=True, separators=(",", ":")).encode()
    return _U32.pack(len(m)) + m + payload


def decode_record(
    rec: Any, *, path: str, index: int, crc: int | None = None, label: int | None = None
) -> tuple[Any, int, dict[str, Any]]:
    """``(payload, label, extras)``; payload is bytes for encoded images, a uint8 array for ``raw`` records.

    ``crc`` and ``label`` are what the index says; the record must agree with both.

    Raises:
        ShardError: CRC mismatch, truncated record, malformed metadata or a label that differs from the index,
            naming ``path`` and ``index``.
    """
    if crc is not None and crc32(rec) != crc:
        raise ShardError(
            "CRC32 mismatch: the record is corrupt (re-pack or restore the shard)", path=path, record=index
        )
    meta, mlen = decode_meta(rec, path=path, index=index, label=label)
    kind = meta["kind"]
    stored = meta["label"]
    extras = meta.get("extras") or {}
    body = rec[4 + mlen :]
    if kind == "raw":
        try:
            shape = tuple(int(s) for s in meta["shape"])
            if any(s < 0 for s in shape) or int(np.prod(shape, dtype=object)) != len(body):
                raise ValueError(f"shape {shape} does not hold {len(body)} bytes")
            arr = np.frombuffer(body, dtype=np.uint8).reshape(shape)
        except (KeyError, ValueError, TypeError, OverflowError) as exc:
            raise ShardError(f"raw record does not match its shape: {exc}", path=path, record=index) from exc
        return arr, stored, extras
    return bytes(body), stored, extras


def decode_meta(
    rec: Any, *, path: str, index: int, label: int | None = None, total: int | None = None
) -> tuple[dict[str, Any], int]:
    """``(meta, meta_len)`` of a record from its first bytes (``rec`` may stop after the metadata: ``total`` is
    the whole record's length then). Not CRC-checked: the CRC covers the whole record, which the payload's read
    checks (``decode_record``).

    Raises:
        ShardError: truncated record, malformed metadata or a label that differs from the index.
    """
    n = len(rec) if total is None else total
    if n < 4:
        raise ShardError(f"record too short ({n} bytes)", path=path, record=index)
    (mlen,) = _U32.unpack_from(rec, 0)
    if 4 + mlen > n:
        raise ShardError(
            f"record metadata length {mlen} exceeds the record ({n} bytes)", path=path, record=index
        )
    if 4 + mlen > len(rec):
        raise ShardError(f"record metadata cut at {len(rec)} bytes of {4 + mlen}", path=path, record=index)
    try:
        meta = json.loads(bytes(rec[4 : 4 + mlen]))
        if not isinstance(meta, dict):
            raise ValueError("metadata is not an object")
        stored = meta["label"]
        kind = meta["kind"]
        if not isinstance(stored, int) or isinstance(stored, bool) or not isinstance(kind, str):
            raise ValueError(f"label {stored!r} / kind {kind!r} have the wrong type")
        extras = meta.get("extras") or {}
        if not isinstance(extras, dict):
            raise ValueError("extras is not an object")
    except (ValueError, KeyError, TypeError, RecursionError) as exc:  # RecursionError: deeply nested JSON
        raise ShardError(f"malformed record metadata: {exc}", path=path, record=index) from exc
    if label is not None and int(label) != stored:
        raise ShardError(
            f"label {stored} in the record differs from label {int(label)} in the index: the index is corrupt "
            "(re-run `ptt pack`)",
            path=path,
            record=index,
        )
    return meta, mlen
