"""``ShardDataset``: map-style random access to a ptt or lmdb pack, safe to fork into DataLoader workers.

The per-sample index is one memmapped numpy structured array (``index.npy``); shards are memory-mapped and LMDB
is opened lazily in each process (``lock=False, readahead=False, meminit=False``). Nothing per sample lives in a
Python list, so workers do not copy pages through reference counting (the ``ImageFolder.samples`` trap).
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np

from pytorchtricks.core import PttError
from pytorchtricks.data.errors import DecodeError, ShardError
from pytorchtricks.shards import layout, ptt_format
from pytorchtricks.shards.record import decode_record

Decode = str | Callable[[Any], Any] | None


def make_decoder(decode: Decode) -> Callable[[Any], Any] | None:
    """``"auto"`` -> ``decode_image`` (uint8 arrays pass through), ``None`` -> raw records, or a callable."""
    if decode is None:
        return None
    if callable(decode):
        return decode
    if isinstance(decode, str):
        from pytorchtricks.data.decode import BACKENDS, decode_image

        if decode != "auto" and decode not in BACKENDS:
            raise PttError(
                f"decode={decode!r}: use 'auto', a backend ({', '.join(BACKENDS)}), None or a callable."
            )

        def _decode(payload: Any) -> Any:
            if isinstance(payload, np.ndarray) and payload.ndim == 3:
                return payload
            return decode_image(payload, backend=decode)

        return _decode
    raise PttError(f"decode must be 'auto', a backend name, None or a callable, got {type(decode).__name__}.")


def check_on_error(on_error: str) -> str:
    if on_error not in ("raise", "skip"):
        raise PttError(f"on_error={on_error!r}: use 'raise' or 'skip'.")
    return on_error


class ShardDataset:
    """Random access to a packed dataset: ``ds[i] -> (image, label, extras)``.

    Args:
        path: the pack folder (``ptt pack SRC DST`` with ``--format ptt`` or ``lmdb``), or the URL of a ptt pack
            (``s3://``, ``gs://``, ``az://``, ``http(s)://``, ``file://``): shards arrive through the node cache.
        decode: ``"auto"`` (``decode_image``), a backend name, ``None`` (yield the stored record: JPEG bytes or the
            uint8 HWC array of a ``--raw`` pack), or a callable ``payload -> image``.
        transform: applied to the decoded image.
        on_error: ``"raise"`` a ``ShardError`` naming file and record, or ``"skip"``: warn and return the next
            readable sample instead (a map-style dataset must return something for every index).
        verify_crc: check each record's CRC32 on read (a few microseconds per 100 KB).
        cache_dir, cache_limit: for a URL, the node-shared shard cache and its bound in bytes (``"50GB"``). Random
            access touches every shard: with a bound, each process keeps only the shards that fit mapped and
            fetches the others again when asked (``ShardStream`` reads shard by shard and suits a small cache).

    Example:
        >>> import tempfile, os; from PIL import Image
        >>> src = tempfile.mkdtemp(); os.makedirs(f"{src}/dog")
        >>> Image.new("RGB", (32, 24), (9, 9, 9)).save(f"{src}/dog/a.jpg")
        >>> dst = tempfile.mkdtemp() + "/p"; _ = ptt.pack(src, dst, workers=0)
        >>> img, label, extras = ptt.ShardDataset(dst)[0]
        >>> img.shape, label, ptt.ShardDataset(dst).classes
        ((24, 32, 3), 0, ['dog'])
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        decode: Decode = "auto",
        transform: Callable[[Any], Any] | None = None,
        on_error: str = "raise",
        verify_crc: bool = True,
        *,
        cache_dir: str | os.PathLike[str] | None = None,
        cache_limit: int | str | None = None,
    ) -> None:
        from pytorchtricks.shards.cache import open_pack
        from pytorchtricks.shards.remote import scrub_url

        self.url = scrub_url(path) if isinstance(path, str) and "://" in path else None
        self.path, self._remote = open_pack(path, cache_dir, cache_limit)
        manifest = layout.load_manifest(self.path)
        self.format = manifest["format"]
        if self.format == "tar":
            raise PttError(
                f"{self.path} holds tar shards, which are read in order: use ptt.ShardStream(path)."
            )
        self.classes: list[str] = list(manifest["classes"])
        self._count = int(manifest["count"])
        self._shards = tuple(dict(s) for s in manifest["shards"])  # one entry per shard, not per sample
        self._first = np.concatenate([[0], np.cumsum([s["count"] for s in self._shards], dtype=np.int64)])
        self._decode = make_decoder(decode)
        self.transform = transform
        self.on_error = check_on_error(on_error)
        self.verify_crc = verify_crc
        index = layout.load_index(self.path, self._count)
        layout.check_index(self.path, manifest, index)  # counts, shard order, class histogram: cheap
        self.labels = np.array(index["label"], dtype=np.int64)
        self._reset()

    def _reset(self) -> None:
        self._pid = os.getpid()
        self._index: np.ndarray | None = None
        self._cols: tuple[np.ndarray, ...] = ()
        self._maps: dict[int, Any] = {}  # insertion order = least recently mapped first
        self._pins: dict[int, Any] = {}
        self._env: Any = None

    def __getstate__(self) -> dict[str, Any]:  # workers reopen files lazily; never pickle maps or the memmap
        state = dict(self.__dict__)
        for k in ("_index", "_maps", "_env", "_cols", "_pins"):
            state[k] = {} if k in ("_maps", "_pins") else None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._reset()

    def __len__(self) -> int:
        return self._count

    def _rows(self) -> np.ndarray:
        if self._pid != os.getpid():
            self._reset()
        if self._index is None:
            self._index = layout.load_index(self.path, self._count)
            # plain ndarray views of the memmapped columns: element access is ~50x cheaper than a memmap row
            self._cols = tuple(
                self._index[f].view(np.ndarray) for f in ("shard", "offset", "length", "crc", "label")
            )
        return self._index

    def read_raw(self, i: int) -> tuple[Any, int, dict[str, Any]]:
        """The stored record of sample ``i``: ``(jpeg_bytes_or_uint8_array, label, extras)``, CRC-checked."""
        n = self._count
        if not -n <= i < n:
            raise IndexError(f"sample {i} out of range for {n} samples")
        i = int(i) % n
        self._rows()
        c_shard, c_offset, c_length, c_crc, c_label = self._cols
        crc = int(c_crc[i]) if self.verify_crc else None
        if self.format == "ptt":
            sid = int(c_shard[i])
            mm = self._maps.get(sid)
            if mm is None:
                mm = self._map_shard(sid, i)
            elif self._remote is not None:
                self._maps[sid] = self._maps.pop(sid)  # most recently used last
            rec = mm.slice(int(c_offset[i]), int(c_length[i]), i)
            where = mm.path
        else:
            from pytorchtricks.shards.lmdb_format import lmdb_get, open_env

            where = os.path.join(self.path, layout.LMDB_DIR)
            if self._env is None:
                self._check_lmdb_size(where, i)
                self._env = open_env(where)  # one env per process, shared with other readers of the pack
            val = lmdb_get(self._env, i, where)
            stored = int.from_bytes(val[:4], "little")
            if crc is not None and stored != crc:
                raise ShardError(
                    "record CRC differs from the index: index and LMDB do not match", path=where, record=i
                )
            rec = val[4:]
        payload, label, extras = decode_record(rec, path=where, index=i, crc=crc, label=int(c_label[i]))
        if isinstance(payload, np.ndarray):
            payload = payload.copy()  # writable and detached from the memory map
        return payload, label, extras

    def read_extras(self) -> list[dict[str, Any]]:
        """Every record's extras (a detection pack's targets), in record order, reading only each record's
        metadata (``ptt_format.read_metas``: a page per record, not the whole pack). Not CRC-checked here: the CRC
        covers the whole record, and ``read_raw`` of the record checks it. An LMDB or remote pack reads whole
        records."""
        index = self._rows()
        if self.format != "ptt" or self._remote is not None:
            return [self.read_raw(i)[2] for i in range(self._count)]
        return [m.get("extras") or {} for m in ptt_format.read_metas(self.path, index, self._shards)]

    def _map_shard(self, sid: int, i: int) -> Any:
        """Map shard ``sid`` on its first read in this process, after checking it against manifest and index."""
        from pytorchtricks.shards.ptt_format import MappedShard

        if not 0 <= sid < len(self._shards):
            raise ShardError(f"index names shard {sid} of {len(self._shards)}", path=self.path, record=i)
        entry = self._shards[sid]
        path = os.path.join(self.path, entry["name"])
        if self._remote is not None:
            self._release_maps()
            self._pins[sid] = self._remote.pin(sid)
            path = self._pins[sid].path
        assert self._index is not None
        ptt_format.check_ptt_shard(path, entry, self._index[self._first[sid] : self._first[sid + 1]], i)
        mm = self._maps[sid] = MappedShard(path)
        if entry.get("bytes") is not None and mm.size != entry["bytes"]:  # replaced between check and map
            raise ShardError("shard changed size while being opened", path=path, record=i)
        return mm

    def _release_maps(self) -> None:
        """With a bounded cache: unmap (and unpin) the oldest shards so the next one fits beside the rest."""
        limit = self._remote.cache.limit if self._remote is not None else None
        if limit is None or not self._maps:
            return
        largest = max(int(s.get("bytes") or 0) for s in self._shards) or 1
        keep = max(1, limit // largest - 1)
        while len(self._maps) >= keep:
            old = next(iter(self._maps))
            self._maps.pop(old)
            pin = self._pins.pop(old, None)
            if pin is not None:
                pin.release()

    def _check_lmdb_size(self, where: str, i: int) -> None:
        want = self._shards[0].get("bytes")
        data = os.path.join(where, "data.mdb")
        size = layout.regular_size(data)
        if want is not None and size < want:  # grows when edited in place; shorter is always a cut file
            raise ShardError(
                f"data.mdb is {size} bytes, the manifest says {want}: truncated (restore it or re-run `ptt pack`)",
                path=data,
                record=i,
            )

    def _load(self, i: int) -> tuple[Any, int, dict[str, Any]]:
        payload, label, extras = self.read_raw(i)
        if self._decode is not None:
            try:
                payload = self._decode(payload)
            except DecodeError as exc:
                raise ShardError(f"image does not decode: {exc}", path=self.path, record=i) from exc
        if self.transform is not None:
            payload = self.transform(payload)
        return payload, label, extras

    def __getitem__(self, i: int) -> tuple[Any, int, dict[str, Any]]:
        try:
            return self._load(i)
        except ShardError as exc:
            if self.on_error == "raise":
                raise
            first = exc
        for k in range(1, self._count):
            j = (int(i) + k) % self._count
            try:
                out = self._load(j)
            except ShardError:
                continue
            warnings.warn(f"skipped a bad sample, returning sample {j} instead: {first}", stacklevel=2)
            return out
        raise first
