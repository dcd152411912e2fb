"""The API reference: one page per part of the package, one mkdocstrings block per module of the flat API.

What is public is what ``import pytorchtricks as ptt`` exposes (``pytorchtricks._EXPORTS``) plus each trick
module's ``__all__``; mkdocstrings renders their docstrings (signature, Args, Returns, Raises, Example) at build
time, so a new export appears here without an edit.
"""

from __future__ import annotations

import importlib

import pytorchtricks

# page slug -> (title, what it holds); a module's page is the first whose prefix it starts with
PAGES: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("data-tricks", "Data tricks", ("pytorchtricks.tricks.data",)),
    ("loop-tricks", "Training-loop tricks", ("pytorchtricks.tricks.loop", "pytorchtricks.distributed")),
    ("model-tricks", "Model tricks", ("pytorchtricks.tricks.model", "pytorchtricks.infer")),
    ("runtime-tricks", "Runtime switches", ("pytorchtricks.tricks.runtime",)),
    ("shards", "Shards and packs", ("pytorchtricks.shards",)),
    (
        "analysis",
        "Analysis, doctors and tune",
        ("pytorchtricks.analysis", "pytorchtricks.safety", "pytorchtricks.tune"),
    ),
    ("core", "Core: errors, catalogue, measuring", ("pytorchtricks",)),
)


def api_page_of(module: str) -> str:
    """The slug of the page that documents ``module``.

    Example:
        >>> api_page_of("pytorchtricks.tricks.model.fuse_conv_bn")
        'model-tricks'
    """
    for slug, _title, prefixes in PAGES:
        if any(module == p or module.startswith(p + ".") for p in prefixes):
            return slug
    raise KeyError(module)


def public_members() -> dict[str, list[str]]:
    """module -> the names it documents (empty list: the name is the module itself, e.g. ``ptt.catalogue``)."""
    from pytorchtricks import catalogue

    members: dict[str, list[str]] = {}
    for name, module in pytorchtricks._EXPORTS.items():
        names = members.setdefault(module, [])
        mod = importlib.import_module(module)
        if module.endswith("." + name) and not hasattr(mod, name):
            continue  # ptt.catalogue, ptt.distributed: the whole module
        if name not in names:
            names.append(name)
    for t in catalogue.discover():
        names = members.setdefault(t.module, [])
        names.extend(n for n in t.exports if n not in names)
    return members


def pages() -> dict[str, str]:
    """``api/<slug>.md`` -> its Markdown, plus ``api/index.md``: the flat API, name by name."""
    members = public_members()
    by_page: dict[str, list[str]] = {slug: [] for slug, _t, _p in PAGES}
    for module in sorted(members):
        by_page[api_page_of(module)].append(module)
    out: dict[str, str] = {}
    index = [
        "# API reference",
        "",
        "Everything below is reachable as `ptt.NAME` after `import pytorchtricks as ptt` (names resolve lazily: "
        "the import stays cheap). Generated at build time from the docstrings.",
        "",
        "| name | module | page |",
        "|---|---|---|",
    ]
    for name, module in sorted(pytorchtricks._EXPORTS.items(), key=lambda kv: kv[0].lower()):
        slug = api_page_of(module)
        anchor = module if name not in members[module] else f"{module}.{name}"
        index.append(
            f"| [`ptt.{name}`]({slug}.md#{anchor}) | `{module}` | {dict((s, t) for s, t, _ in PAGES)[slug]} |"
        )
    out["api/index.md"] = "\n".join(index) + "\n"
    for slug, title, _prefixes in PAGES:
        lines = [f"# {title}", ""]
        for module in by_page[slug]:
            names = members[module]
            lines.append(f"::: {module}")
            lines.append("    options:")
            lines.append("      heading_level: 2")
            if names:
                lines.append(f"      members: [{', '.join(names)}]")
            else:
                lines.append("      members: true")
                lines.append("      filters: ['!^_']")
            lines.append("")
        out[f"api/{slug}.md"] = "\n".join(lines)
    return out
