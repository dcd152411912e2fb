"""Pages of the documentation site generated at build time from the code and from results/.

Not part of the library: mkdocs loads ``hooks.py`` (see mkdocs.yml), which adds the pages each module here renders
(the catalogue from the trick cards, the CLI reference from the argparse parsers, the API reference from
``pytorchtricks._EXPORTS``, the results pages from ``results/<cpu class>/``) and builds the nav, listing every
``docs/guides/*.md`` it finds. The tests (tests/test_docs.py) call the same functions.
"""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
RESULTS = ROOT / "results"


def escape_md(text: str) -> str:
    """Escape Markdown emphasis characters outside ``code spans`` (cards are plain text: ``W*g`` is not italics).

    Example:
        >>> escape_md("W*g and `a*b`")
        'W\\\\*g and `a*b`'
    """
    parts = text.split("`")
    for i in range(0, len(parts), 2):  # even parts lie outside backticks
        parts[i] = parts[i].replace("\\", "\\\\").replace("*", "\\*")
    return "`".join(parts)
