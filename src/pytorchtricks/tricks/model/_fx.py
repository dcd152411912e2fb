"""Helpers shared by the model rewrites: trace the real call graph with torch.fx and count call sites."""

from __future__ import annotations

import warnings
from collections.abc import Iterator
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
