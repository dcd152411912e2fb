"""A oneDNN plan for a PT2E static-int8 graph: each int8 op becomes one primitive, built once, run in one loop.

Why: PyTorch's int8 ops (``onednn::qconv*``) rebuild a oneDNN primitive descriptor and their scale arguments on
every call - about 40 us per op on ResNet-18 (results/int8_breakdown.md) - while ONNX Runtime's per-op cost is near
zero. Here the quantized graph is lowered once: weights reordered to the kernel's layout, scales, zero points,
residual adds (``sum`` post-op) and activations baked into primitive attributes, activation buffers allocated; a
call is then one ``dnnl_primitive_execute`` per op. The library is the system oneDNN 2.x (Debian ``libdnnl2``),
loaded with ctypes through its C API - PyTorch's own copy of oneDNN does not export its symbols.

Supported ops (anything else raises ``PlanUnsupported`` and the caller keeps its compiled path): input quantize,
conv2d (+ add of a quantized tensor) (+ relu / relu6-hardtanh / hardswish / silu / gelu, before or after the add)
with uint8 or float output, grouped and depthwise convs, linear (+ the same activations), max_pool2d, global mean,
adaptive_avg_pool2d with a whole-number window, flatten of a 1x1 map, inference dropout, output dequantize.
Activations are uint8 (per-tensor scale and zero point; 0..255, or 0..127 with ``reduce_range``), weights int8
symmetric per output channel - what the x86 PT2E quantizer makes. Without VNNI only 7-bit activations are lowered:
the AVX2 kernels' int16 pair sums saturate on 8-bit ones (``saturation_risk``).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import operator
import threading
from dataclasses import dataclass, field
from typing import Any

import torch

__all__ = [
    "OnednnPlan",
    "PlanUnsupported",
    "build_plan",
    "onednn_available",
    "rounding_sqnr_db",
    "saturation_risk",
]

# oneDNN 2.x C API constants (dnnl_types.h; stable across 2.x)
F32, S32, S8, U8 = 3, 4, 5, 6
FORMAT_ANY = 1
FORWARD_INFERENCE = 96
CONVOLUTION_DIRECT, POOLING_MAX, POOLING_AVG_EXCLUDE_PADDING = 1, 511, 1023
ELTWISE_RELU, ELTWISE_CLIP, ELTWISE_HARDSWISH, ELTWISE_SWISH, ELTWISE_GELU_ERF, ELTWISE_GELU_TANH = (
    31,
    255,
    112,
    223,
    48,
    207,
)
ELTWISE_LINEAR, ELTWISE_CLIP_V2 = 127, 16  # clip_v2: the 7-bit range clip (see _fused)
QUERY_WEIGHTS_MD, QUERY_IMPL_INFO_STR = 131, 8
ARG_SRC, ARG_DST, ARG_WEIGHTS, ARG_BIAS = 1, 17, 33, 41
ENGINE_CPU, STREAM_DEFAULT = 1, 1
_DESC_BYTES = 16384  # op descriptors are opaque here; 2.6's largest (convolution) is 5976 bytes
_MD_BYTES = 2048  # dnnl_memory_desc_t is 696 bytes in 2.6

_LIB: Any = None
_LIB_LOCK = threading.Lock()


class PlanUnsupported(Exception):
    """The graph (or this machine) has something the oneDNN plan does not lower; the message says what."""


class _ExecArg(ctypes.Structure):
    _fields_ = [("arg", ctypes.c_int), ("memory", ctypes.c_void_p)]


class _Version(ctypes.Structure):
    _fields_ = [
        ("major", ctypes.c_int),
        ("minor", ctypes.c_int),
        ("patch", ctypes.c_int),
        ("hash", ctypes.c_char_p),
    ]


def _load() -> Any:
    """The system oneDNN 2.x library with its C API typed, or ``PlanUnsupported`` saying how to install it."""
    global _LIB
    with _LIB_LOCK:
        if _LIB is not None:
            return _LIB
        name = ctypes.util.find_library("dnnl")
        if name is None:
            raise PlanUnsupported(
                "the system oneDNN library is not installed (Debian/Ubuntu: apt-get install libdnnl2; "
                "`make system-deps` does it)"
            )
        torch.get_num_threads()  # torch's OpenMP runtime is loaded first, so oneDNN's libgomp.so.1 resolves to it
        lib = ctypes.CDLL(name)
        lib.dnnl_version.restype = ctypes.POINTER(_Version)
        ver = lib.dnnl_version().contents
        if ver.major != 2 or ver.minor < 5:
            raise PlanUnsupported(
                f"system oneDNN is {ver.major}.{ver.minor}; the plan needs the 2.x C API (2.5 or newer)"
            )
        # argument types of the C functions used (pointers to dims / scales / zero points are passed as void*)
        vp, out, i, f = ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p), ctypes.c_int, ctypes.c_float
        # fmt: off
        sigs: dict[str, list[Any]] = {
            "dnnl_engine_create": [out, i, ctypes.c_size_t],
            "dnnl_stream_create": [out, vp, ctypes.c_uint],
            "dnnl_stream_wait": [vp],
            "dnnl_memory_desc_init_by_strides": [vp, i, vp, i, vp],
            "dnnl_memory_desc_init_by_tag": [vp, i, vp, i, i],
            "dnnl_memory_create": [out, vp, vp, vp],
            "dnnl_memory_set_data_handle": [vp, vp],
            "dnnl_memory_destroy": [vp],
            "dnnl_primitive_attr_create": [out],
            "dnnl_primitive_attr_destroy": [vp],
            "dnnl_primitive_attr_set_output_scales": [vp, ctypes.c_int64, i, vp],
            "dnnl_primitive_attr_set_zero_points": [vp, i, ctypes.c_int64, i, vp],
            "dnnl_primitive_attr_set_post_ops": [vp, vp],
            "dnnl_post_ops_create": [out],
            "dnnl_post_ops_destroy": [vp],
            "dnnl_post_ops_append_sum_v3": [vp, f, ctypes.c_int32, i],
            "dnnl_post_ops_append_eltwise": [vp, f, i, f, f],
            "dnnl_convolution_forward_desc_init": [vp, i, i, vp, vp, vp, vp, vp, vp, vp],
            "dnnl_dilated_convolution_forward_desc_init": [vp, i, i, vp, vp, vp, vp, vp, vp, vp, vp],
            "dnnl_pooling_v2_forward_desc_init": [vp, i, i, vp, vp, vp, vp, vp, vp, vp],
            "dnnl_inner_product_forward_desc_init": [vp, i, vp, vp, vp, vp],
            "dnnl_primitive_desc_create": [out, vp, vp, vp, vp],
            "dnnl_reorder_primitive_desc_create": [out, vp, vp, vp, vp, vp],
            "dnnl_primitive_desc_destroy": [vp],
            "dnnl_primitive_create": [out, vp],
            "dnnl_primitive_destroy": [vp],
            "dnnl_primitive_execute": [vp, vp, i, vp],
            "dnnl_primitive_desc_query": [vp, i, i, vp],
        }
        # fmt: on
        for fn, argtypes in sigs.items():
            f = getattr(lib, fn)
            f.argtypes, f.restype = argtypes, ctypes.c_int
        lib.dnnl_primitive_desc_query_md.argtypes = [vp, i, i]
        lib.dnnl_primitive_desc_query_md.restype = vp
        lib.dnnl_memory_desc_get_size.argtypes = [vp]
        lib.dnnl_memory_desc_get_size.restype = ctypes.c_size_t
        _LIB = lib
        return lib


def onednn_available() -> bool:
    """True when the system oneDNN 2.x library loads (the plan can be built on this machine)."""
    try:
        _load()
    except (PlanUnsupported, OSError):
        return False
    return True


def _check(status: int, what: str) -> None:
    if status != 0:
        raise PlanUnsupported(f"oneDNN refused {what} (dnnl_status {status})")


def _dims(values: tuple[int, ...] | list[int]) -> Any:
    return (ctypes.c_int64 * 12)(*values)


@dataclass
class _QValue:
    """A uint8 activation in a buffer the plan owns: logical NCHW dims, stored NHWC (or plain 2-D)."""

    buf: torch.Tensor
    dims: tuple[int, ...]
    scale: float
    zero_point: int
    node: Any  # the quantize node that defines it
    view_of: _QValue | None = None
    views: list[_QValue] = field(default_factory=list)
    qmax: int = 255  # 127 with reduce_range: every value the plan writes into buf stays in 0..qmax


@dataclass
class _DQ:
    q: _QValue


@dataclass
class _Weight:
    int8: torch.Tensor
    scales: torch.Tensor  # per output channel (float32)


@dataclass
class _FloatIn:
    index: int
    dims: tuple[int, ...]


@dataclass
class _Pending:
    """A conv/linear/pool whose float output is not materialised yet: add, activations and quantize fuse into it."""

    kind: str  # conv | linear | maxpool | avgpool | flatten
    src: _QValue
    node: Any
    weight: _Weight | None = None
    bias: torch.Tensor | None = None
    params: dict[str, Any] = field(default_factory=dict)
    add: _QValue | None = None
    add_node: Any = None
    # fused after the op, in order: ("sum",) for the residual add, ("eltwise", name, alg, alpha, beta)
    post: list[tuple[Any, ...]] = field(default_factory=list)

    def extend(self, node: Any) -> _Pending:
        """Fuse ``node`` (an add or activation of this result) into the op; only when it is the sole reader."""
        if len(self.tail.users) != 1:
            raise PlanUnsupported(f"{self.tail.name}: its float result has several readers")
        self.tail = node
        return self

    @property
    def tail(self) -> Any:
        return self.params.get("tail", self.node)

    @tail.setter
    def tail(self, node: Any) -> None:
        self.params["tail"] = node


@dataclass
class _Output:
    memory: int
    shape: tuple[int, ...]
    strides: tuple[int, ...]


class OnednnPlan:
    """A built plan: call it with tensors of the shapes it was built for; returns what the graph returns."""

    def __init__(self, lib: Any) -> None:
        self._lib = lib
        self._owned: list[tuple[str, int]] = []  # (destroy function, handle)
        self._keep: list[Any] = []  # tensors and ctypes arrays the primitives point into
        self._steps: list[tuple[int, int, Any]] = []
        # (graph input index, memory, shape, clamp): inputs above clamp would quantize past a 7-bit qmax
        self._inputs: list[tuple[int, int, tuple[int, ...], float | None]] = []
        self.n_inputs = 0
        self._outputs: list[_Output] = []
        self._out_kind: type | None = None
        self._lock = threading.Lock()
        self.shapes: tuple[tuple[int, ...], ...] = ()
        self.primitives: list[str] = []  # one line per primitive: what it does (for reports and tests)
        # oneDNN's implementation per compute primitive, e.g. jit_int8:avx512_core_vnni (reorders not listed)
        self.kernels: list[str] = []
        engine = ctypes.c_void_p()
        _check(lib.dnnl_engine_create(ctypes.byref(engine), ENGINE_CPU, 0), "creating the CPU engine")
        self._engine = engine.value
        self._own("dnnl_engine_destroy", engine.value)
        stream = ctypes.c_void_p()
        _check(
            lib.dnnl_stream_create(ctypes.byref(stream), self._engine, STREAM_DEFAULT), "creating a stream"
        )
        self._stream = stream.value
        self._own("dnnl_stream_destroy", stream.value)

    # -- lifetime --------------------------------------------------------------------------------------------
    def __deepcopy__(self, memo: dict[int, Any]) -> OnednnPlan:
        return self  # built once and read-only afterwards (calls hold a lock): copies of a model share it

    def __reduce__(self) -> Any:
        raise TypeError(
            "a oneDNN plan holds native handles and cannot be pickled; save the model's state dict (ptt optimize "
            "--out writes it with a rebuild recipe) and build the plan again where it runs"
        )

    def _own(self, destroy: str, handle: int | None) -> None:
        self._owned.append((destroy, handle or 0))

    def __del__(self) -> None:
        lib = getattr(self, "_lib", None)
        for destroy, handle in reversed(getattr(self, "_owned", [])):
            if lib is not None and handle:
                try:
                    getattr(lib, destroy)(ctypes.c_void_p(handle))
                except Exception:
                    pass

    # -- building blocks ----------------------------------------------------------------------------------
    def _md(self, dims: tuple[int, ...], dtype: int, strides: tuple[int, ...] | None) -> Any:
        md = ctypes.create_string_buffer(_MD_BYTES)
        if strides is None:
            _check(
                self._lib.dnnl_memory_desc_init_by_tag(md, len(dims), _dims(dims), dtype, FORMAT_ANY),
                "a memory descriptor",
            )
        else:
            _check(
                self._lib.dnnl_memory_desc_init_by_strides(md, len(dims), _dims(dims), dtype, _dims(strides)),
                "a memory descriptor",
            )
        self._keep.append(md)
        return md

    def _memory(self, md: Any, tensor: torch.Tensor | None, *, keep: bool = True) -> int:
        """A memory object over ``tensor``'s storage (kept alive with the plan unless ``keep=False``)."""
        mem = ctypes.c_void_p()
        handle = ctypes.c_void_p(tensor.data_ptr() if tensor is not None else None)
        _check(self._lib.dnnl_memory_create(ctypes.byref(mem), md, self._engine, handle), "a memory object")
        self._own("dnnl_memory_destroy", mem.value)
        if tensor is not None and keep:
            self._keep.append(tensor)
        return int(mem.value or 0)

    def _attr(
        self,
        scales: torch.Tensor | None,
        scale_mask: int,
        src_zp: int = 0,
        dst_zp: int = 0,
        post: list[tuple[Any, ...]] | None = None,
    ) -> int:
        """Attributes: output scales, zero points, and post-ops in order (``("sum", scale, zp)`` or
        ``("eltwise", alg, alpha, beta)``)."""
        lib = self._lib
        attr = ctypes.c_void_p()
        _check(lib.dnnl_primitive_attr_create(ctypes.byref(attr)), "an attribute")
        self._own("dnnl_primitive_attr_destroy", attr.value)
        if scales is not None:
            arr = (ctypes.c_float * scales.numel())(*scales.tolist())
            self._keep.append(arr)
            _check(lib.dnnl_primitive_attr_set_output_scales(attr, scales.numel(), scale_mask, arr), "scales")
        for arg, zp in ((ARG_SRC, src_zp), (ARG_DST, dst_zp)):
            if zp:
                z = (ctypes.c_int32 * 1)(zp)
                self._keep.append(z)
                _check(lib.dnnl_primitive_attr_set_zero_points(attr, arg, 1, 0, z), "zero points")
        if post:
            ops = ctypes.c_void_p()
            _check(lib.dnnl_post_ops_create(ctypes.byref(ops)), "post-ops")
            self._own("dnnl_post_ops_destroy", ops.value)
            for op in post:
                if op[0] == "sum":
                    _check(lib.dnnl_post_ops_append_sum_v3(ops, op[1], op[2], 0), "the sum post-op")
                else:
                    _check(
                        lib.dnnl_post_ops_append_eltwise(ops, 1.0, op[1], op[2], op[3]), "an eltwise post-op"
                    )
            _check(lib.dnnl_primitive_attr_set_post_ops(attr, ops), "post-ops")
        return int(attr.value or 0)

    def _primitive(self, desc: Any, attr: int, what: str) -> tuple[int, int]:
        pd = ctypes.c_void_p()
        _check(self._lib.dnnl_primitive_desc_create(ctypes.byref(pd), desc, attr, self._engine, None), what)
        self._own("dnnl_primitive_desc_destroy", pd.value)
        name = ctypes.c_char_p()
        _check(self._lib.dnnl_primitive_desc_query(pd, QUERY_IMPL_INFO_STR, 0, ctypes.byref(name)), what)
        impl = (name.value or b"?").decode()
        if impl.startswith("ref"):  # oneDNN's reference loops: far slower than PyTorch's own int8 path
            raise PlanUnsupported(f"oneDNN has only a reference kernel ({impl}) for {what} on this CPU")
        self.kernels.append(impl)
        prim = ctypes.c_void_p()
        _check(self._lib.dnnl_primitive_create(ctypes.byref(prim), pd), what)
        self._own("dnnl_primitive_destroy", prim.value)
        return int(pd.value or 0), int(prim.value or 0)

    def _reorder(self, src_md: Any, dst_md: Any, attr: int, what: str) -> int:
        pd = ctypes.c_void_p()
        _check(
            self._lib.dnnl_reorder_primitive_desc_create(
                ctypes.byref(pd), src_md, self._engine, dst_md, self._engine, attr or None
            ),
            what,
        )
        self._own("dnnl_primitive_desc_destroy", pd.value)
        prim = ctypes.c_void_p()
        _check(self._lib.dnnl_primitive_create(ctypes.byref(prim), pd), what)
        self._own("dnnl_primitive_destroy", prim.value)
        return int(prim.value or 0)

    def _step(self, prim: int, args: list[tuple[int, int]], what: str) -> None:
        arr = (_ExecArg * len(args))(*[_ExecArg(a, m) for a, m in args])
        self._keep.append(arr)
        self._steps.append((prim, len(args), arr))
        self.primitives.append(what)

    def _run_now(self, prim: int, args: list[tuple[int, int]], what: str) -> None:
        arr = (_ExecArg * len(args))(*[_ExecArg(a, m) for a, m in args])
        _check(self._lib.dnnl_primitive_execute(prim, self._stream, len(args), arr), what)
        _check(self._lib.dnnl_stream_wait(self._stream), what)

    # -- activations ------------------------------------------------------------------------------------------
    @staticmethod
    def _act_strides(dims: tuple[int, ...]) -> tuple[int, ...]:
        if len(dims) == 4:  # NHWC
            _, c, h, w = dims
            return (h * w * c, 1, w * c, c)
        if len(dims) == 2:
            return (dims[1], 1)
        raise PlanUnsupported(f"activations of rank {len(dims)} (only 4-D NCHW and 2-D)")

    def new_q(self, dims: tuple[int, ...], scale: float, zp: int, node: Any, qmax: int = 255) -> _QValue:
        buf = torch.empty(int(torch.Size(dims).numel()), dtype=torch.uint8)
        return _QValue(buf, dims, scale, zp, node, qmax=qmax)

    def act_memory(self, q: _QValue) -> int:
        return self._memory(self._md(q.dims, U8, self._act_strides(q.dims)), q.buf)

    # -- ops ------------------------------------------------------------------------------------------------------
    def quantize_input(self, src: _FloatIn, q: _QValue) -> None:
        if len(src.dims) != 4 and len(src.dims) != 2:
            raise PlanUnsupported(f"a rank-{len(src.dims)} input (only 4-D and 2-D)")
        contiguous = tuple(int(s) for s in torch.empty(src.dims).stride())
        src_md = self._md(src.dims, F32, contiguous)
        mem = self._memory(src_md, None)
        # the reorder saturates at 255 only: a 7-bit qmax is a clamp of the float input first (a quarter step
        # above the top value, so nothing that rounds below it moves)
        clamp = (q.qmax - q.zero_point + 0.25) * q.scale if q.qmax < 255 else None
        self._inputs.append((src.index, mem, src.dims, clamp))
        attr = self._attr(torch.tensor([1.0 / q.scale]), 0, dst_zp=q.zero_point)
        dst_md = self._md(q.dims, U8, self._act_strides(q.dims))
        prim = self._reorder(src_md, dst_md, attr, "the input quantize reorder")
        self._step(prim, [(ARG_SRC, mem), (ARG_DST, self._memory(dst_md, q.buf))], "quantize input")

    def requantize(self, src: _QValue, dst: _QValue) -> None:
        """dst = round((src - z_src) * s_src / s_dst) + z_dst: a uint8 -> uint8 reorder with scale and zero points."""
        md = self._md(src.dims, U8, self._act_strides(src.dims))
        attr = self._attr(
            torch.tensor([src.scale / dst.scale]), 0, src_zp=src.zero_point, dst_zp=dst.zero_point
        )
        prim = self._reorder(md, md, attr, "a requantize reorder")
        self._step(prim, [(ARG_SRC, self.act_memory(src)), (ARG_DST, self.act_memory(dst))], "requantize")
        # a reorder saturates at 255 only: where src's range maps past a 7-bit qmax, clamp (pooled maps are small)
        top = round((src.qmax - src.zero_point) * src.scale / dst.scale) + dst.zero_point
        if dst.qmax < 255 and top > dst.qmax:
            buf, qmax = dst.buf, dst.qmax
            self._steps.append((0, 0, lambda: buf.clamp_(max=qmax)))
            self.primitives.append(f"clamp to 0..{qmax}")

    def copy(self, src: _QValue, dst: _QValue) -> None:
        md = self._md(src.dims, U8, self._act_strides(src.dims))
        prim = self._reorder(md, md, 0, "a residual copy")
        self._step(prim, [(ARG_SRC, self.act_memory(src)), (ARG_DST, self.act_memory(dst))], "copy residual")

    def conv(self, p: _Pending, out: _QValue | None, out_float: tuple[int, ...] | None) -> None:
        assert p.weight is not None
        w, src = p.weight, p.src
        stride, padding, dilation, groups = (p.params[k] for k in ("stride", "padding", "dilation", "groups"))
        oc = w.int8.shape[0]
        dst_dims = out.dims if out is not None else out_float
        assert dst_dims is not None
        src_md = self._md(src.dims, U8, self._act_strides(src.dims))
        wdims = tuple(w.int8.shape)
        if groups > 1:
            wdims = (groups, oc // groups, *wdims[1:])
        w_user_md = self._md(wdims, S8, tuple(int(s) for s in torch.empty(wdims).stride()))
        w_any_md = self._md(wdims, S8, None)
        b_md = self._md((oc,), F32, (1,))
        dst_md = self._md(dst_dims, U8 if out is not None else F32, self._act_strides(dst_dims))
        desc = ctypes.create_string_buffer(_DESC_BYTES)
        self._keep.append(desc)
        pad = _dims(padding)
        if any(d != 1 for d in dilation):
            _check(
                self._lib.dnnl_dilated_convolution_forward_desc_init(
                    desc,
                    FORWARD_INFERENCE,
                    CONVOLUTION_DIRECT,
                    src_md,
                    w_any_md,
                    b_md,
                    dst_md,
                    _dims(stride),
                    _dims([d - 1 for d in dilation]),
                    pad,
                    pad,
                ),
                "a dilated convolution",
            )
        else:
            _check(
                self._lib.dnnl_convolution_forward_desc_init(
                    desc,
                    FORWARD_INFERENCE,
                    CONVOLUTION_DIRECT,
                    src_md,
                    w_any_md,
                    b_md,
                    dst_md,
                    _dims(stride),
                    pad,
                    pad,
                ),
                "a convolution",
            )
        self._fused(p, desc, w_user_md, src_md, dst_md, oc, out, "conv")

    def linear(self, p: _Pending, out: _QValue | None, out_float: tuple[int, ...] | None) -> None:
        assert p.weight is not None
        w, src = p.weight, p.src
        oc = w.int8.shape[0]
        dst_dims = out.dims if out is not None else out_float
        assert dst_dims is not None
        src_md = self._md(src.dims, U8, self._act_strides(src.dims))
        w_user_md = self._md(tuple(w.int8.shape), S8, (w.int8.shape[1], 1))
        w_any_md = self._md(tuple(w.int8.shape), S8, None)
        b_md = self._md((oc,), F32, (1,))
        dst_md = self._md(dst_dims, U8 if out is not None else F32, self._act_strides(dst_dims))
        desc = ctypes.create_string_buffer(_DESC_BYTES)
        self._keep.append(desc)
        _check(
            self._lib.dnnl_inner_product_forward_desc_init(
                desc, FORWARD_INFERENCE, src_md, w_any_md, b_md, dst_md
            ),
            "an inner product",
        )
        self._fused(p, desc, w_user_md, src_md, dst_md, oc, out, "linear")

    def _fused(
        self,
        p: _Pending,
        desc: Any,
        w_user_md: Any,
        src_md: Any,
        dst_md: Any,
        oc: int,
        out: _QValue | None,
        name: str,
    ) -> None:
        """Primitive for conv/linear: dst = post-ops(s_x*s_w*(acc + b')) / s_o + z_o.

        oneDNN 2.x applies the output scale to the accumulator (bias included) before the post-ops. ReLU commutes
        with a positive scale, so with ReLUs only the 1/s_o is folded into that scale (sum scales follow); any
        other activation runs on true float values and a final linear post-op divides by s_o.
        """
        assert p.weight is not None
        src = p.src
        acc_scale = src.scale * p.weight.scales.double()  # float value of one accumulator unit, per channel
        out_scale = out.scale if out is not None else 1.0
        fold = all(op[0] == "sum" or op[2] == ELTWISE_RELU for op in p.post)
        unit = out_scale if fold else 1.0  # the value of one unit after the output scale
        scales = (acc_scale / unit).float()
        bias = torch.zeros(oc) if p.bias is None else p.bias.detach().double()
        bias_acc = bias / acc_scale  # oneDNN 2.x adds the bias before the output scale
        src_zp = src.zero_point
        if name == "linear" and src_zp:  # 2.x inner product has no src zero point: fold -z * sum_k w[o, k] in
            bias_acc = bias_acc - src_zp * p.weight.int8.double().sum(dim=1)
            src_zp = 0
        bias_acc = bias_acc.float().contiguous()
        post: list[tuple[Any, ...]] = []
        for op in p.post:
            if op[0] == "sum":
                assert p.add is not None
                post.append(("sum", float(p.add.scale / unit), int(p.add.zero_point)))
            else:
                post.append(("eltwise", *op[2:]))  # only ReLUs are folded, so alpha/beta stay in float units
        if not fold and out_scale != 1.0:
            post.append(("eltwise", ELTWISE_LINEAR, 1.0 / out_scale, 0.0))
        if out is not None and out.qmax < 255:  # the u8 conversion saturates at 255: clip to the 7-bit range
            # clip_v2, not clip: oneDNN 2.x keeps one eltwise injector per algorithm in a primitive, so a second
            # clip would run with the first one's bounds (a ReLU6's 0..6)
            lo, hi = float(-out.zero_point), float(out.qmax - out.zero_point)
            post.append(("eltwise", ELTWISE_CLIP_V2, lo, hi))
        algs = [op[1:] for op in post if op[0] == "eltwise"]
        if len({a[0] for a in algs}) != len(set(algs)):
            raise PlanUnsupported(f"{p.node.name}: two {name} post-ops of one kind with other parameters")
        attr = self._attr(
            scales, 2, src_zp=src_zp, dst_zp=out.zero_point if out is not None else 0, post=post
        )
        pd, prim = self._primitive(desc, attr, f"the {name} primitive")
        w_md = self._lib.dnnl_primitive_desc_query_md(pd, QUERY_WEIGHTS_MD, 0)
        w_buf = torch.empty(int(self._lib.dnnl_memory_desc_get_size(w_md)), dtype=torch.uint8)
        w_mem = self._memory(w_md, w_buf)
        w_src = p.weight.int8.contiguous()
        reorder = self._reorder(w_user_md, w_md, 0, "the weight reorder")
        w_user = self._memory(w_user_md, w_src, keep=False)  # read once, by this reorder
        self._run_now(reorder, [(ARG_SRC, w_user), (ARG_DST, w_mem)], "the weight reorder")
        b_mem = self._memory(self._md((oc,), F32, (1,)), bias_acc)
        src_mem = self._memory(src_md, src.buf)
        if out is not None:
            dst_mem = self._memory(dst_md, out.buf)
        else:
            dst_mem = self._memory(dst_md, None)
            dims = tuple(self._float_dims(p))
            self._outputs.append(_Output(dst_mem, dims, self._act_strides(dims)))
        what = name + "".join(" + add" if op[0] == "sum" else f" + {op[1]}" for op in p.post)
        what += " -> uint8" if out is not None else " -> float32"
        self._step(
            prim, [(ARG_SRC, src_mem), (ARG_WEIGHTS, w_mem), (ARG_BIAS, b_mem), (ARG_DST, dst_mem)], what
        )

    @staticmethod
    def _float_dims(p: _Pending) -> tuple[int, ...]:
        return tuple(p.params["out_dims"])

    def pool(self, p: _Pending, out: _QValue) -> None:
        src = p.src
        src_md = self._md(src.dims, U8, self._act_strides(src.dims))
        dims = out.dims if len(out.dims) == 4 else (*out.dims, 1, 1)  # a mean without keepdim: N x C
        dst_md = self._md(dims, U8, self._act_strides(dims))
        kernel, stride, pad_l, pad_r, dil = (
            p.params[k] for k in ("kernel", "stride", "pad_l", "pad_r", "dilation")
        )
        alg = POOLING_MAX if p.kind == "maxpool" else POOLING_AVG_EXCLUDE_PADDING
        desc = ctypes.create_string_buffer(_DESC_BYTES)
        self._keep.append(desc)
        _check(
            self._lib.dnnl_pooling_v2_forward_desc_init(
                desc,
                FORWARD_INFERENCE,
                alg,
                src_md,
                dst_md,
                _dims(stride),
                _dims(kernel),
                _dims([d - 1 for d in dil]),
                _dims(pad_l),
                _dims(pad_r),
            ),
            "a pooling",
        )
        _, prim = self._primitive(desc, 0, "the pooling primitive")
        self._step(prim, [(ARG_SRC, self.act_memory(src)), (ARG_DST, self._memory(dst_md, out.buf))], p.kind)

    def dequantize_output(self, q: _QValue) -> None:
        src_md = self._md(q.dims, U8, self._act_strides(q.dims))
        contiguous = tuple(int(s) for s in torch.empty(q.dims).stride())
        dst_md = self._md(q.dims, F32, contiguous)
        attr = self._attr(torch.tensor([q.scale]), 0, src_zp=q.zero_point)
        prim = self._reorder(src_md, dst_md, attr, "the output dequantize reorder")
        dst_mem = self._memory(dst_md, None)
        self._outputs.append(_Output(dst_mem, q.dims, contiguous))
        self._step(prim, [(ARG_SRC, self.act_memory(q)), (ARG_DST, dst_mem)], "dequantize output")

    # -- running -----------------------------------------------------------------------------------------------
    def __call__(self, *args: torch.Tensor) -> Any:
        if len(args) != self.n_inputs:
            raise TypeError(f"the plan takes {self.n_inputs} inputs, got {len(args)}")
        lib, stream = self._lib, self._stream
        keep = []
        with self._lock:
            for index, mem, shape, clamp in self._inputs:
                a = args[index]
                if tuple(a.shape) != shape:
                    raise ValueError(f"the plan was built for inputs of shape {shape}, got {tuple(a.shape)}")
                a = a.detach().to(torch.float32)
                a = a.contiguous() if clamp is None else a.clamp(max=clamp).contiguous()
                keep.append(a)
                lib.dnnl_memory_set_data_handle(mem, a.data_ptr())
            outs = [torch.empty_strided(o.shape, o.strides) for o in self._outputs]
            for o, t in zip(self._outputs, outs, strict=True):
                lib.dnnl_memory_set_data_handle(o.memory, t.data_ptr())
            execute = lib.dnnl_primitive_execute
            for prim, n, arr in self._steps:
                if not prim:  # a torch step on a plan buffer, once the primitives before it have finished
                    lib.dnnl_stream_wait(stream)
                    arr()
                    continue
                status = execute(prim, stream, n, arr)
                if status:
                    raise RuntimeError(f"oneDNN primitive failed (dnnl_status {status})")
            lib.dnnl_stream_wait(stream)
        if self._out_kind is torch.Tensor:
            return outs[0]
        assert self._out_kind is not None
        return self._out_kind(outs)


# -- lowering a PT2E graph ------------------------------------------------------------------------------------------
def _qparams(node: Any) -> tuple[float, int, int, int, Any]:
    scale, zp, qmin, qmax, dtype = node.args[1:6]
    return float(scale), int(zp), int(qmin), int(qmax), dtype


def _act_qparams(node: Any) -> tuple[float, int, int]:
    """(scale, zero point, qmax) of a uint8 activation quantize: 0..255, or 0..127 with reduce_range."""
    scale, zp, qmin, qmax, dtype = _qparams(node)
    if dtype != torch.uint8 or qmin != 0 or not 0 < qmax <= 255 or not 0 <= zp <= qmax:
        raise PlanUnsupported(f"{node.name}: activations quantized to {dtype} [{qmin}, {qmax}] (uint8 only)")
    return scale, zp, qmax


def saturation_risk(qmax: int) -> str | None:
    """Why this CPU's u8 x s8 kernels cannot compute int8 activations in 0..qmax exactly; None when they can.

    Without VNNI (``cpu_caps().vnni``) oneDNN's AVX2 int8 kernels multiply with ``vpmaddubsw``, which adds each pair
    of u8 x s8 products into int16 with saturation: exact while 2 * qmax * 128 <= 32767, i.e. qmax <= 127.
    """
    from pytorchtricks.hardware import cpu_caps

    caps = cpu_caps()
    if caps.vnni or 2 * qmax * 128 <= 32767:
        return None
    return (
        f"activations in 0..{qmax} on a CPU without VNNI ({caps.cpu_class}): oneDNN's AVX2 u8 x s8 kernels add "
        f"pairs of products into int16 and saturate (2 x {qmax} x 128 > 32767), so the plan would not compute "
        "the int8 graph; quantize with reduce_range=True (quantize_'s default on this CPU)"
    )


def _attr_of(gm: Any, target: str) -> Any:
    obj = gm
    for part in target.split("."):
        obj = getattr(obj, part)
    return obj


def _pool_params(kind: str, node: Any, src: _QValue) -> tuple[dict[str, Any], tuple[int, ...]]:
    n, c, h, w = src.dims
    if kind == "maxpool":
        a = list(node.args) + [None] * 6
        kernel = list(a[1])
        kernel = kernel * 2 if len(kernel) == 1 else kernel
        stride = list(a[2]) if a[2] else kernel
        stride = stride * 2 if len(stride) == 1 else stride
        padding = list(a[3]) if a[3] is not None else [0, 0]
        padding = padding * 2 if len(padding) == 1 else padding
        dilation = list(a[4]) if a[4] is not None else [1, 1]
        dilation = dilation * 2 if len(dilation) == 1 else dilation
        if a[5]:
            raise PlanUnsupported("max_pool2d with ceil_mode=True")
        outs, pad_r = [], []
        for size, k, s, p, d in zip((h, w), kernel, stride, padding, dilation, strict=True):
            o = (size + 2 * p - d * (k - 1) - 1) // s + 1
            outs.append(o)
            pad_r.append((o - 1) * s + d * (k - 1) + 1 - size - p)
        params = {"kernel": kernel, "stride": stride, "pad_l": padding, "pad_r": pad_r, "dilation": dilation}
        return params, (n, c, outs[0], outs[1])
    oh, ow = (list(node.args[1]) * 2)[:2] if len(node.args[1]) == 1 else list(node.args[1])
    if h % oh or w % ow:
        raise PlanUnsupported(f"adaptive_avg_pool2d from {h}x{w} to {oh}x{ow} (windows must be whole)")
    kernel = [h // oh, w // ow]
    params = {"kernel": kernel, "stride": kernel, "pad_l": [0, 0], "pad_r": [0, 0], "dilation": [1, 1]}
    return params, (n, c, oh, ow)


def rounding_sqnr_db(gm: Any, example: tuple[Any, ...]) -> float:
    """SQNR of the int8 graph's outputs against the same graph with its activation rounding taken out.

    Every activation quantize/dequantize pair becomes the identity (weights stay int8): what remains is the noise
    the int8 activations themselves add, the yardstick for how far two faithful evaluations of the graph can differ.
    """
    from pytorchtricks.safety import sqnr_db

    qd = torch.ops.quantized_decomposed
    act_ops = (qd.quantize_per_tensor.default, qd.dequantize_per_tensor.default)

    class _Unrounded(torch.fx.Interpreter):
        def call_function(self, target: Any, args: Any, kwargs: Any) -> Any:
            if target in act_ops and isinstance(args[0], torch.Tensor) and args[0].is_floating_point():
                return args[0]
            return super().call_function(target, args, kwargs)

    with torch.no_grad():
        rounded, unrounded = gm(*example), _Unrounded(gm).run(*example)
    return float(sqnr_db(_flat(unrounded), _flat(rounded)))


def build_plan(gm: Any, example: tuple[Any, ...], *, min_sqnr_db: float | None = None) -> OnednnPlan:
    """Lower a converted PT2E int8 graph module to a ``OnednnPlan`` for ``example``'s shapes.

    The plan is checked against the graph it replaces on ``example``. Where the kernels can represent every sum
    (VNNI, or 7-bit activations: ``saturation_risk``, refused otherwise) the two compute the same integers and
    differ only where float32 rounding of a scale puts a value on the other side of a rounding step (one step, on
    one element in 10^4 or fewer); through a deep net such flips spread until the plan is at worst another rounding of
    the same values. Its distance from the graph is then at most its own rounding error plus the graph's (triangle
    inequality): twice the graph's in amplitude, so the default floor is 6 dB below ``rounding_sqnr_db`` - a floor
    set by the int8 step sizes of this graph, not by a machine. ``min_sqnr_db`` sets a floor instead. Raises
    ``PlanUnsupported`` naming the first node it cannot lower, or the failed check.
    """
    from pytorchtricks.safety import sqnr_db

    lib = _load()
    if not example or not all(isinstance(a, torch.Tensor) and a.dtype == torch.float32 for a in example):
        raise PlanUnsupported("inputs that are not float32 tensors")
    with torch.no_grad():
        ref = gm(*example)
    refs = [ref] if isinstance(ref, torch.Tensor) else list(ref) if isinstance(ref, list | tuple) else None
    if not refs or not all(isinstance(r, torch.Tensor) for r in refs):
        raise PlanUnsupported(f"a graph that returns {type(ref).__name__}")
    _record_shapes(gm, example)
    plan = OnednnPlan(lib)
    plan.shapes = tuple(tuple(a.shape) for a in example)
    plan.n_inputs = len(example)
    nodes = list(gm.graph.nodes)
    position = {n: i for i, n in enumerate(nodes)}
    env: dict[Any, Any] = {}
    qd = torch.ops.quantized_decomposed
    aten = torch.ops.aten
    placeholders = 0

    def shape(node: Any) -> tuple[int, ...]:
        meta = node.meta.get("tensor_meta")
        if meta is None:
            raise PlanUnsupported(f"node {node.name} has no tensor shape")
        return tuple(int(d) for d in meta.shape)

    def need(value: Any, kind: type, node: Any) -> Any:
        if isinstance(value, _Pending) and kind is not _Pending:
            raise PlanUnsupported(
                f"{node.name} ({node.target}) reads the float result of {value.node.name} ({value.kind}), "
                "which has no int8 form in the graph"
            )
        if not isinstance(value, kind):
            raise PlanUnsupported(
                f"{node.name} ({node.target}): an input is {type(value).__name__.strip('_')}"
            )
        return value

    def hardtanh(node: Any) -> tuple[str, int, float, float]:
        lo, hi = (list(node.args[1:3]) + [-1.0, 1.0][len(node.args[1:3]) :])[:2]
        name = "relu6" if (float(lo), float(hi)) == (0.0, 6.0) else "hardtanh"
        return (name, ELTWISE_CLIP, float(lo), float(hi))

    def gelu(node: Any) -> tuple[str, int, float, float]:
        tanh = node.kwargs.get("approximate", "none") == "tanh"
        return ("gelu", ELTWISE_GELU_TANH if tanh else ELTWISE_GELU_ERF, 0.0, 0.0)

    unary: dict[Any, Any] = {
        aten.relu.default: lambda n: ("relu", ELTWISE_RELU, 0.0, 0.0),
        aten.relu_.default: lambda n: ("relu", ELTWISE_RELU, 0.0, 0.0),
        aten.hardtanh.default: hardtanh,
        aten.hardtanh_.default: hardtanh,
        aten.hardswish.default: lambda n: ("hardswish", ELTWISE_HARDSWISH, 0.0, 0.0),
        aten.hardswish_.default: lambda n: ("hardswish", ELTWISE_HARDSWISH, 0.0, 0.0),
        aten.silu.default: lambda n: ("silu", ELTWISE_SWISH, 1.0, 0.0),
        aten.silu_.default: lambda n: ("silu", ELTWISE_SWISH, 1.0, 0.0),
        aten.gelu.default: gelu,
    }
    chain = set(unary) | {  # ops whose primitive is emitted later, at the quantize (or output) that ends them
        aten.dropout.default,
        aten.conv2d.default,
        aten.linear.default,
        aten.add.Tensor,
        aten.add_.Tensor,
        aten.max_pool2d.default,
        aten.adaptive_avg_pool2d.default,
        aten.mean.dim,
        aten.flatten.using_ints,
    }

    def runs_at(node: Any) -> int:
        """Position of the node whose lowering emits the primitive that reads for ``node`` (end of its chain)."""
        while node.op == "call_function" and node.target in chain and len(node.users) == 1:
            node = next(iter(node.users))
        return position[node]

    def read_after(q: _QValue, at: int) -> bool:
        """Does any primitive other than the one emitted at ``at`` read q's buffer at or after ``at``?"""
        readers = [u for dq in q.node.users for u in dq.users] + list(q.node.users)
        return any(runs_at(u) >= at for u in readers if runs_at(u) != at)

    def finish(p: _Pending, qnode: Any | None) -> Any:
        """Materialise a pending op: into a uint8 value (quantize node) or a float32 graph output."""
        if qnode is not None:
            scale, zp, qmax = _act_qparams(qnode)
            dims = shape(qnode)
            # same parameters and a range that holds the source's: the values pass through unchanged
            same = (scale, zp) == (p.src.scale, p.src.zero_point) and p.src.qmax <= qmax
            if p.kind == "flatten":
                view = _QValue(
                    p.src.buf, dims, p.src.scale, p.src.zero_point, qnode, view_of=p.src, qmax=p.src.qmax
                )
                p.src.views.append(view)
                if same:
                    return view
                out = plan.new_q(dims, scale, zp, qnode, qmax)
                plan.requantize(view, out)
                return out
            if p.kind in ("maxpool", "avgpool"):  # both commute with the affine int8 <-> float map
                pooled = plan.new_q(dims, p.src.scale, p.src.zero_point, qnode, p.src.qmax)
                plan.pool(p, pooled)
                if same:
                    return pooled
                out = plan.new_q(dims, scale, zp, qnode, qmax)
                plan.requantize(pooled, out)
                return out
            if len(p.tail.users) != 1:
                raise PlanUnsupported(f"{p.tail.name}: its float result has several readers")
            if p.add is not None:
                res = p.add
                here = position[qnode]
                if (
                    res.view_of is None
                    and not res.views
                    and res.buf is not p.src.buf
                    and not read_after(res, here)
                ):
                    out = _QValue(res.buf, dims, scale, zp, qnode, qmax=qmax)  # the sum post-op adds in place
                else:
                    out = plan.new_q(dims, scale, zp, qnode, qmax)
                    plan.copy(res, out)
            else:
                out = plan.new_q(dims, scale, zp, qnode, qmax)
            (plan.conv if p.kind == "conv" else plan.linear)(p, out, None)
            return out
        if p.kind not in ("conv", "linear") or p.add is not None:
            raise PlanUnsupported(f"{p.node.name}: a float {p.kind} output")
        if len(p.tail.users) != 1:
            raise PlanUnsupported(f"{p.tail.name}: its float result has several readers")
        (plan.conv if p.kind == "conv" else plan.linear)(p, None, p.params["out_dims"])
        return None

    for node in nodes:
        if node.op == "placeholder":
            if placeholders >= len(example):
                raise PlanUnsupported("more graph inputs than example inputs")
            env[node] = _FloatIn(placeholders, tuple(example[placeholders].shape))
            placeholders += 1
        elif node.op == "get_attr":
            env[node] = _attr_of(gm, str(node.target))
        elif node.op == "call_function":
            t, args = node.target, node.args
            if t == qd.quantize_per_tensor.default:
                src = env[args[0]]
                if isinstance(src, _FloatIn):
                    scale, zp, qmax = _act_qparams(node)
                    q = plan.new_q(shape(node), scale, zp, node, qmax)
                    plan.quantize_input(src, q)
                    env[node] = q
                else:
                    env[node] = finish(need(src, _Pending, node), node)
            elif t == qd.dequantize_per_tensor.default:
                q = need(env[args[0]], _QValue, node)
                if _qparams(node)[:2] != (q.scale, q.zero_point):
                    raise PlanUnsupported(f"{node.name}: dequantize with other parameters than its quantize")
                env[node] = _DQ(q)
            elif t == qd.dequantize_per_channel.default:
                w, scales, zps, axis = (env.get(a, a) for a in args[:4])
                if not isinstance(w, torch.Tensor) or w.dtype != torch.int8 or int(axis) != 0:
                    raise PlanUnsupported(f"{node.name}: weights not int8 per output channel")
                if torch.as_tensor(zps).abs().max().item() != 0:
                    raise PlanUnsupported(f"{node.name}: asymmetric weights")
                env[node] = _Weight(w.detach(), torch.as_tensor(scales).detach().float().reshape(-1))
            elif t in (aten.conv2d.default, aten.linear.default):
                x = need(env[args[0]], _DQ, node).q
                risk = saturation_risk(x.qmax)
                if risk is not None:
                    raise PlanUnsupported(f"{node.name}: {risk}")
                w = need(env[args[1]], _Weight, node)
                bias = env.get(args[2]) if len(args) > 2 and args[2] is not None else None
                if bias is not None and not isinstance(bias, torch.Tensor):
                    raise PlanUnsupported(f"{node.name}: a computed bias")
                if w.scales.numel() != w.int8.shape[0]:
                    w = _Weight(w.int8, w.scales.expand(w.int8.shape[0]).contiguous())
                p = _Pending("conv" if t == aten.conv2d.default else "linear", x, node, w, bias)
                if t == aten.conv2d.default:
                    a = list(args) + [None] * 7

                    def pair(v: Any, default: int) -> list[int]:
                        v = [default] if v is None else list(v)
                        return v * 2 if len(v) == 1 else v

                    if len(x.dims) != 4:
                        raise PlanUnsupported(f"{node.name}: conv on a rank-{len(x.dims)} input")
                    p.params = {
                        "stride": pair(a[3], 1),
                        "padding": pair(a[4], 0),
                        "dilation": pair(a[5], 1),
                        "groups": int(a[6] or 1),
                    }
                elif len(x.dims) != 2:
                    raise PlanUnsupported(f"{node.name}: linear on a rank-{len(x.dims)} input")
                p.params["out_dims"] = shape(node)
                env[node] = p
            elif t in (aten.add.Tensor, aten.add_.Tensor):
                if node.kwargs.get("alpha", 1) != 1 or len(args) != 2:
                    raise PlanUnsupported(f"{node.name}: add with alpha")
                lhs, rhs = env.get(args[0]), env.get(args[1])
                p = need(lhs if isinstance(lhs, _Pending) else rhs, _Pending, node)
                other = need(rhs if isinstance(lhs, _Pending) else lhs, _DQ, node)
                if p.kind != "conv" or p.add is not None:
                    raise PlanUnsupported(f"{node.name}: an add that is not conv + residual")
                if other.q.dims != tuple(p.params["out_dims"]):
                    raise PlanUnsupported(f"{node.name}: a broadcasting add")
                p.add, p.add_node = other.q, node
                p.post.append(("sum",))
                env[node] = p.extend(node)
            elif t in unary:
                p = need(env[args[0]], _Pending, node)
                if p.kind not in ("conv", "linear") or len(p.post) >= 3:
                    raise PlanUnsupported(f"{node.name}: {t} after {p.kind}")
                p.post.append(("eltwise", *unary[t](node)))
                env[node] = p.extend(node)
            elif t in (aten.max_pool2d.default, aten.adaptive_avg_pool2d.default):
                x = need(env[args[0]], _DQ, node).q
                kind = "maxpool" if t == aten.max_pool2d.default else "avgpool"
                p = _Pending(kind, x, node)
                p.params, _ = _pool_params(kind, node, x)
                env[node] = p
            elif t == aten.mean.dim:  # a global average over H and W is an average pooling
                x = need(env[args[0]], _DQ, node).q
                dims = sorted(int(d) % 4 for d in args[1]) if len(x.dims) == 4 else []
                if dims != [2, 3] or node.kwargs.get("dtype") is not None:
                    raise PlanUnsupported(f"{node.name}: a mean other than over H and W of an NCHW map")
                h, w = x.dims[2:]
                p = _Pending("avgpool", x, node)
                p.params = {
                    "kernel": [h, w],
                    "stride": [h, w],
                    "pad_l": [0, 0],
                    "pad_r": [0, 0],
                    "dilation": [1, 1],
                }
                env[node] = p
            elif t == aten.flatten.using_ints:
                x = need(env[args[0]], _DQ, node).q
                start = int(args[1]) if len(args) > 1 else 0
                end = int(args[2]) if len(args) > 2 else -1
                if start != 1 or end != -1 or len(x.dims) != 4 or x.dims[2:] != (1, 1):
                    raise PlanUnsupported(f"{node.name}: flatten other than NxCx1x1 -> NxC")
                env[node] = _Pending("flatten", x, node)
            elif t == aten.dropout.default and not (len(args) > 2 and args[2]):
                env[node] = env[args[0]]  # inference dropout is the identity
            elif t is operator.getitem:
                raise PlanUnsupported(f"{node.name}: an op with several outputs")
            else:
                raise PlanUnsupported(f"{node.name}: {t} is not lowered")
        elif node.op == "output":
            flat = node.args[0]
            for out_node in [flat] if not isinstance(flat, list | tuple) else list(flat):
                v = env.get(out_node)
                if isinstance(v, _Pending):
                    finish(v, None)
                elif isinstance(v, _DQ):
                    plan.dequantize_output(v.q)
                else:
                    raise PlanUnsupported(f"graph output {out_node} is {type(v).__name__}")
            if len(plan._outputs) != len(refs):
                raise PlanUnsupported("the graph's outputs do not match what it returns")
        elif node.op == "call_module" and not node.users and str(node.target).startswith("_guards"):
            continue  # torch.export's input-shape guard: the plan checks shapes on every call itself
        else:
            raise PlanUnsupported(f"{node.op} nodes")
    for n in nodes:  # a pending op nobody materialised would be silently skipped
        v = env.get(n)
        if isinstance(v, _Pending) and len(n.users) == 0 and n.op != "output":
            raise PlanUnsupported(f"{n.name}: a result that nothing uses")
    plan._out_kind = torch.Tensor if isinstance(ref, torch.Tensor) else type(ref)
    got = plan(*example)
    if min_sqnr_db is None:  # two float32 evaluations of one graph agree to ~1e-6 (>= 100 dB) at best
        floor, why = min(rounding_sqnr_db(gm, example) - 6.0, 100.0), "the graph's own rounding noise - 6 dB"
    else:
        floor, why = min_sqnr_db, "the floor asked for"
    gots = [got] if isinstance(got, torch.Tensor) else list(got)
    for r, g in zip(refs, gots, strict=True):
        if r.shape != g.shape:
            raise PlanUnsupported(
                f"the plan returned shape {tuple(g.shape)} where the graph returns {tuple(r.shape)}"
            )
    db = float(sqnr_db(_flat(refs), _flat(gots)))
    if not db >= floor:
        raise PlanUnsupported(
            f"the plan's output differs from the int8 graph's: SQNR {db:.1f} dB < {floor:.1f} dB ({why}); "
            f"kernels: {', '.join(sorted(set(plan.kernels)))}"
        )
    return plan


def _flat(out: Any) -> torch.Tensor:
    """All output tensors of a graph as one float vector (SQNR over every output together, as the safety check)."""
    outs = [out] if isinstance(out, torch.Tensor) else list(out)
    return torch.cat([t.detach().float().reshape(-1) for t in outs])


def _record_shapes(gm: Any, example: tuple[Any, ...]) -> None:
    """Store every node's output shape in ``node.meta['tensor_meta']`` (one interpreted run)."""
    from torch.fx.passes.shape_prop import ShapeProp

    with torch.no_grad():
        ShapeProp(gm).propagate(*example)
