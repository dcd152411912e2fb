"""Detection batches from high-resolution photos: each image decoded at the training size, boxes that follow.

Why: the detection reference pipeline (CocoDetection + the v2 "hflip" policy) decodes every photo at full size and
ships it as float32 through the workers - a 12 MP photo is 144 MB - only for the model's own transform to shrink it
to ~0.85 MP. Here each image's geometry (shortest side / max size, LSJ scale jitter + crop, SSD zoom-out + IoU crop,
flip) is planned from the JPEG header, the decoder works at the largest DCT scale (1/2, 1/4, 1/8) that keeps the
output size and, for crops, only the window's rows and columns, and the boxes get the same affine map (clipped,
degenerate ones dropped and counted). Whole batches are built inside the workers: uint8, padded to a multiple of 32.
When: training a detector on photos larger than its input (COCO, YOLO, VOC roots via ``ptt.open_detection``, or
detection packs); with aspect-ratio grouping (torchvision's GroupedBatchSampler, k=3) so padding stays small.
Caveats: batches are ``DetectionBatch(images uint8 [N,3,H,W] padded, sizes, targets)``: cut each image to its
``sizes[i]`` and normalise on the device. Pixels differ from a full decode + resize by the DCT-scaled decode
(>= 30 dB PSNR, tested against torchvision v2 with the same random parameters; boxes within 1e-3 px). Mosaic is not
provided. Each sample's randomness depends only on (seed, epoch, index): the same batches at any worker or rank count.
The batches in flight are planned to fit /dev/shm before the workers start (``data.shm``, as ``make_loader``).
See also: make_loader (classification), pack (detection roots pack with their boxes), open_detection; 预处理提速.

The machinery is ``make_loader``'s: whole batches built inside workers, in shared memory (no copy on hand-over;
``data.batches.BatchSlots``: each worker reuses its buffers once the main process has freed them), an epoch
sampler that gives DDP ranks equal, disjoint shares, and the same ``Loader`` (``set_epoch``, ``dropped_per_epoch``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from pytorchtricks.core import BenchCase, PttError, TrickInfo, config_first, options_of
from pytorchtricks.data.batches import BatchSlots
from pytorchtricks.data.detection_loader import DetectionBatch, DetectionBatcher, aspect_groups
from pytorchtricks.data.recipes import DetectionRecipe
from pytorchtricks.tricks.data import _runtime
from pytorchtricks.tricks.data._runtime import Loader

__all__ = ["DetectionLoaderConfig", "make_detection_loader"]

TRICK = TrickInfo(gains=("speed",), phase=("train",), exact=False)


@dataclass(frozen=True)
class DetectionLoaderConfig:
    """The loader's options beyond the recipe (defaults: training).

    ``group_by_aspect``: batch images of like aspect ratio together (torchvision's ``GroupedBatchSampler``, k=3),
    so padding stays small; it reads every image's size once (annotations, else headers). ``shuffle`` /
    ``drop_last`` default to True (training). ``rank`` / ``world_size`` default to torch.distributed's.
    ``scaled_decode=False`` decodes at full size (the reference path).
    """

    shuffle: bool = True
    drop_last: bool = True
    group_by_aspect: bool = True
    num_workers: int | None = None
    prefetch_factor: int = 2
    persistent_workers: bool = True
    pin_memory: bool = False
    seed: int = 0
    rank: int | None = None
    world_size: int | None = None
    backend: str = "auto"
    scaled_decode: bool = True


class _DetectionBatches(torch.utils.data.Dataset):  # type: ignore[type-arg]
    """Key ``(epoch, indices)`` -> one whole ``DetectionBatch``; runs inside DataLoader workers."""

    def __init__(self, dataset: Any, batcher: DetectionBatcher, slots: BatchSlots) -> None:
        self.dataset, self.batcher, self.slots = dataset, batcher, slots

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, key: tuple[int, np.ndarray]) -> DetectionBatch:
        return self.batcher(self.dataset, key[0], key[1], self.slots)


@options_of(DetectionLoaderConfig)
def make_detection_loader(
    dataset: Any,
    batch_size: int,
    recipe: DetectionRecipe | str = "shortest_side",
    config: DetectionLoaderConfig | None = None,
    **options: Any,
) -> Loader:
    """Batches ``DetectionBatch(images uint8 [N,3,H,W] padded, sizes int64 [N,2], targets list)`` from a
    detection dataset (``ptt.open_detection(root)``, a detection pack, or any map-style dataset returning
    ``(jpeg bytes, {"boxes", "labels", ...})``).

    ``recipe``: a ``DetectionRecipe`` or one of ``"shortest_side"`` (800, max 1333, flip), ``"multiscale"``
    (480-800 step 32 per batch, max 1333, flip), ``"lsj"`` (1024), ``"ssd"`` (300). Each image's geometry is
    planned from its header; the JPEG is decoded at the largest DCT scale that keeps the output size, only the
    window's rows and columns for crops, and warped once into its slot of the padded batch; its boxes follow the
    same map (clipped; degenerate ones dropped, counted in ``target["dropped"]``). The loader's other options are
    ``DetectionLoaderConfig``'s fields: one ``config``, or its fields as keywords (``num_workers=4``; not both).

    Example:
        >>> import io; from PIL import Image
        >>> buf = io.BytesIO(); Image.new("RGB", (640, 480), (90, 10, 10)).save(buf, "JPEG")
        >>> ds = [(buf.getvalue(), {"boxes": torch.tensor([[10., 20., 110., 220.]]), "labels": torch.tensor([1])})] * 4
        >>> cfg = ptt.DetectionLoaderConfig(num_workers=0, shuffle=False)
        >>> b = next(iter(ptt.make_detection_loader(ds, 2, ptt.DetectionRecipe.shortest_side(240, flip=0.0), cfg)))
        >>> tuple(b.images.shape), b.sizes.tolist(), b.targets[0]["boxes"].tolist()
        ((2, 3, 256, 320), [[240, 320], [240, 320]], [[5.0, 10.0, 55.0, 110.0]])
    """
    cfg = config_first(config, DetectionLoaderConfig, options)
    if batch_size < 1:
        raise PttError(f"batch_size must be >= 1, got {batch_size}.")
    rec = detection_recipe(recipe)
    from pytorchtricks.road import DataSource

    if isinstance(dataset, str | os.PathLike | DataSource):  # a path, or what ptt.data_source read of one
        from pytorchtricks.road import open_data

        dataset = open_data(dataset, task="detection", decode=None)  # a detection root or pack (ptt / lmdb)
    if not hasattr(dataset, "__len__") or len(dataset) == 0:
        raise PttError("make_detection_loader needs a non-empty map-style dataset (__len__ and __getitem__).")
    sizes = _sizes(dataset) if cfg.group_by_aspect and rec.kind == "shortest_side" else None
    sampler = _runtime.epoch_sampler(
        len(dataset),
        batch_size,
        shuffle=cfg.shuffle,
        drop_last=cfg.drop_last,
        seed=cfg.seed,
        rank=cfg.rank,
        world_size=cfg.world_size,
        groups=aspect_groups(sizes) if sizes is not None else None,
    )
    canvas = rec.largest_canvas_hw(sizes)
    batch_bytes = batch_size * canvas[0] * canvas[1] * 3 if canvas is not None else None
    plan = _runtime.plan_workers("make_detection_loader", cfg.num_workers, cfg.prefetch_factor, batch_bytes)
    return _runtime.start(
        _DetectionBatches(
            dataset, DetectionBatcher(rec, cfg.seed, cfg.backend, cfg.scaled_decode), plan.reusable_slots()
        ),
        plan,
        sampler=sampler,
        source=sampler,
        batch_size=batch_size,
        mode="train" if cfg.shuffle else "eval",
        dropped_per_epoch=sampler.dropped(),
        persistent_workers=cfg.persistent_workers,
        pin_memory=cfg.pin_memory,
    )


def detection_recipe(recipe: DetectionRecipe | str) -> DetectionRecipe:
    """A recipe as given, or by its name: shortest_side, multiscale, lsj, ssd (``make_detection_loader``'s)."""
    if isinstance(recipe, DetectionRecipe):
        return recipe
    named = {
        "shortest_side": lambda: DetectionRecipe.shortest_side(800, 1333),
        "multiscale": lambda: DetectionRecipe.shortest_side(tuple(range(480, 801, 32)), 1333),
        "lsj": lambda: DetectionRecipe.lsj(1024),
        "ssd": lambda: DetectionRecipe.ssd(300),
    }
    if recipe not in named:
        raise PttError(f"unknown recipe {recipe!r}; use a DetectionRecipe or one of {', '.join(named)}.")
    return named[recipe]()


def _sizes(dataset: Any) -> np.ndarray:
    """Every image's ``(h, w)`` for aspect grouping: the annotations' sizes, else each sample's header."""
    if hasattr(dataset, "image_hw"):
        return np.array([dataset.image_hw(i) for i in range(len(dataset))], np.int64).reshape(-1, 2)
    from pytorchtricks.data.decode import image_size
    from pytorchtricks.data.detection_loader import read_detection_item

    out = []
    for i in range(len(dataset)):
        raw, _ = read_detection_item(dataset, i)
        out.append(raw.shape[:2] if isinstance(raw, np.ndarray) else image_size(raw))
    return np.array(out, np.int64).reshape(-1, 2)


def bench_case(size: str = "smoke", device: str = "cpu") -> BenchCase:
    """One batch of shortest side 320 (max 533) + no flip from real-size JPEGs with boxes: PIL full decode +
    torchvision's resize (what the reference pipeline and the model's transform do on the CPU) vs this loader."""
    import io

    from PIL import Image
    from torchvision.transforms import v2 as T

    from pytorchtricks.data.recipes import DetectionRecipe
    from pytorchtricks.tricks.data.make_loader import _photo_bytes

    n, hw = (4, (960, 1280)) if size == "smoke" else (16, (2448, 3264))
    data = [
        (raw, {"boxes": torch.tensor([[10.0 + i, 20.0, hw[1] / 2, hw[0] / 2]]), "labels": torch.tensor([1]),
               "image_id": i})
        for i, (raw, _) in enumerate(_photo_bytes(n, hw))
    ]  # fmt: skip
    recipe = DetectionRecipe.shortest_side(320, 533, flip=0.0)
    cfg = DetectionLoaderConfig(num_workers=0, shuffle=False, group_by_aspect=False, drop_last=False)
    loader = make_detection_loader(data, n, recipe, cfg)

    def baseline() -> list[torch.Tensor]:
        out = []
        for raw, _ in data:
            img = T.PILToTensor()(Image.open(io.BytesIO(raw)).convert("RGB"))
            # the long side as torchvision's resize rounds it (down): 1280 x 320 / 960 -> 426
            out.append(T.functional.resize(img, [320, int(320 * hw[1] / hw[0])], antialias=True))
        return out

    def treated() -> list[torch.Tensor]:
        b: Any = next(iter(loader))
        return [b.images[i, :, :h, :w] for i, (h, w) in enumerate(b.sizes.tolist())]

    def check(a: list[torch.Tensor], b: list[torch.Tensor]) -> None:
        if [tuple(x.shape) for x in a] != [tuple(x.shape) for x in b]:
            raise AssertionError(
                f"sizes differ: {[tuple(x.shape) for x in a]} vs {[tuple(x.shape) for x in b]}"
            )

    return BenchCase(
        baseline=baseline, treated=treated, items_per_call=n, unit="images", device=device, check=check,
        description=f"{n} JPEGs of {hw[1]}x{hw[0]} -> shortest side 320: PIL full decode + resize vs DCT-scaled",
    )  # fmt: skip
