"""Give every call site of a reused module instance its own copy (the fix for fusion and quantization hazards).

Why: a module called at two places (one ``self.relu`` used after every conv, a conv applied twice) breaks
rewrites that think per instance: eager ``fuse_modules`` silently drops the other call's ReLU, PT2E non-strict
export fails, per-site observers share one range, and a BN can never be folded into a conv used twice.
When: before fusing, quantizing or exporting a model you did not write. Cheap: stateless modules are copied free.
Caveats: the real call graph is traced with torch.fx, and when one attribute is called at several sites the
model's class is swapped for a subclass whose ``forward`` is the traced one (data-dependent Python control flow is frozen to the traced
path). Copies of modules with parameters are independent afterwards: tied weights are untied, so a warning is
raised - fine for inference, wrong if you keep training and want them tied.
See also: fuse_conv_bn, quantize, 推理加速 / 操作融合.
"""

from __future__ import annotations

import copy
import warnings
from typing import Any

import torch
from torch import nn

from pytorchtricks.core import BenchCase, NoEffectWarning, TrickInfo
from pytorchtricks.tricks._cases import inference_case
from pytorchtricks.tricks.graph import call_sites, parent_of, trace

__all__ = ["unshare_modules_"]

TRICK = TrickInfo(gains=("speed",), phase=("infer",), exact=True)


def _stateful(m: nn.Module) -> bool:
    return any(True for _ in m.parameters()) or any(True for _ in m.buffers())


def _free_name(parent: nn.Module, base: str) -> str:
    k = 1
    while hasattr(parent, f"{base}_site{k}"):
        k += 1
    return f"{base}_site{k}"


def unshare_modules_(model: nn.Module) -> nn.Module:
    """Give each call site of a shared module instance its own copy, in place; returns ``model``.

    Each extra call site gets a copy: under another registered name of the same instance when there is one
    (``self.a = self.b = m``), else a new attribute ``<name>_site<k>``; the forward becomes the traced one.

    Example:
        >>> class Net(nn.Module):
        ...     def __init__(self):
        ...         super().__init__()
        ...         self.c1, self.c2, self.relu = nn.Conv2d(3, 4, 1), nn.Conv2d(4, 4, 1), nn.ReLU()
        ...     def forward(self, x):
        ...         return self.relu(self.c2(self.relu(self.c1(x))))
        >>> net = ptt.unshare_modules_(Net())
        >>> net.relu is net.relu_site1
        False
    """
    gm = trace(model)
    changed = False
    stateful: list[str] = []
    for nodes in call_sites(gm, model).values():
        if len(nodes) < 2:
            continue
        original = model.get_submodule(str(nodes[0].target))
        # fx names every call of an instance by its first registered name; other names of it are reused first
        spare = [
            n
            for n, m in model.named_modules(remove_duplicate=False)
            if m is original and n != nodes[0].target
        ]
        for node in nodes[1:]:
            name = str(node.target)
            if spare:  # another registered name of the same instance: give it its own copy, call it here
                alt = spare.pop(0)
                parent, leaf = parent_of(model, alt)
                setattr(parent, leaf, copy.deepcopy(original))
                node.target = alt
            else:  # no name left: a new attribute next to the original
                parent, leaf = parent_of(model, name)
                new_leaf = _free_name(parent, leaf)
                parent.add_module(new_leaf, copy.deepcopy(original))
                node.target = f"{name.rsplit('.', 1)[0]}.{new_leaf}" if "." in name else new_leaf
            changed = True
        if _stateful(original):
            stateful.append(str(nodes[0].target))
    if changed:
        gm.recompile()
        for node in gm.graph.nodes:  # constants fx created while tracing live on gm: move them to the model
            if node.op == "get_attr" and not _has_attr(model, str(node.target)):
                parent, leaf = parent_of(model, str(node.target))
                value = getattr(gm, str(node.target))
                if isinstance(value, torch.Tensor):
                    parent.register_buffer(leaf, value)
        # A per-instance subclass carrying the traced forward: the model keeps its class (isinstance, methods,
        # state_dict names) and later fx traces (which read type(model).forward) see the unshared graph.
        cls = type(model)
        model.__class__ = type(
            cls.__name__, (cls,), {"forward": type(gm).forward, "__module__": cls.__module__}
        )
    if stateful:
        warnings.warn(
            f"unshare_modules_ copied module(s) with parameters or buffers ({', '.join(stateful)}): the copies no "
            "longer share weights. Fine for inference; re-tie them yourself if you keep training.",
            UserWarning,
            stacklevel=2,
        )
    if not changed:
        warnings.warn(
            "unshare_modules_ found no module called at more than one site.", NoEffectWarning, stacklevel=2
        )
    return model


def _has_attr(root: nn.Module, qualname: str) -> bool:
    obj: Any = root
    for part in qualname.split("."):
        if not hasattr(obj, part):
            return False
        obj = getattr(obj, part)
    return True


class _SharedReluNet(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.c1 = nn.Conv2d(3, width, 3, padding=1)
        self.c2 = nn.Conv2d(width, width, 3, padding=1)
        self.relu = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.relu(self.c2(self.relu(self.c1(x))))


def bench_case(size: str = "smoke", device: str = "cpu") -> BenchCase:
    """A conv net with one shared ReLU vs its unshared copy: same cost (the gain is enabling other rewrites)."""
    width, hw = (16, 32) if size == "smoke" else (64, 112)
    torch.manual_seed(0)
    base = _SharedReluNet(width).eval().to(device)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        treated = unshare_modules_(copy.deepcopy(base))
    x = torch.randn(8, 3, hw, hw, device=device)
    return inference_case(
        base,
        treated,
        x,
        description=f"conv net with a shared ReLU, {width} ch, {hw}px, batch 8",
        check=lambda a, b: torch.testing.assert_close(a, b),
    )
