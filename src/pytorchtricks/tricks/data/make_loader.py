"""A fast-by-default image loader: crop-aware scaled decode, whole-batch workers, uint8 NCHW out, DDP-exact.

Why: the stock recipe (ImageFolder + PIL + RandomResizedCrop + ToTensor) decodes every JPEG at full size, then
throws most pixels away, converts to float on the CPU (4x the bytes to copy) and collates sample by sample. Here each
worker builds a whole batch: the crop box is sampled from the JPEG header, the decoder scales in the DCT domain
(1/2, 1/4, 1/8) while the crop stays >= the target, pixels go straight into one uint8 batch buffer.
When: image training (RandomResizedCrop + flip) and evaluation (``mode="eval"``: resize 256, centre crop 224)
input pipelines; any map-style dataset (ShardDataset, JpegFolder, datasets returning PIL, arrays, tensors or bytes)
and iterable ShardStream.
Caveats: batches are uint8 with NCHW shape stored channels_last (no transpose copy): normalize on the device
(prefetch_to_device). Each sample's randomness depends only on (seed, epoch, index), so results do not change with
num_workers or rank count. drop_last=True (training's default) warns once with how many samples it drops per
epoch; with drop_last=False ranks may get one batch more or less (DDP needs equal step counts: keep it True there).
pin_memory is on only for a CUDA target: measure it (autotune_loader). The workers' batches in flight are planned
before they start to fit /dev/shm (a container's is 64 MB): fewer per worker, else anonymous memory files, else a
ShmError with the fixes (``data.shm``; what changed is said in a PttWarning).
See also: cache_in_ram, prefetch_to_device, autotune_loader, doctor_data; 预处理提速 / IO 提速.
"""

from __future__ import annotations

import dataclasses
import os
import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from pytorchtricks.core import BenchCase, PttError, PttWarning, TrickInfo, config_first, options_of
from pytorchtricks.data.batches import BatchDataset, StreamBatches, rank_world
from pytorchtricks.data.decode import resize_array
from pytorchtricks.data.images import SampleMaker, rrc_box, sample_rng
from pytorchtricks.tricks.data import _runtime
from pytorchtricks.tricks.data._runtime import Loader, Mode
from pytorchtricks.tunable import TuneFacts, TuneHook, TuneSetup, unless_input_bound

__all__ = ["LoaderConfig", "make_loader"]

TRICK = TrickInfo(gains=("speed",), phase=("train", "infer"), exact=False)


def _tune_applies(facts: TuneFacts) -> str | None:
    return unless_input_bound(facts, ("files", "pack"))


def _tune_apply(setup: TuneSetup, state: object) -> None:
    setup.loader = "ptt"  # tune builds make_loader(setup.dataset, ...) with setup.loader_kwargs


TUNE = TuneHook(
    changes="loader",
    check="data",
    receipt="loader = ptt.make_loader(dataset, {batch_size}, crop={input_size}, num_workers={workers})"
    "  # uint8 batches: normalise on the device",
    apply=_tune_apply,
    applies=_tune_applies,
    order=105,
    bound="decoded pixels >= 30 dB PSNR vs PIL full decode",
    # on a detection workload tune builds ptt.make_detection_loader in its place (the decode at the training size,
    # boxes that follow): the same idea, the detection geometry
    tasks=("classification", "detection"),
    detection_receipt="loader = ptt.make_detection_loader(dataset, {batch_size}, "
    "ptt.DetectionRecipe.shortest_side({input_size}, {max_size}), ptt.DetectionLoaderConfig(num_workers={workers}))"
    "  # padded uint8 batches: cut each image to batch.sizes[i], /255 on the device",
)

Batch = tuple[torch.Tensor, torch.Tensor]

TRAIN_SCALE, TRAIN_RATIO = (0.08, 1.0), (3 / 4, 4 / 3)  # RandomResizedCrop's defaults (torchvision, timm)
EVAL_CROP_FRACTION = 0.875  # eval resizes the short side to crop / 0.875 (224 -> 256), then centre-crops


def _pair(x: int | Sequence[int] | None) -> tuple[int, int] | None:
    if x is None:
        return None
    if isinstance(x, int):
        return (x, x)
    if len(x) != 2:
        raise PttError(f"crop must be an int or (height, width), got {x!r}")
    return int(x[0]), int(x[1])


def _maker(
    mode: str,
    crop: tuple[int, int] | None,
    resize: int | None,
    scale: tuple[float, float] | None,
    ratio: tuple[float, float] | None,
    flip: bool,
    backend: str,
    scaled_decode: bool,
) -> SampleMaker:
    """The per-sample pipeline of ``mode``, with its options checked (each mode refuses the other's knobs)."""
    if mode == "train":
        if resize is not None:
            raise PttError(
                "resize= is the eval recipe's short side; pass mode='eval' (training uses scale=/ratio=)."
            )
        scale, ratio = scale or TRAIN_SCALE, ratio or TRAIN_RATIO
        if not (0 < scale[0] <= scale[1] <= 1) or not (0 < ratio[0] <= ratio[1]):
            raise PttError(
                f"scale must satisfy 0 < lo <= hi <= 1 and ratio 0 < lo <= hi; got {scale}, {ratio}."
            )
        return SampleMaker(crop, scale, ratio, flip, backend, scaled_decode)
    if mode != "eval":
        raise PttError(f"mode must be 'train' or 'eval', got {mode!r}.")
    if scale is not None or ratio is not None:
        raise PttError(
            "scale=/ratio= are RandomResizedCrop's; mode='eval' centre-crops: drop them (or use resize=)."
        )
    if crop is None:
        if resize is not None:
            raise PttError("resize= needs crop=N in mode='eval' (crop=None keeps the stored size).")
        return SampleMaker(None, TRAIN_SCALE, TRAIN_RATIO, flip, backend, scaled_decode)
    resize = round(max(crop) / EVAL_CROP_FRACTION) if resize is None else int(resize)
    if resize < max(crop):
        raise PttError(
            f"resize={resize} is smaller than crop={crop}; the centre crop must fit: resize >= crop."
        )
    return SampleMaker(crop, TRAIN_SCALE, TRAIN_RATIO, flip, backend, scaled_decode, resize=resize)


def _say_dropped(dropped: int, n: int, batch_size: int, world: int, shuffle: bool) -> None:
    per = f"batch_size={batch_size}" + (f" x world_size={world}" if world > 1 else "")
    which = (
        "all of them: the loader yields no batch"
        if dropped == n
        else "different ones each epoch, as the order is reshuffled"
        if shuffle
        else "always the same last ones: they are never seen"
    )
    ranks = "; DDP ranks may then take one step more or less" if world > 1 else ""
    warnings.warn(
        f"make_loader drops {dropped} of {n} samples every epoch: drop_last=True keeps only full batches of {per} "
        f"({which}). Pass drop_last=False to keep them (the last batch is then partial{ranks}), or make the "
        f"dataset size a multiple of {per}.",
        PttWarning,
        stacklevel=4,  # make_loader -> _epochs -> here: the warning names the caller of make_loader
    )


@dataclasses.dataclass(frozen=True)
class LoaderConfig:
    """``make_loader``'s options as one value: ``ptt.make_loader(ds, 256, ptt.LoaderConfig(crop=224, num_workers=8))``
    (or its fields as keywords: ``ptt.make_loader(ds, 256, crop=224, num_workers=8)``; see there for what each
    does)."""

    mode: Mode = "train"
    crop: int | tuple[int, int] | None = 224
    resize: int | None = None
    scale: tuple[float, float] | None = None
    ratio: tuple[float, float] | None = None
    flip: bool | None = None
    shuffle: bool | None = None
    drop_last: bool | None = None
    num_workers: int | None = None
    device: str | torch.device | None = None
    pin_memory: bool | None = None
    persistent_workers: bool | None = None
    prefetch_factor: int | None = None
    seed: int = 0
    rank: int | None = None
    world_size: int | None = None
    backend: str = "auto"
    scaled_decode: bool = True
    cache_dir: str | os.PathLike[str] | None = None
    cache_limit: int | str | None = None


@options_of(LoaderConfig)
def make_loader(dataset: Any, batch_size: int, config: LoaderConfig | None = None, **options: Any) -> Loader:
    """A ``Loader`` of batches of ``(uint8 images [N,3,H,W], int64 labels [N])``, cropped through a DCT-scaled decode.

    ``mode="train"`` (default): RandomResizedCrop (``scale``, default (0.08, 1); ``ratio``, default (3/4, 4/3)),
    random flip, a reshuffle per epoch, ``drop_last`` (full batches only; warns ``PttWarning`` once with how many
    samples that drops, also on ``loader.dropped_per_epoch``). ``mode="eval"``: torchvision's eval recipe, short
    side resized to ``resize`` (default ``round(crop / 0.875)``: 256 for 224) then the centre ``crop``; no flip,
    no shuffle, every sample exactly once and in order (the last batch may be partial). The decode scale is the
    largest of 1/2, 1/4, 1/8 that keeps the short side >= ``resize``. ``flip``/``shuffle``/``drop_last`` left at
    None follow the mode; set, they override it.

    ``crop=None`` keeps the stored size (every image must then have the same size). ``rank``/``world_size``
    default to torch.distributed's; pass them to simulate ranks. ``scaled_decode=False`` decodes JPEGs at full
    size before cropping (the reference path, for comparison). With ``device`` set to a CUDA device the batches
    arrive there through ``prefetch_to_device`` (pinned memory, side-stream copies).

    The options are ``LoaderConfig``'s fields: one ``config``, or its fields as keywords (not both; an unknown
    keyword is refused with the closest field).

    ``dataset`` may also be a path or URL, opened by ``ptt.open_data``: a ptt pack is read as a ``ShardDataset``,
    a tar pack as a ``ShardStream`` (seeded with ``seed``, split over ``rank``/``world_size``), an ImageFolder tree
    (or the train split of ``ROOT/train`` + ``ROOT/val``) as a ``JpegFolder``; a URL's shards come through the node
    cache ``cache_dir`` (bounded by ``cache_limit`` bytes).

    Example:
        >>> ds = [(torch.randint(0, 255, (3, 40, 50), dtype=torch.uint8), i % 2) for i in range(10)]
        >>> x, y = next(iter(ptt.make_loader(ds, 5, crop=32, num_workers=0)))
        >>> x.shape, x.dtype, y.dtype
        (torch.Size([5, 3, 32, 32]), torch.uint8, torch.int64)
        >>> val = ptt.make_loader(ds, 4, crop=32, mode="eval", num_workers=0)  # short side 37, centre 32x32
        >>> [tuple(x.shape) for x, _ in val], [y.tolist() for _, y in val][-1], val.dropped_per_epoch
        ([(4, 3, 32, 32), (4, 3, 32, 32), (2, 3, 32, 32)], [0, 1], 0)
    """
    cfg = _by_mode(config_first(config, LoaderConfig, options))
    if batch_size < 1:
        raise PttError(f"batch_size must be >= 1, got {batch_size}.")
    maker = _maker(cfg.mode, _pair(cfg.crop), cfg.resize, cfg.scale, cfg.ratio, bool(cfg.flip), cfg.backend,
                   cfg.scaled_decode)  # fmt: skip
    rank, world = rank_world(cfg.rank, cfg.world_size)
    dataset = _opened(dataset, cfg, rank, world)
    iterable = isinstance(dataset, torch.utils.data.IterableDataset)
    crop_hw = maker.crop
    batch_bytes = batch_size * crop_hw[0] * crop_hw[1] * 3 if crop_hw is not None else None
    plan = _runtime.plan_workers("make_loader", cfg.num_workers, cfg.prefetch_factor, batch_bytes)
    if iterable:
        if hasattr(dataset, "state_dict") and hasattr(dataset, "batch_size"):
            dataset.batch_size = (
                batch_size  # a ShardStream hands workers blocks of one batch: the loader's order
            )
        source: Any = StreamBatches(dataset, maker, batch_size, bool(cfg.drop_last), cfg.seed, plan.slots)
        sampler, dropped = (
            None,
            (None if cfg.drop_last else 0),
        )  # a stream splits itself: its remainder is unknown
    else:
        sampler = source = _epochs(dataset, batch_size, cfg, rank, world)
        dropped = source.dropped()
    dev = torch.device(cfg.device) if cfg.device is not None else None
    return _runtime.start(
        source if iterable else BatchDataset(dataset, maker, cfg.seed, plan.slots),
        plan,
        sampler=sampler,
        source=source,
        batch_size=batch_size,
        mode=cfg.mode,
        dropped_per_epoch=dropped,
        persistent_workers=(not iterable) if cfg.persistent_workers is None else cfg.persistent_workers,
        pin_memory=(dev is not None and dev.type == "cuda") if cfg.pin_memory is None else cfg.pin_memory,
        device=dev if dev is not None and dev.type != "cpu" else None,
    )


def _by_mode(cfg: LoaderConfig) -> LoaderConfig:
    """``flip``/``shuffle``/``drop_last`` left at None follow the mode: on for training, off for evaluation."""
    train = cfg.mode == "train"
    return dataclasses.replace(
        cfg,
        flip=train if cfg.flip is None else cfg.flip,
        shuffle=train if cfg.shuffle is None else cfg.shuffle,
        drop_last=train if cfg.drop_last is None else cfg.drop_last,
    )


def _opened(dataset: Any, cfg: LoaderConfig, rank: int, world: int) -> Any:
    """The dataset make_loader reads: a path or URL opened on the one data road (a tar pack in the loader's
    order and rank share), and refused when the loader cannot read it as it is meant."""
    from pytorchtricks.data.detection import refuse_detection
    from pytorchtricks.road import DataSource

    # the one data road: a path, or what ptt.data_source read of one, opened by open_data's reader (raw records)
    if isinstance(dataset, str | os.PathLike | DataSource):
        from pytorchtricks.road import open_data
        from pytorchtricks.shards.stream import StreamConfig

        order = StreamConfig(shuffle=bool(cfg.shuffle), seed=cfg.seed, rank=rank, world_size=world)
        dataset = open_data(
            dataset, decode=None, cache_dir=cfg.cache_dir, cache_limit=cfg.cache_limit, stream=order
        )
    refuse_detection(dataset, "make_loader")
    if hasattr(dataset, "read_raw") and getattr(dataset, "transform", None) is not None:
        raise PttError(
            "make_loader reads the stored records (read_raw) and decodes, crops and flips them itself, so this "
            "dataset's transform= would not run: make it without transform= and give crop/scale/ratio/flip to "
            "make_loader, or iterate it with a plain DataLoader to keep your transform."
        )
    if not isinstance(dataset, torch.utils.data.IterableDataset) and not hasattr(dataset, "__len__"):
        raise PttError("dataset needs __len__ and __getitem__ (map-style) or must be an IterableDataset.")
    return dataset


def _epochs(dataset: Any, batch_size: int, cfg: LoaderConfig, rank: int, world: int) -> Any:
    """A map-style dataset's sampler of whole batches (this rank's share, reshuffled per epoch when asked); what
    ``drop_last`` drops is said once, by one rank (every rank drops the same count)."""
    if len(dataset) == 0:
        raise PttError("dataset is empty.")
    shuffle = bool(cfg.shuffle)
    source = _runtime.epoch_sampler(
        len(dataset), batch_size, shuffle=shuffle, drop_last=bool(cfg.drop_last), seed=cfg.seed, rank=rank,
        world_size=world,
    )  # fmt: skip
    dropped = source.dropped()
    if dropped and rank == 0:
        _say_dropped(dropped, len(dataset), batch_size, world, shuffle)
    return source


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
                torch.from_numpy(resize_array(arr[t : t + h, lf : lf + w], (crop, crop)))
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
