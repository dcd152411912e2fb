"""The staged inference pipeline: unshare -> fuse -> reparameterize -> quantize or compile, each step checked.

Each step runs its safety check (outputs vs the original model on the example inputs, caller's inputs unchanged)
and keeps its stage (``Optimized.stages``), which the inference benchmarks time against eager fp32. ``ptt optimize``
itself picks among whole engines (``picker``); ``load_calibration`` reads its ``--calibrate`` folder.
"""

from __future__ import annotations

import copy
import math
import os
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from pytorchtricks.core import PttError
from pytorchtricks.safety import check_transform, reference_outputs


@dataclass
class Step:
    """One pipeline stage: what it did, its safety numbers and (after timing) its speed vs eager fp32."""

    name: str
    status: str  # "applied", "no effect" or "skipped: <why>"
    sqnr_db: float = math.inf
    max_abs_diff: float = 0.0
    speedup: float | None = None
    speedup_q1: float | None = None
    speedup_q3: float | None = None

    def as_dict(self) -> dict[str, Any]:
        return {k: (None if isinstance(v, float) and math.isinf(v) else v) for k, v in self.__dict__.items()}


@dataclass
class Optimized:
    """Result of ``optimize``: the final callable, the fp32 rewritten model (what is saved), and the steps."""

    model: Callable[..., Any]
    fp32_model: nn.Module
    steps: list[Step]
    stages: dict[str, Callable[..., Any]]


def load_calibration(folder: str, shape: Sequence[int], limit: int = 64) -> list[torch.Tensor]:
    """Images from ``folder`` (jpg/png), resized to ``shape``'s H x W, ImageNet-normalised, in batches of shape[0]."""
    from pytorchtricks.core import require

    image_mod = require("PIL.Image", "data", package="pillow")
    if not os.path.isdir(folder):
        raise PttError(f"--calibrate {folder!r} is not a folder; give a folder of .jpg/.png images.")
    from pytorchtricks.data.normalization import IMAGENET_MEAN, IMAGENET_STD
    from pytorchtricks.data.sources import IMAGE_EXTENSIONS

    files = sorted(
        os.path.join(root, f)
        for root, _, names in os.walk(folder)
        for f in names
        if f.lower().endswith(IMAGE_EXTENSIONS)
    )[:limit]
    if not files:
        raise PttError(f"no .jpg/.png images under {folder!r}; calibration needs a few real inputs.")
    if len(shape) != 4 or shape[1] != 3:
        raise PttError("--calibrate with images needs an input shape N,3,H,W.")
    mean = torch.tensor(IMAGENET_MEAN).view(3, 1, 1)
    std = torch.tensor(IMAGENET_STD).view(3, 1, 1)
    imgs = []
    for f in files:
        with image_mod.open(f) as im:
            im = im.convert("RGB").resize((shape[3], shape[2]))
            t = torch.frombuffer(bytearray(im.tobytes()), dtype=torch.uint8).view(shape[2], shape[3], 3)
        imgs.append((t.permute(2, 0, 1).float() / 255.0 - mean) / std)
    n = shape[0]
    return [torch.stack(imgs[i : i + n]) for i in range(0, len(imgs) - n + 1, n)] or [
        torch.stack(imgs[:1] * n)
    ]


def _try(step: str, fn: Callable[[], Any]) -> tuple[Any, str]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            out = fn()
        except PttError as exc:
            if "safety check" in str(exc):
                raise
            return None, f"skipped: {str(exc)[:120]}"
    no_effect = any(w.category.__name__ == "NoEffectWarning" for w in caught)
    return out, "no effect" if no_effect else "applied"


def optimize(
    model: nn.Module,
    example_inputs: Any,
    *,
    int8: bool = False,
    calibration: Sequence[Any] | None = None,
    compile: bool = True,
    min_sqnr_db: float | None = None,
) -> Optimized:
    """Run the pipeline on ``model`` (eval mode); every step is safety-checked against the original outputs."""
    from pytorchtricks.tricks.model.fuse_conv_bn import fuse_conv_bn_
    from pytorchtricks.tricks.model.reparameterize import reparameterize_
    from pytorchtricks.tricks.model.unshare_modules import unshare_modules_

    example = tuple(example_inputs) if isinstance(example_inputs, list | tuple) else (example_inputs,)
    model = model.eval()
    ref = reference_outputs(model, example)
    stages: dict[str, Callable[..., Any]] = {"eager fp32": copy.deepcopy(model)}
    steps = [Step("eager fp32", "reference")]
    current = model

    def record(name: str, status: str, fn: Callable[..., Any]) -> None:
        step = Step(name, status)
        if not status.startswith("skipped"):
            rep = check_transform(fn, example, ref, step=name, min_sqnr_db=min_sqnr_db)
            step.sqnr_db, step.max_abs_diff = rep.sqnr_db, rep.max_abs_diff
            if status == "applied":  # unchanged stages are not timed again
                stages[name] = fn
        steps.append(step)

    _, status = _try("unshare", lambda: unshare_modules_(current))
    record("unshare_modules", status, copy.deepcopy(current))
    _, status = _try("fuse", lambda: fuse_conv_bn_(current, example))
    record("fuse_conv_bn", status, copy.deepcopy(current))
    _, status = _try("reparameterize", lambda: reparameterize_(current, example))
    record("reparameterize", status, copy.deepcopy(current))
    final: Callable[..., Any] = current
    if int8:
        q, status = _try(
            "quantize",
            lambda: _quantize(copy.deepcopy(current), example, calibration, compile=compile),
        )
        if q is not None:
            final = q
        aot = getattr(q, "aot", None) is not None  # quantize warns when the package could not be built
        planned = getattr(q, "plan_source", None) is not None
        name = "quantize int8" + (
            " + oneDNN plan" if planned else " + AOTInductor" if aot else " + compile" if compile else ""
        )
        record(name, status, final)
    elif compile:
        from pytorchtricks.tricks.model.compile import compile_

        compiled, status = _try("compile", lambda: compile_(copy.deepcopy(current), for_inference=True))
        if compiled is not None:
            final = compiled
        record("compile (freezing)", status, final)
    return Optimized(final, current, steps, stages)


def _quantize(model: nn.Module, example: tuple[Any, ...], calibration: Any, *, compile: bool) -> Any:
    from pytorchtricks.tricks.model.onednn_plan import onednn_available
    from pytorchtricks.tricks.model.quantize import QuantConfig, quantize

    # compiled int8 for the example's shape: a oneDNN plan (every int8 op one prebuilt primitive) when the system
    # oneDNN is installed, plus an AOTInductor package (no guards or Python wrapper per call). ResNet-18, batch 1,
    # 1 thread: plan 4.48 ms, package 5.21 ms, torch.compile 5.90 ms, ORT int8 5.23 ms (results/int8_breakdown.md);
    # other shapes fall back to torch.compile
    config = QuantConfig(
        calibration=calibration, engine=("onednn" if onednn_available() else "aot") if compile else "eager"
    )
    with warnings.catch_warnings():  # a missing plan is not "no effect": the CLI prints q.plan_error instead
        warnings.filterwarnings("ignore", message="no oneDNN plan")
        try:
            return quantize(model, example, config)
        except PttError as exc:
            if "modified the caller's input" not in str(exc):
                raise
            # the oneDNN in-place sum trap: keep int8, protect the caller's tensors with a copy per call
            return quantize(model, example, config.replace(clone_inputs=True))
