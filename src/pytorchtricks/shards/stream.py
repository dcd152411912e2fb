"""``ShardStream``: an iterable over ptt or tar shards with shard + buffer shuffle, exact DDP/worker splits, resume.

Per epoch the order is fixed by ``(seed, epoch)``: shards are permuted, the sample sequence is cut into one
contiguous slice per rank, and a buffer shuffle (buffer ``buffer_size``) is computed on the slice's sample
positions - without reading data - giving the rank's order. DataLoader workers take that order in blocks of
``batch_size``, round robin, which is exactly how an in-order DataLoader interleaves them: the loader yields the
rank's order, whatever the number of workers. So every sample appears once per epoch across ranks x workers, and
``consumed`` (samples the loop has taken) is all a resume needs. Tar shards are read in order (a worker scans its
slice and decodes only its own samples); ptt shards are read by offset.
"""

from __future__ import annotations

import glob
import os
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import torch

from pytorchtricks.core import PttError
from pytorchtricks.shards import layout, ptt_format
from pytorchtricks.shards.dataset import Decode, check_on_error, make_decoder
from pytorchtricks.shards.errors import DecodeError, ShardError
from pytorchtricks.shards.record import decode_record
from pytorchtricks.shards.tar_format import CRC_EXT, iter_tar_groups, tar_sample

_WARNED_UNVERIFIED: set[tuple[str, ...]] = set()  # foreign shard sets already warned about, once per process


def expand_braces(pattern: str) -> list[str]:
    """``"a-{000..002}.tar"`` -> three names (one brace group, zero-padded as written).

    Example:
        >>> expand_braces("s-{00..02}.tar")
        ['s-00.tar', 's-01.tar', 's-02.tar']
    """
    if "{" not in pattern:
        return sorted(glob.glob(pattern)) if any(c in pattern for c in "*?[") else [pattern]
    try:
        pre, rest = pattern.split("{", 1)
        body, post = rest.split("}", 1)
        if ".." not in body:
            return [pre + p + post for p in body.split(",")]
        lo, hi = body.split("..")
        width = len(lo)
        return [f"{pre}{i:0{width}d}{post}" for i in range(int(lo), int(hi) + 1)]
    except ValueError as exc:
        raise PttError(
            f"{pattern!r} is not a brace pattern like 'shard-{{000000..000009}}.tar': {exc}"
        ) from exc


def buffer_shuffle_order(m: int, buffer_size: int, rng: np.random.Generator) -> np.ndarray:
    """The output order of a streaming buffer shuffle over positions ``0..m-1`` (computed, nothing read).

    Example:
        >>> sorted(buffer_shuffle_order(10, 4, np.random.default_rng(0)).tolist()) == list(range(10))
        True
    """
    out = np.empty(m, dtype=np.int64)
    draws = rng.random(m)
    buf: list[int] = []
    o = 0
    for q in range(m):
        buf.append(q)
        if len(buf) >= buffer_size:
            k = int(draws[q] * len(buf))
            buf[k], buf[-1] = buf[-1], buf[k]
            out[o] = buf.pop()
            o += 1
    rest = np.asarray(buf, dtype=np.int64)
    rng.shuffle(rest)
    out[o:] = rest
    return out


class ShardStream(torch.utils.data.IterableDataset):
    """Iterate a packed dataset (ptt or tar) as ``(image, label, extras)``, each sample once per epoch.

    Args:
        path: a pack folder (manifest), or foreign WebDataset tars: a brace pattern or a list of paths.
        shuffle, seed: shard permutation + buffer shuffle, fixed by ``(seed, epoch)``; ``set_epoch`` each epoch.
        decode, transform, on_error: as ``ShardDataset`` (``on_error="skip"`` drops bad samples with a warning).
        buffer_size: shuffle buffer in samples. batch_size: the DataLoader's batch size (worker split blocks).
        rank, world_size: explicit split; default from ``torch.distributed`` when initialised, else (0, 1).

    Example:
        >>> import tempfile, os; from PIL import Image
        >>> src = tempfile.mkdtemp(); os.makedirs(f"{src}/a")
        >>> for i in range(3): Image.new("RGB", (8, 8), (i, 0, 0)).save(f"{src}/a/{i}.png")
        >>> dst = tempfile.mkdtemp() + "/p"; _ = ptt.pack(src, dst, format="tar", workers=0)
        >>> s = ptt.ShardStream(dst, seed=1); len(s), sorted(lab for _, lab, _ in s)
        (3, [0, 0, 0])
    """

    def __init__(
        self,
        path: str | os.PathLike[str] | list[str],
        shuffle: bool = True,
        seed: int = 0,
        decode: Decode = "auto",
        transform: Callable[[Any], Any] | None = None,
        *,
        buffer_size: int = 1000,
        batch_size: int = 1,
        rank: int | None = None,
        world_size: int | None = None,
        on_error: str = "raise",
    ) -> None:
        super().__init__()
        self.shuffle, self.seed = bool(shuffle), int(seed)
        self.decode, self.transform = decode, transform
        self._decode = make_decoder(decode)
        self.on_error = check_on_error(on_error)
        if buffer_size < 1 or batch_size < 1:
            raise PttError("buffer_size and batch_size must be >= 1.")
        self.buffer_size, self.batch_size = int(buffer_size), int(batch_size)
        self._rank, self._world = rank, world_size
        self.epoch = 0
        self._resume: tuple[int, int] | None = None
        self._consumed = 0
        self.classes: list[str] = []
        #: foreign tars whose samples carry no ``.crc32`` checksum: read, but a flipped byte goes unnoticed
        self.unverified: list[str] = []
        self._entries: list[dict[str, Any]] = []
        if isinstance(path, list | tuple) or (isinstance(path, str) and not os.path.isdir(path)):
            files = list(path) if isinstance(path, list | tuple) else expand_braces(path)
            if not files:
                raise PttError(f"no tar shards match {path!r}.")
            self.root, self.format = "", "tar"
            self._files = [os.fspath(f) for f in files]
            self._counts = np.asarray([self._count_foreign(f) for f in self._files], dtype=np.int64)
            if self.unverified and tuple(self._files) not in _WARNED_UNVERIFIED:
                _WARNED_UNVERIFIED.add(tuple(self._files))
                warnings.warn(
                    f"{len(self.unverified)} of {len(self._files)} tar shard(s) carry no per-sample checksums "
                    f"(first: {self.unverified[0]}): their samples are read unverified. Re-pack with `ptt pack` "
                    "to get checked reads.",
                    stacklevel=2,
                )
        else:
            self.root = os.fspath(path)
            m = layout.load_manifest(self.root)
            self.format = m["format"]
            if self.format == "lmdb":
                raise PttError(f"{self.root} is an LMDB pack: read it with ptt.ShardDataset(path).")
            self.classes = list(m["classes"])
            self._entries = [dict(s) for s in m["shards"]]
            self._files = [os.path.join(self.root, s["name"]) for s in m["shards"]]
            self._counts = np.asarray([s["count"] for s in m["shards"]], dtype=np.int64)
            if self.format == "ptt":  # counts, shard order and class histogram, before any sample is read
                layout.check_index(self.root, m, layout.load_index(self.root, int(self._counts.sum())))
        self._first = np.concatenate([[0], np.cumsum(self._counts)])[:-1]
        self._index: np.ndarray | None = None
        self._pid: int | None = None

    def _count_foreign(self, path: str) -> int:
        n = 0
        checked = True
        for _, group in iter_tar_groups(path):
            n += 1
            checked = checked and CRC_EXT in group
        if not checked:
            self.unverified.append(path)
        return n

    def __getstate__(self) -> dict[str, Any]:  # workers reopen the index and maps lazily
        state = dict(self.__dict__)
        state["_index"], state["_pid"] = None, None
        state.pop("_maps", None)
        return state

    # ------------------------------------------------------------------ epoch, split and resume

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)
        self._consumed = 0

    def rank_world(self) -> tuple[int, int]:
        if self._rank is not None or self._world is not None:
            rank, world = int(self._rank or 0), int(self._world or 1)
        elif torch.distributed.is_available() and torch.distributed.is_initialized():
            rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
        else:
            rank, world = 0, 1
        if not 0 <= rank < world:
            raise PttError(f"rank {rank} is not in [0, world_size={world}).")
        return rank, world

    def __len__(self) -> int:
        """Samples this rank yields per epoch (all its DataLoader workers together)."""
        rank, world = self.rank_world()
        n = int(self._counts.sum())
        return (rank + 1) * n // world - rank * n // world

    def state_dict(self, consumed: int | None = None) -> dict[str, int]:
        """``{"epoch", "seed", "consumed"}``. With DataLoader workers, pass the samples your loop has taken."""
        return {
            "epoch": self.epoch,
            "seed": self.seed,
            "consumed": int(self._consumed if consumed is None else consumed),
        }

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Resume: the next iteration of ``state["epoch"]`` skips its first ``consumed`` samples (not read)."""
        if int(state.get("seed", self.seed)) != self.seed:
            raise PttError(f"state was saved with seed {state['seed']}, this stream has seed {self.seed}.")
        self.epoch = int(state["epoch"])
        self._consumed = int(state["consumed"])
        self._resume = (self.epoch, self._consumed)

    def _rank_sequence(self) -> tuple[np.ndarray, np.ndarray]:
        """(shard id, index within shard) of this rank's samples, in reading order."""
        rank, world = self.rank_world()
        shards = np.arange(len(self._counts))
        if self.shuffle:
            shards = np.random.default_rng([self.seed, self.epoch]).permutation(shards)
        sid = np.repeat(shards, self._counts[shards])
        local = (
            np.concatenate([np.arange(c) for c in self._counts[shards]])
            if len(shards)
            else np.zeros(0, np.int64)
        )
        n = len(sid)
        lo, hi = rank * n // world, (rank + 1) * n // world
        return sid[lo:hi], local[lo:hi]

    def rank_order(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(sid, local, order)``: this rank's sequence and the order its positions are yielded in."""
        sid, local = self._rank_sequence()
        if self.shuffle:
            rank, _ = self.rank_world()
            order = buffer_shuffle_order(
                len(sid), self.buffer_size, np.random.default_rng([self.seed, self.epoch, rank])
            )
        else:
            order = np.arange(len(sid))
        return sid, local, order

    # ------------------------------------------------------------------ iteration

    def __iter__(self) -> Iterator[tuple[Any, int, dict[str, Any]]]:
        info = torch.utils.data.get_worker_info()
        wid, nw = (info.id, info.num_workers) if info is not None else (0, 1)
        skip = self._resume[1] if self._resume is not None and self._resume[0] == self.epoch else 0
        sid, local, order = self.rank_order()
        pos = np.arange(skip, len(order))
        mine = pos[((pos - skip) // self.batch_size) % nw == wid]  # blocks count from the resume point
        wanted = order[mine]  # positions in the rank sequence, in yield order
        source = (
            self._read_ptt(sid, local, wanted) if self.format == "ptt" else self._read_tar(sid, local, wanted)
        )
        self._consumed = skip
        for item in source:
            if item is None:
                continue
            self._consumed += 1
            yield item
        self._resume = None

    def _finish(self, payload: Any, label: int, extras: dict[str, Any], where: str, rec: int) -> Any:
        if self._decode is not None:
            try:
                payload = self._decode(payload)
            except DecodeError as exc:
                return self._bad(ShardError(f"image does not decode: {exc}", path=where, record=rec))
        if self.transform is not None:
            payload = self.transform(payload)
        return payload, label, extras

    def _bad(self, exc: ShardError) -> Any:  # None: the caller drops the sample
        if self.on_error == "raise":
            raise exc
        warnings.warn(f"skipped a bad sample: {exc}", stacklevel=3)
        return None

    def _read_ptt(self, sid: np.ndarray, local: np.ndarray, wanted: np.ndarray) -> Iterator[Any]:
        from pytorchtricks.shards.ptt_format import MappedShard

        if self._index is None or self._pid != os.getpid():
            self._pid = os.getpid()
            self._index = layout.load_index(self.root, int(self._counts.sum()))
            self._maps: dict[int, MappedShard] = {}
        index = self._index
        for q in wanted:
            s, g = int(sid[q]), int(self._first[sid[q]] + local[q])
            row = index[g]
            try:
                mm = self._maps.get(s)
                if (
                    mm is None
                ):  # first read of this shard in this process: check it against manifest and index
                    lo = int(self._first[s])
                    ptt_format.check_ptt_shard(
                        self._files[s], self._entries[s], index[lo : lo + self._counts[s]], g
                    )
                    mm = self._maps[s] = MappedShard(self._files[s])
                rec = mm.slice(int(row["offset"]), int(row["length"]), g)
                payload, label, extras = decode_record(
                    rec, path=self._files[s], index=g, crc=int(row["crc"]), label=int(row["label"])
                )
                if isinstance(payload, np.ndarray):
                    payload = payload.copy()
            except ShardError as exc:
                yield self._bad(exc)
                continue
            yield self._finish(payload, label, extras, self._files[s], g)

    def _read_tar(self, sid: np.ndarray, local: np.ndarray, wanted: np.ndarray) -> Iterator[Any]:
        need = set(wanted.tolist())
        pending: dict[int, Any] = {}
        reader = self._scan_tar(sid, local, need)
        for q in wanted:
            q = int(q)
            while q not in pending:
                try:
                    got_q, sample = next(reader)
                except StopIteration:
                    sample, got_q = (
                        ShardError("sample missing: shard ended early", path=self._files[int(sid[q])]),
                        q,
                    )
                pending[got_q] = sample
            sample = pending.pop(q)
            if isinstance(sample, ShardError):
                yield self._bad(sample)
                continue
            yield self._finish(*sample)

    def _scan_tar(self, sid: np.ndarray, local: np.ndarray, need: set[int]) -> Iterator[tuple[int, Any]]:
        """(rank position, (payload, label, extras, file, record) or ShardError) for needed positions, in order."""
        q = 0
        m = len(sid)
        ours = bool(self._entries)  # a pack we wrote: sizes as listed, every sample carries its checksum
        while q < m:
            s = int(sid[q])
            path = self._files[s]
            start, stop = q, q
            while stop < m and int(sid[stop]) == s:
                stop += 1
            lo = int(local[start])  # the slice may begin inside this shard
            to_end = ours and lo + (stop - start) == int(self._counts[s])  # the slice reaches the shard's end
            err: ShardError | None = None
            try:
                if ours:
                    self._check_tar_size(s)
                groups = enumerate(iter_tar_groups(path))
                for j, (key, group) in groups:
                    if j < lo:
                        continue
                    p = start + j - lo
                    if p >= stop:
                        break
                    if p + 1 == stop and to_end and next(groups, None) is not None:
                        raise ShardError(  # caught below: this and no later sample of the shard is yielded
                            f"shard holds more than the {int(self._counts[s])} samples the manifest says: "
                            "manifest and shards do not match (re-run `ptt pack`)",
                            path=path,
                            record=j + 1,
                        )
                    if ours and key != f"{int(self._first[s]) + j:09d}":  # keys count samples over the pack
                        raise ShardError(  # caught below: the rest of the shard is refused
                            f"sample key {key!r} where the manifest puts sample {int(self._first[s]) + j}: shards "
                            "swapped, replaced or reordered (restore them or re-run `ptt pack`)",
                            path=path,
                            record=j,
                        )
                    if p in need:
                        try:
                            payload, label, extras = tar_sample(
                                key, group, path=path, index=j, require_crc=ours
                            )
                            yield p, (payload, label, extras, path, j)
                        except ShardError as exc:
                            yield p, exc
                    q = p + 1
                err = ShardError(
                    f"shard ends after {q - start + lo} samples: fewer than the manifest says", path=path
                )
            except ShardError as exc:
                err = exc
            for p in range(q, stop):  # the rest of this shard cannot be read
                if p in need:
                    yield p, err
            q = stop

    def _check_tar_size(self, s: int) -> None:
        size = layout.regular_size(self._files[s])
        want = self._entries[s].get("bytes")
        if want is not None and size != want:
            raise ShardError(
                f"shard is {size} bytes, the manifest says {want}: truncated, replaced or swapped "
                "(restore it or re-run `ptt pack`)",
                path=self._files[s],
            )
