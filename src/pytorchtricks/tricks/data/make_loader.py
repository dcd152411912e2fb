"""A fast-by-default image loader: crop-aware scaled decode, whole-batch workers, uint8 NCHW out, DDP-exact.

Why: the stock recipe (ImageFolder + PIL + RandomResizedCrop + ToTensor) decodes every JPEG at full size, then
throws most pixels away, converts to float on the CPU (4x the bytes to copy) and collates sample by sample. Here each
worker builds a whole batch: the crop box is sampled from the JPEG header, the decoder scales in the DCT domain
(1/2, 1/4, 1/8) while the crop stays >= the target, pixels go straight into one uint8 batch buffer.
When: image training input pipelines; any map-style dataset (ShardDataset, JpegFolder, datasets returning PIL,
arrays, tensors or bytes) and iterable ShardStream.
Caveats: batches are uint8 with NCHW shape stored channels_last (no transpose copy): normalize on the device
(prefetch_to_device). Each sample's randomness depends only on (seed, epoch, index), so results do not change with
num_workers or rank count. With drop_last=False ranks may get one batch more or less (DDP needs equal step counts:
keep drop_last=True there). pin_memory is on only for a CUDA target: measure it (autotune_loader).
See also: cache_in_ram, prefetch_to_device, autotune_loader, doctor_data; 预处理提速 / IO 提速.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import torch

from pytorchtricks.core import BenchCase, PttError, TrickInfo
from pytorchtricks.tricks.data._images import SampleMaker, read_item, resize_hwc, rrc_box, sample_rng

__all__ = ["make_loader"]

TRICK = TrickInfo(gains=("speed",), phase=("train", "infer"), exact=False)

Batch = tuple[torch.Tensor, torch.Tensor]


def _pair(x: int | Sequence[int] | None) -> tuple[int, int] | None:
    if x is None:
        return None
    if isinstance(x, int):
        return (x, x)
    if len(x) != 2:
        raise PttError(f"crop must be an int or (height, width), got {x!r}")
    return int(x[0]), int(x[1])


def _dist_rank_world() -> tuple[int, int]:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def _stack(images: list[np.ndarray], labels: list[int]) -> Batch:
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


class _BatchDataset(torch.utils.data.Dataset):  # type: ignore[type-arg]
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
                raw, label = read_item(self.dataset, i)
                images.append(self.maker(raw, sample_rng(self.seed, epoch, i)))
                labels.append(label)
            return _stack(images, labels)
        out = _batch_buffer((len(idx), *self.maker.crop, 3))
        buf = out.numpy()
        labels = []
        for k, i in enumerate(idx):
            raw, label = read_item(self.dataset, i)
            self.maker(raw, sample_rng(self.seed, epoch, i), out=buf[k])  # pixels land in the batch directly
            labels.append(label)
        return out.permute(0, 3, 1, 2), torch.tensor(labels, dtype=torch.int64)


def _batch_buffer(shape: tuple[int, ...]) -> torch.Tensor:
    """uint8 buffer; inside a worker it is allocated in shared memory, so handing it over costs no copy."""
    numel = int(np.prod(shape))
    if torch.utils.data.get_worker_info() is None:
        return torch.empty(shape, dtype=torch.uint8)
    storage = torch.UntypedStorage._new_shared(numel)  # what default_collate does for the same reason
    return torch.empty(0, dtype=torch.uint8).set_(storage).view(shape)


class _EpochBatches(torch.utils.data.Sampler):  # type: ignore[type-arg]
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

    def __iter__(self) -> Iterator[tuple[int, np.ndarray]]:
        idx = self.indices()
        for s in range(0, len(self) * self.batch_size, self.batch_size):
            yield self.epoch, idx[s : s + self.batch_size]


class _StreamBatches(torch.utils.data.IterableDataset):  # type: ignore[type-arg]
    """Batches from an iterable dataset (ShardStream): the stream splits itself across ranks and workers."""

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
        info = torch.utils.data.get_worker_info()
        wid = info.id if info is not None else 0
        if hasattr(self.stream, "set_epoch"):
            self.stream.set_epoch(self.epoch)
        images: list[np.ndarray] = []
        labels: list[int] = []
        for k, item in enumerate(self.stream):
            rng = np.random.Generator(np.random.PCG64([self.seed, self.epoch, wid, k]))
            images.append(self.maker(item[0], rng))
            labels.append(int(item[1]))
            if len(images) == self.batch_size:
                yield _stack(images, labels)
                images, labels = [], []
        if images and not self.drop_last:
            yield _stack(images, labels)


def _init_worker(_: int) -> None:
    # One process per core already: threads inside workers only oversubscribe. OpenCV's thread count is left
    # alone: cv2.setNumThreads in a forked child deadlocks when the parent's OpenCV pool was busy at fork time.
    torch.set_num_threads(1)


class Loader:
    """What ``make_loader`` returns: iterate for ``(images uint8 [N,3,H,W], labels int64 [N])`` batches."""

    def __init__(self, dataloader: torch.utils.data.DataLoader, source: Any, batch_size: int) -> None:  # type: ignore[type-arg]
        self.dataloader, self._source, self.batch_size = dataloader, source, batch_size
        self.epoch = 0
        self._explicit_epoch = False

    def set_epoch(self, epoch: int) -> None:
        """Fix the epoch of the next iteration (otherwise each ``iter()`` advances it by one)."""
        self.epoch, self._explicit_epoch = int(epoch), True

    def __len__(self) -> int:
        return len(self.dataloader)

    def __iter__(self) -> Iterator[Batch]:
        self._source.epoch = self.epoch
        if hasattr(self.dataloader.dataset, "epoch"):
            self.dataloader.dataset.epoch = self.epoch
        it = iter(self.dataloader)  # the sampler reads the epoch here, before any prefetch
        if not self._explicit_epoch:
            self.epoch += 1
        self._explicit_epoch = False
        return it


def make_loader(
    dataset: Any,
    batch_size: int,
    *,
    crop: int | tuple[int, int] | None = 224,
    scale: tuple[float, float] = (0.08, 1.0),
    ratio: tuple[float, float] = (3 / 4, 4 / 3),
    flip: bool = True,
    shuffle: bool = True,
    drop_last: bool = True,
    num_workers: int | None = None,
    device: str | torch.device | None = None,
    pin_memory: bool | None = None,
    persistent_workers: bool | None = None,
    prefetch_factor: int | None = None,
    seed: int = 0,
    rank: int | None = None,
    world_size: int | None = None,
    backend: str = "auto",
    scaled_decode: bool = True,
) -> Any:
    """Batches of ``(uint8 images [N,3,H,W], int64 labels [N])`` with RandomResizedCrop via scaled decode.

    ``crop=None`` keeps the stored size (every image must then have the same size). ``rank``/``world_size``
    default to torch.distributed's; pass them to simulate ranks. ``scaled_decode=False`` decodes JPEGs at full
    size before cropping (the reference path, for comparison). With ``device`` set to a CUDA device the batches
    arrive there through ``prefetch_to_device`` (pinned memory, side-stream copies).

    Example:
        >>> ds = [(torch.randint(0, 255, (3, 40, 50), dtype=torch.uint8), i % 2) for i in range(10)]
        >>> x, y = next(iter(ptt.make_loader(ds, 4, crop=32, num_workers=0)))
        >>> x.shape, x.dtype, y.tolist()[:2] == y.tolist()[:2]
        (torch.Size([4, 3, 32, 32]), torch.uint8, True)
    """
    if batch_size < 1:
        raise PttError(f"batch_size must be >= 1, got {batch_size}.")
    if not (0 < scale[0] <= scale[1] <= 1) or not (0 < ratio[0] <= ratio[1]):
        raise PttError(f"scale must satisfy 0 < lo <= hi <= 1 and ratio 0 < lo <= hi; got {scale}, {ratio}.")
    r0, w0 = _dist_rank_world()
    rank = r0 if rank is None else rank
    world = w0 if world_size is None else world_size
    if not 0 <= rank < world:
        raise PttError(f"rank must be in [0, world_size), got rank={rank}, world_size={world}.")
    dev = torch.device(device) if device is not None else None
    workers = min(len(os.sched_getaffinity(0)), 8) if num_workers is None else num_workers
    maker = SampleMaker(_pair(crop), scale, ratio, flip, backend, scaled_decode)
    iterable = isinstance(dataset, torch.utils.data.IterableDataset)
    if not iterable and not hasattr(dataset, "__len__"):
        raise PttError("dataset needs __len__ and __getitem__ (map-style) or must be an IterableDataset.")
    if iterable:
        source: Any = _StreamBatches(dataset, maker, batch_size, drop_last, seed)
        sampler = None
    else:
        if len(dataset) == 0:
            raise PttError("dataset is empty.")
        source = _EpochBatches(len(dataset), batch_size, shuffle, drop_last, seed, rank, world)
        sampler = source
    kwargs: dict[str, Any] = {}
    if workers > 0:
        kwargs["prefetch_factor"] = prefetch_factor or 2  # in batches per worker: 2 keeps every core busy
        kwargs["persistent_workers"] = (not iterable) if persistent_workers is None else persistent_workers
        kwargs["worker_init_fn"] = _init_worker
    dl = torch.utils.data.DataLoader(
        source if iterable else _BatchDataset(dataset, maker, seed),
        batch_size=None,  # each item is already a whole batch
        sampler=sampler,
        num_workers=workers,
        pin_memory=(dev is not None and dev.type == "cuda") if pin_memory is None else pin_memory,
        **kwargs,
    )
    loader = Loader(dl, source, batch_size)
    if dev is not None and dev.type != "cpu":
        from pytorchtricks.tricks.data.prefetch_to_device import prefetch_to_device

        return prefetch_to_device(loader, dev)
    return loader


def _photo_bytes(n: int, size: tuple[int, int] = (180, 240)) -> list[tuple[bytes, int]]:
    """``n`` JPEG crops of a generated image (deterministic), for smoke benchmarks and doctests."""
    import io

    from PIL import Image

    rng = np.random.default_rng(0)
    base = rng.integers(0, 255, (size[0] // 8, size[1] // 8, 3), dtype=np.uint8)
    img = Image.fromarray(base).resize((size[1] * 2, size[0] * 2), Image.Resampling.BICUBIC)
    out = []
    for i in range(n):
        t, lf = int(rng.integers(0, size[0])), int(rng.integers(0, size[1]))
        buf = io.BytesIO()
        img.crop((lf, t, lf + size[1], t + size[0])).save(buf, format="JPEG", quality=90)
        out.append((buf.getvalue(), i % 10))
    return out


def bench_case(size: str = "smoke", device: str = "cpu") -> BenchCase:
    """One batch of RandomResizedCrop 112 from JPEG bytes: decode-full-then-crop (PIL) vs make_loader's path."""
    import io

    from PIL import Image

    n = 32 if size == "smoke" else 256
    data = _photo_bytes(n, (240, 320) if size == "smoke" else (480, 640))
    crop = 112

    def baseline() -> torch.Tensor:
        out = []
        for i, (raw, _) in enumerate(data):
            arr = np.asarray(Image.open(io.BytesIO(raw)).convert("RGB"))
            rng = sample_rng(0, 0, i)
            t, lf, h, w = rrc_box(arr.shape[0], arr.shape[1], (0.08, 1.0), (3 / 4, 4 / 3), rng)
            out.append(
                torch.from_numpy(resize_hwc(arr[t : t + h, lf : lf + w], (crop, crop)))
                .permute(2, 0, 1)
                .float()
            )
        return torch.stack(out)

    loader = make_loader(data, n, crop=crop, num_workers=0, shuffle=False)

    def treated() -> torch.Tensor:
        return next(iter(loader))[0]

    return BenchCase(
        baseline=baseline,
        treated=treated,
        items_per_call=n,
        unit="images",
        device=device,
        description=f"{n} JPEGs -> RandomResizedCrop {crop}: full PIL decode + float collate vs scaled decode uint8",
    )
