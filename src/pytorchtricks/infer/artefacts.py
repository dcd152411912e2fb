"""Inference artefacts: one file per engine that runs without the model's code, how to build it, how to load it.

Kinds (the receipt beside the file says which, ``load_artefact`` reads it):

- ``export``: a ``torch.export`` program (``.pt2``), run eagerly by PyTorch (``torch.export.load(f).module()``);
  with ``channels_last`` the program converts its input and keeps its weights NHWC.
- ``aoti``: an AOTInductor package (``.pt2``, built with freezing): Inductor's C++ kernels for the example's shapes,
  no Dynamo guards or Python wrapper per call (``torch._inductor.aoti_load_package``).
- ``onnx``: an ONNX file run by ONNX Runtime with its full graph optimisation (``onnxruntime.InferenceSession``).
- ``onednn``: the PT2E int8 program (``.pt2``), lowered at load to a oneDNN plan for its input shape (every int8
  op one prebuilt primitive of the system oneDNN, ``libdnnl2``); needs pytorchtricks at load time.
"""

from __future__ import annotations

import importlib
import json
import os
import shutil
import tempfile
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from pytorchtricks.core import PttError

KINDS = ("export", "aoti", "onnx", "onednn")
EXTENSIONS = {"export": ".pt2", "aoti": ".pt2", "onnx": ".onnx", "onednn": ".pt2"}
RECEIPT_FORMAT = "pytorchtricks.artefact/1"


class ChannelsLast(nn.Module):
    """``model`` with NHWC weights that converts its 4-d float inputs to channels_last (the layout oneDNN's
    convolutions run without reorders)."""

    def __init__(self, model: nn.Module) -> None:
        from pytorchtricks.tricks.model.to_channels_last import to_channels_last_

        super().__init__()
        with (
            warnings.catch_warnings()
        ):  # its grouped-conv / no-effect warnings: the candidate's timing says it
            warnings.simplefilter("ignore")
            self.model = to_channels_last_(model)

    def forward(self, *args: torch.Tensor) -> Any:
        return self.model(
            *(a.contiguous(memory_format=torch.channels_last) if a.dim() == 4 else a for a in args)
        )


class Cast(nn.Module):
    """``model`` in ``dtype``: float inputs cast to it on the way in, float outputs back to float32 on the way out."""

    def __init__(self, model: nn.Module, dtype: torch.dtype) -> None:
        super().__init__()
        self.model, self.dtype = model.to(dtype), dtype

    def forward(self, *args: torch.Tensor) -> Any:
        out = self.model(*(a.to(self.dtype) if a.is_floating_point() else a for a in args))
        return torch.utils._pytree.tree_map(
            lambda t: t.float() if isinstance(t, torch.Tensor) and t.is_floating_point() else t, out
        )


def atomic_copy(src: str, dst: str) -> None:
    """Copy ``src`` to ``dst`` through a temporary file beside it and a rename (never a half-written ``dst``)."""
    os.makedirs(os.path.dirname(os.path.abspath(dst)) or ".", exist_ok=True)
    root, ext = os.path.splitext(dst)
    tmp = f"{root}.tmp{ext}"
    shutil.copyfile(src, tmp)
    os.replace(tmp, dst)


def write_export(model: nn.Module, example: tuple[Any, ...], path: str) -> str:
    """``model`` as a ``torch.export`` program at ``path`` (static shapes: the example's)."""
    with torch.no_grad():
        ep = torch.export.export(model, example)
    root, ext = os.path.splitext(path)
    tmp = f"{root}.tmp{ext or '.pt2'}"  # torch.export.save wants a name ending in .pt2
    torch.export.save(ep, tmp)
    os.replace(tmp, path)
    return path


def write_aoti(model: nn.Module | Any, example: tuple[Any, ...], path: str) -> str:
    """``model`` compiled by AOTInductor (freezing on: weights folded into the kernels' constants) at ``path``."""
    import torch._inductor.config as inductor_config

    folder = tempfile.mkdtemp(prefix="ptt-aoti-")
    try:
        with torch.no_grad():
            ep = torch.export.export(model, example)
            with inductor_config.patch(freezing=True), warnings.catch_warnings():
                warnings.simplefilter("ignore")
                built = torch._inductor.aoti_compile_and_package(
                    ep, package_path=os.path.join(folder, "model.pt2")
                )
        atomic_copy(built, path)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return path


def write_onnx(model: nn.Module, example: tuple[Any, ...], path: str) -> str:
    from pytorchtricks.tricks.model.export_onnx import export_onnx

    export_onnx(model, example, path, check=False)
    return path


def write_onnx_int8(fp32_onnx: str, calibration: Sequence[Any], path: str) -> str:
    from pytorchtricks.tricks.model.export_onnx import quantize_onnx_static

    return quantize_onnx_static(fp32_onnx, path, calibration)


def load(kind: str, path: str, *, input_shapes: Sequence[Sequence[int]], threads: int | None = None) -> Any:
    """The callable an artefact file holds (tensors in, tensors out), ready for ``input_shapes``."""
    if kind not in KINDS:
        raise PttError(f"unknown artefact kind {kind!r}; one of {', '.join(KINDS)}.")
    if not os.path.isfile(path):
        raise PttError(f"{path} does not exist; write it with ptt optimize ... --out {path}.")
    if kind == "onnx":
        from pytorchtricks.tricks.model.export_onnx import OnnxRunner

        return OnnxRunner(path, threads=threads)
    if kind == "aoti":
        return _no_grad(torch._inductor.aoti_load_package(path))
    # an int8 program's quantize/dequantize ops live in the quantized_decomposed namespace, registered only when
    # the module that defines them is imported: a fresh process that loads the file has not imported it yet
    # (torch's own module; torchao's where a later torch drops it; an fp32 program needs neither)
    for module in ("torch.ao.quantization.fx._decomposed", "torchao.quantization.pt2e"):
        try:
            importlib.import_module(module)
            break
        except ImportError:
            continue

    program = torch.export.load(path).module()
    if kind == "export":
        return _no_grad(program)
    from pytorchtricks.tricks.model.onednn_plan import build_plan

    example = tuple(_probe(s) for s in input_shapes)
    return build_plan(program, example)  # checks itself against the int8 program on the probe input


def _probe(shape: Sequence[int]) -> torch.Tensor:
    """A fixed input of ``shape`` for the plan's self-check at load time (the values only need to be typical)."""
    g = torch.Generator().manual_seed(0)
    return torch.randn(*shape, generator=g)


def _no_grad(fn: Callable[..., Any]) -> Callable[..., Any]:
    def run(*args: Any) -> Any:
        with torch.no_grad():
            return fn(*args)

    run.inner = fn  # type: ignore[attr-defined]
    return run


def receipt_path(path: str) -> str:
    """``m.pt2`` -> ``m.json``: the receipt written beside an artefact."""
    return os.path.splitext(path)[0] + ".json"


def load_artefact(path: str, *, threads: int | None = None) -> Any:
    """Load what ``ptt optimize ... --out`` wrote: the winning engine's file, by the receipt beside it.

    Example (the receipt's ``load`` line)::

        m = ptt.load_artefact("m.pt2")   # or "m.onnx"
        y = m(x)                         # x of the input shape given to ptt optimize
    """
    rpath = receipt_path(path)
    if not os.path.isfile(rpath):
        raise PttError(
            f"no receipt {rpath} beside {path}: load_artefact reads which engine wrote the file from it; "
            "keep the .json that ptt optimize wrote next to the artefact."
        )
    with open(rpath, encoding="utf-8") as fh:
        receipt = json.load(fh)
    if receipt.get("format") != RECEIPT_FORMAT:
        raise PttError(f"{rpath} is not a ptt optimize receipt (format {receipt.get('format')!r}).")
    win = receipt["winner"]
    return load(win["kind"], path, input_shapes=receipt["input_shapes"], threads=threads)
