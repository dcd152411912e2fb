"""The ``data`` check of a loader candidate: proved before it is timed.

A data trick changes how samples reach the step, never which samples or what they show. On a subset of the data
(``SUBSET`` samples, the first ones) the configured loader must give:

- every sample exactly once per epoch (indices read back through the loader, the partial batch dropped only when
  ``drop_last`` says so) and the same label multiset as the dataset;
- batches of the dtype and shape the step expects (uint8 ``[N, C, size, size]``, int64 labels);
- pixels within ``MIN_PSNR_DB`` (the median over 16 samples; the worst is reported: a RAM cache or a resized
  pack rounds the crop box on a smaller image, and a one-pixel shift of a finely textured photo alone costs
  ~25 dB on that photo) of the baseline's decode on the same crop box: the evaluation geometry (resize the
  short side to ``size / 0.875``, centre crop) through the candidate's own decode path vs PIL full decode +
  torchvision ``Resize`` + ``CenterCrop`` of the original file. PSNR bounds what a faster decode (DCT-scaled,
  from a RAM cache at a smaller size, from a re-encoded pack) costs in fidelity.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from pytorchtricks.clock import now_s
from pytorchtricks.core import PttError

SUBSET = 96
MIN_PSNR_DB = (
    30.0  # JPEG re-encoding at q90 and one extra resize stay near 35-45 dB; a wrong box or channel <15
)


@dataclass
class DataCheck:
    kind: str
    ok: bool
    detail: str
    psnr_db: float | None = None
    sample_s: float | None = (
        None  # the loader alone, seconds per sample after its first batch (a cost estimate)
    )


class FirstSamples:
    """The first ``n`` samples of ``dataset``, read raw; with ``index_labels`` each sample's index is its label
    (to read the order of an epoch back through a loader)."""

    def __init__(self, dataset: Any, n: int, *, index_labels: bool = False) -> None:
        self.dataset, self.n, self.index_labels = dataset, n, index_labels

    def __len__(self) -> int:
        return self.n

    def read_raw(self, i: int) -> tuple[Any, int, dict[str, Any]]:
        from pytorchtricks.data.images import read_item

        if not 0 <= i < self.n:
            raise IndexError(i)
        raw, label = read_item(self.dataset, i)
        return raw, i if self.index_labels else label, {}


def psnr_db(a: torch.Tensor | np.ndarray, b: torch.Tensor | np.ndarray) -> float:
    """Peak signal-to-noise ratio of two uint8 images of one shape, tensors or arrays (dB; inf when equal)."""
    a, b = torch.as_tensor(a), torch.as_tensor(b)
    if a.shape != b.shape:
        raise PttError(f"images of shapes {tuple(a.shape)} and {tuple(b.shape)} cannot be compared")
    mse = float(((a.double() - b.double()) ** 2).mean())
    return math.inf if mse == 0 else 10 * math.log10(255.0**2 / mse)


def reference_pixels(files: Sequence[str], size: int) -> torch.Tensor:
    """The baseline's decode on the evaluation box: PIL full decode, ``Resize(size/0.875)``, ``CenterCrop``."""
    from PIL import Image
    from torchvision.transforms import CenterCrop, PILToTensor, Resize

    resize, crop, to_tensor = Resize(round(size / 0.875)), CenterCrop(size), PILToTensor()
    out = []
    for f in files:
        with Image.open(f) as im:
            out.append(to_tensor(crop(resize(im.convert("RGB")))))
    return torch.stack(out)


def check_data(
    dataset: Any,
    labels: Sequence[int],
    files: Sequence[str] | None,
    *,
    batch_size: int,
    size: int,
    loader_kwargs: dict[str, Any],
    seed: int = 0,
) -> DataCheck:
    """Run the three checks on the first ``SUBSET`` samples of ``dataset`` read through ``make_loader``.

    ``labels[i]`` is sample ``i``'s label and ``files[i]`` its original file (None: no pixel check, e.g.
    synthetic data). ``loader_kwargs`` are the candidate's ``make_loader`` settings.
    """
    from pytorchtricks.tricks.data.make_loader import make_loader

    n = min(SUBSET, len(dataset))
    bs = max(1, min(batch_size, n // 3 or 1))  # a few batches, and a partial one when n does not divide
    kw = {k: v for k, v in loader_kwargs.items() if k in ("num_workers", "prefetch_factor", "pin_memory")}
    kw["num_workers"] = min(int(kw.get("num_workers", 0)), 2)
    loader = make_loader(
        FirstSamples(dataset, n, index_labels=True), bs, crop=size, seed=seed, drop_last=False, **kw
    )
    seen: list[int] = []
    t_first: float | None = None
    after_first = 0
    for x, y in loader:
        if t_first is None:
            t_first = now_s()
        else:
            after_first += int(x.shape[0])
        if (problem := _batch_problem(x, size)) is not None:
            return DataCheck("data", False, problem)
        if y.dtype != torch.int64:
            return DataCheck("data", False, f"labels are {y.dtype}, not int64")
        seen.extend(int(i) for i in y)
    sample_s = (now_s() - t_first) / after_first if t_first is not None and after_first else None
    dup = [i for i, c in Counter(seen).items() if c > 1]
    missing = sorted(set(range(n)) - set(seen))
    if dup or missing:
        return DataCheck(
            "data",
            False,
            f"one epoch of {n} samples: {len(dup)} repeated, {len(missing)} missing (e.g. {(dup + missing)[:3]})",
        )
    if Counter(int(labels[i]) for i in seen) != Counter(int(labels[i]) for i in range(n)):
        return DataCheck("data", False, "the label multiset of an epoch differs from the dataset's")
    detail = f"{n} samples once each per epoch, labels kept, uint8 [N, C, {size}, {size}]"
    if files is None:
        return DataCheck("data", True, detail + "; no pixel check (no source files)", sample_s=sample_s)
    k = min(16, n)
    ev = make_loader(FirstSamples(dataset, k, index_labels=True), k, crop=size, mode="eval", num_workers=0)
    return _pixel_check(next(iter(ev))[0], files[:k], size, detail, sample_s)


def _batch_problem(x: torch.Tensor, size: int) -> str | None:
    if x.dtype != torch.uint8 or x.dim() != 4 or tuple(x.shape[2:]) != (size, size):
        return f"batches are {x.dtype} {tuple(x.shape)}, not uint8 [N, C, {size}, {size}]"
    return None


def _pixel_check(
    got: torch.Tensor, files: Sequence[str], size: int, detail: str, sample_s: float | None = None
) -> DataCheck:
    """``got[i]`` (uint8, the evaluation box at ``size``) against PIL's decode of ``files[i]`` on the same box:
    the median PSNR must reach ``MIN_PSNR_DB``."""
    k = len(files)
    ref = reference_pixels(files, size)
    values = sorted(psnr_db(got[i].cpu(), ref[i]) for i in range(k))
    median, worst = values[k // 2], values[0]
    ok = median >= MIN_PSNR_DB
    detail += (
        f"; pixels {median:.1f} dB PSNR median of {k} (worst {worst:.1f}) vs PIL decode + Resize + CenterCrop"
        f" at {size} px"
    )
    return DataCheck(
        "data", ok, detail + ("" if ok else f" < {MIN_PSNR_DB:.0f} dB"), psnr_db=median, sample_s=sample_s
    )


def label_array(dataset: Any) -> np.ndarray:
    """The labels of a JpegFolder / ShardDataset / CachedDataset, read without decoding where possible."""
    labels = getattr(dataset, "labels", None)
    if labels is not None:
        return np.asarray(labels, dtype=np.int64)
    from pytorchtricks.data.images import read_item

    return np.asarray([read_item(dataset, i)[1] for i in range(len(dataset))], dtype=np.int64)


def check_device_data(
    device_data: Any, labels: Sequence[int], files: Sequence[str] | None, *, size: int, side: int
) -> DataCheck:
    """The same checks for a dataset resident on the device (``ptt.dataset_on_device``): one epoch of its own
    batching over the stored images with each sample's index as its label (every sample once), the labels it
    holds against the dataset's, batches uint8 ``[N, C, size, size]``, and the stored pixels (decoded once at
    ``side``, resize + centre crop) against PIL's decode on the same box."""
    from pytorchtricks.tricks.data.dataset_on_device import dataset_on_device

    images, held = device_data.images, device_data.labels
    n = int(images.shape[0])
    probe = dataset_on_device(
        images, torch.arange(n, device=images.device), min(device_data.batch_size, n), device=images.device,
        shuffle=True, drop_last=False, augment=device_data.augment,
    )  # fmt: skip
    seen: list[int] = []
    for x, y in probe:
        if (problem := _batch_problem(x, size)) is not None:
            return DataCheck("data", False, problem)
        seen.extend(int(i) for i in y.cpu())
    if sorted(seen) != list(range(n)):
        return DataCheck("data", False, f"one epoch of {n} samples: {n - len(set(seen))} missing or repeated")
    if Counter(int(v) for v in held.cpu()) != Counter(int(labels[i]) for i in range(n)):
        return DataCheck("data", False, "the labels held on the device differ from the dataset's")
    detail = f"{n} samples once each per epoch, labels kept, uint8 [N, C, {size}, {size}] on {images.device}"
    if files is None:
        return DataCheck("data", True, detail + "; no pixel check (no source files)")
    k = min(16, n)
    return _pixel_check(images[:k], files[:k], side, detail + "; stored")
