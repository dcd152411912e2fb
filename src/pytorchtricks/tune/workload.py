"""What ``tune`` measures: a model, a dataset of images, a batch size and an input size.

``build_workload`` turns the command-line strings into a ``Workload``: MODEL via ``bench.workloads.load_model``
(or the built-in ResNet-18), DATA an image folder (``root/<class>/<image>``, or a flat folder of images),
a ``ptt pack`` folder, ``synthetic`` (deterministic random images) or nothing (the built-in wallpaper set, see ``default_image_folder``).
Every failure raises ``PttError`` with one paragraph that names the problem and the fix, before anything is written.
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


# ----------------------------------------------------------------------------------------------- datasets


def _decode(path: str, size: int) -> torch.Tensor:
    """Decode an image file to a uint8 CHW tensor of ``size`` x ``size`` (JPEG decoded at reduced DCT scale)."""
    from PIL import Image

    with Image.open(path) as f:
        f.draft("RGB", (size, size))  # JPEG: decode at 1/2, 1/4 or 1/8 scale when that still covers `size`
        im = f.convert("RGB").resize((size, size), Image.Resampling.BILINEAR)
        arr = np.asarray(im, dtype=np.uint8)
    return torch.from_numpy(arr.copy()).permute(2, 0, 1).contiguous()


class ImageFolderData(torch.utils.data.Dataset):
    """Map-style dataset over ``root/<class>/<image>`` (or a flat folder: one class): ``(uint8 CHW, label)``.

    Paths are kept in one numpy array (not a Python list) so forked DataLoader workers do not copy pages.
    """

    def __init__(self, root: str, size: int) -> None:
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
        self.classes = [c for c, _ in groups]
        self._paths = np.array([p.encode() for p in paths])
        self.labels = np.asarray(labels, dtype=np.int64)

    def __len__(self) -> int:
        return len(self.labels)

    def path(self, i: int) -> str:
        return self._paths[i].decode()

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        return _decode(self.path(i), self.size), int(self.labels[i])


class ShardImages(torch.utils.data.Dataset):
    """A ``ptt pack`` folder (ptt or lmdb format) read with ``ShardDataset``: ``(uint8 CHW, label)`` at ``size``."""

    def __init__(self, path: str, size: int) -> None:
        from pytorchtricks.shards.dataset import ShardDataset

        self.shards = ShardDataset(path)
        self.source = path
        self.size = size
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
        im = Image.fromarray(np.asarray(img, dtype=np.uint8)).resize(
            (self.size, self.size), Image.Resampling.BILINEAR
        )
        return torch.from_numpy(np.asarray(im, dtype=np.uint8).copy()).permute(2, 0, 1).contiguous(), int(
            label
        )


def _is_pack(path: str) -> bool:
    return os.path.isfile(os.path.join(path, "manifest.json"))


class SyntheticImages(torch.utils.data.Dataset):
    """Deterministic random uint8 images: item ``i`` is the same on every run and in every worker."""

    def __init__(self, n: int, size: int, num_classes: int = 10, seed: int = 0) -> None:
        self.n, self.size, self.seed = n, size, seed
        self.classes = [f"class{k}" for k in range(num_classes)]

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + i)
        img = torch.randint(0, 256, (3, self.size, self.size), generator=g, dtype=torch.uint8)
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
    input_size: int
    for_: str  # "train" or "infer"
    device: torch.device
    notes: list[str] = field(default_factory=list)

    @property
    def num_classes(self) -> int:
        return len(getattr(self.dataset, "classes", [])) or self.num_outputs

    def example_batch(self, n: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """The first ``n`` (default: batch size) samples, collated: uint8 NCHW images and int64 labels."""
        n = min(n or self.batch_size, len(self.dataset))  # type: ignore[arg-type]
        items = [self.dataset[i] for i in range(n)]
        return torch.stack([x for x, _ in items]), torch.tensor([y for _, y in items], dtype=torch.int64)


def _load_model_or_explain(spec: str) -> nn.Module:
    try:
        from pytorchtricks.bench.workloads import load_model

        return load_model(spec)
    except PttError as exc:
        raise PttError(
            f"could not build the model from --model {spec!r}: {exc} (--model takes torchvision:NAME, "
            "package.module:factory or path/to/file.py:factory; fix the spec or the code it points to.)"
        ) from exc


def _probe(model: nn.Module, batch: torch.Tensor, spec: str, size: int, device: torch.device) -> int:
    """Run one forward on the real input size; return the output width (classes), or explain the failure."""
    try:
        with torch.no_grad():
            out = model.to(device).eval()(batch.to(device).float() / 255)
    except Exception as exc:
        raise PttError(
            f"the model {spec} fails on inputs of shape {tuple(batch.shape)} (--input-size {size}): "
            f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}. Pass the input size the model "
            "was built for with --input-size (e.g. 224 for ImageNet models, 28 for MNIST-style ones), or fix the "
            "model's forward so it accepts this size."
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


def build_workload(
    model: str | None = None,
    data: str | None = None,
    *,
    batch_size: int | None = None,
    input_size: int | None = None,
    for_: str = "train",
    device: str | None = "cpu",
    seed: int = 0,
) -> Workload:
    """Resolve MODEL and DATA into a ``Workload``; all checks happen here, before any output is written.

    Example:
        >>> build_workload("torch.nn:Identity", "synthetic", batch_size=2, input_size=8)
        Traceback (most recent call last):
        ...
        pytorchtricks.core.PttError: the model torch.nn:Identity returns (2, 3, 8, 8), but tune trains with ...
    """
    if for_ not in ("train", "infer", "inference"):
        raise PttError(f"--for must be train or inference, not {for_!r}.")
    for_ = "infer" if for_ == "inference" else for_
    dev = resolve_device(device)
    size = input_size or DEFAULT_INPUT_SIZE
    bs = batch_size or DEFAULT_BATCH_SIZE
    if size < 8 or bs < 1:
        raise PttError(f"--input-size must be >= 8 and --batch-size >= 1 (got {size} and {bs}).")
    notes: list[str] = []
    dataset: Any
    if data is None:
        folder, desc = default_image_folder()
        dataset = ImageFolderData(folder, size)
        data_desc = f"built-in: {desc}, decoded and resized to {size} px"
    elif data == "synthetic":
        dataset = SyntheticImages(max(8 * bs, 64), size)
        data_desc = f"synthetic: {len(dataset)} deterministic random uint8 images, {size} px"
    elif _is_pack(data):
        dataset = ShardImages(data, size)
        data_desc = f"ptt pack {data}: {len(dataset)} images in {len(dataset.classes)} classes, {size} px"
    else:
        dataset = ImageFolderData(data, size)
        data_desc = f"image folder {data}: {len(dataset)} images in {len(dataset.classes)} classes, {size} px"
    if len(dataset) < bs:
        notes.append(
            f"the dataset has {len(dataset)} images, fewer than one batch of {bs}; batches repeat images"
        )
    spec = model or DEFAULT_MODEL
    require("PIL", "data", package="pillow")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        if model is None:
            base = _load_model_or_explain(f"{DEFAULT_MODEL}")
            n_cls = len(dataset.classes)
            base.fc = nn.Linear(
                int(base.fc.in_features),  # type: ignore[union-attr,arg-type]
                n_cls,
            )  # torchvision ResNet-18, weights=None, our classes
        else:
            base = _load_model_or_explain(spec)
    probe_x = torch.stack([dataset[i % len(dataset)][0] for i in range(min(2, bs))])
    n_out = _probe(base, probe_x, spec, size, dev)
    base = base.cpu()
    if n_out < len(getattr(dataset, "classes", [])):
        notes.append(
            f"the model has {n_out} outputs for {len(dataset.classes)} classes; labels are taken mod {n_out}"
        )
    state = copy.deepcopy(base)

    def factory() -> nn.Module:
        return copy.deepcopy(state)

    return Workload(spec, factory, dataset, data_desc, n_out, bs, size, for_, dev, notes)
