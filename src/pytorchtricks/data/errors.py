"""The errors of reading a sample: its bytes are not an image (``DecodeError``, raised by ``data.decode``) or its
pack's shard, index or record is bad (``ShardError``, raised by the formats in ``shards/``).

Both live here, on the data floor below ``shards/``, because the loaders' batch reader (``data.batches``) skips a bad
sample whichever of the two it is, and nothing on this floor may import ``shards/``.
"""

from __future__ import annotations

from pytorchtricks.core import PttError


class ShardError(PttError):
    """A shard, index or record is missing, truncated or corrupt; the message names the file and the record.

    Attributes:
        path: the file that failed (shard, index, manifest or LMDB folder).
        record: the record index inside that file, or ``None`` when the whole file is bad.
        reason: the message without the file and record prefix.
    """

    def __init__(self, message: str, *, path: str | None = None, record: int | None = None) -> None:
        self.reason = message
        where = ""
        if path is not None:
            where = f"{path}" + (f", record {record}" if record is not None else "")
            message = f"{where}: {message}"
        super().__init__(message)
        self.path = path
        self.record = record


class DecodeError(PttError, ValueError):
    """Bytes that are not a decodable image (corrupt, truncated, or an unsupported format)."""
