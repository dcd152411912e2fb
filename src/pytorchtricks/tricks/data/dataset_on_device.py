"""Keep the whole uint8 dataset resident on the device; shuffle and augment there (airbench-style), no workers.

Why: for small datasets (CIFAR-size, or any set whose uint8 pixels fit in free device memory) the fastest loader
is no loader: one ``randperm`` and an index gather per batch on the device, augmentation batched on the device.
When: datasets of equal-size images whose bytes fit in device memory with room for the model; quick experiments.
Caveats: a memory check refuses sets that would leave less than ``reserve`` of free memory (CUDA: mem_get_info;
CPU: available RAM). Images must already share one size (resize once beforehand). Shuffling uses the generator you
seed, on the device.
See also: device_augment, cache_in_ram, prefetch_to_device; airbench.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch

from pytorchtricks.core import BenchCase, PttError, TrickInfo, config_first, options_of, resolve_device
from pytorchtricks.tricks.data.device_augment import device_augment
from pytorchtricks.tunable import TuneFacts, TuneHook, TuneSetup, TuneSkip, stored_side, unless_input_bound

__all__ = ["DeviceDatasetConfig", "dataset_on_device"]

TRICK = TrickInfo(gains=("speed",), phase=("train",), exact=True)


def _tune_applies(facts: TuneFacts) -> str | None:
    if facts.device != "cuda":
        return (
            "keeps every decoded image in GPU memory and crops/flips batches there; this run is on the CPU, "
            "where the RAM cache (cache_in_ram) is the same idea"
        )
    return unless_input_bound(facts, ("files", "pack"))


def _tune_prepare(setup: TuneSetup) -> dict[str, Any]:
    """Every sample decoded once (the library's decoder, resize + centre crop to one square side), stacked."""
    from pytorchtricks.tricks.data.make_loader import make_loader

    side = stored_side(setup.input_size)
    n = len(setup.dataset)
    dev = resolve_device(setup.device)
    try:  # refuse before decoding: n images of side^2 x 3 bytes must fit with a quarter of the memory left
        _check_fits(n * 3 * side * side, dev, 0.25)
    except PttError as exc:
        raise TuneSkip(str(exc)) from exc
    workers = int(setup.loader_kwargs.get("num_workers", 0))
    loader = make_loader(setup.dataset, 64, crop=side, mode="eval", num_workers=workers)
    xs, ys = zip(*((x, y) for x, y in loader), strict=True)
    return {"images": torch.cat(xs), "labels": torch.cat(ys), "side": side}


def _tune_apply(setup: TuneSetup, state: dict[str, Any]) -> None:
    try:
        setup.dataset = dataset_on_device(
            state["images"],
            state["labels"],
            setup.batch_size,
            device=setup.device,
            shuffle=setup.train,
            drop_last=setup.train,
            augment={"crop": setup.input_size, "flip": True} if setup.train else None,
        )
    except PttError as exc:
        raise TuneSkip(str(exc)) from exc
    setup.loader = "device"  # the dataset is its own loader: batches come out on the device
    setup.loader_kwargs["num_workers"] = 0


TUNE = TuneHook(
    changes="loader",
    check="data",
    receipt=(
        "dataset = ptt.dataset_on_device(images, labels, {batch_size}, device='cuda', "
        "augment={{'crop': {input_size}, 'flip': True}})  # decoded once (ptt.make_loader mode='eval'), on the GPU"
    ),
    apply=_tune_apply,
    applies=_tune_applies,
    prepare=_tune_prepare,
    cost="cache",
    order=102,
    bound="decoded pixels >= 30 dB PSNR vs PIL full decode",
    group="dataset",
)


def _free_bytes(device: torch.device) -> int:
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free)
    import psutil

    return int(psutil.virtual_memory().available)


def _check_fits(need: int, dev: torch.device, reserve: float) -> None:
    free = _free_bytes(dev)
    if need > (1 - reserve) * free:
        raise PttError(
            f"the dataset needs {need / 2**30:.2f} GiB but only {free / 2**30:.2f} GiB is free on {dev} (keeping "
            f"{reserve:.0%} in reserve); use make_loader + cache_in_ram instead, or a smaller image size."
        )


class DeviceDataset:
    """Batches ``(images uint8 [B, C, H, W], labels [B])`` from tensors resident on one device."""

    def __init__(
        self,
        images: torch.Tensor,
        labels: torch.Tensor,
        batch_size: int,
        *,
        shuffle: bool,
        drop_last: bool,
        augment: dict[str, Any] | None,
        seed: int,
    ) -> None:
        self.images, self.labels, self.batch_size = images, labels, batch_size
        self.shuffle, self.drop_last, self.augment = shuffle, drop_last, augment
        self.generator = torch.Generator(device=images.device).manual_seed(seed)

    def __len__(self) -> int:
        n = len(self.labels)
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        n = len(self.labels)
        dev = self.images.device
        order = (
            torch.randperm(n, device=dev, generator=self.generator)
            if self.shuffle
            else torch.arange(n, device=dev)
        )
        for b in range(len(self)):
            idx = order[b * self.batch_size : (b + 1) * self.batch_size]
            x = self.images.index_select(0, idx)
            if self.augment:
                x = device_augment(x, generator=self.generator, **self.augment)
            yield x, self.labels.index_select(0, idx)


@dataclass(frozen=True)
class DeviceDatasetConfig:
    """``dataset_on_device``'s options as one value: ``ptt.dataset_on_device(x, y, 256, ptt.DeviceDatasetConfig(
    device="cuda", augment={"flip": True}))``, or its fields as keywords.

    ``device``: where the set lives (None: CUDA when available, else CPU). ``shuffle``: a new order each pass,
    drawn on the device from ``seed``'s generator. ``drop_last``: full batches only. ``augment``: ``device_augment``
    options (e.g. ``{"flip": True, "translate": 2}``). ``reserve``: the share of the device's free memory the set
    must leave free (else ``PttError``).

    Example:
        >>> cfg = ptt.DeviceDatasetConfig(device="cpu", shuffle=False, drop_last=True)
        >>> dd = ptt.dataset_on_device(torch.zeros(6, 3, 4, 4, dtype=torch.uint8), torch.arange(6), 4, cfg)
        >>> len(dd), [y.tolist() for _, y in dd]
        (1, [[0, 1, 2, 3]])
    """

    device: str | torch.device | None = None
    shuffle: bool = True
    drop_last: bool = False
    augment: dict[str, Any] | None = None
    seed: int = 0
    reserve: float = 0.25


@options_of(DeviceDatasetConfig)
def dataset_on_device(
    images: torch.Tensor,
    labels: torch.Tensor,
    batch_size: int,
    config: DeviceDatasetConfig | None = None,
    **options: Any,
) -> DeviceDataset:
    """Move ``images`` (uint8 ``[N, C, H, W]``) and ``labels`` to ``device`` once; iterate shuffled batches there.

    The options are ``DeviceDatasetConfig``'s fields (``device``, ``shuffle``, ``drop_last``, ``augment``,
    ``seed``, ``reserve``): one ``config``, or its fields as keywords (not both). ``augment`` holds
    ``device_augment`` options (e.g. ``{"flip": True, "translate": 2}``). Refuses (``PttError``) when the set would
    use more than ``1 - reserve`` of the free memory of the device.

    Example:
        >>> x = torch.randint(0, 256, (10, 3, 8, 8), dtype=torch.uint8)
        >>> dd = ptt.dataset_on_device(x, torch.arange(10), 4, device="cpu", augment={"flip": True})
        >>> [tuple(b[0].shape) for b in dd][-1], len(dd)
        ((2, 3, 8, 8), 3)
    """
    cfg = config_first(config, DeviceDatasetConfig, options)
    if not isinstance(images, torch.Tensor) or images.dim() != 4 or images.dtype != torch.uint8:
        raise PttError(
            "images must be one uint8 tensor [N, C, H, W]; resize to one size and stack them first."
        )
    if len(labels) != len(images):
        raise PttError(f"{len(images)} images but {len(labels)} labels.")
    if batch_size < 1:
        raise PttError(f"batch_size must be >= 1, got {batch_size}.")
    dev = resolve_device(cfg.device)
    labels = torch.as_tensor(labels)
    if images.device != dev:  # already resident: nothing new to allocate
        _check_fits(images.nbytes + labels.nbytes, dev, cfg.reserve)
    return DeviceDataset(
        images.to(dev),
        labels.to(dev),
        batch_size,
        shuffle=cfg.shuffle,
        drop_last=cfg.drop_last,
        augment=cfg.augment,
        seed=cfg.seed,
    )


def bench_case(size: str = "smoke", device: str = "cpu") -> BenchCase:
    """An epoch of 32x32 uint8 batches with flip + translate: DataLoader over a TensorDataset vs resident set."""
    n = 2048 if size == "smoke" else 20000
    dev = resolve_device(device)
    x = torch.randint(0, 256, (n, 3, 32, 32), dtype=torch.uint8)
    y = torch.randint(0, 10, (n,))
    dl = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=256, shuffle=True)
    dd = dataset_on_device(x, y, 256, device=dev, augment={"flip": True, "translate": 2})

    def baseline() -> int:
        g = torch.Generator(device=dev).manual_seed(0)
        return sum(
            int(device_augment(b.to(dev), flip=True, translate=2, generator=g).shape[0]) for b, _ in dl
        )

    return BenchCase(
        baseline=baseline,
        treated=lambda: sum(int(b.shape[0]) for b, _ in dd),
        items_per_call=n,
        unit="images",
        device=str(dev),
        description=f"one epoch of {n} 32x32 images, flip + translate 2: DataLoader+TensorDataset vs on-device",
    )
