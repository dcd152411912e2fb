"""The plan at run time: its values, primitives and buffers, and the call that runs them in one loop."""

from __future__ import annotations

import ctypes
import ctypes.util
import threading
from dataclasses import dataclass, field
from typing import Any

import torch

from pytorchtricks.tricks.model.onednn_plan.binding import (
    _DESC_BYTES,
    _MD_BYTES,
    ARG_BIAS,
    ARG_DST,
    ARG_SRC,
    ARG_WEIGHTS,
    CONVOLUTION_DIRECT,
    ELTWISE_CLIP_V2,
    ELTWISE_LINEAR,
    ELTWISE_RELU,
    ENGINE_CPU,
    F32,
    FORMAT_ANY,
    FORWARD_INFERENCE,
    POOLING_AVG_EXCLUDE_PADDING,
    POOLING_MAX,
    QUERY_IMPL_INFO_STR,
    QUERY_WEIGHTS_MD,
    S8,
    STREAM_DEFAULT,
    U8,
    PlanUnsupported,
    _check,
    _dims,
    _ExecArg,
)


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
        self._out_kind: type | None = None  # set by returns_like() once the lowering knows the graph's return
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
        _check(  # oneDNN counts dilation from 0 (torch from 1): 0 is a plain convolution, the same kernels
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
    @property
    def num_outputs(self) -> int:
        return len(self._outputs)

    def returns_like(self, ref: Any) -> None:
        """Return what the graph returns: one tensor, or a list/tuple of them (``ref``: the graph's output)."""
        self._out_kind = torch.Tensor if isinstance(ref, torch.Tensor) else type(ref)

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
