"""The detection workload of ``ptt tune --task detection``: a torchvision detector on a detection root.

What differs from classification, in one place: the data (``ptt.open_detection``: COCO / YOLO / VOC, or the built-in
high-resolution photos with seeded boxes), the model (a torchvision detector built offline: ``weights=None,
weights_backbone=None``, ``min_size`` = ``--input-size``, the shortest side), the step (the detector's own loss
dict, summed), the user's pipeline as the torchvision detection reference runs it (``references/detection``, its
"hflip" policy: PIL decode at full size, flip, ``PILToTensor``, ``ToDtype(float32, scale=True)``, a list collate,
the user's workers - the model's ``GeneralizedRCNNTransform`` then shrinks each image), and ours
(``ptt.make_detection_loader``: the decode at the DCT scale the training size needs, padded uint8 batches, boxes
that follow). The runner asks this module for the loader and the loss; the catalogue's loader hooks that say they
serve detection (``TuneHook.tasks``) are measured, the others are skipped with the reason.
"""

from __future__ import annotations

import io
import os
import warnings
from typing import Any

import torch
from torch import nn

from pytorchtricks.core import Option, PttError, PttWarning, Spelt
from pytorchtricks.data.baselines import detection_reference_loader

DEFAULT_DETECTOR = "torchvision:fasterrcnn_mobilenet_v3_large_320_fpn"
BUILTIN_PHOTOS = (
    48  # 2-24 MP photos at native resolution: the archetype's photos, few enough to build in a minute
)
BUILTIN_SEED = 0
MIN_PSNR_DB = 30.0  # our decode at the DCT scale vs PIL's full decode + torchvision's resize (see datacheck)


def builtin_root(cache_dir: str) -> str:
    """The built-in detection set: ``BUILTIN_PHOTOS`` high-resolution crops of the Debian wallpapers (>= 2 MP, at
    native resolution) with 1-8 seeded boxes each, as a COCO instances JSON; built once under ``cache_dir``.
    Returns the annotation file (``open_detection`` reads the images beside it)."""
    from pytorchtricks.data.photoset import build_photo_set, coco_with_boxes

    root = os.path.join(cache_dir, f"tune-detection-{BUILTIN_PHOTOS}-{BUILTIN_SEED}")
    ann = os.path.join(root, "annotations.json")
    if not os.path.exists(ann):
        photos = os.path.join(root, "images")
        build_photo_set(photos, BUILTIN_PHOTOS, seed=BUILTIN_SEED, min_mp=2.0)
        coco_with_boxes(photos, ann, BUILTIN_SEED)
    return ann


def detection_data(data: str | None, cache_dir: str, split: str | None = None) -> tuple[Any, str, str]:
    """(dataset, description, source) of ``--data`` for detection: a COCO / YOLO / VOC root (``split``: which of
    its splits, default the train split) or a COCO JSON file, read once by ``data_source`` and opened by it, or None
    for the built-in set. Bad annotations are left out, as ``ptt pack`` leaves them out, and said (a
    ``PttWarning``): tune measures speed, and a few boxes fewer do not change it."""
    from pytorchtricks.data.detection import DetectionDataset, open_detection
    from pytorchtricks.road import data_source

    if data is None:
        if split is not None:
            raise PttError(Spelt("the built-in photo set has one split: leave out {o}.", o=Option("split")))
        src = builtin_root(cache_dir)
        ds = open_detection(src, format="coco", images=os.path.join(os.path.dirname(src), "images"))
        desc = f"built-in: {len(ds)} photos of 2-24 MP (Debian wallpapers) with seeded boxes, COCO JSON"
        return ds, desc, src
    if not os.path.exists(data):
        raise PttError(
            f"--data {data}: no such file or folder; give a COCO, YOLO or VOC root (or a COCO JSON)."
        )
    source = data_source(data, split=split)  # what --data is, read once
    if source.task != "detection":
        raise PttError(
            f"--data {data} is not a detection root: --task detection reads COCO (annotations/instances_*.json), "
            "YOLO (images/ + labels/) or Pascal VOC (Annotations/ + JPEGImages/), or a COCO JSON file."
        )
    found = source.check("tune", packs=False).open(on_error="skip")
    assert isinstance(found, DetectionDataset)  # a detection root (a pack was refused above)
    ds = found
    _say_rejects(ds, data)
    which = f" (split {ds.split})" if ds.split else ""
    if source.images is not None:  # a COCO JSON over the images/ beside it
        return (
            ds,
            f"COCO {data} over {source.images}: {len(ds)} images, {len(ds.categories)} categories",
            data,
        )
    return (
        ds,
        f"{source.format.upper()} {data}{which}: {len(ds)} images, {len(ds.categories)} categories",
        data,
    )


def _say_rejects(ds: Any, data: str) -> None:
    if ds.rejects:
        r = ds.rejects[0]
        first = f"{r['file']}" + (f", annotation {r['annotation']}" if r["annotation"] is not None else "")
        warnings.warn(
            f"{data}: {len(ds.rejects)} bad annotation(s) left out (the first: {first}: {r['reason']}); "
            "`ptt inspect` on the root lists them all",
            PttWarning,
            stacklevel=3,
        )


def build_model(spec: str | None, num_classes: int, input_size: int | None) -> tuple[nn.Module, int, int]:
    """(the detector with random weights, its shortest side, its longest side); nothing is downloaded."""
    from pytorchtricks.bench.workloads import load_model

    spec = spec or DEFAULT_DETECTOR
    kw: dict[str, Any] = {"num_classes": num_classes}
    if input_size is not None:
        kw["min_size"] = input_size
    try:
        model = load_model(spec, **kw)
    except PttError as exc:
        raise PttError(f"could not build the detector --model {spec!r}: {exc}") from exc
    return (model, *model_sizes(model, spec))


def model_sizes(model: Any, spec: str | None = None) -> tuple[int, int]:
    """(shortest side, longest side) of a torchvision detector's own resize (its ``GeneralizedRCNNTransform``)."""
    t = getattr(model, "transform", None)
    if t is None or not hasattr(t, "min_size"):
        raise PttError(
            f"--task detection trains torchvision detectors (their forward takes images and targets and returns a "
            f"dict of losses, e.g. {DEFAULT_DETECTOR}); {spec or type(model).__name__} has no "
            "GeneralizedRCNNTransform."
        )
    return int(t.min_size[0]), int(t.max_size)


def loss_of(
    model: Any, images: list[torch.Tensor], targets: list[dict[str, Any]]
) -> tuple[torch.Tensor, Any]:
    """(each loss of the detector's dict as one vector in key order, their sum): what the step backpropagates,
    and what a correctness check compares."""
    d = model(images, targets)
    vals = torch.stack([d[k] for k in sorted(d)])
    return vals, vals.sum()


def to_model_inputs(
    xb: Any, yb: Any, device: torch.device, dtype: torch.dtype = torch.float32
) -> tuple[list[torch.Tensor], list[dict[str, Any]]]:
    """A batch of either loader -> (images in [0, 1] on ``device`` as ``dtype``, targets with boxes and labels)."""
    from pytorchtricks.data.detection_loader import DetectionBatch

    if isinstance(xb, DetectionBatch):  # ours: padded uint8; each image cut to its own size
        imgs = [xb.images[i, :, : int(h), : int(w)] for i, (h, w) in enumerate(xb.sizes.tolist())]
        images = [im.to(device, non_blocking=True).to(dtype).div_(255) for im in imgs]
        targets = xb.targets
    else:  # the reference's list collate: float images already
        images, targets = [im.to(device, dtype) for im in xb], list(yb)
    return images, [
        {"boxes": t["boxes"].to(device, dtype).reshape(-1, 4), "labels": t["labels"].to(device).long()}
        for t in targets
    ]


def our_loader(
    dataset: Any,
    batch_size: int,
    min_size: int,
    max_size: int,
    kwargs: dict[str, Any],
    seed: int,
    train: bool,
) -> Any:
    """``ptt.make_detection_loader`` with the reference's geometry (shortest side ``min_size``, long side at most
    ``max_size``, flip 0.5 in training): the images the model's transform would make, decoded at that size."""
    from pytorchtricks.data.recipes import DetectionRecipe
    from pytorchtricks.tricks.data.make_detection_loader import DetectionLoaderConfig, make_detection_loader

    cfg = DetectionLoaderConfig(
        shuffle=train, drop_last=train, num_workers=int(kwargs.get("num_workers", 0)), seed=seed,
        persistent_workers=True,  # steady state: tune's Runner stops them between its variants' blocks
    )  # fmt: skip
    recipe = DetectionRecipe.shortest_side(min_size, max_size, flip=0.5 if train else 0.0)
    return make_detection_loader(dataset, batch_size, recipe, cfg)


class _Head(torch.utils.data.Dataset):  # type: ignore[type-arg]
    """The first ``n`` samples of a detection dataset or pack as ``(encoded bytes, target)``."""

    def __init__(self, dataset: Any, n: int) -> None:
        self.dataset, self.n = dataset, min(n, len(dataset))

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> Any:
        from pytorchtricks.data.detection_loader import read_detection_item

        if not 0 <= i < self.n:
            raise IndexError(i)
        return read_detection_item(self.dataset, i)


def check_loader(
    dataset: Any, min_size: int, max_size: int, kwargs: dict[str, Any], n: int = 24, reference: Any = None
) -> Any:
    """The data check of our detection loader on the first ``n`` images, before it is timed: every image exactly
    once per epoch, every box inside its image, and pixels >= ``MIN_PSNR_DB`` of PIL's full decode resized by
    torchvision (the model's own resize) on the same geometry (no flip). ``reference``: the dataset ``dataset``
    was made from (a pack of it, in its order): the pixels are compared with its images - what a pack at the
    training size lost to its resize counts - and each image's boxes, scaled to the output, with ours within 1 px."""
    from PIL import Image
    from torchvision.transforms import v2 as T

    from pytorchtricks.data.decode import image_size
    from pytorchtricks.tune.datacheck import DataCheck, psnr_db

    sub = _Head(dataset, n)
    ref = _Head(reference if reference is not None else dataset, n)
    want = {int(sub[i][1]["image_id"]): i for i in range(len(sub))}  # batches come grouped by aspect ratio
    for i in range(len(sub)) if reference is not None else ():
        if int(ref[i][1]["image_id"]) != int(sub[i][1]["image_id"]):
            return DataCheck(
                "data: detection", False, f"sample {i} of the pack is not image {ref[i][1]['image_id']}"
            )
    ld = our_loader(sub, 4, min_size, max_size, {"num_workers": 0}, seed=0, train=False)
    seen: list[int] = []
    worst, box_err = float("inf"), 0.0
    for b in ld:
        for k, ((h, w), t) in enumerate(zip(b.sizes.tolist(), b.targets, strict=True)):
            seen.append(int(t["image_id"]))
            bx = t["boxes"]
            if len(bx) and (
                bx[:, 0].min() < 0 or bx[:, 1].min() < 0 or bx[:, 2].max() > w or bx[:, 3].max() > h
            ):
                return DataCheck(
                    "data: detection", False, f"image {t['image_id']}: a box outside its {w}x{h} image"
                )
            if reference is None and len(seen) > 4:
                continue  # pixels are compared on the first 4 images; boxes against a source on every one
            raw, target = ref[want[int(t["image_id"])]]
            if reference is not None:  # the source's boxes, scaled to this output, against ours
                sh, sw = image_size(raw)
                src = torch.as_tensor(target["boxes"], dtype=torch.float32).reshape(-1, 4)
                src = (src * torch.tensor([w / sw, h / sh, w / sw, h / sh])).clamp(min=0)
                src = torch.minimum(src, torch.tensor([w, h, w, h], dtype=torch.float32))
                if src.shape != bx.shape:
                    return DataCheck(
                        "data: detection", False, f"image {t['image_id']}: {len(bx)} boxes for {len(src)}"
                    )
                box_err = max(box_err, float((src - bx.float()).abs().max()) if len(bx) else 0.0)
            if len(seen) <= 4:
                im = T.PILToTensor()(Image.open(io.BytesIO(raw)).convert("RGB"))
                im = T.functional.resize(im, [h, w], antialias=True)
                worst = min(worst, psnr_db(b.images[k, :, :h, :w].float(), im.float()))
    if sorted(seen) != sorted(want):
        return DataCheck(
            "data: detection", False, f"an epoch gave {len(seen)} images for {len(want)}, not each once"
        )
    ok = worst >= MIN_PSNR_DB and box_err <= 1.0
    boxes = f", boxes within {box_err:.2f} px of the source's" if reference is not None else ""
    return DataCheck(
        "data: detection",
        ok,
        f"{len(seen)} images each once, boxes inside their images{boxes}, pixels {worst:.1f} dB vs PIL full decode "
        f"of the {'source' if reference is not None else 'image'} + torchvision resize (bound {MIN_PSNR_DB:.0f} dB)",
        psnr_db=worst,
    )


def loader_rates(w: Any, batches: int = 3) -> dict[str, dict[str, float]]:
    """The reference pipeline's and our loader's own rates, each alone (no step beside it), with the user's
    workers: images/s and their workers' CPU-seconds per image, after one warm-up batch each."""
    from pytorchtricks.clock import drain

    out: dict[str, dict[str, float]] = {}
    kw = {"num_workers": w.num_workers}
    for name, ours in (
        ("reference (hflip policy, full size float32)", False),
        ("ptt.make_detection_loader", True),
    ):
        ld = (
            our_loader(w.dataset, w.batch_size, w.input_size, w.max_size or 1333, kw, 0, True)
            if ours
            else detection_reference_loader(w.dataset, w.batch_size, w.num_workers, 0, True)
        )
        it = iter(ld)
        next(it)  # worker start-up and the first prefetch
        n, took_s, use = drain(it, batches)
        del it, ld
        imgs = max(1, n * w.batch_size)
        out[name] = {
            "images_per_s": imgs / max(took_s, 1e-9),
            "cpu_s_per_image": (use.main_cpu_s + use.workers_cpu_s) / imgs,
        }
    return out
