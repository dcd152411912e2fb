"""Lowering a PT2E static-int8 graph to an ``OnednnPlan``, one handler per op (``_Lowering.handlers``), and checking
the plan against the graph it replaces. A new op: a handler method and its line in the table."""

from __future__ import annotations

import functools
import operator
from collections.abc import Callable
from typing import Any

import torch

from pytorchtricks.tricks.model.onednn_plan.binding import (
    ELTWISE_CLIP,
    ELTWISE_GELU_ERF,
    ELTWISE_GELU_TANH,
    ELTWISE_HARDSWISH,
    ELTWISE_RELU,
    ELTWISE_SWISH,
    PlanUnsupported,
    _load,
)
from pytorchtricks.tricks.model.onednn_plan.executor import (
    _DQ,
    OnednnPlan,
    _FloatIn,
    _Pending,
    _QValue,
    _Weight,
)


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


def saturation_risk(qmax: int, weight_absmax: int = 128) -> str | None:
    """Why this CPU's u8 x s8 kernels cannot compute activations in 0..qmax times weights in
    -weight_absmax..weight_absmax exactly; None when they can.

    Without VNNI (``cpu_caps().vnni``) oneDNN's AVX2 int8 kernels multiply with ``vpmaddubsw``, which adds each pair
    of u8 x s8 products into int16 with saturation: exact while 2 * qmax * weight_absmax <= 32767 (7-bit
    activations with 8-bit weights, 8-bit activations with weights in -64..64, or a split in between).
    """
    from pytorchtricks.hardware import cpu_caps

    caps = cpu_caps()
    if caps.vnni or 2 * qmax * weight_absmax <= 32767:
        return None
    return (
        f"activations in 0..{qmax} times weights up to {weight_absmax} on a CPU without VNNI ({caps.cpu_class}): "
        f"oneDNN's AVX2 u8 x s8 kernels add pairs of products into int16 and saturate (2 x {qmax} x "
        f"{weight_absmax} > 32767), so the plan would not compute the int8 graph; quantize with "
        "QuantConfig(reduce_range=None) (on this CPU: activation and weight levels balanced so that they cannot "
        "saturate) or reduce_range=True"
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


def build_plan(
    gm: Any, example: tuple[Any, ...], *, min_sqnr_db: float | None = None, allow_saturation: bool = False
) -> OnednnPlan:
    """Lower a converted PT2E int8 graph module to a ``OnednnPlan`` for ``example``'s shapes.

    The plan is checked against the graph it replaces on ``example``. Where the kernels can represent every sum
    (VNNI, or 7-bit activations: ``saturation_risk``, refused otherwise) the two compute the same integers and
    differ only where float32 rounding of a scale puts a value on the other side of a rounding step (one step, on
    one element in 10^4 or fewer); through a deep net such flips spread until the plan is at worst another rounding of
    the same values. Its distance from the graph is then at most its own rounding error plus the graph's (triangle
    inequality): twice the graph's in amplitude, so the default floor is 6 dB below ``rounding_sqnr_db`` - a floor
    set by the int8 step sizes of this graph, not by a machine. ``min_sqnr_db`` sets a floor instead. Raises
    ``PlanUnsupported`` naming the first node it cannot lower, or the failed check. ``allow_saturation`` builds
    8-bit activations on a CPU without VNNI anyway (to measure what the saturation costs; pair it with a low
    ``min_sqnr_db``).
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
    plan = _Lowering(gm, example, OnednnPlan(lib), allow_saturation=allow_saturation).run()
    if plan.num_outputs != len(refs):
        raise PlanUnsupported("the graph's outputs do not match what it returns")
    plan.returns_like(ref)
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


def _hardtanh(node: Any) -> tuple[str, int, float, float]:
    lo, hi = (list(node.args[1:3]) + [-1.0, 1.0][len(node.args[1:3]) :])[:2]
    name = "relu6" if (float(lo), float(hi)) == (0.0, 6.0) else "hardtanh"
    return (name, ELTWISE_CLIP, float(lo), float(hi))


def _gelu(node: Any) -> tuple[str, int, float, float]:
    tanh = node.kwargs.get("approximate", "none") == "tanh"
    return ("gelu", ELTWISE_GELU_TANH if tanh else ELTWISE_GELU_ERF, 0.0, 0.0)


@functools.cache
def _eltwise_ops() -> dict[Any, Callable[[Any], tuple[str, int, float, float]]]:
    """Activation ops fused into the conv/linear before them: op -> (name, oneDNN algorithm, alpha, beta)."""
    aten = torch.ops.aten

    def fixed(name: str, alg: int, alpha: float = 0.0) -> Callable[[Any], tuple[str, int, float, float]]:
        return lambda node: (name, alg, alpha, 0.0)

    return {
        aten.relu.default: fixed("relu", ELTWISE_RELU),
        aten.relu_.default: fixed("relu", ELTWISE_RELU),
        aten.hardtanh.default: _hardtanh,
        aten.hardtanh_.default: _hardtanh,
        aten.hardswish.default: fixed("hardswish", ELTWISE_HARDSWISH),
        aten.hardswish_.default: fixed("hardswish", ELTWISE_HARDSWISH),
        aten.silu.default: fixed("silu", ELTWISE_SWISH, 1.0),
        aten.silu_.default: fixed("silu", ELTWISE_SWISH, 1.0),
        aten.gelu.default: _gelu,
    }


@functools.cache
def _chain_ops() -> frozenset[Any]:
    """Ops whose primitive is emitted later, at the quantize (or output) that ends their chain."""
    aten = torch.ops.aten
    return frozenset(_eltwise_ops()) | {
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


def _pair(v: Any, default: int) -> list[int]:
    v = [default] if v is None else list(v)
    return v * 2 if len(v) == 1 else v


class _Lowering:
    """One lowering of a graph into ``plan``: the value each node lowered to, and one handler per op.

    A handler takes the node and returns its value: a ``_QValue`` (a uint8 buffer of the plan), a ``_DQ`` (its
    dequantized view), a ``_Weight``, or a ``_Pending`` op whose primitive is emitted where its chain ends
    (``finish``, at the quantize that reads it or at the graph output), so that eltwise post-ops, the residual sum
    and the output scale are one primitive.
    """

    def __init__(
        self, gm: Any, example: tuple[Any, ...], plan: OnednnPlan, *, allow_saturation: bool = False
    ) -> None:
        self.gm, self.example, self.plan = gm, example, plan
        self.allow_saturation = allow_saturation
        plan.shapes = tuple(tuple(a.shape) for a in example)
        plan.n_inputs = len(example)
        self.nodes = list(gm.graph.nodes)
        self.position = {n: i for i, n in enumerate(self.nodes)}
        self.env: dict[Any, Any] = {}
        self.placeholders = 0
        qd, aten = torch.ops.quantized_decomposed, torch.ops.aten
        self.handlers: dict[Any, Callable[[Any], Any]] = {
            qd.quantize_per_tensor.default: self.quantize,
            qd.dequantize_per_tensor.default: self.dequantize,
            qd.dequantize_per_channel.default: self.weight,
            aten.conv2d.default: self.conv,
            aten.linear.default: self.linear,
            aten.add.Tensor: self.add,
            aten.add_.Tensor: self.add,
            aten.max_pool2d.default: self.pool,
            aten.adaptive_avg_pool2d.default: self.pool,
            aten.mean.dim: self.mean,
            aten.flatten.using_ints: self.flatten,
            aten.dropout.default: self.dropout,
            **dict.fromkeys(_eltwise_ops(), self.eltwise),
        }

    def run(self) -> OnednnPlan:
        for node in self.nodes:
            if node.op == "placeholder":
                if self.placeholders >= len(self.example):
                    raise PlanUnsupported("more graph inputs than example inputs")
                self.env[node] = _FloatIn(self.placeholders, tuple(self.example[self.placeholders].shape))
                self.placeholders += 1
            elif node.op == "get_attr":
                self.env[node] = _attr_of(self.gm, str(node.target))
            elif node.op == "call_function":
                handler = self.handlers.get(node.target)
                if handler is None:
                    several = node.target is operator.getitem
                    raise PlanUnsupported(
                        f"{node.name}: "
                        + ("an op with several outputs" if several else f"{node.target} is not lowered")
                    )
                self.env[node] = handler(node)
            elif node.op == "output":
                self.output(node)
            elif node.op == "call_module" and not node.users and str(node.target).startswith("_guards"):
                continue  # torch.export's input-shape guard: the plan checks shapes on every call itself
            else:
                raise PlanUnsupported(f"{node.op} nodes")
        for n in self.nodes:  # a pending op nobody materialised would be silently skipped
            v = self.env.get(n)
            if isinstance(v, _Pending) and len(n.users) == 0 and n.op != "output":
                raise PlanUnsupported(f"{n.name}: a result that nothing uses")
        return self.plan

    # -- helpers ----------------------------------------------------------------------------------------------------
    @staticmethod
    def shape(node: Any) -> tuple[int, ...]:
        meta = node.meta.get("tensor_meta")
        if meta is None:
            raise PlanUnsupported(f"node {node.name} has no tensor shape")
        return tuple(int(d) for d in meta.shape)

    @staticmethod
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

    def input_q(self, node: Any) -> _QValue:
        """The uint8 value a node reads through its dequantize (its first argument)."""
        return self.need(self.env[node.args[0]], _DQ, node).q  # type: ignore[no-any-return]

    def runs_at(self, node: Any) -> int:
        """Position of the node whose lowering emits the primitive that reads for ``node`` (end of its chain)."""
        chain = _chain_ops()
        while node.op == "call_function" and node.target in chain and len(node.users) == 1:
            node = next(iter(node.users))
        return self.position[node]

    def read_after(self, q: _QValue, at: int) -> bool:
        """Does any primitive other than the one emitted at ``at`` read q's buffer at or after ``at``?"""
        readers = [u for dq in q.node.users for u in dq.users] + list(q.node.users)
        return any(self.runs_at(u) >= at for u in readers if self.runs_at(u) != at)

    # -- handlers ---------------------------------------------------------------------------------------------------
    def quantize(self, node: Any) -> Any:
        src = self.env[node.args[0]]
        if isinstance(src, _FloatIn):
            scale, zp, qmax = _act_qparams(node)
            q = self.plan.new_q(self.shape(node), scale, zp, node, qmax)
            self.plan.quantize_input(src, q)
            return q
        return self.finish(self.need(src, _Pending, node), node)

    def dequantize(self, node: Any) -> _DQ:
        q = self.need(self.env[node.args[0]], _QValue, node)
        if _qparams(node)[:2] != (q.scale, q.zero_point):
            raise PlanUnsupported(f"{node.name}: dequantize with other parameters than its quantize")
        return _DQ(q)

    def weight(self, node: Any) -> _Weight:
        w, scales, zps, axis = (self.env.get(a, a) for a in node.args[:4])
        if not isinstance(w, torch.Tensor) or w.dtype != torch.int8 or int(axis) != 0:
            raise PlanUnsupported(f"{node.name}: weights not int8 per output channel")
        if torch.as_tensor(zps).abs().max().item() != 0:
            raise PlanUnsupported(f"{node.name}: asymmetric weights")
        return _Weight(w.detach(), torch.as_tensor(scales).detach().float().reshape(-1))

    def _matmul_like(self, node: Any, kind: str, rank: int) -> _Pending:
        x = self.input_q(node)
        args = node.args
        w = self.need(self.env[args[1]], _Weight, node)
        absmax = int(w.int8.to(torch.int16).abs().max()) if w.int8.numel() else 0
        risk = None if self.allow_saturation else saturation_risk(x.qmax, absmax)
        if risk is not None:
            raise PlanUnsupported(f"{node.name}: {risk}")
        bias = self.env.get(args[2]) if len(args) > 2 and args[2] is not None else None
        if bias is not None and not isinstance(bias, torch.Tensor):
            raise PlanUnsupported(f"{node.name}: a computed bias")
        if w.scales.numel() != w.int8.shape[0]:
            w = _Weight(w.int8, w.scales.expand(w.int8.shape[0]).contiguous())
        if len(x.dims) != rank:
            raise PlanUnsupported(f"{node.name}: {kind} on a rank-{len(x.dims)} input")
        p = _Pending(kind, x, node, w, bias)
        p.params["out_dims"] = self.shape(node)
        return p

    def conv(self, node: Any) -> _Pending:
        p = self._matmul_like(node, "conv", 4)
        a = list(node.args) + [None] * 7
        p.params.update(
            stride=_pair(a[3], 1), padding=_pair(a[4], 0), dilation=_pair(a[5], 1), groups=int(a[6] or 1)
        )
        return p

    def linear(self, node: Any) -> _Pending:
        return self._matmul_like(node, "linear", 2)

    def add(self, node: Any) -> _Pending:
        args = node.args
        if node.kwargs.get("alpha", 1) != 1 or len(args) != 2:
            raise PlanUnsupported(f"{node.name}: add with alpha")
        lhs, rhs = self.env.get(args[0]), self.env.get(args[1])
        p = self.need(lhs if isinstance(lhs, _Pending) else rhs, _Pending, node)
        other = self.need(rhs if isinstance(lhs, _Pending) else lhs, _DQ, node)
        if p.kind != "conv" or p.add is not None:
            raise PlanUnsupported(f"{node.name}: an add that is not conv + residual")
        if other.q.dims != tuple(p.params["out_dims"]):
            raise PlanUnsupported(f"{node.name}: a broadcasting add")
        p.add, p.add_node = other.q, node
        p.post.append(("sum",))
        return p.extend(node)

    def eltwise(self, node: Any) -> _Pending:
        p = self.need(self.env[node.args[0]], _Pending, node)
        if p.kind not in ("conv", "linear") or len(p.post) >= 3:
            raise PlanUnsupported(f"{node.name}: {node.target} after {p.kind}")
        p.post.append(("eltwise", *_eltwise_ops()[node.target](node)))
        return p.extend(node)

    def pool(self, node: Any) -> _Pending:
        x = self.input_q(node)
        kind = "maxpool" if node.target == torch.ops.aten.max_pool2d.default else "avgpool"
        p = _Pending(kind, x, node)
        p.params, _ = _pool_params(kind, node, x)
        return p

    def mean(self, node: Any) -> _Pending:  # a global average over H and W is an average pooling
        x = self.input_q(node)
        dims = sorted(int(d) % 4 for d in node.args[1]) if len(x.dims) == 4 else []
        if dims != [2, 3] or node.kwargs.get("dtype") is not None:
            raise PlanUnsupported(f"{node.name}: a mean other than over H and W of an NCHW map")
        h, w = x.dims[2:]
        p = _Pending("avgpool", x, node)
        p.params = {"kernel": [h, w], "stride": [h, w], "pad_l": [0, 0], "pad_r": [0, 0], "dilation": [1, 1]}
        return p

    def flatten(self, node: Any) -> _Pending:
        x = self.input_q(node)
        args = node.args
        start = int(args[1]) if len(args) > 1 else 0
        end = int(args[2]) if len(args) > 2 else -1
        if start != 1 or end != -1 or len(x.dims) != 4 or x.dims[2:] != (1, 1):
            raise PlanUnsupported(f"{node.name}: flatten other than NxCx1x1 -> NxC")
        return _Pending("flatten", x, node)

    def dropout(self, node: Any) -> Any:
        if len(node.args) > 2 and node.args[2]:
            raise PlanUnsupported(f"{node.name}: dropout in training mode is not lowered")
        return self.env[node.args[0]]  # inference dropout is the identity

    def output(self, node: Any) -> None:
        flat = node.args[0]
        for out_node in [flat] if not isinstance(flat, list | tuple) else list(flat):
            v = self.env.get(out_node)
            if isinstance(v, _Pending):
                self.finish(v, None)
            elif isinstance(v, _DQ):
                self.plan.dequantize_output(v.q)
            else:
                raise PlanUnsupported(f"graph output {out_node} is {type(v).__name__}")

    # -- the end of a chain: emit the pending primitive ---------------------------------------------------------------
    def finish(self, p: _Pending, qnode: Any | None) -> Any:
        """Materialise a pending op: into a uint8 value (quantize node) or a float32 graph output."""
        plan = self.plan
        if qnode is None:
            if p.kind not in ("conv", "linear") or p.add is not None:
                raise PlanUnsupported(f"{p.node.name}: a float {p.kind} output")
            if len(p.tail.users) != 1:
                raise PlanUnsupported(f"{p.tail.name}: its float result has several readers")
            (plan.conv if p.kind == "conv" else plan.linear)(p, None, p.params["out_dims"])
            return None
        scale, zp, qmax = _act_qparams(qnode)
        dims = self.shape(qnode)
        # same parameters and a range that holds the source's: the values pass through unchanged
        same = (scale, zp) == (p.src.scale, p.src.zero_point) and p.src.qmax <= qmax
        if p.kind in ("flatten", "maxpool", "avgpool"):
            if p.kind == "flatten":
                done = _QValue(
                    p.src.buf, dims, p.src.scale, p.src.zero_point, qnode, view_of=p.src, qmax=p.src.qmax
                )
                p.src.views.append(done)
            else:  # both pools commute with the affine int8 <-> float map
                done = plan.new_q(dims, p.src.scale, p.src.zero_point, qnode, p.src.qmax)
                plan.pool(p, done)
            if same:
                return done
            out = plan.new_q(dims, scale, zp, qnode, qmax)
            plan.requantize(done, out)
            return out
        if len(p.tail.users) != 1:
            raise PlanUnsupported(f"{p.tail.name}: its float result has several readers")
        res = p.add
        if res is None:
            out = plan.new_q(dims, scale, zp, qnode, qmax)
        elif (
            res.view_of is None
            and not res.views
            and res.buf is not p.src.buf
            and not self.read_after(res, self.position[qnode])
        ):
            out = _QValue(res.buf, dims, scale, zp, qnode, qmax=qmax)  # the sum post-op adds in place
        else:
            out = plan.new_q(dims, scale, zp, qnode, qmax)
            plan.copy(res, out)
        (plan.conv if p.kind == "conv" else plan.linear)(p, out, None)
        return out


def _flat(out: Any) -> torch.Tensor:
    """All output tensors of a graph as one float vector (SQNR over every output together, as the safety check)."""
    outs = [out] if isinstance(out, torch.Tensor) else list(out)
    return torch.cat([t.detach().float().reshape(-1) for t in outs])


def _record_shapes(gm: Any, example: tuple[Any, ...]) -> None:
    """Store every node's output shape in ``node.meta['tensor_meta']`` (one interpreted run)."""
    from torch.fx.passes.shape_prop import ShapeProp

    with torch.no_grad():
        ShapeProp(gm).propagate(*example)
