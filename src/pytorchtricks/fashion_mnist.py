"""Fashion-MNIST (Debian ``dataset-fashion-mnist``) and a cached small-CNN trainer for honest accuracy checks.

The IDX ``.gz`` files are read directly (no torchvision download). ``trained_small_cnn`` trains once per recipe
and caches the weights (``torch.save`` state dict, loaded with ``weights_only=True``, atomic write) under
``core.cache_root()`` (``$PTT_CACHE_DIR``, ``$XDG_CACHE_HOME/pytorchtricks`` or ``~/.cache/pytorchtricks``); later
calls load in milliseconds.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import tempfile
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from pytorchtricks.core import PttError, cache_root

DEFAULT_ROOT = "/usr/share/datasets/fashion-mnist"
MEAN, STD = 0.2860, 0.3530  # training-set pixel statistics (0..1 scale)
CLASSES = (
    "T-shirt/top",
    "Trouser",
    "Pullover",
    "Dress",
    "Coat",
    "Sandal",
    "Shirt",
    "Sneaker",
    "Bag",
    "Ankle boot",
)
_FILES = {
    "train": ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz"),
    "test": ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"),
}


def available(root: str = DEFAULT_ROOT) -> bool:
    """True when the four IDX files are present."""
    return all(os.path.isfile(os.path.join(root, f)) for pair in _FILES.values() for f in pair)


def _read_idx(path: str) -> np.ndarray:
    with gzip.open(path, "rb") as fh:
        data = fh.read()
    magic = int.from_bytes(data[:4], "big")
    ndim = magic & 0xFF
    if magic >> 8 != 0x08:  # 0x08 = unsigned byte payload
        raise PttError(f"{path} is not an unsigned-byte IDX file (magic {magic:#x}); re-install the dataset.")
    dims = [int.from_bytes(data[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim)]
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)


def load_uint8(split: str = "train", root: str = DEFAULT_ROOT) -> tuple[np.ndarray, np.ndarray]:
    """``(images, labels)`` as stored: uint8 ``(N, 28, 28)`` (0 = background, bright = garment), int64 ``(N,)``
    indexing ``CLASSES``."""
    if split not in _FILES:
        raise PttError(f"unknown split {split!r}; use 'train' or 'test'.")
    if not available(root):
        raise PttError(
            f"Fashion-MNIST not found under {root}; install it with `apt-get install dataset-fashion-mnist`."
        )
    img_f, lab_f = _FILES[split]
    return _read_idx(os.path.join(root, img_f)), _read_idx(os.path.join(root, lab_f)).astype(np.int64)


def load(split: str = "train", root: str = DEFAULT_ROOT) -> tuple[torch.Tensor, torch.Tensor]:
    """``(images, labels)``: images normalised float32 ``(N, 1, 28, 28)``, labels int64 ``(N,)``."""
    raw, lab = load_uint8(split, root)
    images = torch.from_numpy(raw.copy()).float().div_(255.0)
    return images.sub_(MEAN).div_(STD).unsqueeze(1), torch.from_numpy(lab)


def evaluate(
    model: Callable[[torch.Tensor], torch.Tensor],
    images: torch.Tensor,
    labels: torch.Tensor,
    batch_size: int = 500,
) -> float:
    """Top-1 accuracy in percent of ``model`` (any callable) on ``images``."""
    if isinstance(model, nn.Module):
        model.eval()
    correct = 0
    with torch.no_grad():
        for i in range(0, len(images), batch_size):
            out = model(images[i : i + batch_size].clone())
            correct += int((out.argmax(1) == labels[i : i + batch_size]).sum())
    return 100.0 * correct / len(images)


def train(
    model: nn.Module,
    images: torch.Tensor,
    labels: torch.Tensor,
    *,
    epochs: float = 1.0,
    lr: float = 0.05,
    batch_size: int = 128,
    seed: int = 0,
    loss_fn: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
    after_backward: Callable[[nn.Module], None] | None = None,
) -> nn.Module:
    """SGD (momentum 0.9, nesterov, cosine lr) over shuffled mini-batches; returns ``model`` in eval mode.

    ``loss_fn(logits, labels, batch_images)`` replaces cross-entropy (e.g. distillation); ``after_backward(model)``
    runs between ``backward`` and the step (e.g. an L1 penalty on BN gammas).
    """
    g = torch.Generator().manual_seed(seed)
    steps = max(1, int(epochs * len(images)) // batch_size)
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9, nesterov=True, weight_decay=5e-4)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=lr, total_steps=steps, pct_start=0.15)
    model.train()
    order = torch.randperm(len(images), generator=g)
    pos = 0
    for _ in range(steps):
        if pos + batch_size > len(order):
            order, pos = torch.randperm(len(images), generator=g), 0
        idx = order[pos : pos + batch_size]
        pos += batch_size
        x, y = images[idx], labels[idx]
        logits = model(x)
        loss = loss_fn(logits, y, x) if loss_fn is not None else F.cross_entropy(logits, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if after_backward is not None:
            after_backward(model)
        opt.step()
        sched.step()
    return model.eval()


def fmnist_cnn(width: int = 16, num_classes: int = 10) -> nn.Sequential:
    """Three Conv-BN-ReLU stages with max-pooling (28 -> 14 -> 7), global average pool, Linear: ~1.9 MMAC/image."""
    w = width

    def stage(c_in: int, c_out: int) -> list[nn.Module]:
        return [nn.Conv2d(c_in, c_out, 3, padding=1, bias=False), nn.BatchNorm2d(c_out), nn.ReLU()]

    return nn.Sequential(
        *stage(1, w),
        nn.MaxPool2d(2),
        *stage(w, 2 * w),
        nn.MaxPool2d(2),
        *stage(2 * w, 4 * w),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(4 * w, num_classes),
    )


def trained_small_cnn(
    *,
    width: int = 16,
    train_subset: int | None = 20000,
    epochs: float = 3.0,
    seed: int = 0,
    root: str = DEFAULT_ROOT,
) -> nn.Module:
    """``fmnist_cnn`` trained on Fashion-MNIST (first ``train_subset`` images, lr 0.2, batch 256); cached on disk."""
    recipe: dict[str, Any] = {
        "v": 2,
        "width": width,
        "subset": train_subset,
        "epochs": epochs,
        "seed": seed,
        "torch": torch.__version__.split("+")[0],
    }
    key = hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:16]
    path = cache_root("fashion_mnist", f"fmnist_cnn-{key}.pt")
    torch.manual_seed(seed)
    model = fmnist_cnn(width)
    if os.path.isfile(path):
        model.load_state_dict(torch.load(path, map_location="cpu", weights_only=True))
        return model.eval()
    images, labels = load("train", root)
    if train_subset is not None:
        images, labels = images[:train_subset], labels[:train_subset]
    train(model, images, labels, epochs=epochs, lr=0.2, batch_size=256, seed=seed)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), suffix=".tmp")
    os.close(fd)
    torch.save(model.state_dict(), tmp)
    os.replace(tmp, path)  # atomic: a concurrent reader never sees half a file
    return model.eval()
