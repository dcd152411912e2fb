"""The one place for graph questions about a module: trace the real call graph with torch.fx (piece by piece
where the whole does not trace), count registrations and call sites, find what consumes a module's output
(``successors``: "this conv feeds only this BN") and the conv -> BatchNorm pairs (``conv_bn_links``).

Used by the model rewrites (fuse, remove_conv_bias, unshare, prune, low-bit), the loop's to_inplace_abn, lint
(PTL001) and tune's diagnosis. Not a trick (leading underscore). Where the model does not trace, consumers come
from the adjacency of ``nn.Sequential`` children, which is exactly the call order there.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import fx, nn

from pytorchtricks.core import PttError

_LEAF_KINDS = (nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.Linear, nn.modules.batchnorm._BatchNorm)


class _Tracer(fx.Tracer):
    """Standard tracer that also keeps conv/Linear/BN subclasses (low-bit layers) and RepVGG-style blocks whole."""

    def is_leaf_module(self, m: nn.Module, module_qualified_name: str) -> bool:
        if callable(getattr(m, "reparameterize_", None)) or callable(getattr(m, "switch_to_deploy", None)):
            return True  # re-parameterizable blocks change their insides later: the graph must call the block
        return isinstance(m, _LEAF_KINDS) or super().is_leaf_module(m, module_qualified_name)


def trace(model: nn.Module) -> fx.GraphModule:
    """``torch.fx`` trace with a PttError that says what to do when the forward is not traceable."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            graph = _Tracer().trace(model)
            return fx.GraphModule(model, graph, type(model).__name__)
    except Exception as exc:
        raise PttError(
            f"cannot trace {type(model).__name__} with torch.fx ({type(exc).__name__}: {str(exc)[:200]}); "
            "make data-dependent control flow static, or apply the rewrite to traceable submodules."
        ) from exc


def traced_pieces(model: nn.Module, prefix: str = "") -> Iterator[tuple[str, nn.Module, fx.GraphModule]]:
    """Trace ``model``; where that fails, trace its children instead, recursively (their own forwards are known).

    Yields ``(qualified_prefix, module, graph_module)``.
    """
    try:
        yield prefix, model, trace(model)
    except PttError:
        for name, child in model.named_children():
            yield from traced_pieces(child, f"{prefix}{name}.")


def registrations(model: nn.Module) -> dict[int, int]:
    """How many qualified names each submodule instance is registered under (>1 means shared by name)."""
    counts: dict[int, int] = {}
    for _, m in model.named_modules(remove_duplicate=False):
        counts[id(m)] = counts.get(id(m), 0) + 1
    return counts


def call_sites(gm: fx.GraphModule, root: nn.Module) -> dict[int, list[fx.Node]]:
    """Graph nodes calling each leaf module instance (by identity, so two names of one module count together)."""
    sites: dict[int, list[fx.Node]] = {}
    for node in gm.graph.nodes:
        if node.op == "call_module":
            sites.setdefault(id(root.get_submodule(node.target)), []).append(node)
    return sites


def attr_users(gm: fx.GraphModule, root: nn.Module) -> set[int]:
    """Instances whose parameters are read directly (``get_attr``), e.g. ``F.conv2d(x, self.conv.weight)``."""
    used: set[int] = set()
    for node in gm.graph.nodes:
        if node.op == "get_attr" and "." in str(node.target):
            owner = str(node.target).rsplit(".", 1)[0]
            try:
                used.add(id(root.get_submodule(owner)))
            except AttributeError:
                pass
    return used


def runtime_calls(model: nn.Module, example_inputs: Any) -> tuple[dict[int, int], dict[int, int]]:
    """Run ``model`` once with forward hooks: (calls per module instance, ndim of each module's last output)."""
    counts: dict[int, int] = {}
    ndims: dict[int, int] = {}
    handles = []

    def hook(mod: nn.Module, _inp: Any, out: Any) -> None:
        counts[id(mod)] = counts.get(id(mod), 0) + 1
        if isinstance(out, torch.Tensor):
            ndims[id(mod)] = out.dim()

    for m in model.modules():
        handles.append(m.register_forward_hook(hook))
    args = tuple(example_inputs) if isinstance(example_inputs, list | tuple) else (example_inputs,)
    try:
        with torch.no_grad():
            model(*(a.clone() if isinstance(a, torch.Tensor) else a for a in args))
    finally:
        for h in handles:
            h.remove()
    return counts, ndims


def parent_of(root: nn.Module, qualname: str) -> tuple[nn.Module, str]:
    """The module owning ``qualname`` and the attribute name inside it."""
    if "." in qualname:
        parent, leaf = qualname.rsplit(".", 1)
        return root.get_submodule(parent), leaf
    return root, qualname


@dataclass
class Link:
    """``first`` (at ``first_name``) feeds ``second`` (at ``second_name``) and nothing else; None if unknown."""

    first_name: str
    first: nn.Module
    second_name: str | None
    second: nn.Module | None


def successors(model: nn.Module, first_types: tuple[type, ...]) -> list[Link]:
    """Every submodule of ``first_types`` with its sole consumer module (when there is exactly one)."""
    regs = registrations(model)
    links: dict[int, Link] = {}
    _walk(model, "", first_types, regs, links)
    return list(links.values())


def _walk(
    mod: nn.Module, prefix: str, types: tuple[type, ...], regs: dict[int, int], out: dict[int, Link]
) -> None:
    if isinstance(mod, types):
        out.setdefault(id(mod), Link(prefix.rstrip("."), mod, None, None))
        return
    if not any(isinstance(m, types) for m in mod.modules()):
        return
    try:
        gm = trace(mod)
    except PttError:
        gm = None
    if gm is not None:
        _from_graph(mod, gm, prefix, types, regs, out)
        return
    if isinstance(mod, nn.Sequential):
        kids = list(mod.named_children())
        for (na, a), (nb, b) in zip(kids, kids[1:]):
            if isinstance(a, types) and regs.get(id(a), 0) == 1 and regs.get(id(b), 0) == 1:
                out[id(a)] = Link(f"{prefix}{na}", a, f"{prefix}{nb}", b)
    for name, child in mod.named_children():
        _walk(child, f"{prefix}{name}.", types, regs, out)


def _from_graph(
    root: nn.Module, gm: fx.GraphModule, prefix: str, types: tuple[type, ...], regs: dict[int, int], out: dict
) -> None:
    calls: dict[int, int] = {}
    for node in gm.graph.nodes:
        if node.op == "call_module":
            m = root.get_submodule(node.target)
            calls[id(m)] = calls.get(id(m), 0) + 1
    for node in gm.graph.nodes:
        if node.op != "call_module":
            continue
        a = root.get_submodule(node.target)
        if not isinstance(a, types):
            continue
        link = Link(prefix + str(node.target), a, None, None)
        users = list(node.users)
        once = calls[id(a)] == 1 and regs.get(id(a), 0) == 1
        if once and len(users) == 1 and users[0].op == "call_module" and users[0].args[:1] == (node,):
            b = root.get_submodule(users[0].target)
            if calls[id(b)] == 1 and regs.get(id(b), 0) == 1:
                link = Link(link.first_name, a, prefix + str(users[0].target), b)
        if not once:
            link.second = link.second_name = None
        out[id(a)] = link


def set_submodule(root: nn.Module, qualname: str, new: nn.Module) -> None:
    """Replace the submodule at ``qualname`` (keeps the name, so state_dict keys stay the same)."""
    parent = root.get_submodule(qualname.rsplit(".", 1)[0]) if "." in qualname else root
    setattr(parent, qualname.rsplit(".", 1)[-1], new)


CONVS = (nn.Conv1d, nn.Conv2d, nn.Conv3d)
BATCHNORMS = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d, nn.SyncBatchNorm)


def conv_bn_links(model: nn.Module) -> list[Link]:
    """Every convolution whose output feeds one BatchNorm and nothing else (called once each)."""
    return [lk for lk in successors(model, CONVS) if isinstance(lk.second, BATCHNORMS)]
