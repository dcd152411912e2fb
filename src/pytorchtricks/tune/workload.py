"""What ``tune`` measures: a model, a dataset of images, a batch size and an input size.

``build_workload`` turns the command-line strings into a ``Workload``: MODEL via ``bench.workloads.load_model``
(or the built-in ResNet-18), DATA an image folder (``root/<class>/<image>``; an ImageNet-style root with
``train/`` and ``val/`` is read through its train split), a ``ptt pack`` folder, ``synthetic`` (deterministic random
images) or nothing (the built-in set of high-resolution photos, see ``default_image_folder``). The data is read by
the library's own readers (``JpegFolder``, ``ShardDataset``): one data road, shared with the user's ``ptt`` calls;
the user's pipeline (torchvision ImageFolder + PIL, the baseline) is built from the same folder (``data.baselines``).
Every failure raises ``PttError`` with one paragraph that names the problem and the fix, before anything is written.

The input shape is the user's whole shape, channels included: ``--input-shape 1,28,28`` (C,H,W) for an MNIST-style
model; without it the channels come from the model (its first convolution's ``in_channels``) and the side from
``--input-size`` (default 64).
"""

from __future__ import annotations

import copy
import dataclasses
import os
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import nn

from pytorchtricks.core import (
    Option,
    PttError,
    Spelt,
    cache_root,
    config_first,
    options_of,
    require,
    resolve_device,
)
from pytorchtricks.data.baselines import DEFAULT_WORKERS
from pytorchtricks.tune.config import TuneConfig

if TYPE_CHECKING:
    from pytorchtricks.road import DataSource

DEFAULT_MODEL = "torchvision:resnet18"
DEFAULT_INPUT_SIZE = 64
DEFAULT_BATCH_SIZE = 32
DEFAULT_PHOTOS = 256  # the built-in set: a few hundred camera-size photos (the seed's 10M, in miniature)
DEFAULT_MIN_MP = 4.0  # camera photos are 12 MP and more; the wallpapers that have 4 MP give crops of 4-24 MP
# The built-in workload's input side: on the archetype's GPU box the model computes far faster than the CPUs decode
# camera-size JPEGs; 32 px reproduces that balance on 2 CPU cores (measured: at 64 px ResNet-18 itself runs at
# ~57 images/s here, about what two workers decode, so no loader could show more than ~1.4x).
DEFAULT_WORKLOAD_SIZE = 32
# PIL modes by channel count: images are decoded straight to the channels the model takes
PIL_MODES = {1: "L", 2: "LA", 3: "RGB", 4: "RGBA"}
Size = int | tuple[int, int]  # a side, or (height, width)


def size_hw(size: Size) -> tuple[int, int]:
    return (size, size) if isinstance(size, int) else (int(size[0]), int(size[1]))


def pil_mode(channels: int) -> str:
    if channels not in PIL_MODES:
        raise PttError(
            f"images cannot be decoded to {channels} channels (only 1, 2, 3 or 4); pass --input-shape with the "
            "channels your model takes, or --data synthetic for generated inputs of any channel count."
        )
    return PIL_MODES[channels]


# ----------------------------------------------------------------------------------------------- datasets


class SyntheticImages(torch.utils.data.Dataset):
    """Deterministic random uint8 images: item ``i`` is the same on every run and in every worker."""

    def __init__(self, n: int, size: Size, num_classes: int = 10, seed: int = 0, channels: int = 3) -> None:
        self.n, self.size, self.seed, self.channels = n, size, seed, channels
        self.classes = [f"class{k}" for k in range(num_classes)]
        self.labels = np.arange(n, dtype=np.int64) % num_classes

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + i)
        img = torch.randint(0, 256, (self.channels, *size_hw(self.size)), generator=g, dtype=torch.uint8)
        return img, i % len(self.classes)


# ----------------------------------------------------------------------------------------------- default data


def default_image_folder(*, count: int = DEFAULT_PHOTOS, root: str | None = None) -> tuple[str, str]:
    """Build (once, cached) the built-in image set; returns ``(folder, description)``.

    The seed's case in miniature: ``count`` high-resolution photos (crops of at least ``DEFAULT_MIN_MP``
    megapixels of the Debian wallpapers at native resolution, ``data.photoset``), one class per source package.
    """
    from pytorchtricks.data.photoset import build_photo_set

    folder = os.path.join(root or cache_root(), f"tune-photos-{count}-{DEFAULT_MIN_MP:g}mp")
    summary = build_photo_set(folder, count, min_mp=DEFAULT_MIN_MP, workers=2)
    size = sum(e.stat().st_size for d in os.scandir(folder) if d.is_dir() for e in os.scandir(d.path))
    desc = (
        f"{count} photos of >= {DEFAULT_MIN_MP:g} MP ({size / 1e6:.0f} MB of JPEG) cut at native resolution from "
        f"{len(summary['sources'])} Debian wallpapers"
    )
    return folder, desc


# ----------------------------------------------------------------------------------------------- workload


@dataclass
class RunState:
    """What one run of ``tune`` writes while it goes: the one-time builds, what they said, the staged batches and
    the memory search's plan. Created once per run (``run_tune``) and held by the run's ``Workload`` as its only
    mutable member, so that every function handed the workload sees the same run without a second parameter.
    ``dataclasses.replace`` keeps the run of the workload it copies: a new run passes ``run=RunState()``."""

    # what the run's one-time builds and hooks said (a pack left on disk, an arena in /dev/shm, a warning), in the
    # order they said it: the receipt's notes after the workload's own
    notes: list[str] = field(default_factory=list)
    # one-time builds shared by every configuration (a pack, a RAM cache, a loader sweep) and their seconds
    prepared: dict[str, Any] = field(default_factory=dict)
    prepare_s: dict[str, float] = field(default_factory=dict)
    # batches read once, held for the compute step (stage_batches)
    staged: list[Any] = field(default_factory=list)
    # a memory search: what one micro-batch's activations may take (the budget less the bytes every step holds),
    # given to every configuration's hooks (a checkpoint planner plans to it); None: no budget
    activation_budget_bytes: int | None = None
    # what hooks worked out once for the run, by their own keys (TuneSetup.memo: a checkpoint plan per model,
    # micro-batch and budget, put on every configuration's fresh model copy without measuring it again)
    memo: dict[Any, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Workload:
    """A model factory plus data, as ``tune`` measures them: the run's inputs, fixed once built.

    A changed workload is a new one (``dataclasses.replace``). What a run writes lives in ``run`` (a ``RunState``);
    ``run_tune`` gives each run a fresh one, so two runs on the same workload share nothing they wrote.
    """

    model_spec: str
    model_factory: Callable[[], nn.Module]  # a fresh copy with the same initial weights on every call
    dataset: (
        Any  # what the library's loaders read: JpegFolder (files), ShardDataset (a pack), SyntheticImages
    )
    data_desc: str
    num_outputs: int
    batch_size: int
    input_size: int  # the image side in pixels (its height when ``width`` differs)
    for_: str  # "train" or "infer"
    device: torch.device
    notes: tuple[str, ...] = ()  # what building the workload found (few images, labels taken mod the outputs)
    channels: int = 3  # input channels the model takes (1: gray, 3: RGB)
    width: int | None = None  # the image width when it differs from ``input_size`` (None: square)
    num_workers: int = DEFAULT_WORKERS  # loader worker processes the user's loop uses: the baseline's
    data_kind: str = "files"  # "files" (an image folder), "pack" (a ptt pack) or "synthetic"
    source: str | None = None  # the folder or pack path (None: synthetic)
    labels: Any = None  # int64 label of every sample
    files: list[str] | None = None  # the file of every sample (files and packs of files; None: synthetic)
    optimizer: tuple[str, dict[str, Any]] = ("sgd", {"lr": 0.01, "momentum": 0.9})
    # the accelerator's step, declared (``--device-step-ms``): every step holds the main process this long without
    # using a core, in place of the model's step on this machine; loaders are then measured against it (a
    # projection for that accelerator). None: the model's own step runs here.
    device_step_s: float | None = None
    task: str = "classification"  # or "detection" (tune.detection: a torchvision detector, its loss dict)
    split: str | None = None  # detection: the split of the root read (None: the root has one)
    max_size: int | None = (
        None  # detection: the long side's cap of the model's resize (input_size: the short side)
    )
    # what a run writes (not an input: left out of comparisons and the repr)
    run: RunState = field(default_factory=RunState, compare=False, repr=False)

    @property
    def num_classes(self) -> int:
        return len(getattr(self.dataset, "classes", [])) or self.num_outputs

    @property
    def input_shape(self) -> tuple[int, int, int]:
        """(C, H, W) of one sample, as the model takes it."""
        return self.channels, self.input_size, self.width or self.input_size

    def shape_text(self) -> str:
        """``"1x28x28"``: one sample's shape for receipts and messages."""
        return "x".join(map(str, self.input_shape))

    def example_batch(self, n: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """The first ``n`` (default: batch size) samples in the evaluation geometry (resize, centre crop),
        through the library's loader: uint8 NCHW images and int64 labels (the same on every call)."""
        n = min(n or self.batch_size, len(self.dataset))
        if self.data_kind == "synthetic":
            items = [self.dataset[i] for i in range(n)]
            return torch.stack([x for x, _ in items]), torch.tensor([y for _, y in items], dtype=torch.int64)
        from pytorchtricks.tricks.data.make_loader import make_loader

        crop = (self.input_size, self.width or self.input_size)
        from pytorchtricks.tune.datacheck import FirstSamples

        first = FirstSamples(self.dataset, n)
        x, y = next(iter(make_loader(first, n, crop=crop, mode="eval", num_workers=0)))
        return to_channels(x, self.channels), y


def model_in_channels(model: nn.Module) -> int | None:
    """The channels the model takes: its first convolution's ``in_channels`` (None without a convolution).

    Example:
        >>> model_in_channels(nn.Sequential(nn.Conv2d(1, 8, 3), nn.ReLU(), nn.Conv2d(8, 8, 3)))
        1
    """
    first = next((m for m in model.modules() if isinstance(m, nn.Conv1d | nn.Conv2d | nn.Conv3d)), None)
    return int(first.in_channels) if first is not None else None


def parse_input_shape(shape: str | tuple[int, ...]) -> tuple[int | None, int, int, int]:
    """``--input-shape``: C,H,W (``1,28,28``) or N,C,H,W (the batch too) -> (batch or None, C, H, W).

    Example:
        >>> parse_input_shape("1,28,28"), parse_input_shape((16, 3, 32, 48))
        ((None, 1, 28, 28), (16, 3, 32, 48))
    """
    if isinstance(shape, str):
        from pytorchtricks.bench.workloads import parse_shape

        shape = parse_shape(shape)
    dims = tuple(int(d) for d in shape)
    if len(dims) == 3 and all(d > 0 for d in dims):
        return None, dims[0], dims[1], dims[2]
    if len(dims) == 4 and all(d > 0 for d in dims):
        return dims[0], dims[1], dims[2], dims[3]
    raise PttError(
        f"--input-shape {','.join(map(str, dims))} is not an image shape; write one sample's C,H,W (e.g. 1,28,28 "
        "for MNIST, 3,224,224 for ImageNet) or N,C,H,W with the batch first."
    )


def _load_model_or_explain(spec: str) -> nn.Module:
    try:
        from pytorchtricks.bench.workloads import load_model

        return load_model(spec)
    except PttError as exc:
        raise PttError(
            f"could not build the model from --model {spec!r}: {exc} (--model takes torchvision:NAME, "
            "package.module:factory or path/to/file.py:factory; fix the spec or the code it points to.)"
        ) from exc


def _probe(model: nn.Module, batch: torch.Tensor, spec: str, given: str, device: torch.device) -> int:
    """Run one forward on the real input shape; return the output width (classes), or explain the failure.

    ``given`` says where the shape came from (``--input-shape 1,28,28``, or the defaults), for the message.
    """
    try:
        with torch.no_grad():
            out = model.to(device).eval()(batch.to(device).float() / 255)
    except Exception as exc:
        raise PttError(
            f"the model {spec} fails on inputs of shape {tuple(batch.shape)} ({given}): "
            f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}. Pass the shape the model was "
            "built for with --input-shape C,H,W (e.g. 1,28,28 for MNIST-style models, 3,224,224 for ImageNet ones) "
            "or just the side with --input-size, or fix the model's forward so it accepts this shape."
        ) from exc
    finally:
        model.train()
    if isinstance(out, (tuple, list)):
        out = out[0]
    if not isinstance(out, torch.Tensor) or out.dim() != 2:
        shape = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
        raise PttError(
            f"the model {spec} returns {shape}, but tune trains with cross-entropy and needs logits of shape "
            "(batch, classes). Wrap the model so its forward returns a (batch, classes) tensor."
        )
    return int(out.shape[1])


def _resolve_shape(
    base: nn.Module, input_shape: str | tuple[int, ...] | None, input_size: int | None, batch_size: int | None
) -> tuple[int, int, int, int, str]:
    """(batch, C, H, W, where the shape came from) from the options, the model and the defaults."""
    n, c, h, w = parse_input_shape(input_shape) if input_shape is not None else (None, None, None, None)
    if input_size is not None and h is not None and (h, w) != (input_size, input_size):
        raise PttError(
            f"--input-size {input_size} disagrees with --input-shape {input_shape}; give one of them (--input-shape "
            "C,H,W is the whole shape)."
        )
    if n is not None and batch_size is not None and n != batch_size:
        raise PttError(
            f"--batch-size {batch_size} disagrees with the batch {n} in --input-shape {input_shape}; give the batch "
            "once (--input-shape C,H,W takes one sample's shape)."
        )
    side = input_size or DEFAULT_INPUT_SIZE
    from_model = model_in_channels(base)
    c = c or from_model or 3
    h, w = h or side, w or side
    bs = n or batch_size or DEFAULT_BATCH_SIZE
    if min(h, w) < 8 or bs < 1:
        raise PttError(
            f"images must be at least 8 px on each side and the batch >= 1 (got {h}x{w} and batch {bs}); fix "
            "--input-shape / --input-size / --batch-size."
        )
    if input_shape is not None:
        given = f"--input-shape {input_shape if isinstance(input_shape, str) else ','.join(map(str, input_shape))}"
    else:
        where = "the model's first convolution" if from_model else "the default, the model has no convolution"
        given = f"{c} channels from {where}, {h} px from " + ("--input-size" if input_size else "the default")
    return bs, c, h, w, given


def _dataset(
    data: str | None, size: tuple[int, int], channels: int, bs: int, split: str | None = None
) -> tuple[Any, str, str, str | None]:
    """(dataset, description, kind, source): ``synthetic`` and the built-in set here, any path read once by
    ``data_source`` and opened by it (the library's readers: JpegFolder, ShardDataset), with tune's own words on a
    refusal."""
    from pytorchtricks.data.folder import JpegFolder
    from pytorchtricks.road import data_source
    from pytorchtricks.shards.remote import is_url

    h, w = size
    px = f"{h} px" if h == w else f"{h}x{w} px"
    px += "" if channels == 3 else f", {channels} channel(s)"
    if data == "synthetic":
        ds: Any = SyntheticImages(max(8 * bs, 64), size, channels=channels)
        return ds, f"synthetic: {len(ds)} deterministic random uint8 images, {px}", "synthetic", None
    if data is None:
        folder, desc = default_image_folder()
        return JpegFolder(folder), f"built-in: {desc}; crops of {px}", "files", folder
    if not os.path.exists(data) and not is_url(data):
        raise PttError(
            f"the data folder {data!r} does not exist. Pass --data with an image folder (root/<class>/<image>.jpg), "
            "a ptt pack folder, or `synthetic` for generated images."
        )
    src = data_source(data, split=split)  # what --data is, read once: the one data road
    _refuse_detection_data(src)
    src.check("tune", by_index=True)
    try:
        ds = src.open()  # ROOT/train + ROOT/val: the train split (or --split), not classes
    except PttError as exc:
        if src.kind == "pack":  # the pack's own words (a bad manifest)
            raise
        raise PttError(
            f"the data folder {data!r} holds no images tune can read ({exc}). Put them in it as "
            "root/<class>/<image>.jpg, point --data at a ptt pack, or use --data synthetic to measure with "
            "generated images."
        ) from exc
    if not isinstance(ds, JpegFolder):
        if len(ds) == 0:
            raise PttError(
                f"the pack {data!r} holds no samples; pack a folder with images (`ptt pack SRC DST`)."
            )
        return ds, f"ptt pack {data}: {len(ds)} images in {len(ds.classes)} classes, {px}", "pack", data
    splits = src.splits
    which = next((k for k, v in splits.items() if v == ds.root), "train")
    note = f" (the {which} split of {data}; splits {', '.join(splits)})" if splits else ""
    return (
        ds,
        f"image folder {ds.root}{note}: {len(ds)} images in {len(ds.classes)} classes, {px}",
        "files",
        ds.root,
    )


@options_of(TuneConfig)
def build_workload(
    model: str | nn.Module | None = None,
    data: str | None = None,
    *,
    config: TuneConfig | None = None,
    seed: int = 0,
    **options: Any,
) -> Workload:
    """Resolve MODEL and DATA into a ``Workload``; all checks happen here, before any output is written.

    Takes tune's ``TuneConfig`` whole (``config=``; ``tune_model`` hands it down as it is), or its fields as
    keywords (``core.config_first``): ``model``, ``data``, ``batch_size``, ``input_size``, ``input_shape``,
    ``num_workers``, ``for_``, ``device``, ``optimizer``, ``device_step_ms``, ``task`` and ``split`` are read; the
    rest (goal, budgets, receipt) are the engine's. ``seed``: the model's initialisation and the data order.

    ``model`` is a spec (``torchvision:resnet18``, ``pkg.mod:factory``, ``file.py:factory``) or a module object
    (a script's own model, copied); ``optimizer`` the loop's ``(name, hyper-parameters)`` (default: SGD lr 0.01,
    momentum 0.9). ``split``: the split of a data root that has several (``open_data``'s; default its train split).

    ``input_shape`` is one sample's C,H,W (or N,C,H,W); without it the channels are the model's (its first
    convolution's ``in_channels``) and the side ``input_size`` (default 64). ``num_workers`` is the loader
    workers the user's loop already uses: the baseline loads with them, and tune does not recommend them again.

    Example:
        >>> build_workload("torch.nn:Identity", "synthetic", batch_size=2, input_size=8)
        Traceback (most recent call last):
        ...
        pytorchtricks.core.PttError: the model torch.nn:Identity returns (2, 3, 8, 8), but tune trains with ...
    """
    if config is not None and (model is not None or data is not None):
        raise PttError(
            "pass a TuneConfig alone, or the model, the data and the options as keywords - not both."
        )
    fields = options if config is not None else {"model": model, "data": data, **options}
    cfg = _checked(config_first(config, TuneConfig, fields))
    model, data, input_size, input_shape, num_workers, device, optimizer, device_step_ms, task, split, for_ = (
        cfg.model, cfg.data, cfg.input_size, cfg.input_shape, cfg.num_workers, cfg.device, cfg.optimizer,
        cfg.device_step_ms, cfg.task, cfg.split, cfg.for_,
    )  # fmt: skip
    batch_size = cfg.batch_size if isinstance(cfg.batch_size, int) else None  # checked: an int or None
    dev = resolve_device(device)
    require("PIL", "data", package="pillow")
    if task not in ("classification", "detection"):
        raise PttError(f"--task must be classification or detection, not {task!r}.")
    if task == "detection":
        out = _detection_workload(model, data, batch_size, input_size, num_workers, for_, dev, seed, split)
        return _declared(out, optimizer, device_step_ms)
    if isinstance(model, nn.Module):  # a script's own model (ptt doctor run --tune)
        spec = f"captured {type(model).__name__}"
        base = copy.deepcopy(model).cpu()
    else:
        spec = model or DEFAULT_MODEL
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            base = _load_model_or_explain(spec)
    if data is None and input_size is None and input_shape is None:
        input_size = DEFAULT_WORKLOAD_SIZE  # the built-in workload's balance: the step waits on decoding
    bs, channels, h, w, given = _resolve_shape(base, input_shape, input_size, batch_size)
    dataset, data_desc, kind, source = _dataset(data, (h, w), channels, bs, split)
    notes: list[str] = []
    if len(dataset) < bs:
        notes.append(
            f"the dataset has {len(dataset)} images, fewer than one batch of {bs}; batches repeat images"
        )
    if model is None:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            base.fc = nn.Linear(  # torchvision ResNet-18, weights=None, our classes
                int(base.fc.in_features),  # type: ignore[union-attr,arg-type]
                len(dataset.classes),
            )
    w0 = Workload(spec, lambda: base, dataset, data_desc, 0, bs, h, for_, dev, channels=channels,
                  width=None if w == h else w, data_kind=kind, source=source)  # fmt: skip
    probe_x = to_channels(w0.example_batch(min(2, bs))[0], channels)
    n_out = _probe(base, probe_x, spec, given, dev)
    base = base.cpu()
    if n_out < len(getattr(dataset, "classes", [])):
        notes.append(
            f"the model has {n_out} outputs for {len(dataset.classes)} classes; labels are taken mod {n_out}"
        )
    state = copy.deepcopy(base)

    def factory() -> nn.Module:
        return copy.deepcopy(state)

    files = (
        [dataset.path(i) for i in range(len(dataset))] if callable(getattr(dataset, "path", None)) else None
    )
    from pytorchtricks.tune.datacheck import label_array

    out = Workload(
        spec, factory, dataset, data_desc, n_out, bs, h, for_, dev, tuple(notes),
        channels=channels, width=None if w == h else w, num_workers=num_workers,
        data_kind=kind, source=source, labels=label_array(dataset), files=files,
    )  # fmt: skip
    return _declared(out, optimizer, device_step_ms)


def _checked(cfg: TuneConfig) -> TuneConfig:
    """``build_workload``'s options checked (``for_`` normalised to ``train`` / ``infer``): every refusal here,
    before anything is built."""
    batch_size, for_, num_workers, step_ms = cfg.batch_size, cfg.for_, cfg.num_workers, cfg.device_step_ms
    if batch_size is not None and not isinstance(batch_size, int):
        raise PttError(f"--batch-size must be a positive integer here, not {batch_size!r}.")
    if for_ not in ("train", "infer", "inference"):
        raise PttError(f"--for must be train or inference, not {for_!r}.")
    for_ = "infer" if for_ == "inference" else for_
    if num_workers < 0:
        raise PttError(f"--num-workers must be 0 (load in the training process) or more, not {num_workers}.")
    if step_ms is not None and not (0 < step_ms < 600_000):
        raise PttError(
            f"--device-step-ms must be the accelerator's step in milliseconds (0 < MS < 600000), not "
            f"{step_ms}: read it from your training logs, or `ptt doctor run` on the GPU machine."
        )
    if step_ms is not None and for_ != "train":
        raise PttError("--device-step-ms declares a training step; for inference use ptt optimize.")
    return dataclasses.replace(cfg, for_=for_)


def _declared(
    out: Workload, optimizer: tuple[str, dict[str, Any]] | None, device_step_ms: float | None
) -> Workload:
    """A built workload with the loop's optimizer and the accelerator's declared step."""
    if optimizer is not None:
        out = replace(out, optimizer=(str(optimizer[0]), dict(optimizer[1])))
    if device_step_ms is not None:
        note = (
            f"the step is declared: {device_step_ms:g} ms on the accelerator (--device-step-ms); every figure below "
            "is a projection - each loader is timed feeding a stand-in step that holds the training process that "
            "long without using this machine's cores, as a GPU step does apart from its launch thread"
        )
        out = replace(out, device_step_s=device_step_ms / 1e3, notes=(*out.notes, note))
    return out


def to_channels(x: torch.Tensor, channels: int) -> torch.Tensor:
    """uint8 RGB batches (what the library's decoders give) as the model's channels: gray by ITU-R 601 luma
    (PIL's ``convert("L")``), other counts by repeating or cutting channels."""
    if x.shape[1] == channels:
        return x
    if channels == 1 and x.shape[1] == 3:
        wts = torch.tensor([0.299, 0.587, 0.114], device=x.device).view(1, 3, 1, 1)
        return (x.float() * wts).sum(1, keepdim=True).round().clamp(0, 255).to(torch.uint8)
    reps = -(-channels // x.shape[1])
    return x.repeat(1, reps, 1, 1)[:, :channels]


def _refuse_detection_data(src: DataSource) -> None:
    """A detection root or pack given to a classification tune: name the option that reads it."""
    if src.task != "detection":
        return
    if src.kind == "pack":
        raise PttError(
            Spelt(
                "{data} is a detection pack; tune reads detection roots, not packs: tune a detector on the root "
                "it was packed from with {o}.",
                data=src.path,
                o=Option("task", "detection"),
            )
        )
    raise PttError(
        Spelt(
            "{data} is a {fmt} detection root (boxes per image, not class folders): tune a detector on it with {o}.",
            data=src.path,
            fmt=src.format.upper(),
            o=Option("task", "detection"),
        )
    )


def _detection_workload(
    model: str | nn.Module | None,
    data: str | None,
    batch_size: int | None,
    input_size: int | None,
    num_workers: int,
    for_: str,
    dev: torch.device,
    seed: int,
    split: str | None = None,
) -> Workload:
    """``--task detection``: a detection root (or the built-in photos with boxes) and a torchvision detector."""
    from pytorchtricks.tune import detection

    if for_ != "train":
        raise PttError("--task detection tunes training; for a detector's inference use ptt optimize.")
    dataset, desc, source = detection.detection_data(data, cache_root(), split)
    n_classes = max([0, *dataset.categories]) + 1  # category ids as labels, 0 the background
    if isinstance(model, nn.Module):  # a script's own detector (ptt doctor run --tune)
        base, (short, long) = copy.deepcopy(model).cpu(), detection.model_sizes(model)
        spec: str = f"captured {type(model).__name__}"
    else:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            base, short, long = detection.build_model(model, n_classes, input_size)
        spec = model or detection.DEFAULT_DETECTOR
    state = copy.deepcopy(base)

    def factory() -> nn.Module:
        return copy.deepcopy(state)

    bs = batch_size or 4
    files = [dataset.path(i) for i in range(len(dataset))]
    return Workload(
        spec, factory, dataset, desc, n_classes, bs, short, for_, dev,
        num_workers=num_workers, data_kind="files", source=source, files=files, task="detection", max_size=long,
        split=getattr(dataset, "split", None),
    )  # fmt: skip
