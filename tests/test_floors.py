"""The house's floors (CONTRIBUTING.md): nothing imports upward - not even inside a function -, no two packages
import each other, no circles, and no package reaches into another's ``_private`` module or name.

Read from the source with ``ast`` (every ``import`` and ``from ... import`` of a ``pytorchtricks`` module, at any
depth, relative ones resolved), so a lazy import inside a function counts as much as one at the top. A package is
the first name below ``pytorchtricks`` (``data``, ``shards``, ``tricks``...); a top-level module (``core.py``) is
its own.
"""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "pytorchtricks"

# bottom (0) to top; a module may import its own floor and the floors below it. Above the ground each package has
# a floor of its own, so the order between any two of them is written here; on the ground (one-module helpers that
# import nothing of ours but ``core``, and ``clock`` ``hardware``) test_no_two_packages_import_each_other keeps it.
# CONTRIBUTING.md lists the same floors (test_contributing_lists_these_floors).
FLOORS: dict[str, int] = {
    "core": 0, "hardware": 0, "quiet": 0, "clock": 0, "safety": 0, "fixtures": 0, "fashion_mnist": 0,
    "tunable": 0,
    "data": 1,  # what a sample is: sources, decode, geometry, folder and detection datasets, the errors of reading
    "shards": 2,  # the packs: written from data's sources, read back through data's decoder
    "road": 3,  # open_data: a path becomes a data/ dataset or a pack's reader
    "tricks": 4,
    "catalogue": 5,  # finds the tricks
    "distributed": 6,
    "report": 7,  # renders plain data (a receipt, a run's rows): below every job that writes a page
    "bench": 8,
    "analysis": 9,
    "infer": 10,
    "integrations": 11,
    "tune": 12,
    "cli": 13,
    "__main__": 14,
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
PACKAGES = {_module(p) for p in SRC.rglob("__init__.py")}


def _edges(source: str, me: str) -> list[tuple[str, str | None, int]]:
    """``(module, name, line)`` for each ``pytorchtricks`` import in ``source`` (the text of module ``me``):
    ``from pkg import name`` is module ``pkg.name`` (name None) when that is a module (``from pytorchtricks.shards
    import layout``), else module ``pkg`` and ``name``; ``import pkg.mod`` is module ``pkg.mod``. A relative import
    is resolved against ``me``."""
    found: list[tuple[str, str | None, int]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [
                (a.name, None, node.lineno) for a in node.names if a.name.split(".")[0] == "pytorchtricks"
            ]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # from . import x / from ..pkg import y: counted against the package it names
                package = me.split(".") if me in PACKAGES else me.split(".")[:-1]
                base = ".".join(package[: len(package) - node.level + 1] + ([base] if base else []))
            if base.split(".")[0] != "pytorchtricks":
                continue
            for a in node.names:
                sub = f"{base}.{a.name}"
                found.append((sub, None, node.lineno) if sub in MODULES else (base, a.name, node.lineno))
    return found


def _imports(path: Path) -> list[tuple[str, int]]:
    """The pytorchtricks modules ``path`` imports, with the line."""
    return [(mod, line) for mod, _, line in _edges(path.read_text(encoding="utf-8"), _module(path))]


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


def _package(module: str) -> str:
    """``data`` for ``pytorchtricks.data.decode``, ``core`` for ``pytorchtricks.core``; the facade is ``pytorchtricks``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def _private_imports(source: str, me: str) -> list[str]:
    """The imports in ``source`` (module ``me``) of another package's ``_module`` or ``_name``, as ``me:line imports
    what``."""
    return [
        f"{me}:{line} imports {target}{'.' + name if name else ''}"
        for target, name, line in _edges(source, me)
        if _package(target) != _package(me) and _private(target, name)
    ]


def test_no_private_module_is_imported_across_packages():
    """A ``_module`` (or a ``_name`` of a module) is its package's own: another package (``analysis``, ``tune``,
    ``tricks``...) that needs it needs it public (or moved), not reached into."""
    found = [
        x
        for p in sorted(SRC.rglob("*.py"))
        for x in _private_imports(p.read_text(encoding="utf-8"), _module(p))
    ]
    assert not found, "private imports across packages (make them public or move them):\n" + "\n".join(found)


def _two_way(graph: dict[str, list[tuple[str, int]]]) -> list[str]:
    """Each pair of packages that import each other, with every line of both directions."""
    lines: dict[tuple[str, str], list[str]] = defaultdict(list)
    for mod, imports in graph.items():
        for target, line in imports:
            a, b = _package(mod), _package(target)
            if a != b and "pytorchtricks" not in (a, b):  # the facade maps names to module strings
                lines[(a, b)].append(f"{mod}:{line} imports {target}")
    return [
        f"{a} <-> {b}:\n  " + "\n  ".join(dict.fromkeys(lines[(a, b)] + lines[(b, a)]))
        for a, b in sorted(lines)
        if a < b and (b, a) in lines
    ]


def test_no_two_packages_import_each_other():
    """Between any two packages imports go one way: the pair's floors say which (the ground's one-module helpers
    share a floor, and this is what orders them)."""
    pairs = _two_way(_graph())
    assert not pairs, (
        "packages that import each other (pick the direction; move what goes the other way):\n"
        + ("\n".join(pairs))
    )


def test_every_package_above_the_ground_has_a_floor_of_its_own():
    taken: dict[int, list[str]] = defaultdict(list)
    for package, floor in FLOORS.items():
        taken[floor].append(package)
    shared = {f: names for f, names in taken.items() if f > 0 and len(names) > 1}
    assert not shared, f"give each package its own floor in FLOORS: {shared}"
    assert sorted(taken) == list(range(len(taken))), "FLOORS skips a number"


def test_the_checks_catch_what_they_are_for():
    """The checks above on planted cases: a two-way pair (both lines named), a private module or name reached from
    another package (``from``, ``import``, relative), and what stays allowed (the same package's own)."""
    graph = {
        "pytorchtricks.a.x": [("pytorchtricks.b.y", 3)],
        "pytorchtricks.b.y": [("pytorchtricks.a.z", 7)],
        "pytorchtricks.a.z": [("pytorchtricks.b", 1)],
        "pytorchtricks.c": [("pytorchtricks.a.x", 2)],
    }
    (pair,) = _two_way(graph)
    assert (
        pair.startswith("a <-> b:")
        and "pytorchtricks.a.x:3 imports" in pair
        and "pytorchtricks.b.y:7" in pair
    )
    assert "pytorchtricks.a.z:1" in pair and "pytorchtricks.c" not in pair
    planted = (
        "from pytorchtricks.shards import _pool\n"
        "from pytorchtricks.core import _spelt, Option\n"
        "def f():\n"
        "    import pytorchtricks.shards._pool\n"
        "    from ..shards import _pool\n"
        "    from . import _own\n"
    )
    found = _private_imports(planted, "pytorchtricks.data.decode")
    assert found == [
        "pytorchtricks.data.decode:1 imports pytorchtricks.shards._pool",
        "pytorchtricks.data.decode:2 imports pytorchtricks.core._spelt",
        "pytorchtricks.data.decode:4 imports pytorchtricks.shards._pool",
        "pytorchtricks.data.decode:5 imports pytorchtricks.shards._pool",
    ]
    assert (
        _private_imports(
            "from pytorchtricks.shards._pool import ordered_map\n", "pytorchtricks.shards.writer"
        )
        == []
    )


def _contributing_floors() -> dict[str, int]:
    """The floors block of CONTRIBUTING.md (``## The floors``): ``N  name/  name.py ...  what they are``, a line
    without a number continuing the floor above."""
    text = (ROOT / "CONTRIBUTING.md").read_text(encoding="utf-8")
    block = text.split("## The floors", 1)[1].split("```", 2)[1]
    floors: dict[str, int] = {}
    floor = -1
    for line in block.splitlines()[1:]:
        head = re.match(r"\s*(\d+)?\s+((?:[\w.]+(?:/|\.py)\s+)+)", line + " ")
        if not head:
            continue
        floor = int(head.group(1)) if head.group(1) else floor
        for name in head.group(2).split():
            floors[name.removesuffix("/").removesuffix(".py")] = floor
    return floors


def test_contributing_lists_these_floors():
    assert _contributing_floors() == FLOORS, "CONTRIBUTING.md's floors must be FLOORS here, name for name"


@pytest.mark.parametrize("package", sorted(FLOORS))
def test_every_floor_names_a_package_that_exists(package):
    assert (SRC / package).is_dir() or (SRC / f"{package}.py").is_file(), (
        f"FLOORS names {package}: no such package"
    )
