"""Keep the README's trick table in step with the catalogue: ``python -m pytorchtricks.report.readme README.md``."""

from __future__ import annotations

import re
import sys

from pytorchtricks.catalogue import to_markdown

PATTERN = re.compile(r"(<!-- trick-table:start[^\n]*-->\n)(.*?)(<!-- trick-table:end -->)", re.S)


def update_readme(path: str) -> bool:
    """Rewrite the table between the markers; returns True when the file changed."""
    with open(path, encoding="utf-8") as fh:
        text = fh.read()
    if not PATTERN.search(text):
        raise SystemExit(f"{path}: no <!-- trick-table:start --> ... <!-- trick-table:end --> markers")
    new = PATTERN.sub(lambda m: m.group(1) + to_markdown() + m.group(3), text)
    if new != text:
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(new)
    return new != text


if __name__ == "__main__":  # pragma: no cover
    changed = update_readme(sys.argv[1] if len(sys.argv) > 1 else "README.md")
    print("README table updated" if changed else "README table already up to date")
