"""Channel dependency graph for physical pruning: which channel dimensions must be pruned together.

Walks a torch.fx graph and gives every tensor a *layout*: the list of channel groups its channel dimension is made
of (``[(group, size), ...]``, more than one after a concatenation). A conv/Linear starts a new group; BN, element-wise
ops, pooling and depthwise convs pass it through; residual ``add``/``mul`` merge the groups of both operands
(union-find); ``cat`` on dim 1 concatenates layouts. Anything not understood (reshape, a model output, a module
called twice, a grouped non-depthwise conv) pins its groups as *fixed*: never pruned. Being wrong here would give
silently wrong shapes, so the rule is: unknown means fixed.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import fx, nn

from pytorchtricks.tricks.graph import call_sites, registrations, trace

_PASS_MODULES = (
    nn.ReLU, nn.ReLU6, nn.SiLU, nn.GELU, nn.Sigmoid, nn.Tanh, nn.Hardswish, nn.Hardsigmoid, nn.LeakyReLU, nn.ELU,
    nn.Mish, nn.Dropout, nn.Dropout2d, nn.Identity, nn.MaxPool1d, nn.MaxPool2d, nn.MaxPool3d, nn.AvgPool1d,
    nn.AvgPool2d, nn.AvgPool3d,
)  # fmt: skip
_PASS_FUNCS = {
    F.relu, F.relu6, F.silu, F.gelu, F.hardswish, F.hardsigmoid, F.leaky_relu, F.elu, F.dropout, F.max_pool2d,
    F.avg_pool2d, torch.relu, torch.sigmoid, torch.tanh, torch.nn.functional.sigmoid,
}  # fmt: skip
_PASS_METHODS = {"relu", "relu_", "sigmoid", "sigmoid_", "tanh", "contiguous", "clone", "detach"}
_MERGE = {
    operator.add,
    operator.mul,
    operator.sub,
    torch.add,
    torch.mul,
    torch.sub,
    operator.iadd,
    operator.imul,
}
_MERGE_METHODS = {"add", "add_", "mul", "mul_", "sub", "sub_"}


@dataclass
class Layout:
    segs: list[tuple[int, int]]  # (group id, channels)
    spatial1: bool = False  # spatial dims known to be 1x1 (after global pooling)
    flat: bool = False  # 2-D (N, C): channels are dim 1 and the last dim
    last: bool = False  # channels are the last dim (Linear outputs; also dim 1 when flat)


@dataclass
class ChannelGraph:
    """Result of the analysis: groups, which are fixed, and what each module does with which group."""

    parent: dict[int, int] = field(default_factory=dict)
    size: dict[int, int] = field(default_factory=dict)
    fixed: set[int] = field(default_factory=set)
    producers: dict[int, list[nn.Module]] = field(default_factory=dict)  # group -> convs/linears writing it
    out_group: dict[int, int] = field(default_factory=dict)  # id(module) -> group of its output channels
    in_layout: dict[int, list[tuple[int, int]]] = field(default_factory=dict)  # id(consumer) -> input layout
    bn_layout: dict[int, list[tuple[int, int]]] = field(default_factory=dict)  # id(bn) -> channel layout
    dw_layout: dict[int, list[tuple[int, int]]] = field(default_factory=dict)  # id(depthwise conv) -> layout
    modules: dict[int, Any] = field(default_factory=dict)

    def find(self, g: int) -> int:
        while self.parent[g] != g:
            self.parent[g] = self.parent[self.parent[g]]
            g = self.parent[g]
        return g

    def new(self, size: int, fixed: bool = False) -> int:
        g = len(self.parent)
        self.parent[g], self.size[g] = g, size
        if fixed:
            self.fixed.add(g)
        return g

    def union(self, a: int, b: int) -> None:
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            self.parent[rb] = ra
            if rb in self.fixed:
                self.fixed.add(ra)

    def is_fixed(self, g: int) -> bool:
        r = self.find(g)
        return r in self.fixed or any(self.find(f) == r for f in self.fixed)

    def pin(self, layout: Layout | None) -> None:
        if layout is not None:
            for g, _ in layout.segs:
                self.fixed.add(self.find(g))


def _is_global_pool(m: Any) -> bool:
    out = getattr(m, "output_size", None)
    return out == 1 or out == (1, 1) or out == (1, 1, 1)


def analyze(model: nn.Module) -> ChannelGraph:
    gm = trace(model)
    cg = ChannelGraph()
    sites = call_sites(gm, model)
    regs = registrations(model)
    env: dict[fx.Node, Layout | None] = {}

    def fixed_layout() -> Layout:
        return Layout([(cg.new(0, fixed=True), 0)])

    def lay(a: Any) -> Layout | None:
        return env.get(a) if isinstance(a, fx.Node) else None

    for node in gm.graph.nodes:
        ins = [lay(a) for a in _flat_nodes(node.args)]
        x = ins[0] if ins else None
        out: Layout | None
        if node.op in ("placeholder", "get_attr"):
            out = fixed_layout()
        elif node.op == "output":
            for arg in _flat_nodes(node.args):
                cg.pin(env.get(arg))
            out = None
        elif node.op == "call_module":
            m = model.get_submodule(str(node.target))
            cg.modules[id(m)] = m
            shared = len(sites[id(m)]) > 1 or regs[id(m)] > 1
            out = _module_rule(cg, m, x, shared)
            if out is None:
                for lay_in in ins:
                    cg.pin(lay_in)
                out = fixed_layout()
        else:
            out = _function_rule(cg, node, ins, x)
        env[node] = out
    return cg


def _flat_nodes(args: Any) -> list[fx.Node]:
    found: list[fx.Node] = []
    fx.node.map_arg(args, lambda n: found.append(n) or n)  # type: ignore[func-returns-value]
    return found


def _module_rule(cg: ChannelGraph, m: nn.Module, x: Layout | None, shared: bool) -> Layout | None:
    if x is None:
        return None
    if shared and not isinstance(m, _PASS_MODULES):  # a stateless module may be reused (BasicBlock's ReLU)
        return None
    if x.last and not x.flat and not isinstance(m, (nn.Linear, *_PASS_MODULES)):
        return None  # channels sit in the last dim of a >2-D tensor: conv/BN would read another axis
    if isinstance(m, nn.Conv1d | nn.Conv2d | nn.Conv3d):
        if m.groups == 1:
            cg.in_layout[id(m)] = x.segs
            g = cg.new(m.out_channels)
            cg.producers.setdefault(g, []).append(m)
            cg.out_group[id(m)] = g
            return Layout([(g, m.out_channels)])
        if m.groups == m.in_channels == m.out_channels:  # depthwise: channel c in -> channel c out
            cg.dw_layout[id(m)] = x.segs
            return Layout(list(x.segs))
        return None
    if isinstance(m, nn.Linear):
        unknown = any(n == 0 for _, n in x.segs)  # e.g. the model input: fixed, never sliced
        if not (x.last or unknown):
            return None
        cg.in_layout[id(m)] = x.segs
        g = cg.new(m.out_features)
        cg.producers.setdefault(g, []).append(m)
        cg.out_group[id(m)] = g
        return Layout([(g, m.out_features)], flat=x.flat, last=True)
    if isinstance(m, nn.modules.batchnorm._BatchNorm):
        cg.bn_layout[id(m)] = x.segs
        return Layout(list(x.segs), x.spatial1, x.flat, x.last)
    if isinstance(m, _PASS_MODULES):
        return Layout(list(x.segs), x.spatial1, x.flat, x.last)
    if isinstance(
        m, nn.AdaptiveAvgPool2d | nn.AdaptiveMaxPool2d | nn.AdaptiveAvgPool1d | nn.AdaptiveAvgPool3d
    ):
        return Layout(list(x.segs), _is_global_pool(m), False)
    if isinstance(m, nn.Flatten) and m.start_dim == 1 and (x.spatial1 or x.flat):
        return Layout(list(x.segs), True, True, True)
    return None


def _function_rule(
    cg: ChannelGraph, node: fx.Node, ins: list[Layout | None], x: Layout | None
) -> Layout | None:
    target = node.target
    is_method = node.op == "call_method"
    if not ins:  # no tensor argument from the graph (e.g. sizes): nothing to track
        return None
    if (is_method and target in ("size", "dim")) or target is getattr:
        return None
    if x is not None and (
        (is_method and target in _PASS_METHODS) or (not is_method and target in _PASS_FUNCS)
    ):
        return Layout(list(x.segs), x.spatial1, x.flat, x.last)
    if (is_method and target in _MERGE_METHODS) or (not is_method and target in _MERGE):
        tensors = [a for a in ins if a is not None]
        if len(tensors) == 1:
            return Layout(list(tensors[0].segs), tensors[0].spatial1, tensors[0].flat, tensors[0].last)
        a, b = tensors[0], tensors[1]
        if (
            len(tensors) == 2
            and [s for _, s in a.segs] == [s for _, s in b.segs]
            and all(s > 0 for _, s in a.segs)
        ):
            for (ga, _), (gb, _) in zip(a.segs, b.segs):
                cg.union(ga, gb)
            return Layout(list(a.segs), a.spatial1 and b.spatial1, a.flat and b.flat, a.last and b.last)
    if target in (torch.cat, torch.concat) and node.args and isinstance(node.args[0], list | tuple):
        dim = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim", 0)
        parts = [ins_ for ins_ in ins if ins_ is not None]
        known = all(
            n > 0 for p in parts for _, n in p.segs
        )  # unknown-size parts (inputs) make offsets unknown
        if dim == 1 and known and len(parts) == len(node.args[0]) and not any(p.last for p in parts):
            return Layout([s for p in parts for s in p.segs], all(p.spatial1 for p in parts), False)
    if (x is not None and target in (torch.flatten,)) or (is_method and target == "flatten"):
        start = node.args[1] if len(node.args) > 1 else node.kwargs.get("start_dim", 0)
        if x is not None and start == 1 and (x.spatial1 or x.flat):
            return Layout(list(x.segs), True, True, True)
    if x is not None and target is F.adaptive_avg_pool2d:
        size = node.args[1] if len(node.args) > 1 else node.kwargs.get("output_size")
        return Layout(list(x.segs), size in (1, (1, 1)), False)
    if x is not None and is_method and target == "mean":
        dims = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim")
        keep = node.kwargs.get("keepdim", False) or (len(node.args) > 2 and node.args[2])
        if isinstance(dims, list | tuple) and sorted(dims) in ([2, 3], [-2, -1]):
            return Layout(list(x.segs), True, not keep, not keep)
    for lay_in in ins:
        cg.pin(lay_in)
    return Layout([(cg.new(0, fixed=True), 0)])
