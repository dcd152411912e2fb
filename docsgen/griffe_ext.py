"""A griffe extension for the API pages: read a docstring's ``Example:`` section as Google-style ``Examples:``.

Griffe parses only ``Examples:`` into code blocks; our docstrings write ``Example:`` (STYLE.md) over doctests,
which would otherwise be rendered as prose (and ``x[0]["lr"]`` read as a Markdown link).
"""

from __future__ import annotations

import re
from typing import Any

import griffe

_EXAMPLE = re.compile(r"^(\s*)Example:\s*$", re.M)


class ExampleSections(griffe.Extension):
    def on_instance(self, *, obj: Any, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = _EXAMPLE.sub(r"\1Examples:", obj.docstring.value)
