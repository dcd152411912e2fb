"""Copy the next batch to the device while the model runs on this one; normalize and cast there, not on the CPU.

Why: a uint8 batch is 4x fewer bytes to copy than float32; a side CUDA stream with ``non_blocking`` from pinned
memory overlaps the copy with compute; normalizing on the GPU frees the CPU workers for decoding. The consumer stream
waits for the copy stream (``wait_stream``) and each tensor is ``record_stream``-ed so the caching allocator does not
reuse its memory while the copy may still be in flight (timm's PrefetchLoader omits this).
When: any loop that moves batches to a GPU; on CPU a background thread prefetches with the same API and results.
Caveats: normalization happens after the copy in float32 (or ``dtype``); pass ``normalize=None`` to keep uint8.
Labels and other tensors are copied as they are. The CPU path overlaps only Python/collate work (the GIL).
See also: make_loader, device_augment; apex data_prefetcher, timm PrefetchLoader; 预处理提速 / IO 提速.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import torch

from pytorchtricks.core import BenchCase, PttError, TrickInfo, resolve_device
from pytorchtricks.tunable import TuneFacts, TuneHook, TuneSetup

__all__ = ["prefetch_to_device"]

TRICK = TrickInfo(gains=("speed",), phase=("train", "infer"), exact=True)


def _tune_applies(facts: TuneFacts) -> str | None:
    if facts.device != "cuda":
        return "overlaps host-to-GPU copies with compute; this run is on the CPU (nothing to copy)"
    return None


def _tune_apply(setup: TuneSetup, state: object) -> None:
    setup.loader = "ptt"
    setup.device_loader.append(lambda loader: prefetch_to_device(loader, setup.device))


TUNE = TuneHook(
    changes="loader",
    check="data",
    receipt="loader = ptt.prefetch_to_device(loader, device)  # pinned buffers, side-stream copies",
    apply=_tune_apply,
    applies=_tune_applies,
    order=130,
    requires=("make_loader",),
)

_DONE = object()


class _Transform:
    """uint8 images -> normalized ``dtype`` (and channels_last) on the device; other tensors moved as they are."""

    def __init__(
        self,
        device: torch.device,
        normalize: tuple[Sequence[float], Sequence[float]] | None,
        dtype: torch.dtype | None,
        channels_last: bool,
    ) -> None:
        self.device, self.dtype, self.channels_last = device, dtype, channels_last
        self.mean: torch.Tensor | None = None
        self.inv_std: torch.Tensor | None = None
        if normalize is not None:
            mean, std = normalize
            if len(mean) != len(std):
                raise PttError(f"normalize=(mean, std) need the same length, got {len(mean)} and {len(std)}.")
            if any(s == 0 for s in std):
                raise PttError(
                    "normalize std contains 0; use the per-channel standard deviation (e.g. 58.4)."
                )
            self.mean = torch.tensor(mean, dtype=torch.float32, device=device).view(1, -1, 1, 1)
            self.inv_std = 1.0 / torch.tensor(std, dtype=torch.float32, device=device).view(1, -1, 1, 1)

    def images(self, x: torch.Tensor) -> torch.Tensor:
        if self.mean is not None and self.inv_std is not None:
            x = (x.float() - self.mean) * self.inv_std  # float32 math, then the requested dtype
            if self.dtype is not None:
                x = x.to(self.dtype)
        elif self.dtype is not None:
            x = x.to(self.dtype)
        if self.channels_last and x.dim() == 4:
            x = x.contiguous(memory_format=torch.channels_last)
        return x

    def __call__(self, batch: Any, non_blocking: bool) -> Any:
        def move(t: torch.Tensor) -> torch.Tensor:
            return t.to(self.device, non_blocking=non_blocking)

        if isinstance(batch, torch.Tensor):
            return self.images(move(batch))
        if isinstance(batch, tuple | list) and batch and isinstance(batch[0], torch.Tensor):
            rest = [move(t) if isinstance(t, torch.Tensor) else t for t in batch[1:]]
            return (self.images(move(batch[0])), *rest)
        raise PttError("batches must be a tensor or a (images, labels, ...) tuple of tensors.")


def _tensors(obj: Any) -> list[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, tuple | list):
        return [t for t in obj if isinstance(t, torch.Tensor)]
    return []


class DevicePrefetcher:
    """Iterable wrapper made by ``prefetch_to_device``; keeps ``len`` and ``set_epoch`` of the wrapped loader."""

    def __init__(
        self, loader: Iterable[Any], device: torch.device, transform: _Transform, depth: int
    ) -> None:
        self.loader, self.device, self.transform, self.depth = loader, device, transform, depth

    def __len__(self) -> int:
        return len(self.loader)  # type: ignore[arg-type]

    def set_epoch(self, epoch: int) -> None:
        if hasattr(self.loader, "set_epoch"):
            self.loader.set_epoch(epoch)

    def __iter__(self) -> Iterator[Any]:
        if self.device.type == "cuda":
            return self._cuda_iter()
        return self._thread_iter()

    def _cuda_iter(self) -> Iterator[Any]:
        stream = torch.cuda.Stream(device=self.device)
        pending: list[Any] = []
        it = iter(self.loader)

        def issue() -> bool:
            try:
                batch = next(it)
            except StopIteration:
                return False
            with torch.cuda.stream(stream):
                pending.append(self.transform(batch, non_blocking=True))
            return True

        for _ in range(self.depth):
            if not issue():
                break
        while pending:
            current = torch.cuda.current_stream(self.device)
            current.wait_stream(stream)  # the copy and normalize must finish before the model reads
            out = pending.pop(0)
            for t in _tensors(out):
                t.record_stream(current)  # allocated on `stream`, used on `current`: keep it alive until used
            issue()
            yield out

    def _thread_iter(self) -> Iterator[Any]:
        q: queue.Queue[Any] = queue.Queue(maxsize=self.depth)
        stop = threading.Event()

        def work() -> None:
            try:
                for batch in self.loader:
                    item = self.transform(batch, non_blocking=False)
                    while not stop.is_set():
                        try:
                            q.put(item, timeout=0.1)
                            break
                        except queue.Full:
                            continue
                    if stop.is_set():
                        return
                q.put(_DONE)
            except BaseException as exc:  # re-raised in the consumer, never swallowed
                q.put(exc)

        thread = threading.Thread(target=work, name="ptt-prefetch", daemon=True)
        thread.start()
        try:
            while True:
                item = q.get()
                if item is _DONE:
                    return
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            stop.set()
            thread.join(timeout=5)


def prefetch_to_device(
    loader: Iterable[Any],
    device: str | torch.device | None = None,
    *,
    normalize: tuple[Sequence[float], Sequence[float]] | None = None,
    channels_last: bool = False,
    dtype: torch.dtype | None = None,
    depth: int = 2,
) -> DevicePrefetcher:
    """Wrap ``loader`` so batches arrive on ``device``, normalized and cast there, ``depth`` batches ahead.

    ``normalize=(mean, std)`` in pixel units (0..255) for uint8 batches. CUDA: side stream, ``non_blocking``,
    ``record_stream``. CPU: a background thread; the same batches in the same order either way.

    Example:
        >>> batches = [(torch.full((2, 3, 4, 4), 255, dtype=torch.uint8), torch.tensor([0, 1]))]
        >>> x, y = next(iter(ptt.prefetch_to_device(batches, "cpu", normalize=([127.5] * 3, [127.5] * 3))))
        >>> x.dtype, float(x.max())
        (torch.float32, 1.0)
    """
    if depth < 1:
        raise PttError(f"depth must be >= 1 batch, got {depth}.")
    dev = resolve_device(device)
    return DevicePrefetcher(loader, dev, _Transform(dev, normalize, dtype, channels_last), depth)


def bench_case(size: str = "smoke", device: str = "cpu") -> BenchCase:
    """Consume batches that take CPU work to produce while a 'step' also works: plain vs background prefetch."""
    n = 8 if size == "smoke" else 32
    dev = resolve_device(device)
    w = torch.randn(256, 256, device=dev)

    def produce() -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        g = torch.Generator().manual_seed(0)
        for _ in range(n):
            yield torch.randint(0, 255, (64, 3, 64, 64), dtype=torch.uint8, generator=g), torch.zeros(64)

    def consume(batches: Iterable[Any]) -> torch.Tensor:
        acc = torch.zeros((), device=dev)
        for x, _ in batches:
            acc = acc + (x.float().mean() + (w @ w).mean())
        return acc

    norm = ([127.5] * 3, [64.0] * 3)
    plain = _Transform(dev, norm, None, False)
    return BenchCase(
        baseline=lambda: consume(plain(b, non_blocking=False) for b in produce()),
        treated=lambda: consume(prefetch_to_device(produce(), dev, normalize=norm)),
        items_per_call=n * 64,
        unit="images",
        device=str(dev),
        description=f"{n} uint8 batches of 64x3x64x64 normalized on {dev.type}: in-loop vs prefetched",
        check=lambda a, b: torch.testing.assert_close(a, b),
    )
