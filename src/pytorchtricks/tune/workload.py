"""What ``tune`` measures: a model, a dataset of images, a batch size and an input size.

``build_workload`` turns the command-line strings into a ``Workload``: MODEL via ``bench.workloads.load_model``
(or the built-in ResNet-18), DATA an image folder (``root/<class>/<image>``, or a flat folder of images),
a ``ptt pack`` folder, ``synthetic`` (deterministic random images) or nothing (the built-in wallpaper set, see ``default_image_folder``).
Every failure raises ``PttError`` with one paragraph that names the problem and the fix, before anything is written.

The input shape is the user's whole shape, channels included: ``--input-shape 1,28,28`` (C,H,W) for an MNIST-style
model; without it the channels come from the model (its first convolution's ``in_channels``) and the side from
``--input-size`` (default 64).
"""

from __future__ import annotations

import copy
import hashlib
import os
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn

from pytorchtricks.core import PttError, require, resolve_device

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".webp")
DEFAULT_MODEL = "torchvision:resnet18"
DEFAULT_INPUT_SIZE = 64
DEFAULT_BATCH_SIZE = 32
# Folders the Debian wallpaper packages install into (lomiri-wallpapers, mate-backgrounds, plasma wallpapers).
WALLPAPER_DIRS = ("/usr/share/backgrounds", "/usr/share/wallpapers")
DEFAULT_CLASSES = 10
DEFAULT_TILES_PER_CLASS = 32
DEFAULT_TILE_PX = 96
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


def _decode(path: str, size: Size, channels: int = 3) -> torch.Tensor:
    """Decode an image file to a uint8 CHW tensor of ``size`` (side, or (H, W)) with ``channels`` channels
    (JPEG decoded at reduced DCT scale)."""
    from PIL import Image

    h, w = size_hw(size)
    mode = pil_mode(channels)
    with Image.open(path) as f:
        f.draft(
            mode if mode in ("L", "RGB") else "RGB", (w, h)
        )  # JPEG: decode at 1/2..1/8 scale when it covers
        im = f.convert(mode).resize((w, h), Image.Resampling.BILINEAR)
    return _chw(im)


def _chw(im: Any) -> torch.Tensor:
    """A PIL image as a contiguous uint8 CHW tensor (gray images get their channel axis)."""
    arr = np.asarray(im, dtype=np.uint8)
    arr = arr[:, :, None] if arr.ndim == 2 else arr
    return torch.from_numpy(arr.copy()).permute(2, 0, 1).contiguous()


class ImageFolderData(torch.utils.data.Dataset):
    """Map-style dataset over ``root/<class>/<image>`` (or a flat folder: one class): ``(uint8 CHW, label)``.

    Paths are kept in one numpy array (not a Python list) so forked DataLoader workers do not copy pages.
    """

    def __init__(self, root: str, size: Size, channels: int = 3) -> None:
        pil_mode(channels)
        if not os.path.isdir(root):
            raise PttError(
                f"the data folder {root!r} does not exist. Pass --data with an image folder (root/<class>/<image>.jpg), "
                "a folder of images, or `synthetic` for generated images."
            )
        classes = sorted(e.name for e in os.scandir(root) if e.is_dir() and not e.name.startswith("."))
        groups = [(c, os.path.join(root, c)) for c in classes] or [("images", root)]
        paths: list[str] = []
        labels: list[int] = []
        for label, (_, folder) in enumerate(groups):
            for dirpath, _, files in sorted(os.walk(folder)):
                for f in sorted(files):
                    if f.lower().endswith(IMAGE_EXTENSIONS):
                        paths.append(os.path.join(dirpath, f))
                        labels.append(label)
        if not paths:
            raise PttError(
                f"the data folder {root!r} holds no images ({', '.join(IMAGE_EXTENSIONS)}), so there is nothing to "
                "load or measure. Put images in it as root/<class>/<image>.jpg (or directly in the folder), point "
                "--data at a folder that has them, or use --data synthetic to measure with generated images."
            )
        self.root = root
        self.size = size
        self.channels = channels
        self.classes = [c for c, _ in groups]
        self._paths = np.array([p.encode() for p in paths])
        self.labels = np.asarray(labels, dtype=np.int64)

    def __len__(self) -> int:
        return len(self.labels)

    def path(self, i: int) -> str:
        return self._paths[i].decode()

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        return _decode(self.path(i), self.size, self.channels), int(self.labels[i])


class ShardImages(torch.utils.data.Dataset):
    """A ``ptt pack`` folder (ptt or lmdb format) read with ``ShardDataset``: ``(uint8 CHW, label)`` at ``size``."""

    def __init__(self, path: str, size: Size, channels: int = 3) -> None:
        from pytorchtricks.shards.dataset import ShardDataset

        pil_mode(channels)
        self.shards = ShardDataset(path)
        self.source = path
        self.size = size
        self.channels = channels
        self.classes = list(self.shards.classes) or ["images"]
        if len(self.shards) == 0:
            raise PttError(
                f"the pack {path!r} holds no samples; pack a folder with images (`ptt pack SRC DST`)."
            )

    def __len__(self) -> int:
        return len(self.shards)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        from PIL import Image

        img, label, _ = self.shards[i]
        h, w = size_hw(self.size)
        im = Image.fromarray(np.asarray(img, dtype=np.uint8))
        im = im if im.mode == pil_mode(self.channels) else im.convert(pil_mode(self.channels))
        return _chw(im.resize((w, h), Image.Resampling.BILINEAR)), int(label)


def _is_pack(path: str) -> bool:
    return os.path.isfile(os.path.join(path, "manifest.json"))


class SyntheticImages(torch.utils.data.Dataset):
    """Deterministic random uint8 images: item ``i`` is the same on every run and in every worker."""

    def __init__(self, n: int, size: Size, num_classes: int = 10, seed: int = 0, channels: int = 3) -> None:
        self.n, self.size, self.seed, self.channels = n, size, seed, channels
        self.classes = [f"class{k}" for k in range(num_classes)]

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + i)
        img = torch.randint(0, 256, (self.channels, *size_hw(self.size)), generator=g, dtype=torch.uint8)
        return img, i % len(self.classes)


# ----------------------------------------------------------------------------------------------- default data


def cache_root() -> str:
    """Where generated data lives: ``$PTT_CACHE_DIR`` or ``$XDG_CACHE_HOME/pytorchtricks`` (``~/.cache``)."""
    base = os.environ.get("PTT_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "pytorchtricks"
    )
    return base


def wallpaper_photos(limit: int = DEFAULT_CLASSES) -> list[str]:
    """The first ``limit`` JPEG wallpaper photos installed by the Debian packages (sorted, so runs agree)."""
    found: list[str] = []
    for top in WALLPAPER_DIRS:
        for dirpath, _, files in sorted(os.walk(top)):
            for f in sorted(files):
                if f.lower().endswith((".jpg", ".jpeg")):
                    found.append(os.path.join(dirpath, f))
    return sorted(found)[:limit]


def _tiles_from_photo(path: str, n: int, px: int, rng: np.random.Generator) -> list[Any]:
    from PIL import Image

    with Image.open(path) as f:
        f.draft("RGB", (512, 512))  # decode big photos at reduced scale: ~8x fewer pixels to decode
        im: Any = f.convert("RGB")
        scale = 384 / min(im.size)
        im = im.resize((max(px, round(im.size[0] * scale)), max(px, round(im.size[1] * scale))))
        out = []
        for _ in range(n):
            side = int(rng.integers(px, min(im.size) + 1))
            x = int(rng.integers(0, im.size[0] - side + 1))
            y = int(rng.integers(0, im.size[1] - side + 1))
            out.append(im.crop((x, y, x + side, y + side)).resize((px, px), Image.Resampling.BILINEAR))
    return out


def _generated_tiles(k: int, n: int, px: int, rng: np.random.Generator) -> list[Any]:
    """Class ``k``: smooth colour fields with a class-specific hue and stripe frequency, plus noise."""
    from PIL import Image

    yy, xx = np.mgrid[0:px, 0:px].astype(np.float32) / px
    base = np.array([(k * 37) % 256, (k * 91) % 256, (k * 53) % 256], dtype=np.float32)
    out = []
    for _ in range(n):
        phase = rng.uniform(0, 2 * np.pi)
        wave = np.sin((k + 1) * 3.0 * (xx + yy) * np.pi + phase)[..., None]
        img = base + 60 * wave + rng.normal(0, 12, (px, px, 3))
        out.append(Image.fromarray(np.clip(img, 0, 255).astype(np.uint8)))
    return out


def default_image_folder(
    *,
    classes: int = DEFAULT_CLASSES,
    per_class: int = DEFAULT_TILES_PER_CLASS,
    px: int = DEFAULT_TILE_PX,
    root: str | None = None,
) -> tuple[str, str]:
    """Build (once, cached) the built-in image set; returns ``(folder, description)``.

    One class per installed wallpaper photo, ``per_class`` random square crops of it saved as ``px`` JPEGs; without
    the photos, deterministic generated images of the same layout. Written to a temp folder and renamed, so a
    half-built set is never used.
    """
    photos = wallpaper_photos(classes)
    source = "photos" if len(photos) >= 2 else "generated"
    key = hashlib.sha256(repr((source, photos, classes, per_class, px, 1)).encode()).hexdigest()[:12]
    folder = os.path.join(root or cache_root(), f"tune-default-{key}")
    n_classes = len(photos) if source == "photos" else classes
    desc = (
        f"{n_classes * per_class} JPEG tiles ({px} px) cut from {n_classes} Debian wallpaper photos"
        if source == "photos"
        else f"{n_classes * per_class} generated JPEG images ({px} px, no wallpaper photos installed)"
    )
    if os.path.isdir(folder):
        return folder, desc
    os.makedirs(os.path.dirname(folder), exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=".tmp-", dir=os.path.dirname(folder))
    try:
        rng = np.random.default_rng(0)
        for k in range(n_classes):
            if source == "photos":
                name = os.path.splitext(os.path.basename(photos[k]))[0][:40]
                tiles = _tiles_from_photo(photos[k], per_class, px, rng)
            else:
                name, tiles = f"pattern{k:02d}", _generated_tiles(k, per_class, px, rng)
            os.makedirs(os.path.join(tmp, f"{k:02d}_{name}"))
            for j, tile in enumerate(tiles):
                tile.save(os.path.join(tmp, f"{k:02d}_{name}", f"{j:04d}.jpg"), quality=90)
        try:
            os.replace(tmp, folder)
        except OSError:  # another process built it first
            shutil.rmtree(tmp, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return folder, desc


# ----------------------------------------------------------------------------------------------- workload


@dataclass
class Workload:
    """A model factory plus data, as ``tune`` measures them."""

    model_spec: str
    model_factory: Callable[[], nn.Module]  # a fresh copy with the same initial weights on every call
    dataset: torch.utils.data.Dataset[Any]
    data_desc: str
    num_outputs: int
    batch_size: int
    input_size: int  # the image side in pixels (its height when ``width`` differs)
    for_: str  # "train" or "infer"
    device: torch.device
    notes: list[str] = field(default_factory=list)
    channels: int = 3  # input channels the model takes (1: gray, 3: RGB)
    width: int | None = None  # the image width when it differs from ``input_size`` (None: square)
    num_workers: int = 0  # loader worker processes the user's loop already uses: the baseline's

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
        """The first ``n`` (default: batch size) samples, collated: uint8 NCHW images and int64 labels."""
        n = min(n or self.batch_size, len(self.dataset))  # type: ignore[arg-type]
        items = [self.dataset[i] for i in range(n)]
        return torch.stack([x for x, _ in items]), torch.tensor([y for _, y in items], dtype=torch.int64)


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


def _dataset(data: str | None, size: tuple[int, int], channels: int, bs: int) -> tuple[Any, str]:
    h, w = size
    px = f"{h} px" if h == w else f"{h}x{w} px"
    px += "" if channels == 3 else f", {channels} channel(s)"
    if data is None:
        folder, desc = default_image_folder()
        return ImageFolderData(folder, size, channels), f"built-in: {desc}, decoded and resized to {px}"
    if data == "synthetic":
        ds: Any = SyntheticImages(max(8 * bs, 64), size, channels=channels)
        return ds, f"synthetic: {len(ds)} deterministic random uint8 images, {px}"
    if _is_pack(data):
        ds = ShardImages(data, size, channels)
        return ds, f"ptt pack {data}: {len(ds)} images in {len(ds.classes)} classes, {px}"
    ds = ImageFolderData(data, size, channels)
    return ds, f"image folder {data}: {len(ds)} images in {len(ds.classes)} classes, {px}"


def build_workload(
    model: str | None = None,
    data: str | None = None,
    *,
    batch_size: int | None = None,
    input_size: int | None = None,
    input_shape: str | tuple[int, ...] | None = None,
    num_workers: int = 0,
    for_: str = "train",
    device: str | None = "cpu",
    seed: int = 0,
) -> Workload:
    """Resolve MODEL and DATA into a ``Workload``; all checks happen here, before any output is written.

    ``input_shape`` is one sample's C,H,W (or N,C,H,W); without it the channels are the model's (its first
    convolution's ``in_channels``) and the side ``input_size`` (default 64). ``num_workers`` is the loader
    workers the user's loop already uses: the baseline loads with them, and tune does not recommend them again.

    Example:
        >>> build_workload("torch.nn:Identity", "synthetic", batch_size=2, input_size=8)
        Traceback (most recent call last):
        ...
        pytorchtricks.core.PttError: the model torch.nn:Identity returns (2, 3, 8, 8), but tune trains with ...
    """
    if for_ not in ("train", "infer", "inference"):
        raise PttError(f"--for must be train or inference, not {for_!r}.")
    for_ = "infer" if for_ == "inference" else for_
    if num_workers < 0:
        raise PttError(f"--num-workers must be 0 (load in the training process) or more, not {num_workers}.")
    dev = resolve_device(device)
    spec = model or DEFAULT_MODEL
    require("PIL", "data", package="pillow")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        base = _load_model_or_explain(spec)
    bs, channels, h, w, given = _resolve_shape(base, input_shape, input_size, batch_size)
    dataset, data_desc = _dataset(data, (h, w), channels, bs)
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
    probe_x = torch.stack([dataset[i % len(dataset)][0] for i in range(min(2, bs))])
    n_out = _probe(base, probe_x, spec, given, dev)
    base = base.cpu()
    if n_out < len(getattr(dataset, "classes", [])):
        notes.append(
            f"the model has {n_out} outputs for {len(dataset.classes)} classes; labels are taken mod {n_out}"
        )
    state = copy.deepcopy(base)

    def factory() -> nn.Module:
        return copy.deepcopy(state)

    return Workload(
        spec, factory, dataset, data_desc, n_out, bs, h, for_, dev, notes,
        channels=channels, width=None if w == h else w, num_workers=num_workers,
    )  # fmt: skip
