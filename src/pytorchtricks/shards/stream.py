"""``ShardStream``: an iterable over ptt or tar shards (a folder or a URL) with shard + window shuffle, exact
rank/worker splits at any world size, and mid-epoch resume at another world size.

Per epoch the global order is fixed by ``(seed, epoch)`` alone: shards are permuted and a window shuffle
(``buffer_size``) is computed on the sample positions - without reading data. Rank r of W takes an equal part of it,
blocked or interleaved (``split``), padding or dropping the remainder (``uneven``). DataLoader workers take the
rank's order in blocks of ``batch_size``, round robin, which is exactly how an in-order DataLoader interleaves
them: the loader yields the rank's order, whatever the number of workers. So every sample appears once per epoch
across ranks x workers, and the samples each rank has taken (ranks step in lockstep) are all a resume needs - at
this world size or another (``remaining_positions``). Tar shards are read in order (a worker scans each shard once
and decodes only its own samples); ptt shards are read by offset. Shards at a URL come through the node cache
(``shards.cache``), prefetched ahead of use.
"""

from __future__ import annotations

import dataclasses
import glob
import os
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import torch

from pytorchtricks.core import PttError, config_first, options_of
from pytorchtricks.data.errors import DecodeError, ShardError
from pytorchtricks.shards import layout, ptt_format
from pytorchtricks.shards.cache import Prefetcher, RemotePack, open_pack
from pytorchtricks.shards.dataset import Decode, check_on_error, make_decoder
from pytorchtricks.shards.record import decode_record
from pytorchtricks.shards.remote import is_url, scrub_url
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


def window_shuffle_order(n: int, window: int, rng: np.random.Generator) -> np.ndarray:
    """A local shuffle of ``0..n-1``: each position moves less than ``window`` places (vectorised; no data read).

    Sorting ``i + U[0, window)`` mixes every sample with its ``window`` neighbours, like a streaming shuffle
    buffer of that size, at numpy speed (10M samples in about a second) - the global order of every rank.

    Example:
        >>> o = window_shuffle_order(10, 4, np.random.default_rng(0))
        >>> sorted(o.tolist()) == list(range(10)), bool(np.abs(o - np.arange(10)).max() < 4)
        (True, True)
    """
    keys = np.arange(n, dtype=np.float64) + rng.random(n) * max(1, int(window))
    return np.argsort(keys, kind="stable")


SPLITS = ("blocked", "interleaved")
UNEVEN = ("pad", "drop")


def split_positions(m: int, world: int, split: str, uneven: str) -> list[np.ndarray]:
    """The positions ``0..m-1`` of what is left of an epoch, cut into ``world`` parts of equal length.

    ``blocked``: rank r takes a contiguous run (a node's consecutive ranks read neighbouring shards, so each node
    downloads about its share); ``interleaved``: rank r takes r, r + world, ... . ``uneven="pad"`` repeats the
    first positions so every rank gets ``ceil(m / world)``; ``"drop"`` leaves the last ``m % world`` out.

    Example:
        >>> [p.tolist() for p in split_positions(5, 2, "blocked", "pad")]
        [[0, 1, 2], [3, 4, 0]]
        >>> [p.tolist() for p in split_positions(5, 2, "interleaved", "drop")]
        [[0, 2], [1, 3]]
    """
    per = -(-m // world) if uneven == "pad" else m // world
    idx = np.arange(per * world, dtype=np.int64) % max(m, 1)
    if split == "blocked":
        return [idx[r * per : (r + 1) * per] for r in range(world)]
    return [idx[r::world] for r in range(world)]


def remaining_positions(n: int, history: list[tuple[int, int]], split: str, uneven: str) -> np.ndarray:
    """Global-order positions not yet taken after each ``(world_size, samples_per_rank)`` stage of ``history``.

    Ranks step in lockstep, so the state of one rank (its count) gives every rank's: the taken set is exact, and
    the rest of the epoch is split again at the next world size - no sample repeated (beyond padding) or skipped.

    Example:
        >>> remaining_positions(8, [(2, 2)], "blocked", "pad").tolist()  # ranks took 0,1 and 4,5
        [2, 3, 6, 7]
    """
    rem = np.arange(n, dtype=np.int64)
    for world, k in history:
        parts = split_positions(len(rem), int(world), split, uneven)
        taken = np.concatenate([p[: int(k)] for p in parts]) if parts else np.zeros(0, np.int64)
        keep = np.ones(len(rem), dtype=bool)
        keep[taken] = False
        rem = rem[keep]
    return rem


@dataclasses.dataclass(frozen=True)
class StreamConfig:
    """``ShardStream``'s options as one value: ``ptt.ShardStream(url, config=ptt.StreamConfig(seed=3, rank=r))`` (the
    keywords of ``ShardStream`` are a convenience over it; see there for what each does).

    Example:
        >>> import tempfile, os; from PIL import Image
        >>> src = tempfile.mkdtemp(); os.makedirs(f"{src}/a")
        >>> for i in range(4): Image.new("RGB", (8, 8), (i, 0, 0)).save(f"{src}/a/{i}.png")
        >>> dst = tempfile.mkdtemp() + "/p"; _ = ptt.pack(src, dst, format="tar", workers=0)
        >>> half = ptt.StreamConfig(seed=1, decode=None, rank=0, world_size=2)
        >>> len(list(ptt.ShardStream(dst, config=half)))
        2
    """

    shuffle: bool = True
    seed: int = 0
    decode: Decode = "auto"
    transform: Callable[[Any], Any] | None = None
    buffer_size: int = 1000
    batch_size: int = 1
    rank: int | None = None
    world_size: int | None = None
    on_error: str = "raise"
    split: str = "blocked"
    uneven: str = "pad"
    cache_dir: str | os.PathLike[str] | None = None
    cache_limit: int | str | None = None
    prefetch: int = 2


class ShardStream(torch.utils.data.IterableDataset):
    """Iterate a packed dataset (ptt or tar, a folder or a URL) as ``(image, label, extras)``, each sample once.

    The global order of an epoch is a function of ``(seed, epoch)`` only: shards permuted, then a window shuffle
    (``buffer_size``). Rank r of W takes a ``split`` part of it ("blocked" or "interleaved"), every rank the same
    number of samples (``uneven="pad"`` repeats a few, ``"drop"`` leaves up to W-1 out per epoch), so ranks step in
    lockstep and no rank waits at a collective. DataLoader workers take the rank's order in blocks of
    ``batch_size``, round robin - how an in-order DataLoader interleaves them - so the loader yields the rank's
    order whatever the number of workers. ``state_dict()`` after k samples per rank resumes the epoch at any
    world size: ``ShardStream(url, rank=r, world_size=W2, seed=s).load_state_dict(state)``.

    Args:
        path: a pack folder (manifest) or its URL (``s3://``, ``gs://``, ``az://``, ``http(s)://``, ``file://``),
            or foreign WebDataset tars: a brace pattern or a list of local paths.
        shuffle, seed: shard permutation + window shuffle, fixed by ``(seed, epoch)``; ``set_epoch`` each epoch.
        decode, transform, on_error: as ``ShardDataset`` (``on_error="skip"`` drops bad samples with a warning).
        buffer_size: shuffle window in samples. batch_size: the DataLoader's batch size (worker split blocks).
        rank, world_size: explicit split; default from ``torch.distributed`` when initialised, else (0, 1).
        split: ``"blocked"`` (default) or ``"interleaved"``. uneven: ``"pad"`` (default) or ``"drop"``.
        cache_dir, cache_limit, prefetch: for URLs, the node-shared cache (``shards.cache``), its bound in bytes
            (``"20GB"``; None: unbounded) and how many shards ahead each reader downloads.
        config: a ``StreamConfig``; the options above are its fields, given as it or as keywords (not both).

    Example:
        >>> import tempfile, os; from PIL import Image
        >>> src = tempfile.mkdtemp(); os.makedirs(f"{src}/a")
        >>> for i in range(3): Image.new("RGB", (8, 8), (i, 0, 0)).save(f"{src}/a/{i}.png")
        >>> dst = tempfile.mkdtemp() + "/p"; _ = ptt.pack(src, dst, format="tar", workers=0)
        >>> s = ptt.ShardStream(dst, seed=1); len(s), sorted(lab for _, lab, _ in s)
        (3, [0, 0, 0])
    """

    @options_of(StreamConfig)
    def __init__(
        self, path: str | os.PathLike[str] | list[str], config: StreamConfig | None = None, **options: Any
    ) -> None:
        super().__init__()
        cfg = config_first(config, StreamConfig, options)
        self.shuffle, self.seed = bool(cfg.shuffle), int(cfg.seed)
        self.decode, self.transform = cfg.decode, cfg.transform
        self._decode = make_decoder(cfg.decode)
        self.on_error = check_on_error(cfg.on_error)
        if cfg.buffer_size < 1 or cfg.batch_size < 1:
            raise PttError("buffer_size and batch_size must be >= 1.")
        if cfg.split not in SPLITS or cfg.uneven not in UNEVEN:
            raise PttError(
                f"split must be one of {SPLITS} and uneven one of {UNEVEN}; got {cfg.split!r}, {cfg.uneven!r}."
            )
        self.buffer_size, self.batch_size = int(cfg.buffer_size), int(cfg.batch_size)
        self.split, self.uneven, self.prefetch = cfg.split, cfg.uneven, int(cfg.prefetch)
        self._rank, self._world = cfg.rank, cfg.world_size
        cache_dir, cache_limit = cfg.cache_dir, cfg.cache_limit
        self.epoch = 0
        self._resume: tuple[int, list[tuple[int, int]]] | None = None  # (epoch, earlier stages)
        self._consumed = 0
        self._plan_key: Any = None
        self._plan: Any = None
        self.classes: list[str] = []
        #: foreign tars whose samples carry no ``.crc32`` checksum: read, but a flipped byte goes unnoticed
        self.unverified: list[str] = []
        self._entries: list[dict[str, Any]] = []
        self._remote: RemotePack | None = None
        if isinstance(path, str) and is_url(path):
            local, self._remote = open_pack(path, cache_dir, cache_limit)
            self.url: str | None = scrub_url(path)
            path = local
        else:
            self.url = None
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
        # the key of each shard's first sample: counted over the pack, or listed (a --distributed pack's first_key)
        listed = [e.get("first_key") for e in self._entries]
        ok = bool(listed) and all(isinstance(k, int) for k in listed)
        self._key0 = np.asarray(listed, dtype=np.int64) if ok else self._first
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
        state["_plan"], state["_plan_key"] = None, None  # 3 int64 per sample: recomputed, not pickled
        state.pop("_maps", None)
        return state

    # ------------------------------------------------------------------ epoch, split and resume

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)
        self._consumed = 0

    def rank_world(self) -> tuple[int, int]:
        """This stream's ``(rank, world_size)``: the ones it was given, else torch.distributed's (the loaders' one
        rule, ``data.batches.rank_world``)."""
        from pytorchtricks.data.batches import rank_world

        return rank_world(self._rank, self._world)

    def _history(self) -> list[tuple[int, int]]:
        """The earlier stages of this epoch (resumed from a state saved at some world size), else none."""
        if self._resume is not None and self._resume[0] == self.epoch:
            return list(self._resume[1])
        return []

    def __len__(self) -> int:
        """Samples this rank yields per epoch (all its DataLoader workers together); equal on every rank."""
        return len(self._part())

    def state_dict(self, consumed: int | None = None) -> dict[str, Any]:
        """``{"epoch", "seed", "consumed", "world_size", "split", "uneven", "history"}``.

        ``consumed``: samples this rank has taken in the epoch (with DataLoader workers, pass the loop's count:
        batches x batch_size); ranks step in lockstep, so any rank's state resumes all of them.
        """
        _, world = self.rank_world()
        return {
            "epoch": self.epoch,
            "seed": self.seed,
            "consumed": int(self._consumed if consumed is None else consumed),
            "world_size": world,
            "split": self.split,
            "uneven": self.uneven,
            "history": [list(h) for h in self._history()],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume: the next iteration of ``state["epoch"]`` yields what no rank took yet, split at this world size.

        A state from before elastic resume (no ``world_size``) is read as saved at this stream's world size.
        """
        if int(state.get("seed", self.seed)) != self.seed:
            raise PttError(f"state was saved with seed {state['seed']}, this stream has seed {self.seed}.")
        for key, mine in (("split", self.split), ("uneven", self.uneven)):
            if state.get(key, mine) != mine:
                raise PttError(f"state was saved with {key}={state[key]!r}, this stream has {key}={mine!r}.")
        world = int(state.get("world_size", self.rank_world()[1]))
        history = [(int(w), int(k)) for w, k in state.get("history", [])] + [(world, int(state["consumed"]))]
        self.epoch = int(state["epoch"])
        self._consumed = 0
        self._resume = (self.epoch, history)

    def _global(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(sid, local, order)`` of the whole epoch: shard-ordered sequence and its global shuffled order."""
        key = (self.epoch, self.shuffle)
        if self._plan_key != key:
            shards = np.arange(len(self._counts))
            if self.shuffle:
                shards = np.random.default_rng([self.seed, self.epoch]).permutation(shards)
            sid = np.repeat(shards, self._counts[shards])
            local = (
                np.concatenate([np.arange(c) for c in self._counts[shards]])
                if len(shards)
                else np.zeros(0, np.int64)
            )
            order = (
                window_shuffle_order(
                    len(sid), self.buffer_size, np.random.default_rng([self.seed, self.epoch, 1])
                )
                if self.shuffle
                else np.arange(len(sid))
            )
            self._plan_key, self._plan = key, (sid, local, order)
        return self._plan

    def _part(self) -> np.ndarray:
        """This rank's part of the epoch: indices into the global order, in yield order."""
        rank, world = self.rank_world()
        rem = remaining_positions(len(self._global()[0]), self._history(), self.split, self.uneven)
        parts = split_positions(len(rem), world, self.split, self.uneven)
        return rem[parts[rank]]

    def rank_order(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(sid, local, order)``: this rank's samples in shard-reading order, and the order they are yielded in."""
        sid_all, local_all, gorder = self._global()
        seq = gorder[self._part()]  # sequence indices (shard-ordered) in yield order
        by_seq = np.argsort(
            seq, kind="stable"
        )  # reading order: each shard one run, padded repeats side by side
        order = np.empty(len(seq), dtype=np.int64)
        order[by_seq] = np.arange(len(seq))
        return sid_all[seq[by_seq]], local_all[seq[by_seq]], order

    # ------------------------------------------------------------------ iteration

    def __iter__(self) -> Iterator[tuple[Any, int, dict[str, Any]]]:
        info = torch.utils.data.get_worker_info()
        wid, nw = (info.id, info.num_workers) if info is not None else (0, 1)
        sid, local, order = self.rank_order()
        pos = np.arange(len(order))
        mine = pos[(pos // self.batch_size) % nw == wid]
        wanted = order[mine]  # positions in the rank sequence, in yield order
        fetch = self._fetcher(sid, wanted)
        try:
            source = (
                self._read_ptt(sid, local, wanted, fetch)
                if self.format == "ptt"
                else self._read_tar(sid, local, wanted, fetch)
            )
            self._consumed = 0
            for item in source:
                if item is None:
                    continue
                self._consumed += 1
                yield item
        finally:
            if fetch is not None:
                fetch.shutdown()
        self._resume = None

    def _fetcher(self, sid: np.ndarray, wanted: np.ndarray) -> Prefetcher | None:
        """For a URL: the shards this reader touches, in order of first use, fetched ``prefetch`` ahead."""
        if self._remote is None:
            return None
        touched = sid[wanted] if self.format == "ptt" else sid[np.sort(wanted)]
        _, first = np.unique(touched, return_index=True)
        plan = [int(s) for s in touched[np.sort(first)]]
        remote = self._remote
        return Prefetcher(remote.pin, plan, self.prefetch)

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

    def _read_ptt(
        self, sid: np.ndarray, local: np.ndarray, wanted: np.ndarray, fetch: Prefetcher | None
    ) -> Iterator[Any]:
        from pytorchtricks.shards.ptt_format import MappedShard

        if self._index is None or self._pid != os.getpid():
            self._pid = os.getpid()
            self._index = layout.load_index(self.root, int(self._counts.sum()))
            self._maps: dict[int, MappedShard] = {}
        index = self._index
        last: dict[int, int] = {}
        cap = self._open_cap()
        if fetch is not None:  # a cached shard is released (evictable) after this reader's last sample of it
            last = {int(s): k for k, s in enumerate(sid[wanted].tolist())}
        for k, q in enumerate(wanted):
            s, g = int(sid[q]), int(self._first[sid[q]] + local[q])
            row = index[g]
            try:
                mm = self._maps.get(s)
                if (
                    mm is None
                ):  # first read of this shard in this process: check it against manifest and index
                    if fetch is not None and cap is not None:
                        while self._maps and len(self._maps) >= cap:  # the least recently opened makes room
                            old = next(iter(self._maps))
                            self._maps.pop(old)
                            fetch.close(old)
                    path = self._files[s] if fetch is None else fetch.open(s)
                    lo = int(self._first[s])
                    ptt_format.check_ptt_shard(path, self._entries[s], index[lo : lo + self._counts[s]], g)
                    mm = self._maps[s] = MappedShard(path)
                rec = mm.slice(int(row["offset"]), int(row["length"]), g)
                payload, label, extras = decode_record(
                    rec, path=mm.path, index=g, crc=int(row["crc"]), label=int(row["label"])
                )
                if isinstance(payload, np.ndarray):
                    payload = payload.copy()
                del rec
            except ShardError as exc:
                yield self._bad(exc)
                continue
            finally:
                if fetch is not None and last.get(s) == k:
                    self._maps.pop(s, None)
                    fetch.close(s)
            yield self._finish(payload, label, extras, mm.path, g)

    def _open_cap(self) -> int | None:
        """With a bounded cache: how many shards one reader keeps open (the rest of the limit is prefetch)."""
        if self._remote is None or self._remote.cache.limit is None:
            return None
        largest = max((int(e.get("bytes") or 0) for e in self._entries), default=0) or 1
        return max(1, self._remote.cache.limit // largest - self.prefetch - 2)

    def _read_tar(
        self, sid: np.ndarray, local: np.ndarray, wanted: np.ndarray, fetch: Prefetcher | None
    ) -> Iterator[Any]:
        need = set(wanted.tolist())
        pending: dict[int, Any] = {}
        reader = self._scan_tar(sid, local, need, fetch)
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

    def _scan_tar(
        self, sid: np.ndarray, local: np.ndarray, need: set[int], fetch: Prefetcher | None
    ) -> Iterator[tuple[int, Any]]:
        """(rank position, (payload, label, extras, file, record) or ShardError) for needed positions, in order.

        The rank's sequence holds each shard as one run of sample indices in increasing order (a subset of the
        shard; a padded repeat twice): the shard is scanned once, up to the last sample the run needs."""
        q = 0
        m = len(sid)
        ours = bool(self._entries)  # a pack we wrote: sizes as listed, every sample carries its checksum
        while q < m:
            s = int(sid[q])
            start, stop = q, q
            while stop < m and int(sid[stop]) == s:
                stop += 1
            if not any(p in need for p in range(start, stop)):
                q = stop
                continue
            path = self._files[s]
            err: ShardError | None = None
            p = start  # next position of the run to serve
            try:
                if fetch is not None:
                    path = fetch.open(s)
                if ours:
                    self._check_tar_size(s, path)
                want_last = int(local[stop - 1])
                to_end = ours and want_last + 1 == int(self._counts[s])  # the run reaches the shard's end
                groups = enumerate(iter_tar_groups(path))
                seen = 0
                for j, (key, group) in groups:
                    if j > want_last:
                        break
                    seen = j + 1
                    if int(local[p]) != j:
                        continue
                    if j == want_last and to_end and next(groups, None) is not None:
                        raise ShardError(  # caught below: this and no later sample of the shard is yielded
                            f"shard holds more than the {int(self._counts[s])} samples the manifest says: "
                            "manifest and shards do not match (re-run `ptt pack`)",
                            path=path,
                            record=j + 1,
                        )
                    if ours and key != f"{int(self._key0[s]) + j:09d}":  # consecutive within a shard
                        raise ShardError(  # caught below: the rest of the shard is refused
                            f"sample key {key!r} where the manifest puts key {int(self._key0[s]) + j}: shards "
                            "swapped, replaced or reordered (restore them or re-run `ptt pack`)",
                            path=path,
                            record=j,
                        )
                    got: Any = None
                    while p < stop and int(local[p]) == j:
                        if p in need:
                            if got is None:
                                try:
                                    payload, label, extras = tar_sample(
                                        key, group, path=path, index=j, require_crc=ours
                                    )
                                    got = (payload, label, extras, path, j)
                                except ShardError as exc:
                                    got = exc
                            yield p, got
                        p += 1
                    if p >= stop:
                        break
                if p < stop:
                    err = ShardError(
                        f"shard ends after {seen} samples: fewer than the manifest says", path=path
                    )
            except ShardError as exc:
                err = exc
            finally:
                if fetch is not None:
                    fetch.close(s)
            for r in range(p, stop):  # the rest of this shard cannot be read
                if r in need:
                    yield r, err
            q = stop

    def _check_tar_size(self, s: int, path: str) -> None:
        size = layout.regular_size(path)
        want = self._entries[s].get("bytes")
        if want is not None and size != want:
            raise ShardError(
                f"shard is {size} bytes, the manifest says {want}: truncated, replaced or swapped "
                "(restore it or re-run `ptt pack`)",
                path=path,
            )
