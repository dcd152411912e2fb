"""Decode every image once, at the training size, into one shared uint8 arena (RAM or local disk).

Why: after the first epoch the decode is the same work again; a decoded, downsized copy turns later epochs into
memory copies. One flat uint8 file plus an offset index (no Python objects per image) is mapped by every worker and
every DDP rank on the node: the page cache holds one copy per node, not one per rank (YOLOv5 keeps one per rank).
When: datasets whose decoded, resized pixels fit in RAM (``/dev/shm``) or on local disk (``cache_dir=...``).
Detection data (``ptt.open_detection(root)`` or a detection pack): each image is stored at the detector's training
size (short side ``size``, long side at most ``max_size``, as ``ptt pack --resize --max-side`` stores it) with its
target - boxes, areas and polygons scaled to those pixels - beside it as checksummed JSON; ``make_detection_loader``
reads it, and the model's own transform then resizes nothing.
Caveats: the admission check extrapolates from a sample of images and keeps a safety margin; if the arena would not
fit it warns and returns the dataset unchanged (``strict=True`` raises instead). The cache stores images with their
short side resized to ``size`` (aspect kept): random crops then come from that smaller image, not the original.
The arena is named by a digest of the content (files' paths, their folders' mtimes and a sample of files' sizes and
mtimes; a pack's manifest; or the records' bytes) and the size: other data never shares it, changed data gets a new one. Before reuse it is checked (this
user's own, writable by no one else, checksums of metadata, index and pixels); a damaged one is rebuilt. One process
builds under a lock the kernel drops if it dies; the others wait and map the same file. The arena outlives the
process by design (later runs and other ranks reuse it) and holds its RAM in ``/dev/shm`` until removed: each call
warns ``PttWarning`` with where it is, its size and how to remove it; ``list_arenas()`` lists them,
``remove_arenas(paths or "all")`` frees them.
See also: make_loader, dataset_on_device; 借助内存 / YOLOv5 --cache ram.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import warnings
from typing import Any

import numpy as np
import torch

from pytorchtricks.core import (
    BenchCase,
    NoEffectWarning,
    PttError,
    PttWarning,
    TrickInfo,
    config_first,
    options_of,
)
from pytorchtricks.data.batches import default_workers
from pytorchtricks.data.decode import decode_image, image_size, resize_array, short_side_hw
from pytorchtricks.data.folder import JpegFolder
from pytorchtricks.data.images import is_encoded, read_item, to_hwc
from pytorchtricks.data.shm import RESERVE_BYTES, shm_space
from pytorchtricks.tricks._cases import first_batch_case
from pytorchtricks.tricks.data import _runtime
from pytorchtricks.tricks.data._arena import (
    DEFAULT_DIR,
    FORMAT,
    ArenaError,
    ArenaWriter,
    CachedDataset,
    Verify,
    build_lock,
    clear_builds,
    discard,
    in_ram,
    list_arenas,
    private_root,
    remove_arenas,
)
from pytorchtricks.tricks.data._arena import (
    ArenaInfo as ArenaInfo,  # re-exported: ptt.ArenaInfo, what list_arenas returns
)
from pytorchtricks.tunable import TuneFacts, TuneHook, TuneSetup, TuneSkip, stored_side, unless_input_bound

__all__ = ["CacheConfig", "cache_in_ram", "list_arenas", "remove_arenas"]

TRICK = TrickInfo(gains=("speed",), phase=("train", "infer"), exact=False)


def _tune_applies(facts: TuneFacts) -> str | None:
    return unless_input_bound(facts, ("files", "pack"))


def _tune_prepare(setup: TuneSetup) -> Any:
    try:  # the admission check (estimate x 1.3 against the free RAM of /dev/shm) refuses with the numbers
        if setup.task == "detection":  # at the detector's own size: its transform then resizes nothing
            return cache_in_ram(setup.dataset, setup.input_size, max_size=setup.max_size, strict=True)
        return cache_in_ram(setup.dataset, stored_side(setup.input_size), strict=True)
    except PttError as exc:
        raise TuneSkip(str(exc)) from exc


def _tune_apply(setup: TuneSetup, state: Any) -> None:
    setup.dataset, setup.loader = state, "ptt"


TUNE = TuneHook(
    changes="loader",
    check="data",
    receipt="dataset = ptt.cache_in_ram(dataset, size={cache_side})  # decoded once into /dev/shm",
    detection_receipt="dataset = ptt.cache_in_ram(dataset, {input_size}, max_size={max_size})  # decoded once "
    "into /dev/shm at the training size, the boxes scaled with the images",
    tasks=("classification", "detection"),
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


def _decoded(raw: Any, size: int | None, max_size: int | None = None, detection: bool = False) -> np.ndarray:
    """``raw`` decoded with its short side at ``size``; a detection image as ``ptt pack --resize size --max-side
    max_size`` stores it (``target_hw``: never enlarged, the long side at most ``max_size``)."""
    if is_encoded(raw):
        h, w = image_size(raw)
        return np.ascontiguousarray(decode_image(raw, size=_stored_hw(h, w, size, max_size, detection)))
    arr = to_hwc(raw)
    hw = _stored_hw(arr.shape[0], arr.shape[1], size, max_size, detection)
    return np.ascontiguousarray(arr if hw == arr.shape[:2] else resize_array(arr, hw))


def _stored_hw(h: int, w: int, size: int | None, max_size: int | None, detection: bool) -> tuple[int, int]:
    cap = (
        max_size if detection else None
    )  # a pack's rule (``target_hw``); a classification image: short side only
    return short_side_hw(h, w, size, max_size=cap, enlarge=False, rounding="round", scale_first=True)


def _detection_item(dataset: Any, i: int, size: int | None, max_size: int | None) -> tuple[np.ndarray, str]:
    """Image ``i`` of a detection dataset decoded at the stored size, and its target as JSON with the boxes,
    areas and polygons scaled to those pixels (``scale_target_json``, as a resized pack stores them)."""
    from pytorchtricks.data.detection_loader import read_detection_item, target_to_json
    from pytorchtricks.data.detection_pack import scale_target_json

    raw, target = read_detection_item(dataset, i)
    arr = _decoded(raw, size, max_size, detection=True)
    hw0 = image_size(raw) if is_encoded(raw) else tuple(to_hwc(raw).shape[:2])
    t = {k: v for k, v in target_to_json(target).items() if k != "dropped"}
    t["size"] = [int(hw0[0]), int(hw0[1])]
    if tuple(arr.shape[:2]) != tuple(hw0):
        t = scale_target_json(t, (int(arr.shape[0]), int(arr.shape[1])))
    return arr, json.dumps(t)


def _is_detection(dataset: Any) -> bool:
    """A detection dataset cache_in_ram reads: ours (``open_detection``, ``DetectionDataset``) or a detection pack
    (its manifest says so). torchvision's detection datasets are refused with the fix."""
    from pytorchtricks.data.detection import is_detection_dataset

    pack = _location(dataset, "path")
    manifest = os.path.join(pack, "manifest.json") if pack else ""
    if manifest and os.path.isfile(manifest):
        with open(manifest, encoding="utf-8") as fh:
            return "detection" in json.load(fh)
    if not is_detection_dataset(dataset):
        return False
    if getattr(dataset, "task", None) != "detection":
        raise PttError(
            f"cache_in_ram caches detection datasets opened by ptt.open_detection(root) (or a detection pack); "
            f"{type(dataset).__name__} is torchvision's, whose samples are PIL images with annotation lists. Open "
            "the same annotations with ptt.open_detection(root), then ptt.cache_in_ram(dataset, size, "
            "max_size=...) and ptt.make_detection_loader."
        )
    return True


def _free_bytes(cache_dir: str) -> int:
    import psutil

    free = shutil.disk_usage(cache_dir).free
    if in_ram(cache_dir):  # tmpfs pages are RAM: bounded by available memory too
        free = min(free, psutil.virtual_memory().available)
    return int(free)


def _estimate(
    dataset: Any,
    size: int | None,
    n_sample: int,
    seed: int,
    max_size: int | None = None,
    detection: bool = False,
) -> int:
    n = len(dataset)
    picks = np.random.default_rng(seed).choice(n, size=min(n, n_sample), replace=False)
    if detection:
        per = [_detection_item(dataset, int(i), size, max_size)[0].nbytes for i in picks]
    else:
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


def _digest_records(h: Any, dataset: Any) -> None:
    """Every record's bytes (dtype and shape of arrays too) and label: what an in-memory dataset holds."""
    for i in range(len(dataset)):
        raw, label = read_item(dataset, i)
        if isinstance(raw, bytes | bytearray | memoryview):
            h.update(b"bytes%d:" % len(raw))
            h.update(raw)
        else:
            arr = raw.detach().cpu().numpy() if isinstance(raw, torch.Tensor) else np.asarray(raw)
            if arr.dtype == object:
                raise PttError(
                    f"sample {i} of the dataset is not an image (an object array); pass key= to name it."
                )
            arr = np.ascontiguousarray(arr)
            h.update(f"{arr.dtype.str}{arr.shape}:".encode())
            h.update(arr.data)
        h.update(b"|%d\n" % int(label))


def _digest_files(h: Any, files: list[tuple[str, str]]) -> None:
    """Each file's name, size and modification time (ns): a changed, added or removed file changes the digest."""
    for shown, path in files:
        try:
            st = os.stat(path)
        except OSError as exc:
            raise PttError(
                f"cache_in_ram cannot read {path} ({exc.strerror}): the dataset changed on disk."
            ) from exc
        h.update(f"{shown}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())


SAMPLED_FILES = (
    64  # files of a folder dataset whose size and mtime join its key, spread evenly over the listing
)


def _folders(rel: np.ndarray) -> list[bytes]:
    """The distinct parent folders of ``rel`` (fixed-width bytes paths), sorted; vectorised: no object per name."""
    if not len(rel):
        return []
    grid = rel.view(np.uint8).reshape(len(rel), rel.itemsize)
    slash = grid == ord("/")
    last = np.where(slash.any(axis=1), rel.itemsize - 1 - np.argmax(slash[:, ::-1], axis=1), 0)
    cut = grid.copy()
    cut[np.arange(rel.itemsize)[None, :] >= last[:, None]] = 0  # keep what precedes the last "/"
    return [bytes(f) for f in np.unique(cut.view(rel.dtype).reshape(-1))]


def _digest_listing(h: Any, root: str, rel: np.ndarray, labels: np.ndarray) -> None:
    """A folder dataset's key: its listing (``rel``: relative paths as bytes, labels), each folder's mtime and a
    sample of files' sizes and mtimes.

    O(#folders) stats, not one per file (a million stats is seconds per call, per rank): adding, removing or
    renaming a file changes its folder's mtime; a file rewritten in place under its old name is caught when it is
    one of the ``SAMPLED_FILES`` (evenly spaced) - else pass ``key=`` or remove the arena (``remove_arenas``).
    """
    rel = np.ascontiguousarray(rel.astype(np.bytes_))
    h.update(f"{rel.dtype.str}{rel.shape}".encode())
    h.update(rel.data)  # one buffer: no Python object per name
    h.update(np.ascontiguousarray(labels, dtype=np.int64).data)
    folders = _folders(rel)
    _digest_files(
        h,
        [
            (
                f.decode("utf-8", "surrogateescape") + "/",
                os.path.join(root, f.decode("utf-8", "surrogateescape")),
            )
            for f in folders
        ],
    )
    picks = np.unique(np.linspace(0, len(rel) - 1, min(len(rel), SAMPLED_FILES)).astype(np.int64))
    sample = [rel[int(k)].decode("utf-8", "surrogateescape") for k in picks] if len(rel) else []
    _digest_files(h, [(r, os.path.join(root, r)) for r in sample])


def _digest_detection(h: Any, dataset: Any) -> None:
    """A ``DetectionDataset``'s key: its annotations (``content_digest``) and a sample of its files' sizes and
    mtimes (``SAMPLED_FILES``, evenly spaced)."""
    h.update(f"detection:{dataset.content_digest()}\n".encode())
    n = len(dataset)
    picks = np.unique(np.linspace(0, max(n - 1, 0), min(n, SAMPLED_FILES)).astype(np.int64))
    _digest_files(h, [(dataset.file(int(i)), dataset.path(int(i))) for i in picks])


def _content(dataset: Any, size: int | None, key: str | None, max_size: int | None = None) -> str:
    """The digest of what the arena holds, the same in every process (workers, DDP ranks, later runs).

    ``key=`` names the content itself (the caller vouches for it). A ``JpegFolder``: its root, each file's
    path and label, each folder's mtime and a sample of files' sizes and mtimes (``_digest_listing``: no stat per
    file); torchvision's ImageFolder likewise from its ``samples``. A pack (``ShardDataset``: a ``path`` holding ``manifest.json``): the manifest's bytes
    and each file's size and mtime. Anything else (in-memory lists, custom datasets): every record's bytes, read
    once; SHA-256 runs ~1 GB/s, cheap next to decoding (a dataset whose reads are costly can pass ``key=``). The
    size, the decoder and the arena format are always part of it. A dataset's own ``transform`` is not (a repr
    holds memory addresses): the records hashed and cached are what ``read_raw`` / ``[i]`` return.
    """
    from pytorchtricks.data.detection import DetectionDataset

    decode = decode_image
    kind = f"{type(dataset).__module__}.{type(dataset).__qualname__}"
    head: list[Any] = [FORMAT, size, f"{decode.__module__}.{decode.__qualname__}", len(dataset)]
    h = hashlib.sha256(json.dumps(head if max_size is None else [*head, "max_size", max_size]).encode())
    pack = _location(dataset, "path")
    pairs = None if key is not None or isinstance(dataset, JpegFolder) else _file_samples(dataset)
    if key is not None:
        h.update(f"key:{key}".encode())
    elif isinstance(dataset, DetectionDataset):
        _digest_detection(h, dataset)
    elif isinstance(dataset, JpegFolder):
        root = os.path.abspath(dataset.root)
        h.update(f"folder:{kind}:{root}\n".encode())
        _digest_listing(h, root, dataset.rel_paths, dataset.labels)
    elif pairs is not None:  # torchvision's ImageFolder / DatasetFolder: (path, label) pairs
        root = os.path.abspath(str(getattr(dataset, "root", "") or "/"))
        h.update(f"samples:{kind}:{root}\n".encode())
        labels = np.asarray([label for _, label in pairs], dtype=np.int64)
        names = [os.path.relpath(os.path.abspath(p), root).encode() for p, _ in pairs]
        _digest_listing(h, root, np.array(names), labels)
    elif pack and os.path.isfile(os.path.join(pack, "manifest.json")):
        with open(os.path.join(pack, "manifest.json"), "rb") as fh:
            h.update(f"pack:{kind}:{pack}\n".encode() + fh.read())
        files = [  # lock.mdb: LMDB readers with locking rewrite it; the data is untouched
            os.path.join(d, f)
            for d, _, names in sorted(os.walk(pack))
            for f in sorted(names)
            if f != "lock.mdb"
        ]
        _digest_files(h, [(os.path.relpath(p, pack), p) for p in files])
    else:
        h.update(f"records:{kind}\n".encode())
        _digest_records(h, dataset)
    return h.hexdigest()


def _file_samples(dataset: Any) -> list[tuple[str, int]] | None:
    """A torchvision folder dataset's ``samples`` (file path, label), when that is what it has."""
    samples = getattr(dataset, "samples", None)
    if not isinstance(samples, list) or len(samples) != len(dataset):
        return None
    ok = all(
        isinstance(x, tuple) and len(x) == 2 and isinstance(x[0], str) and isinstance(x[1], int)
        for x in samples
    )
    return samples if ok else None


def _key(dataset: Any, size: int | None, key: str | None, max_size: int | None = None) -> str:
    """The arena's folder name: the first 16 hex digits of ``_content`` (which the arena stores in full)."""
    return _content(dataset, size, key, max_size)[:16]


def _human(nbytes: int) -> str:
    for unit, factor in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if nbytes >= factor:
            return f"{nbytes / factor:.1f} {unit}"
    return f"{nbytes} bytes"


def _say_where(cached: CachedDataset, built: bool, root: str) -> None:
    ram = " of RAM (/dev/shm is memory)" if in_ram(cached.path) else ""
    where = "" if os.path.abspath(root) == DEFAULT_DIR else repr(root)
    warnings.warn(
        f"cache_in_ram {'built' if built else 'reuses'} the arena {cached.path} ({len(cached)} images, "
        f"{_human(cached.nbytes)}{ram}). It stays after this process exits, for later runs and ranks: remove it "
        f"with `rm -r {cached.path}` or ptt.remove_arenas; ptt.list_arenas({where}) lists every arena.",
        PttWarning,
        stacklevel=3,
    )


def _local_rank() -> int:
    return int(os.environ.get("LOCAL_RANK", "0"))


BUILD_BATCH = (
    64  # images per worker task: one shared-memory buffer and one pickle per 64 images, not per image
)
BUILD_IN_FLIGHT = 3  # tasks per worker in shared memory at once: 2 prefetched + the one the writer is copying
BUILD_SPREAD = 2.0  # a task's bytes against the sampled mean image's x its count: images differ in size


def _build_plan(workers: int, image_bytes: float, arena_shm_bytes: int) -> tuple[int, int]:
    """``(workers, images per task)`` for the build so that its tasks in flight fit ``/dev/shm`` beside the
    arena (``arena_shm_bytes`` of it when the arena lives there): fewer images per task first, down to one, then
    no workers (the build decodes in this process and uses no shared memory); either change said."""
    space = shm_space()
    if workers < 1 or space is None:
        return workers, BUILD_BATCH
    room = space.free_bytes - RESERVE_BYTES - arena_shm_bytes
    batch = BUILD_BATCH

    def need(b: int) -> float:
        return workers * BUILD_IN_FLIGHT * b * image_bytes * BUILD_SPREAD

    while batch > 1 and need(batch) > room:
        batch //= 2
    where = f"{space.path} ({space.total_bytes / 2**20:.0f} MiB, {space.free_bytes / 2**20:.0f} MiB free)"
    if need(batch) > room:
        warnings.warn(
            f"cache_in_ram: its build's decoded images in flight do not fit {where} even one per task; it "
            f"decodes in this process (no workers, so slower) instead. Give /dev/shm room (docker run "
            "--shm-size=...) or pass cache_dir= on a local disk for a faster build.",
            PttWarning,
            stacklevel=4,
        )
        return 0, BUILD_BATCH
    if batch < BUILD_BATCH:
        warnings.warn(
            f"cache_in_ram: its build hands {batch} image{'s' if batch > 1 else ''} per worker task instead of "
            f"{BUILD_BATCH}, so that its "
            f"decoded images in flight fit {where}.",
            PttWarning,
            stacklevel=4,
        )
    return workers, batch


def _build(
    dataset: Any,
    size: int | None,
    final: str,
    num_workers: int,
    limit_bytes: int,
    source: str,
    content: str,
    detection: tuple[int | None] | None = None,
    batch: int = BUILD_BATCH,
) -> None:
    """Decode ``dataset`` into the arena ``final`` (built aside, renamed when complete), ``batch`` images per
    worker task. ``detection``: ``(max_size,)`` for a detection dataset, whose targets (scaled to the stored
    pixels) go to ``targets.json``."""
    tmp = f"{final}.tmp{os.getpid()}"  # the name _arena.list_arenas reads as "a build of process <pid>"
    os.mkdir(
        tmp, 0o700
    )  # private whatever the umask; under the build lock, after clear_builds: never there yet
    loader = _runtime.whole_batches(_DecodeBatches(dataset, size, batch, detection), num_workers)
    writer = ArenaWriter(tmp, len(dataset))
    targets: list[str] = []
    try:
        for b, (pixels, shapes, labels, batch_targets) in enumerate(loader):
            if writer.offset + pixels.numel() > limit_bytes:
                raise MemoryError(
                    f"arena passed its budget of {limit_bytes / 2**30:.2f} GiB in images "
                    f"{b * batch}..{b * batch + len(labels) - 1}"
                )
            writer.add_batch(b * batch, pixels.numpy(), shapes.numpy(), labels.numpy())
            targets += batch_targets
        extras = {"targets.json": ("[" + ",".join(targets) + "]").encode()} if detection is not None else None
        writer.finish(size, source, content, extras)
        os.replace(tmp, final)  # atomic: readers see a complete arena or none
    finally:
        writer.close()
        shutil.rmtree(tmp, ignore_errors=True)


def _open(final: str, verify: Verify, content: str, *, discard_bad: bool) -> CachedDataset | None:
    """The checked arena at ``final``, or None: missing, or not servable (then, with ``discard_bad``, moved away)."""
    if not os.path.lexists(final):
        return None
    try:
        return CachedDataset(final, verify=verify, content=content)
    except ArenaError as exc:
        if discard_bad:  # under the build lock: nobody else is replacing it
            warnings.warn(f"cache_in_ram rebuilds the arena {final}: {exc}.", PttWarning, stacklevel=3)
            discard(final)
        return None


class _DecodeBatches(torch.utils.data.Dataset):  # type: ignore[type-arg]
    """Item ``b``: images ``b * batch ..`` decoded, as (pixels back to back uint8 [bytes], shapes [k, 2], labels [k]).

    A whole batch per task: the worker hands one buffer through shared memory instead of one tensor (one shared
    memory file, one pickle, one queue message) per image, and the writer appends it with one write.
    """

    def __init__(
        self, dataset: Any, size: int | None, batch: int, detection: tuple[int | None] | None = None
    ) -> None:
        self.dataset, self.size, self.batch, self.detection = dataset, size, batch, detection

    def __len__(self) -> int:
        return -(-len(self.dataset) // self.batch)

    def __getitem__(self, b: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, list[str]]:
        """Also each image's target as JSON (a detection dataset; else an empty list): one string per image
        crosses from the worker, not a dict of tensors."""
        lo, hi = b * self.batch, min(len(self.dataset), (b + 1) * self.batch)
        arrays, labels, targets = [], [], []
        for i in range(lo, hi):
            if self.detection is not None:
                arr, t = _detection_item(self.dataset, i, self.size, self.detection[0])
                arrays.append(arr)
                labels.append(0)  # a detection image has no class label: its labels are in its target
                targets.append(t)
                continue
            raw, label = read_item(self.dataset, i)
            arrays.append(_decoded(raw, self.size))
            labels.append(label)
        shapes = torch.tensor([a.shape[:2] for a in arrays], dtype=torch.int64).reshape(-1, 2)
        pixels = torch.from_numpy(np.concatenate([a.reshape(-1) for a in arrays]))
        return pixels, shapes, torch.tensor(labels, dtype=torch.int64), targets


@dataclasses.dataclass(frozen=True)
class CacheConfig:
    """``cache_in_ram``'s options as one value: ``ptt.cache_in_ram(ds, 256, ptt.CacheConfig(cache_dir="/scratch"))``
    (the keywords of ``cache_in_ram`` are a convenience over it; see there for what each does). The short side
    ``size`` stays an argument of its own: it names the arena, like the data.

    Example:
        >>> import tempfile
        >>> ds = [(torch.full((3, 8, 12), i, dtype=torch.uint8), i) for i in range(5)]
        >>> cfg = ptt.CacheConfig(cache_dir=tempfile.mkdtemp(), num_workers=0)
        >>> ptt.cache_in_ram(ds, 4, cfg).read_raw(3)[0].shape
        (4, 6, 3)
    """

    budget: int | None = None
    cache_dir: str | None = None
    max_size: int | None = None
    key: str | None = None
    num_workers: int | None = None
    sample: int = 32
    strict: bool = False
    wait_s: float = 3600.0
    verify: Verify = "auto"


@options_of(CacheConfig)
def cache_in_ram(
    dataset: Any,
    size: int | None = 256,
    config: CacheConfig | None = None,
    **options: Any,
) -> Any:
    """Decode ``dataset`` once (short side resized to ``size``) into a shared arena; returns a ``CachedDataset``.

    ``budget`` caps the arena in bytes (default: free space of ``cache_dir``; ``/dev/shm`` means RAM). If the
    estimated bytes x 1.3 exceed it, warns ``NoEffectWarning`` and returns ``dataset`` unchanged (or raises with
    ``strict=True``). The arena's name is a digest of the content (a folder's file paths, folder mtimes and 64
    sampled files' sizes and mtimes - a file rewritten in place outside the sample is not seen; a pack's
    manifest and files; else every record's bytes) with ``size``; ``key=`` names the content instead (you vouch for it:
    for a custom dataset whose reads are costly).
    ``cache_dir`` (default ``/dev/shm/ptt-cache``) is used only when it is this user's and no one else may write
    it; else its private sibling ``<cache_dir>-<uid>`` (with a ``PttWarning``). An existing arena is served only
    after ``CachedDataset``'s checks (owner, permissions, checksums; ``verify=`` "auto" reads every pixel block up
    to 2 GiB and a sample above, "full" always, "sample" never all); one that fails them is rebuilt, with a
    ``PttWarning`` saying why. One process per node builds, holding a lock; the others (any local rank) wait up to
    ``wait_s`` for it, and if it dies take over within ``POLL_S`` and rebuild, deleting its leftovers.
    The options are ``CacheConfig``'s fields: one ``config``, or its fields as keywords (not both).
    A detection dataset (``ptt.open_detection(root)``, a detection pack): images stored with the short side at
    ``size`` and the long side at most ``max_size`` (never enlarged), each target scaled to them and kept in the
    arena (``read_raw(i)[2]["target"]``); torchvision's ``CocoDetection`` is refused with the fix.

    Example:
        >>> import tempfile
        >>> ds = [(torch.full((3, 8, 12), i, dtype=torch.uint8), i) for i in range(5)]
        >>> c = ptt.cache_in_ram(ds, size=4, cache_dir=tempfile.mkdtemp(), num_workers=0)
        >>> c.read_raw(3)[0].shape, int(c.read_raw(3)[0][0, 0, 0]), len(c)
        ((4, 6, 3), 3, 5)
    """
    cfg = config_first(config, CacheConfig, options)
    budget, cache_dir, key, num_workers = cfg.budget, cfg.cache_dir, cfg.key, cfg.num_workers
    sample, strict, wait_s, verify = cfg.sample, cfg.strict, cfg.wait_s, cfg.verify
    if isinstance(dataset, CachedDataset):
        warnings.warn("dataset is already cached; nothing to do.", NoEffectWarning, stacklevel=2)
        return dataset
    detection = (cfg.max_size,) if _is_detection(dataset) else None
    if detection is None and cfg.max_size is not None:
        raise PttError(
            "max_size= caps a detection image's long side; this dataset is not a detection dataset."
        )
    if isinstance(dataset, torch.utils.data.IterableDataset) or not hasattr(dataset, "__len__"):
        raise PttError(
            "cache_in_ram needs a map-style dataset (ShardDataset, JpegFolder, ...), not a stream."
        )
    if verify not in ("auto", "full", "sample", "none"):
        raise PttError(f"verify={verify!r}: use 'auto', 'full', 'sample' or 'none'.")
    asked = os.path.abspath(cache_dir or DEFAULT_DIR)
    root = private_root(asked)
    if root != asked:
        warnings.warn(
            f"cache_in_ram does not trust {asked} (another user owns it or may write it): arenas go to {root}.",
            PttWarning,
            stacklevel=2,
        )
    content = _content(dataset, size, key, cfg.max_size)
    final = os.path.join(root, content[:16])
    cached, built = _open(final, verify, content, discard_bad=False), False
    if cached is None:
        with build_lock(root, content[:16], wait_s):
            cached = _open(final, verify, content, discard_bad=True)  # a builder may have finished meanwhile
            if cached is None:
                clear_builds(root, content[:16])  # ours to delete: we hold the lock, their builders are dead
                if not _admit_and_build(
                    dataset, size, final, budget, num_workers, sample, strict, key, content, detection
                ):
                    return dataset
                cached, built = CachedDataset(final, verify="none", content=content), True
    if _local_rank() == 0:  # said once per node, by local rank 0: the others map the same arena
        _say_where(cached, built, root)
    return cached


def _admit_and_build(
    dataset: Any,
    size: int | None,
    final: str,
    budget: int | None,
    num_workers: int | None,
    sample: int,
    strict: bool,
    key: str | None,
    content: str,
    detection: tuple[int | None] | None = None,
) -> bool:
    """Build the arena at ``final`` when the estimate fits; False (after warning) when the dataset stays uncached."""
    root = os.path.dirname(final)
    max_size = detection[0] if detection is not None else None
    need = _estimate(dataset, size, sample, 0, max_size, detection is not None)
    limit = _free_bytes(root) if budget is None else min(int(budget), _free_bytes(root))
    if need * SAFETY > limit:
        msg = (
            f"cache_in_ram refused: about {need / 2**30:.2f} GiB needed (x{SAFETY} margin) but "
            f"{limit / 2**30:.2f} GiB allowed in {root}; using the dataset uncached. Lower size=, raise "
            "budget=, or pass cache_dir= on a local disk."
        )
        if strict:
            raise PttError(msg)
        warnings.warn(msg, NoEffectWarning, stacklevel=3)
        return False
    workers = default_workers(num_workers)
    arena_in_shm = need * SAFETY if in_ram(root) else 0  # the arena's own pages come out of /dev/shm too
    workers, batch = _build_plan(workers, need / max(1, len(dataset)), int(arena_in_shm))
    try:
        _build(dataset, size, final, workers, limit, _source(dataset, key), content, detection, batch)
    except MemoryError as exc:
        if strict:
            raise PttError(
                f"cache_in_ram: {exc}; the sample underestimated. Raise budget= or lower size=."
            ) from exc
        warnings.warn(
            f"cache_in_ram gave up: {exc}; using the dataset uncached.", NoEffectWarning, stacklevel=3
        )
        return False
    return True


def bench_case(size: str = "smoke", device: str = "cpu") -> BenchCase:
    """One batch from JPEG bytes (scaled decode + crop) vs from the cached arena (crop + resize only)."""
    import tempfile

    from pytorchtricks.tricks.data.make_loader import _photo_bytes, make_loader

    n = 64 if size == "smoke" else 512
    data = _photo_bytes(n, (240, 320) if size == "smoke" else (480, 640))
    cached = cache_in_ram(data, size=128, cache_dir=tempfile.mkdtemp(prefix="ptt-bench-"), num_workers=0)
    base = make_loader(data, n, crop=112, num_workers=0, shuffle=False)
    treat = make_loader(cached, n, crop=112, num_workers=0, shuffle=False)
    return first_batch_case(
        base,
        treat,
        n,
        device=device,
        description=f"{n} images -> RandomResizedCrop 112: decode every time vs decoded arena (short side 128)",
        cleanup=lambda: shutil.rmtree(cached.path, ignore_errors=True),
    )
