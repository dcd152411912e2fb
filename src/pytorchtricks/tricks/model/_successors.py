"""Find what consumes a module's output: "Conv feeds only this BN", "BN feeds only this LeakyReLU".

Used by remove_conv_bias_before_bn and to_inplace_abn. The real call graph comes from torch.fx where the model
traces (pieces that do not trace are traced child by child); inside untraceable leaves we fall back to the
adjacency of ``nn.Sequential`` children, which is exactly the call order there.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import fx, nn

from pytorchtricks.core import PttError
from pytorchtricks.tricks.model._fx import registrations, trace


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
