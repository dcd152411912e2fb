"""Decode every image once, at the training size, into one shared uint8 arena (RAM or local disk).

Why: after the first epoch the decode is the same work again; a decoded, downsized copy turns later epochs into
memory copies. One flat uint8 file plus an offset index (no Python objects per image) is mapped by every worker and
every DDP rank on the node: the page cache holds one copy per node, not one per rank (YOLOv5 keeps one per rank).
When: datasets whose decoded, resized pixels fit in RAM (``/dev/shm``) or on local disk (``cache_dir=...``).
Caveats: the admission check extrapolates from a sample of images and keeps a safety margin; if the arena would not
fit it warns and returns the dataset unchanged (``strict=True`` raises instead). The cache stores images with their
short side resized to ``size`` (aspect kept): random crops then come from that smaller image, not the original.
Rebuilt when the dataset length, size or key changes. The arena outlives the process by design (later runs and
other ranks reuse it) and holds its RAM in ``/dev/shm`` until removed: each call warns ``PttWarning`` with where it
is, its size and how to remove it; ``list_arenas()`` lists them, ``remove_arenas(paths or "all")`` frees them.
See also: make_loader, dataset_on_device; 借助内存 / YOLOv5 --cache ram.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import warnings
from typing import Any

import numpy as np
import torch

from pytorchtricks.core import BenchCase, NoEffectWarning, PttError, PttWarning, TrickInfo
from pytorchtricks.tricks.data._arena import (
    DEFAULT_DIR,
    FORMAT,
    CachedDataset,
    in_ram,
    list_arenas,
    remove_arenas,
)
from pytorchtricks.tricks.data._arena import (
    ArenaInfo as ArenaInfo,  # re-exported: ptt.ArenaInfo, what list_arenas returns
)
from pytorchtricks.tricks.data._images import decoders, is_encoded, read_item, resize_hwc, to_hwc
from pytorchtricks.tunable import TuneFacts, TuneHook, TuneSetup, TuneSkip, stored_side, unless_input_bound

__all__ = ["cache_in_ram", "list_arenas", "remove_arenas"]

TRICK = TrickInfo(gains=("speed",), phase=("train", "infer"), exact=False)


def _tune_applies(facts: TuneFacts) -> str | None:
    return unless_input_bound(facts, ("files", "pack"))


def _tune_prepare(setup: TuneSetup) -> Any:
    try:  # the admission check (estimate x 1.3 against the free RAM of /dev/shm) refuses with the numbers
        return cache_in_ram(setup.dataset, stored_side(setup.input_size), strict=True)
    except PttError as exc:
        raise TuneSkip(str(exc)) from exc


def _tune_apply(setup: TuneSetup, state: Any) -> None:
    setup.dataset, setup.loader = state, "ptt"


TUNE = TuneHook(
    changes="loader",
    check="data",
    receipt="dataset = ptt.cache_in_ram(dataset, size={cache_side})  # decoded once into /dev/shm",
    apply=_tune_apply,
    applies=_tune_applies,
    prepare=_tune_prepare,
    cost="cache",
    order=100,
    requires=("make_loader",),
    bound="decoded pixels >= 30 dB PSNR vs PIL full decode",
    group="dataset",
)

SAFETY = 1.3  # need x 1.3 must fit: sample estimates err, and the OS still needs page cache (YOLOv5 uses 1.1)


def _short_side(h: int, w: int, size: int | None) -> tuple[int, int]:
    if size is None or min(h, w) <= size:
        return h, w
    s = size / min(h, w)
    return max(size, round(h * s)), max(size, round(w * s))


def _decoded(raw: Any, size: int | None) -> np.ndarray:
    decode, size_of = decoders()
    if is_encoded(raw):
        h, w = size_of(raw)
        return np.ascontiguousarray(decode(raw, size=_short_side(h, w, size)))
    arr = to_hwc(raw)
    return np.ascontiguousarray(resize_hwc(arr, _short_side(arr.shape[0], arr.shape[1], size)))


def _free_bytes(cache_dir: str) -> int:
    import psutil

    free = shutil.disk_usage(cache_dir).free
    if in_ram(cache_dir):  # tmpfs pages are RAM: bounded by available memory too
        free = min(free, psutil.virtual_memory().available)
    return int(free)


def _estimate(dataset: Any, size: int | None, n_sample: int, seed: int) -> int:
    n = len(dataset)
    picks = np.random.default_rng(seed).choice(n, size=min(n, n_sample), replace=False)
    per = [_decoded(read_item(dataset, int(i))[0], size).nbytes for i in picks]
    return int(np.mean(per) * n)


def _location(dataset: Any, name: str) -> str:
    """``dataset.<name>`` when it is a path (a method called ``path`` would print its memory address)."""
    value = getattr(dataset, name, None)
    return os.path.abspath(os.fspath(value)) if isinstance(value, str | os.PathLike) else ""


def _source(dataset: Any, key: str | None) -> str:
    """What is cached, in words the same for every process: ``key`` or the dataset's type, location and length."""
    return key or (
        f"{type(dataset).__module__}.{type(dataset).__qualname__}:{_location(dataset, 'path')}:"
        f"{_location(dataset, 'root')}:{len(dataset)}"
    )


def _key(dataset: Any, size: int | None, key: str | None) -> str:
    """The arena's name: the same for every process (workers, DDP ranks, later runs) that caches this data."""
    return hashlib.sha256(f"{_source(dataset, key)}|{size}".encode()).hexdigest()[:16]


def _human(nbytes: int) -> str:
    for unit, factor in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if nbytes >= factor:
            return f"{nbytes / factor:.1f} {unit}"
    return f"{nbytes} bytes"


def _say_where(cached: CachedDataset, built: bool, cache_dir: str) -> None:
    ram = " of RAM (/dev/shm is memory)" if in_ram(cached.path) else ""
    where = "" if os.path.abspath(cache_dir) == DEFAULT_DIR else repr(cache_dir)
    warnings.warn(
        f"cache_in_ram {'built' if built else 'reuses'} the arena {cached.path} ({len(cached)} images, "
        f"{_human(cached.nbytes)}{ram}). It stays after this process exits, for later runs and ranks: remove it "
        f"with `rm -r {cached.path}` or ptt.remove_arenas; ptt.list_arenas({where}) lists every arena.",
        PttWarning,
        stacklevel=3,
    )


def _local_rank() -> int:
    return int(os.environ.get("LOCAL_RANK", "0"))


def _build(
    dataset: Any, size: int | None, final: str, num_workers: int, limit_bytes: int, source: str
) -> None:
    tmp = f"{final}.tmp{os.getpid()}"  # the name _arena.list_arenas reads as "a build of process <pid>"
    os.makedirs(tmp, exist_ok=True)
    n = len(dataset)
    index = np.zeros((n, 4), dtype=np.int64)
    offset = 0
    loader = torch.utils.data.DataLoader(
        _DecodeAll(dataset, size),
        batch_size=None,
        num_workers=num_workers,
        prefetch_factor=8 if num_workers else None,
    )
    try:
        with open(os.path.join(tmp, "arena.u8"), "wb") as fh:
            for i, (arr, label) in enumerate(loader):
                arr = arr.numpy() if isinstance(arr, torch.Tensor) else arr
                if offset + arr.nbytes > limit_bytes:
                    raise MemoryError(
                        f"arena passed its budget of {limit_bytes / 2**30:.2f} GiB at image {i}"
                    )
                fh.write(arr.tobytes())
                index[i] = (offset, arr.shape[0], arr.shape[1], int(label))
                offset += arr.nbytes
        np.save(os.path.join(tmp, "index.npy"), index)
        with open(os.path.join(tmp, "index.json"), "w", encoding="utf-8") as fh:
            json.dump({"format": FORMAT, "count": n, "size": size, "nbytes": offset, "source": source}, fh)
        os.replace(tmp, final)  # atomic: readers see a complete arena or none
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


class _DecodeAll(torch.utils.data.Dataset):  # type: ignore[type-arg]
    def __init__(self, dataset: Any, size: int | None) -> None:
        self.dataset, self.size = dataset, size

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        raw, label = read_item(self.dataset, i)
        arr = _decoded(raw, self.size)
        return torch.from_numpy(arr if arr.flags.writeable else arr.copy()), label


def cache_in_ram(
    dataset: Any,
    size: int | None = 256,
    *,
    budget: int | None = None,
    cache_dir: str | None = None,
    key: str | None = None,
    num_workers: int | None = None,
    sample: int = 32,
    strict: bool = False,
    wait_s: float = 3600.0,
) -> Any:
    """Decode ``dataset`` once (short side resized to ``size``) into a shared arena; returns a ``CachedDataset``.

    ``budget`` caps the arena in bytes (default: free space of ``cache_dir``; ``/dev/shm`` means RAM). If the
    estimated bytes x 1.3 exceed it, warns ``NoEffectWarning`` and returns ``dataset`` unchanged (or raises with
    ``strict=True``). Local rank 0 builds; other ranks on the node wait for the atomic rename and map the same file.

    Example:
        >>> import tempfile
        >>> ds = [(torch.full((3, 8, 12), i, dtype=torch.uint8), i) for i in range(5)]
        >>> c = ptt.cache_in_ram(ds, size=4, cache_dir=tempfile.mkdtemp(), num_workers=0)
        >>> c.read_raw(3)[0].shape, int(c.read_raw(3)[0][0, 0, 0]), len(c)
        ((4, 6, 3), 3, 5)
    """
    if isinstance(dataset, CachedDataset):
        warnings.warn("dataset is already cached; nothing to do.", NoEffectWarning, stacklevel=2)
        return dataset
    if isinstance(dataset, torch.utils.data.IterableDataset) or not hasattr(dataset, "__len__"):
        raise PttError(
            "cache_in_ram needs a map-style dataset (ShardDataset, JpegFolder, ...), not a stream."
        )
    cache_dir = cache_dir or DEFAULT_DIR
    os.makedirs(cache_dir, exist_ok=True)
    final = os.path.join(cache_dir, _key(dataset, size, key))
    built = not os.path.exists(os.path.join(final, "index.json"))
    if built:
        if _local_rank() != 0:  # one copy per node: wait for local rank 0's atomic rename
            from pytorchtricks.bench.measure import Deadline

            deadline = Deadline(wait_s)
            while not os.path.exists(os.path.join(final, "index.json")):
                if deadline.expired:
                    raise PttError(f"waited {wait_s:.0f} s for local rank 0 to build the cache at {final}.")
                import time

                time.sleep(0.5)  # a pause, not a clock read
            return CachedDataset(final)
        need = _estimate(dataset, size, sample, 0)
        limit = _free_bytes(cache_dir) if budget is None else min(int(budget), _free_bytes(cache_dir))
        if need * SAFETY > limit:
            msg = (
                f"cache_in_ram refused: about {need / 2**30:.2f} GiB needed (x{SAFETY} margin) but "
                f"{limit / 2**30:.2f} GiB allowed in {cache_dir}; using the dataset uncached. Lower size=, raise "
                "budget=, or pass cache_dir= on a local disk."
            )
            if strict:
                raise PttError(msg)
            warnings.warn(msg, NoEffectWarning, stacklevel=2)
            return dataset
        workers = min(len(os.sched_getaffinity(0)), 8) if num_workers is None else num_workers
        try:
            _build(dataset, size, final, workers, limit, _source(dataset, key))
        except MemoryError as exc:
            if strict:
                raise PttError(
                    f"cache_in_ram: {exc}; the sample underestimated. Raise budget= or lower size=."
                ) from exc
            warnings.warn(
                f"cache_in_ram gave up: {exc}; using the dataset uncached.", NoEffectWarning, stacklevel=2
            )
            return dataset
    cached = CachedDataset(final)
    if _local_rank() == 0:  # said once per node, by the rank that builds: the others map the same arena
        _say_where(cached, built, cache_dir)
    return cached


def bench_case(size: str = "smoke", device: str = "cpu") -> BenchCase:
    """One batch from JPEG bytes (scaled decode + crop) vs from the cached arena (crop + resize only)."""
    import tempfile

    from pytorchtricks.tricks.data.make_loader import _photo_bytes, make_loader

    n = 64 if size == "smoke" else 512
    data = _photo_bytes(n, (240, 320) if size == "smoke" else (480, 640))
    cached = cache_in_ram(data, size=128, cache_dir=tempfile.mkdtemp(prefix="ptt-bench-"), num_workers=0)
    base = make_loader(data, n, crop=112, num_workers=0, shuffle=False)
    treat = make_loader(cached, n, crop=112, num_workers=0, shuffle=False)
    return BenchCase(
        baseline=lambda: next(iter(base))[0],
        treated=lambda: next(iter(treat))[0],
        items_per_call=n,
        unit="images",
        device=device,
        description=f"{n} images -> RandomResizedCrop 112: decode every time vs decoded arena (short side 128)",
        cleanup=lambda: shutil.rmtree(cached.path, ignore_errors=True),
    )
