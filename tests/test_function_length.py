"""No function in ``src/`` is over 100 lines unless its docstring says why ("Long on purpose: ...") - issue 49."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "pytorchtricks"
MAX_LINES = 100
NOTE = "Long on purpose"

# being split (issue 49); remove when done
BEING_SPLIT: set[tuple[str, str]] = set()


def _functions(
    tree: ast.AST, prefix: str = ""
) -> Iterator[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef]]:
    """Every function and method in ``tree`` with its qualified name (``Class.method``, ``outer.inner``)."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            name = prefix + node.name
            if not isinstance(node, ast.ClassDef):
                yield name, node
            yield from _functions(node, name + ".")
        else:
            yield from _functions(node, prefix)


def lengths(root: Path = SRC) -> dict[tuple[str, str], tuple[int, bool]]:
    """(file relative to the package, qualified name) -> (lines from ``def`` to the last line, has the note)."""
    out = {}
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        rel = path.relative_to(root).as_posix()
        for name, fn in _functions(tree):
            lines = (fn.end_lineno or fn.lineno) - fn.lineno + 1
            out[(rel, name)] = (lines, NOTE in (ast.get_docstring(fn) or ""))
    return out


def too_long(found: dict[tuple[str, str], tuple[int, bool]]) -> list[str]:
    return [
        f"{rel} {name}: {lines} lines"
        for (rel, name), (lines, noted) in sorted(found.items())
        if lines > MAX_LINES and not noted and (rel, name) not in BEING_SPLIT
    ]


def test_no_function_is_over_100_lines_without_a_note() -> None:
    long = too_long(lengths())
    assert not long, (
        f"functions over {MAX_LINES} lines: split each into named steps, or say why it stays long in its "
        f'docstring ("{NOTE}: ..."):\n  ' + "\n  ".join(long)
    )


def test_the_being_split_list_names_only_long_functions() -> None:
    found = lengths()
    done = [
        f"{rel} {name}"
        for rel, name in sorted(BEING_SPLIT)
        if found.get((rel, name), (0, False))[0] <= MAX_LINES
    ]
    assert not done, (
        "split (or gone) now: remove from BEING_SPLIT in tests/test_function_length.py:\n  "
        + "\n  ".join(done)
    )


def test_the_walk_sees_methods_nested_functions_and_the_note(tmp_path: Path) -> None:
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_LINES))
    (tmp_path / "m.py").write_text(
        f"class C:\n    def method(self):\n    {body.replace(chr(10), chr(10) + '    ')}\n\n"
        f"def outer():\n    def inner():\n    {body.replace(chr(10), chr(10) + '    ')}\n\n"
        f'def noted():\n    """{NOTE}: one table."""\n{body}\n\n'
        "def short():\n    return 1\n",
        encoding="utf-8",
    )
    found = lengths(tmp_path)
    assert too_long(found) == [
        f"m.py C.method: {MAX_LINES + 1} lines",
        f"m.py outer: {MAX_LINES + 2} lines",
        f"m.py outer.inner: {MAX_LINES + 1} lines",
    ]
    assert found[("m.py", "noted")] == (MAX_LINES + 2, True) and found[("m.py", "short")] == (2, False)


if __name__ == "__main__":  # pragma: no cover - the list by hand: python tests/test_function_length.py
    for (rel, name), (lines, noted) in sorted(lengths().items(), key=lambda kv: -kv[1][0])[:20]:
        print(lines, rel, name, "(noted)" if noted else "")
