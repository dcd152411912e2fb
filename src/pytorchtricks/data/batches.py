"""Whole batches for ``make_loader``: the epoch sampler, the batch-building dataset, the stream batcher.

Not a trick (leading underscore): make_loader's machinery, kept apart so the trick file stays readable.
"""

from __future__ import annotations

import mmap
import os
import warnings
import weakref
from collections.abc import Iterator
from typing import Any, NamedTuple

import numpy as np
import torch

from pytorchtricks.core import PttError, PttWarning
from pytorchtricks.data.errors import DecodeError, ShardError
from pytorchtricks.data.images import SampleMaker, read_item, sample_rng
from pytorchtricks.data.shm import HELD_BATCHES, ShmError, ShmPlan, plan_shm

Batch = tuple[torch.Tensor, torch.Tensor]


def stack_batch(images: list[np.ndarray], labels: list[int]) -> Batch:
    shapes = {a.shape for a in images}
    if len(shapes) != 1:
        raise PttError(
            f"images in a batch differ in size {sorted(shapes)[:3]}; pass crop=N (or pack with --resize) so every "
            "image has the same size."
        )
    h, w, c = images[0].shape
    out = torch.empty((len(images), h, w, c), dtype=torch.uint8)
    buf = out.numpy()
    for k, a in enumerate(images):
        buf[k] = a  # one copy per image, straight into the batch (flip views are resolved here)
    return out.permute(0, 3, 1, 2), torch.tensor(labels, dtype=torch.int64)


class BatchDataset(torch.utils.data.Dataset):  # type: ignore[type-arg]
    """Key ``(epoch, indices)`` -> one whole batch; runs inside DataLoader workers, where a fixed-size batch lands
    in one of the worker's reused buffers (``slots``)."""

    def __init__(self, dataset: Any, maker: SampleMaker, seed: int, slots: BatchSlots | None = None) -> None:
        self.dataset, self.maker, self.seed, self.slots = dataset, maker, seed, slots

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, key: tuple[int, np.ndarray]) -> Batch:
        epoch, indices = key
        idx = indices.tolist()
        if self.maker.crop is None:  # sizes unknown up front: stack (and check) afterwards
            images, labels = [], []
            for i in idx:
                got = self._read(i)
                if got is not None:
                    images.append(self.maker(got[0], sample_rng(self.seed, epoch, i)))
                    labels.append(got[1])
            return stack_batch(images, labels)
        shape = (len(idx), *self.maker.crop, 3)
        out, slot = self.slots.acquire(shape) if self.slots is not None else (batch_buffer(shape), -1)
        buf = out.numpy()
        labels = []
        for i in idx:
            got = self._read(i)
            if got is None:
                continue
            try:  # pixels land in the batch directly
                self.maker(got[0], sample_rng(self.seed, epoch, i), out=buf[len(labels)])
            except DecodeError as exc:
                self._skip_or_raise(exc)
                continue
            labels.append(got[1])
        return wire_batch(out, labels, self.slots, slot)

    def _read(self, i: int) -> tuple[Any, int] | None:
        try:
            return read_item(self.dataset, i)
        except (ShardError, DecodeError) as exc:
            self._skip_or_raise(exc)
            return None

    def _skip_or_raise(self, exc: Exception) -> None:
        """A dataset made with ``on_error="skip"`` (ShardDataset) loses the bad sample from its batch, with a
        warning, as when it is read directly; otherwise the error stands."""
        if getattr(self.dataset, "on_error", "raise") != "skip":
            raise exc
        warnings.warn(f"skipped a bad sample (its batch is one smaller): {exc}", PttWarning, stacklevel=2)


def batch_buffer(shape: tuple[int, ...]) -> torch.Tensor:
    """uint8 buffer; inside a worker it is allocated in shared memory, so handing it over costs no copy."""
    numel = int(np.prod(shape))
    if torch.utils.data.get_worker_info() is None:
        return torch.empty(shape, dtype=torch.uint8)
    try:
        storage = torch.UntypedStorage._new_shared(numel)  # what default_collate does for the same reason
    except RuntimeError as exc:  # /dev/shm is full: torch's own words do not say what to change
        raise ShmError(
            f"a loader worker could not allocate a {numel / 2**20:.0f} MiB batch in shared memory ({exc}). "
            "The loop holds more batches than the loader keeps buffers for, or /dev/shm filled up after the "
            "loader was made: let go of batches you are done with, or give /dev/shm room (docker run "
            "--shm-size=...), or use fewer workers."
        ) from None
    return torch.empty(0, dtype=torch.uint8).set_(storage).view(shape)


_SLOT_FLAGS: weakref.WeakValueDictionary[str, torch.Tensor] = weakref.WeakValueDictionary()
_MEMFILES: weakref.WeakValueDictionary[str, _MemFile] = weakref.WeakValueDictionary()


class _MemFile:
    """An anonymous memory file (``memfd_create``) made by the main process before its workers start: the
    workers write batches into it, the main process maps the same pages and reads them without a copy. A
    worker forked from the main process holds its descriptor already; a spawned one opens it through
    ``/proc/<pid>/fd``. Its memory counts like ``/dev/shm``'s, outside that mount's size limit."""

    def __init__(self, name: str, nbytes: int) -> None:
        self.fd = os.memfd_create(name, os.MFD_CLOEXEC)
        os.ftruncate(self.fd, nbytes)  # sparse: a page takes memory when a batch is first written there
        self.pid, self.nbytes, self.ino = os.getpid(), nbytes, os.fstat(self.fd).st_ino
        self._map: mmap.mmap | None = None
        weakref.finalize(self, os.close, self.fd)

    def __getstate__(self) -> dict[str, Any]:
        return {"fd": self.fd, "pid": self.pid, "nbytes": self.nbytes, "ino": self.ino}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state, _map=None)

    def mapping(self) -> mmap.mmap:
        if self._map is None:
            try:
                same = os.getpid() == self.pid or os.fstat(self.fd).st_ino == self.ino  # inherited by fork
            except OSError:
                same = False
            if same:
                self._map = mmap.mmap(self.fd, self.nbytes)
            else:
                fd = os.open(f"/proc/{self.pid}/fd/{self.fd}", os.O_RDWR)
                try:
                    self._map = mmap.mmap(fd, self.nbytes)
                finally:
                    os.close(fd)
        return self._map

    def view(self, offset: int, shape: tuple[int, ...]) -> torch.Tensor:
        """A uint8 tensor of ``shape`` over the file's bytes at ``offset`` (it keeps the mapping alive)."""
        count = int(np.prod(shape))
        return torch.frombuffer(self.mapping(), dtype=torch.uint8, count=count, offset=offset).view(shape)


class BatchSlots:
    """Batch buffers that each DataLoader worker reuses once the main process is done with them.

    ``batch_buffer`` hands over a fresh shared-memory file per batch: the worker takes a page fault on every 4 KiB
    it writes (the kernel zeroes each page first) and the file is torn down when the main process drops the batch.
    For detection batches (~10 MB for 4 images at 800 px) that is ~2.6 ms of system time per image in the worker,
    measured (``docs/guides/detection.md``). Here each worker keeps ``slots`` buffers; a buffer is marked busy in
    a small shared flag array when it is filled, and the main process clears the mark when the last tensor over
    its copy of the batch is freed (a finalizer on the storage: views, slices and numpy arrays of the batch keep
    it busy). A worker with every slot busy - the user holds many batches - allocates a fresh buffer as before, so
    a slot is never written while the main process can still read it, and nothing ever waits.

    ``backing``: ``"shm"`` (each slot a ``/dev/shm`` file, grown to the largest batch it held) or ``"memfd"`` (one
    anonymous memory file of ``slot_bytes`` per slot, for all workers; ``data.shm.plan_shm`` picks it when
    ``/dev/shm`` is too small). Made in the main process before the workers start (it is pickled into them with
    the dataset); outside a worker ``acquire`` returns a plain tensor. What a worker sends for a slot is
    ``export(buffer, slot)``; the main process turns it back into the batch's tensor with ``receive``.
    """

    def __init__(self, workers: int, slots: int = 4, *, backing: str = "shm", slot_bytes: int = 0) -> None:
        if backing not in ("shm", "memfd") or (backing == "memfd" and slot_bytes < 1):
            raise PttError(
                f"BatchSlots: backing must be 'shm' or 'memfd' (with slot_bytes), got {backing!r}."
            )
        self.slots, self.backing, self.slot_bytes = slots, backing, slot_bytes
        self.flags = torch.zeros(max(1, workers) * slots, dtype=torch.uint8).share_memory_()
        self.key = os.urandom(8).hex()
        _SLOT_FLAGS[self.key] = self.flags  # main process: how a received batch finds its flag
        self.file = (
            _MemFile(f"ptt-batches-{self.key}", len(self.flags) * slot_bytes) if backing == "memfd" else None
        )
        if self.file is not None:
            _MEMFILES[self.key] = self.file
        self._mine: dict[int, torch.UntypedStorage] = {}
        self.plan: ShmPlan | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {
            k: getattr(self, k) for k in ("slots", "flags", "key", "backing", "slot_bytes", "file", "plan")
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state, _mine={})

    def acquire(self, shape: tuple[int, ...]) -> tuple[torch.Tensor, int]:
        """A uint8 buffer of ``shape`` and its slot number (-1: a fresh buffer that no one reuses)."""
        info = torch.utils.data.get_worker_info()
        if info is None or (info.id + 1) * self.slots > len(self.flags):
            return batch_buffer(shape), -1
        numel = int(np.prod(shape))
        if self.file is not None and numel > self.slot_bytes:
            raise PttError(
                f"a batch of {shape} is larger than the loader planned its buffers for ({self.slot_bytes} bytes)"
            )
        flags = self.flags.numpy()
        for s in range(info.id * self.slots, (info.id + 1) * self.slots):
            if flags[s]:
                continue  # the main process still holds that batch
            flags[s] = 1
            if self.file is not None:
                return self.file.view(s * self.slot_bytes, shape), s
            storage = self._mine.get(s)
            if storage is None or storage.nbytes() < numel:
                storage = self._mine[s] = batch_buffer((numel,)).untyped_storage()
            return torch.empty(0, dtype=torch.uint8).set_(storage)[:numel].view(shape), s
        return batch_buffer(shape), -1

    def release(self, slot: int) -> None:
        """In a worker: give back ``slot`` of a buffer that was never sent."""
        if slot >= 0:
            self.flags.numpy()[slot] = 0

    def export(self, buffer: torch.Tensor, slot: int) -> Any:
        """What a worker sends for ``buffer`` (of ``acquire``): the tensor itself (torch shares its ``/dev/shm``
        file), or for a memory-file slot its place in the file (the file's pages are the main process's too)."""
        if self.file is None or slot < 0:
            return buffer
        return _SlotRef(slot * self.slot_bytes, tuple(buffer.shape))


class _SlotRef(NamedTuple):
    offset: int
    shape: tuple[int, ...]


def receive(sent: Any, key: str, slot: int) -> torch.Tensor:
    """In the main process: the tensor a worker's ``BatchSlots.export`` sent, watched so that its slot is freed
    when the last tensor over it is."""
    images = _MEMFILES[key].view(sent.offset, sent.shape) if isinstance(sent, _SlotRef) else sent
    watch_slot(images, key, slot)
    return images


MAX_DEFAULT_WORKERS = 8  # past ~8 workers per process the main process, not the decode, sets the pace


def default_workers(num_workers: int | None) -> int:
    """``num_workers``, or the loaders' default: one worker per core this process may run on, at most 8."""
    return min(len(os.sched_getaffinity(0)), MAX_DEFAULT_WORKERS) if num_workers is None else num_workers


def rank_world(rank: int | None, world_size: int | None) -> tuple[int, int]:
    """This process's ``(rank, world_size)``: the ones given, else torch.distributed's, else ``(0, 1)``."""
    import torch.distributed as dist

    on = dist.is_available() and dist.is_initialized()
    r = (dist.get_rank() if on else 0) if rank is None else rank
    w = (dist.get_world_size() if on else 1) if world_size is None else world_size
    if not 0 <= r < w:
        raise PttError(f"rank must be in [0, world_size), got rank={r}, world_size={w}.")
    return r, w


def plan_slots(
    who: str, batch_bytes: int | None, workers: int, prefetch_factor: int
) -> tuple[BatchSlots | None, ShmPlan | None]:
    """The reused batch buffers of a loader whose ``workers`` build batches of ``batch_bytes`` (None: sizes
    unknown up front, fresh buffers per batch), planned before the workers start to fit ``/dev/shm``
    (``data.shm.plan_shm``: fewer batches in flight, or memory files; what changed is said in a ``PttWarning``).
    The loader then queues ``plan.prefetch_factor`` batches per worker."""
    if workers < 1 or batch_bytes is None:
        return None, None
    plan = plan_shm(who, batch_bytes, workers, prefetch_factor)
    if plan.message:
        warnings.warn(plan.message, PttWarning, stacklevel=3)
    slots = BatchSlots(
        workers, plan.prefetch_factor + HELD_BATCHES, backing=plan.backing, slot_bytes=batch_bytes
    )
    slots.plan = plan  # what the doctors read off a loader's dataset
    return slots, plan


def wire_batch(out: torch.Tensor, labels: list[int], slots: BatchSlots | None, slot: int) -> Batch:
    """A classification batch of ``out`` (NHWC, its first ``len(labels)`` images filled): in a worker, what it
    sends (unpickled in the main process into ``(images, labels)``, the slot watched); elsewhere the batch."""
    if torch.utils.data.get_worker_info() is None or slots is None:
        return _batch_from_wire(out, np.asarray(labels, np.int64), len(labels))
    return _BatchWire(slots.export(out, slot), np.asarray(labels, np.int64), slots.key, slot)  # type: ignore[return-value]


class _BatchWire:
    """What a worker hands the main process for a classification batch: the images' buffer (a tensor over a
    ``/dev/shm`` file, or a memory-file slot's place) and the labels inline (as a tensor they would be one more
    shared-memory file per batch). ``default_convert`` leaves it alone; unpickling makes the batch."""

    def __init__(self, sent: Any, labels: np.ndarray, key: str, slot: int) -> None:
        self.sent, self.labels, self.key, self.slot = sent, labels, key, slot

    def __reduce__(self) -> tuple[Any, ...]:
        return (_batch_from_wire, (self.sent, self.labels, len(self.labels), self.key, self.slot))


def _batch_from_wire(sent: Any, labels: np.ndarray, n: int, key: str = "", slot: int = -1) -> Batch:
    images = receive(sent, key, slot) if key else sent
    return images[:n].permute(0, 3, 1, 2), torch.from_numpy(labels)


def watch_slot(images: torch.Tensor, key: str, slot: int) -> None:
    """In the main process: free ``slot`` of the ``BatchSlots`` named ``key`` when ``images``' storage is freed."""
    flags = _SLOT_FLAGS.get(key) if slot >= 0 else None
    if flags is not None:
        weakref.finalize(images.untyped_storage(), _free_slot, flags, slot)


def _free_slot(flags: torch.Tensor, slot: int) -> None:
    flags[slot] = 0


class EpochBatches(torch.utils.data.Sampler):  # type: ignore[type-arg]
    """Yields ``(epoch, indices)``: a seeded permutation per epoch, this rank's share, cut into batches."""

    def __init__(
        self, n: int, batch_size: int, shuffle: bool, drop_last: bool, seed: int, rank: int, world: int
    ):
        self.n, self.batch_size, self.shuffle, self.drop_last = n, batch_size, shuffle, drop_last
        self.seed, self.rank, self.world, self.epoch = seed, rank, world, 0

    def indices(self) -> np.ndarray:
        order = (
            np.random.default_rng([self.seed, self.epoch]).permutation(self.n)
            if self.shuffle
            else np.arange(self.n)
        )
        if self.drop_last:  # equal share per rank so DDP ranks take the same number of steps
            order = order[: (self.n // self.world) * self.world]
        return order[self.rank :: self.world]

    def __len__(self) -> int:
        m = len(
            range(self.rank, (self.n // self.world) * self.world if self.drop_last else self.n, self.world)
        )
        return m // self.batch_size if self.drop_last else -(-m // self.batch_size)

    def dropped(self) -> int:
        """Samples that no rank sees in an epoch: with drop_last, the rank remainder and each rank's partial batch."""
        return self.n - self.world * len(self) * self.batch_size if self.drop_last else 0

    def __iter__(self) -> Iterator[tuple[int, np.ndarray]]:
        idx = self.indices()
        for s in range(0, len(self) * self.batch_size, self.batch_size):
            yield self.epoch, idx[s : s + self.batch_size]


def sample_identity(payload: Any, label: int) -> int:
    """A sample's identity from its content (crc32 of its bytes and its label), for a stream that does not say its
    samples' indices: its augmentation is then a function of (seed, epoch, sample), the same whatever the workers,
    ranks or order. Two byte-identical samples with one label get the same draw in an epoch."""
    import zlib

    if isinstance(payload, torch.Tensor):
        payload = payload.detach().cpu().contiguous().numpy()
    if isinstance(payload, np.ndarray):
        data: Any = np.ascontiguousarray(payload)
    elif isinstance(payload, bytes | bytearray | memoryview):
        data = payload
    elif hasattr(payload, "tobytes"):  # a PIL image
        data = payload.tobytes()
    else:
        raise PttError(
            f"make_loader cannot read a stream item of type {type(payload).__name__}: give bytes or arrays."
        )
    return zlib.crc32(memoryview(data).cast("B"), zlib.crc32(int(label).to_bytes(8, "little", signed=True)))


class StreamBatches(torch.utils.data.IterableDataset):  # type: ignore[type-arg]
    """Batches from an iterable dataset (ShardStream): the stream splits itself across ranks and workers. Each
    sample's augmentation draws from (seed, epoch, its content's identity): the same batches' samples whatever
    the worker count. A fixed-size batch lands in one of the worker's reused buffers (``slots``)."""

    def __init__(
        self,
        stream: Any,
        maker: SampleMaker,
        batch_size: int,
        drop_last: bool,
        seed: int,
        slots: BatchSlots | None = None,
    ) -> None:
        self.stream, self.maker, self.batch_size, self.drop_last = stream, maker, batch_size, drop_last
        self.seed, self.slots = seed, slots
        self.epoch = 0

    def __iter__(self) -> Iterator[Batch]:
        if hasattr(self.stream, "set_epoch"):
            self.stream.set_epoch(self.epoch)
        fixed = self.maker.crop is not None and self.slots is not None
        images: list[np.ndarray] = []
        labels: list[int] = []
        out, slot = None, -1
        for item in self.stream:
            rng = sample_rng(self.seed, self.epoch, sample_identity(item[0], item[1]))
            if fixed:  # pixels land in the batch directly
                if out is None:
                    out, slot = self.slots.acquire((self.batch_size, *self.maker.crop, 3))  # type: ignore[union-attr,misc]
                self.maker(item[0], rng, out=out.numpy()[len(labels)])
            else:
                images.append(self.maker(item[0], rng))
            labels.append(int(item[1]))
            if len(labels) == self.batch_size:
                yield self._batch(out, slot, images, labels)
                images, labels, out = [], [], None
        if labels and not self.drop_last:
            yield self._batch(out, slot, images, labels)
        elif out is not None:  # a partial batch dropped: its buffer was never sent
            self.slots.release(slot)  # type: ignore[union-attr]

    def _batch(
        self, out: torch.Tensor | None, slot: int, images: list[np.ndarray], labels: list[int]
    ) -> Batch:
        return stack_batch(images, labels) if out is None else wire_batch(out, labels, self.slots, slot)


def init_worker(_: int) -> None:
    # One process per core already: threads inside workers only oversubscribe. OpenCV's thread count is left
    # alone: cv2.setNumThreads in a forked child deadlocks when the parent's OpenCV pool was busy at fork time.
    torch.set_num_threads(1)
