"""Count FLOPs, parameters and memory access cost per layer: ``count_flops(model, example_inputs)``.

Conventions (stated because counters disagree by 2x):
- ``macs`` = multiply-accumulates of convolutions, matmuls and attention; ``flops = 2 * macs`` for those ops.
  Bias additions are not counted (as torch.utils.flop_counter and fvcore).
- Attention (``scaled_dot_product_attention``) counts its two matmuls, ``Q K^T`` and ``P V``; the softmax is
  counted as an element-wise op of the same call.
- Pooling: one FLOP per window element per output (``max``/``avg``), adaptive pooling and ``mean`` one per input
  element. Element-wise ops (activations, add, mul, normalisation, softmax) one FLOP per output element.
- Memory access cost (``bytes``) follows ShuffleNetV2 (Ma et al. 2018): every tensor an op reads (inputs, weights)
  plus every tensor it writes, counted once per op. For a convolution this is ``N*h*w*(c1 + c2) + k*k*c1*c2/g``
  elements times the element size, correct for grouped and depthwise convs. Views and allocation ops move no data.
- Arithmetic intensity = flops / bytes (FLOP per byte); low values are memory bound.

Ops are counted at the ATen level with a ``TorchDispatchMode`` during one forward pass (no autograd, buffers
restored afterwards) and attributed to the innermost module running, so functional calls inside a ``forward`` land
on that module.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from pytorchtricks.analysis._probe import ModuleTracker, as_args, check_module, display, preserved_state
from pytorchtricks.core import PttError

__all__ = ["FlopReport", "LayerCost", "count_flops"]

_MATMUL = {"mm", "addmm", "bmm", "baddbmm"}
_ATTENTION = {
    "_scaled_dot_product_flash_attention_for_cpu",
    "_scaled_dot_product_flash_attention",
    "_scaled_dot_product_efficient_attention",
    "_scaled_dot_product_cudnn_attention",
    "_scaled_dot_product_attention_math",
}
_POOL = {
    "max_pool2d_with_indices",
    "max_pool1d_with_indices",
    "max_pool3d_with_indices",
    "avg_pool1d",
    "avg_pool2d",
    "avg_pool3d",
    "max_pool2d",
    "max_pool1d",
}
_REDUCE_POOL = {
    "mean",
    "_adaptive_avg_pool2d",
    "adaptive_avg_pool2d",
    "_adaptive_avg_pool3d",
    "adaptive_max_pool2d",
    "sum",
    "amax",
}
_NORM = {
    "native_batch_norm",
    "_native_batch_norm_legit",
    "_native_batch_norm_legit_no_training",
    "_native_batch_norm_legit_functional",
    "native_layer_norm",
    "native_group_norm",
    "_batch_norm_with_update",
    "_batch_norm_no_update",
}
_NO_TRAFFIC = {
    "view", "_unsafe_view", "reshape", "t", "transpose", "permute", "expand", "slice", "select", "unsqueeze",
    "squeeze", "as_strided", "alias", "detach", "split", "split_with_sizes", "chunk", "unbind", "flatten",
    "empty", "empty_like", "empty_strided", "zeros", "zeros_like", "ones", "ones_like", "full", "full_like",
    "randn", "rand", "randint", "arange", "lift_fresh", "lift_fresh_copy", "_to_copy_noop", "new_empty",
    "new_zeros", "new_ones", "scalar_tensor", "_local_scalar_dense", "sym_size", "sym_stride", "sym_numel",
    "is_same_size", "resize_", "set_",
}  # fmt: skip
_DATA_MOVEMENT = {
    "cat",
    "stack",
    "clone",
    "copy_",
    "_to_copy",
    "contiguous",
    "constant_pad_nd",
    "index",
    "gather",
}

CATEGORIES = ("conv", "matmul", "attention", "pool", "norm", "elementwise", "data")


@dataclass
class LayerCost:
    """Costs attributed to one module path (ops run directly inside its ``forward``, not in its children)."""

    path: str
    type: str
    flops: int = 0
    macs: int = 0
    bytes: int = 0
    params: int = 0
    calls: int = 0
    by_category: dict[str, int] = field(default_factory=dict)  # category -> flops
    bytes_by_category: dict[str, int] = field(default_factory=dict)

    @property
    def intensity(self) -> float:
        """Arithmetic intensity, FLOP per byte of memory traffic."""
        return self.flops / self.bytes if self.bytes else 0.0


@dataclass
class FlopReport:
    """Result of ``count_flops``: per-layer rows and totals. ``str(report)`` is a readable table."""

    layers: list[LayerCost]
    flops: int
    macs: int
    bytes: int
    params: int
    flops_by_category: dict[str, int]
    bytes_by_category: dict[str, int]
    ops: list[dict[str, Any]] = field(repr=False, default_factory=list)  # one row per counted ATen op

    @property
    def intensity(self) -> float:
        return self.flops / self.bytes if self.bytes else 0.0

    def layer(self, path: str) -> LayerCost:
        for row in self.layers:
            if row.path == path:
                return row
        raise KeyError(f"no layer {path!r}; known: {[r.path for r in self.layers][:10]}...")

    def table(self, top: int | None = None) -> str:
        rows = sorted(self.layers, key=lambda r: -r.flops)[:top] if top else self.layers
        lines = [f"{'layer':<40} {'type':<18} {'MFLOPs':>10} {'params':>10} {'MiB moved':>10} {'FLOP/B':>7}"]
        for r in rows:
            lines.append(
                f"{display(r.path)[:40]:<40} {r.type[:18]:<18} {r.flops / 1e6:>10.2f} {r.params:>10,} "
                f"{r.bytes / 2**20:>10.2f} {r.intensity:>7.1f}"
            )
        return "\n".join(lines)

    def __str__(self) -> str:
        return (
            f"{self.flops / 1e9:.3f} GFLOPs ({self.macs / 1e9:.3f} GMACs; 1 MAC = 2 FLOPs), {self.params:,} params, "
            f"memory access {self.bytes / 2**20:.1f} MiB, intensity {self.intensity:.1f} FLOP/byte"
        )


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _op_cost(name: str, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> tuple[str, int, int, int]:
    """(category, macs, flops, bytes) of one ATen op call."""
    outs = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
    ins = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
    if name in _NO_TRAFFIC:
        return "none", 0, 0, 0
    if name in ("max_pool2d_with_indices", "max_pool1d_with_indices", "max_pool3d_with_indices"):
        outs = outs[:1]  # the int64 indices are bookkeeping for backward, not part of the forward result
    if name.startswith("_native_batch_norm") or name in (
        "native_batch_norm",
        "native_layer_norm",
        "native_group_norm",
    ):
        outs = outs[:1]  # saved mean / invstd are per-channel scalars
    traffic = sum(_nbytes(t) for t in ins) + sum(_nbytes(t) for t in outs)
    out0 = outs[0] if outs else None
    if name in ("convolution", "_convolution", "mkldnn_convolution", "cudnn_convolution"):
        x, w = args[0], args[1]
        transposed = bool(args[6]) if len(args) > 6 else False
        assert out0 is not None
        kernel = math.prod(w.shape[2:])
        # weight [c_out, c_in/g, k...]: each output element reads c_in/g * k inputs; transposed weight
        # [c_in, c_out/g, k...]: each input element scatters to c_out/g * k outputs. Groups live in the weight shape.
        macs = (x.numel() if transposed else out0.numel()) * w.shape[1] * kernel
        return "conv", macs, 2 * macs, traffic
    if name in _MATMUL:
        a, b = (args[1], args[2]) if name in ("addmm", "baddbmm") else (args[0], args[1])
        macs = a.numel() * b.shape[-1]
        return "matmul", macs, 2 * macs, traffic
    if name in _ATTENTION:
        q, k, v = args[0], args[1], args[2]
        batch_heads = math.prod(q.shape[:-2])
        lq, lk, e, ev = q.shape[-2], k.shape[-2], q.shape[-1], v.shape[-1]
        macs = batch_heads * lq * lk * (e + ev)
        softmax = batch_heads * lq * lk
        return "attention", macs, 2 * macs + softmax, traffic
    if name in _POOL:
        kernel_size = args[1] if len(args) > 1 else kwargs.get("kernel_size")
        window = math.prod(kernel_size) if isinstance(kernel_size, list | tuple) else int(kernel_size or 1)
        if isinstance(kernel_size, list | tuple) and len(kernel_size) == 1:
            window = int(kernel_size[0]) ** (args[0].dim() - 2)
        return "pool", 0, (out0.numel() if out0 is not None else 0) * window, traffic
    if name in _REDUCE_POOL:
        return "pool", 0, args[0].numel(), traffic
    if name in _NORM:
        return "norm", 0, out0.numel() if out0 is not None else 0, traffic
    if name in _DATA_MOVEMENT:
        return "data", 0, 0, traffic
    if out0 is not None and out0.is_floating_point():
        return "elementwise", 0, out0.numel(), traffic
    return "data", 0, 0, traffic


class _Counter(TorchDispatchMode):
    def __init__(self, tracker: ModuleTracker) -> None:
        super().__init__()
        self.tracker = tracker
        self.ops: list[dict[str, Any]] = []

    def __torch_dispatch__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None
    ) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        name = func.overloadpacket.__name__
        category, macs, flops, nbytes = _op_cost(name, args, kwargs, out)
        if category != "none":
            row = {"module": self.tracker.current, "op": name, "category": category, "macs": macs, "flops": flops,
                   "bytes": nbytes}  # fmt: skip
            row.update(_attention_shape(name, args))
            self.ops.append(row)
        return out


def _attention_shape(name: str, args: tuple[Any, ...]) -> dict[str, int]:
    """Token count and score-matrix size of attention ops (fused, or a softmax over [B, H, L, S] scores)."""
    if name in _ATTENTION:
        q, k = args[0], args[1]
        return {"tokens": int(q.shape[-2]), "score_elements": math.prod(q.shape[:-1]) * int(k.shape[-2])}
    if name in ("_softmax", "_safe_softmax") and isinstance(args[0], torch.Tensor):
        x = args[0]
        if x.dim() == 4 or (x.dim() == 3 and x.shape[-1] == x.shape[-2]):
            return {"tokens": int(x.shape[-2]), "score_elements": x.numel()}
    return {}


def count_flops(model: nn.Module, example_inputs: Any) -> FlopReport:
    """Per-layer and total FLOPs, MACs, parameters and memory access cost of one forward pass.

    ``example_inputs`` is a tensor or a tuple of positional arguments. The model runs once under ``no_grad``;
    its buffers (BatchNorm statistics) are restored afterwards. See the module docstring for the conventions.

    Example:
        >>> r = ptt.count_flops(nn.Conv2d(8, 16, 3, padding=1, bias=False), torch.randn(1, 8, 10, 10))
        >>> r.macs == 10 * 10 * 16 * 8 * 9, r.flops == 2 * r.macs
        (True, True)
        >>> r.bytes == 4 * (10 * 10 * (8 + 16) + 16 * 8 * 9)  # ShuffleNetV2's MAC, fp32
        True
    """
    check_module(model)
    args = as_args(example_inputs)
    tracker = ModuleTracker(model)
    counter = _Counter(tracker)
    with preserved_state(model), torch.no_grad(), tracker, counter:
        try:
            model(*args)
        except (RuntimeError, ValueError, TypeError, IndexError) as exc:
            shapes = [tuple(a.shape) for a in args if isinstance(a, torch.Tensor)]
            raise PttError(
                f"running {type(model).__name__} on inputs of shape {shapes} failed ({type(exc).__name__}: "
                f"{str(exc).splitlines()[0][:200]}); pass inputs the model accepts (e.g. --input-shape 1,3,224,224)."
            ) from exc
    paths = dict(model.named_modules())
    layers: dict[str, LayerCost] = {}
    for op in counter.ops:
        path = op["module"]
        row = layers.get(path)
        if row is None:
            mod = paths.get(path, model)
            row = layers[path] = LayerCost(
                path=path,
                type=type(mod).__name__,
                params=sum(p.numel() for p in mod.parameters(recurse=False)),
                calls=tracker.calls.get(path, 0),
            )
        row.flops += op["flops"]
        row.macs += op["macs"]
        row.bytes += op["bytes"]
        row.by_category[op["category"]] = row.by_category.get(op["category"], 0) + op["flops"]
        row.bytes_by_category[op["category"]] = row.bytes_by_category.get(op["category"], 0) + op["bytes"]
    flops_cat = {c: sum(r.by_category.get(c, 0) for r in layers.values()) for c in CATEGORIES}
    bytes_cat = {c: sum(r.bytes_by_category.get(c, 0) for r in layers.values()) for c in CATEGORIES}
    ordered = [layers[p] for p in dict.fromkeys(op["module"] for op in counter.ops)]
    return FlopReport(
        layers=ordered,
        flops=sum(r.flops for r in ordered),
        macs=sum(r.macs for r in ordered),
        bytes=sum(r.bytes for r in ordered),
        params=sum(p.numel() for p in model.parameters()),
        flops_by_category=flops_cat,
        bytes_by_category=bytes_cat,
        ops=counter.ops,
    )
