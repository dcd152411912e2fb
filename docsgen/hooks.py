"""MkDocs hooks (mkdocs.yml ``hooks:``): the nav, and the pages generated from the code and from results/.

The nav is built here rather than typed in mkdocs.yml so that every ``docs/guides/*.md`` appears without an edit:
the three journeys first, the other guides after them by file name.
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path
from typing import Any

_ROOT = Path(__file__).resolve().parent.parent
for _p in (str(_ROOT / "src"), str(_ROOT)):  # this checkout's code, whatever the environment has installed
    if _p not in sys.path:
        sys.path.insert(0, _p)

from mkdocs.structure.files import File, Files  # noqa: E402

from docsgen import DOCS, api_pages, catalogue_page, cli_page, results_pages  # noqa: E402

JOURNEYS = ("your-script.md", "your-data.md", "inference.md")
REFERENCE = ("shard-formats.md", "reliability.md", "architecture.md")


def guides(docs: Path = DOCS) -> list[str]:
    """Every guide under docs/guides/, the journeys first."""
    found = sorted(p.name for p in (docs / "guides").glob("*.md"))
    return [
        f"guides/{n}"
        for n in (*[j for j in JOURNEYS if j in found], *[n for n in found if n not in JOURNEYS])
    ]


def generated_pages() -> dict[str, str]:
    """Site path -> Markdown of every generated page."""
    pages = {"catalogue.md": catalogue_page.render(), "cli.md": cli_page.render(), **api_pages.pages()}
    pages["results/index.md"] = results_pages.index()
    for cpu in results_pages.cpu_classes():
        pages[f"results/{cpu}.md"] = results_pages.render(cpu)
    return pages


def nav() -> list[Any]:
    api = ["api/index.md", *[f"api/{slug}.md" for slug, _t, _p in api_pages.PAGES]]
    results = ["results/index.md", *[f"results/{cpu}.md" for cpu in results_pages.cpu_classes()]]
    return [
        {"Home": "index.md"},
        {"Getting started": "getting-started.md"},
        {"Guides": guides()},
        {"Reference": ["catalogue.md", "cli.md", {"API": api}, *REFERENCE]},
        {"Results": results},
    ]


_INCLUDE = re.compile(r'^<!-- include (\S+) "([^"]+)" -->$', re.M)


def include_section(path: str, heading: str) -> str:
    """The section of a repository file that starts at ``heading``, up to the next heading of its level.

    A page says ``<!-- include CONTRIBUTING.md "## The floors: nothing imports upward" -->`` to show that section
    without a second copy; a heading that is gone fails the build.
    """
    text = (_ROOT / path).read_text(encoding="utf-8")
    level = heading.split(" ", 1)[0]
    lines = text.splitlines()
    if heading not in lines:
        raise ValueError(f"{path} has no line {heading!r}: fix the include in the page that names it")
    start = lines.index(heading) + 1
    end = next(
        (i for i in range(start, len(lines)) if re.match(rf"^#{{1,{len(level)}}} ", lines[i])),
        len(lines),
    )
    return "\n".join(lines[start:end]).strip()


_TEST_TABLE = re.compile(r"^<!-- test-table (\S+) -->$", re.M)


def test_table(folder: str) -> str:
    """A table of the ``test_*.py`` files of ``folder`` with the first line of each one's module docstring."""
    rows = ["| tests | what they prove |", "|---|---|"]
    for path in sorted((_ROOT / folder).glob("test_*.py")):
        doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""
        summary = doc.strip().split("\n\n")[0].replace("\n", " ").replace("|", "/")
        rows.append(f"| `{folder}/{path.name}` | {summary} |")
    if len(rows) == 2:
        raise ValueError(f"{folder} holds no test_*.py: fix the test-table in the page that names it")
    return "\n".join(rows)


def on_page_markdown(markdown: str, page: Any, config: Any, files: Files) -> str:
    markdown = _INCLUDE.sub(lambda m: include_section(m.group(1), m.group(2)), markdown)
    return _TEST_TABLE.sub(lambda m: test_table(m.group(1)), markdown)


def on_config(config: Any) -> Any:
    config["nav"] = nav()
    return config


def on_files(files: Files, config: Any) -> Files:
    for path, text in generated_pages().items():
        files.append(File.generated(config, path, content=text))
    for src, dest in results_pages.raw_files():
        files.append(File.generated(config, dest, abs_src_path=str(src)))
    return files
