"""The house's floors (CONTRIBUTING.md): nothing imports upward - not even inside a function - and no circles.

Read from the source with ``ast`` (every ``import`` and ``from ... import`` of a ``pytorchtricks`` module, at any
depth), so a lazy import inside a function counts as much as one at the top.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "pytorchtricks"

# bottom (0) to top (4); a module may import its own floor and the floors below it
FLOORS: dict[str, int] = {
    "core": 0, "hardware": 0, "quiet": 0, "clock": 0, "safety": 0, "fixtures": 0, "fashion_mnist": 0,
    "tunable": 0,
    "shards": 1, "data": 1, "road": 1,
    "tricks": 2, "catalogue": 2, "distributed": 2,
    "analysis": 3, "bench": 3, "infer": 3, "tune": 3, "report": 3, "integrations": 3,
    "cli": 4, "__main__": 4,
}  # fmt: skip


def _module(path: Path) -> str:
    rel = path.relative_to(SRC.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _floor(module: str) -> int | None:
    parts = module.split(".")
    if len(parts) == 1:
        return None  # the package's lazy facade (names -> module strings): neither above nor below anyone
    return FLOORS.get(parts[1], -1)


MODULES = {_module(p) for p in SRC.rglob("*.py")}


def _imports(path: Path) -> list[tuple[str, int]]:
    """The pytorchtricks modules ``path`` imports, with the line: ``from pkg import name`` counts as importing
    ``pkg.name`` when that is a module (``from pytorchtricks.shards import layout``), else ``pkg``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found += [(a.name, node.lineno) for a in node.names if a.name.split(".")[0] == "pytorchtricks"]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module.split(".")[0] != "pytorchtricks":
                continue
            for a in node.names:
                sub = f"{node.module}.{a.name}"
                found.append((sub if sub in MODULES else node.module, node.lineno))
    return found


def _graph() -> dict[str, list[tuple[str, int]]]:
    return {_module(p): _imports(p) for p in sorted(SRC.rglob("*.py"))}


def test_every_module_has_a_floor():
    unknown = sorted(m for m in _graph() if _floor(m) == -1)
    assert not unknown, f"give these modules a floor in tests/test_floors.py FLOORS: {unknown}"


def test_nothing_imports_upward():
    upward = []
    for mod, imports in _graph().items():
        here = _floor(mod)
        for target, line in imports:
            there = _floor(target)
            if here is not None and there is not None and there > here:
                upward.append(f"{mod}:{line} imports {target} (floor {here} -> {there})")
    assert not upward, "upward imports:\n" + "\n".join(upward)


def test_no_circles_between_modules():
    graph = _graph()
    edges: dict[str, set[str]] = defaultdict(set)
    for mod, imports in graph.items():
        for target, _ in imports:
            if target != mod and _floor(target) is not None and not mod.startswith(target + "."):
                edges[mod].add(target)
    circles = set()
    for start in graph:
        stack, seen = [(start, (start,))], set()
        while stack:
            node, path = stack.pop()
            for nxt in edges.get(node, ()):
                if nxt == start:
                    circles.add(" -> ".join(sorted(path)))
                elif nxt not in seen and _floor(nxt) == _floor(start):
                    seen.add(nxt)
                    stack.append((nxt, (*path, nxt)))
    assert not circles, "import circles:\n" + "\n".join(sorted(circles))


def _private(module: str, name: str | None) -> bool:
    """A ``_module`` anywhere below the package (``tricks.data._folder``) or a ``_name`` imported from a module."""
    parts = module.split(".")[1:]
    hidden = any(p.startswith("_") and not p.startswith("__") for p in parts)
    return hidden or (name is not None and name.startswith("_") and not name.startswith("__"))


def test_no_private_module_is_imported_across_packages():
    """A ``_module`` (or a ``_name`` of a module) is its package's own: another package (``analysis``, ``tune``,
    ``tricks``...) that needs it needs it public (or moved), not reached into."""
    found = []
    for path in sorted(SRC.rglob("*.py")):
        me = _module(path)
        top = me.split(".")[1] if "." in me else None
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not (isinstance(node, ast.ImportFrom) and node.level == 0 and node.module):
                continue
            if node.module.split(".")[0] != "pytorchtricks" or node.module == "pytorchtricks":
                continue
            for a in node.names:
                sub = f"{node.module}.{a.name}"
                target = sub if sub in MODULES else node.module
                name = None if target == sub else a.name
                if target.split(".")[1] != top and _private(target, name):
                    found.append(f"{me}:{node.lineno} imports {target}{'.' + name if name else ''}")
    assert not found, "private imports across packages (make them public or move them):\n" + "\n".join(found)
