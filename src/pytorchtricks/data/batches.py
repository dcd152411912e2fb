"""Whole batches for ``make_loader``: the epoch sampler, the batch-building dataset, the stream batcher.

Not a trick (leading underscore): make_loader's machinery, kept apart so the trick file stays readable.
"""

from __future__ import annotations

import os
import warnings
import weakref
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

from pytorchtricks.core import PttError, PttWarning
from pytorchtricks.data.images import SampleMaker, read_item, sample_rng
from pytorchtricks.shards.errors import DecodeError, ShardError

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
    """Key ``(epoch, indices)`` -> one whole batch; runs inside DataLoader workers."""

    def __init__(self, dataset: Any, maker: SampleMaker, seed: int) -> None:
        self.dataset, self.maker, self.seed = dataset, maker, seed

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
        out = batch_buffer((len(idx), *self.maker.crop, 3))
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
        return out[: len(labels)].permute(0, 3, 1, 2), torch.tensor(labels, dtype=torch.int64)

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
    storage = torch.UntypedStorage._new_shared(numel)  # what default_collate does for the same reason
    return torch.empty(0, dtype=torch.uint8).set_(storage).view(shape)


_SLOT_FLAGS: weakref.WeakValueDictionary[str, torch.Tensor] = weakref.WeakValueDictionary()


class BatchSlots:
    """Shared-memory batch buffers that each DataLoader worker reuses once the main process is done with them.

    ``batch_buffer`` hands over a fresh shared-memory file per batch: the worker takes a page fault on every 4 KiB
    it writes (the kernel zeroes each page first) and the file is torn down when the main process drops the batch.
    For detection batches (~10 MB for 4 images at 800 px) that is ~2.6 ms of system time per image in the worker,
    measured (``docs/guides/detection.md``). Here each worker keeps ``slots`` buffers; a buffer is marked busy in
    a small shared flag array when it is filled, and the main process clears the mark when the last tensor over
    its copy of the batch is freed (a finalizer on the storage: views, slices and numpy arrays of the batch keep
    it busy). A worker with every slot busy - the user holds many batches - allocates a fresh buffer as before, so
    a slot is never written while the main process can still read it, and nothing ever waits.

    Made in the main process before the workers start (it is pickled into them with the dataset); outside a
    worker ``acquire`` returns a plain tensor.
    """

    def __init__(self, workers: int, slots: int = 4) -> None:
        self.slots = slots
        self.flags = torch.zeros(max(1, workers) * slots, dtype=torch.uint8).share_memory_()
        self.key = os.urandom(8).hex()
        _SLOT_FLAGS[self.key] = self.flags  # main process: how a received batch finds its flag
        self._mine: dict[int, torch.UntypedStorage] = {}

    def __getstate__(self) -> dict[str, Any]:
        return {"slots": self.slots, "flags": self.flags, "key": self.key}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.slots, self.flags, self.key = state["slots"], state["flags"], state["key"]
        self._mine = {}

    def acquire(self, shape: tuple[int, ...]) -> tuple[torch.Tensor, int]:
        """A uint8 buffer of ``shape`` and its slot number (-1: a fresh buffer that no one reuses)."""
        info = torch.utils.data.get_worker_info()
        if info is None or (info.id + 1) * self.slots > len(self.flags):
            return batch_buffer(shape), -1
        numel = int(np.prod(shape))
        flags = self.flags.numpy()
        for s in range(info.id * self.slots, (info.id + 1) * self.slots):
            if flags[s]:
                continue  # the main process still holds that batch
            storage = self._mine.get(s)
            if storage is None or storage.nbytes() < numel:
                storage = self._mine[s] = torch.UntypedStorage._new_shared(numel)
            flags[s] = 1
            return torch.empty(0, dtype=torch.uint8).set_(storage)[:numel].view(shape), s
        return batch_buffer(shape), -1


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
    the worker count."""

    def __init__(self, stream: Any, maker: SampleMaker, batch_size: int, drop_last: bool, seed: int) -> None:
        self.stream, self.maker, self.batch_size, self.drop_last, self.seed = (
            stream,
            maker,
            batch_size,
            drop_last,
            seed,
        )
        self.epoch = 0

    def __iter__(self) -> Iterator[Batch]:
        if hasattr(self.stream, "set_epoch"):
            self.stream.set_epoch(self.epoch)
        images: list[np.ndarray] = []
        labels: list[int] = []
        for item in self.stream:
            rng = sample_rng(self.seed, self.epoch, sample_identity(item[0], item[1]))
            images.append(self.maker(item[0], rng))
            labels.append(int(item[1]))
            if len(images) == self.batch_size:
                yield stack_batch(images, labels)
                images, labels = [], []
        if images and not self.drop_last:
            yield stack_batch(images, labels)


def init_worker(_: int) -> None:
    # One process per core already: threads inside workers only oversubscribe. OpenCV's thread count is left
    # alone: cv2.setNumThreads in a forked child deadlocks when the parent's OpenCV pool was busy at fork time.
    torch.set_num_threads(1)
