"""The catalogue page: every trick's card, as ``ptt list`` and ``ptt show NAME`` print them."""

from __future__ import annotations

from docsgen import escape_md
from docsgen.api_pages import api_page_of
from pytorchtricks import catalogue
from pytorchtricks.catalogue import CARD_SECTIONS, Trick, parse_card

WHERE_TITLES = {
    "data": "Data: what touches samples",
    "loop": "Training loop: what touches the step",
    "model": "Model: what rewrites a module",
    "runtime": "Runtime: process-wide switches",
}


def _tune_line(t: Trick) -> str:
    hook = getattr(t.load(), "TUNE", None)
    if hook is None:
        return "`ptt tune`: not a candidate (no `TUNE` hook in its module)."
    hooks = hook if isinstance(hook, tuple) else (hook,)
    names = [t.name + (f"[{h.variant}]" if h.variant else "") for h in hooks]
    checks = ", ".join(f"`{n}` checked *{h.check}*, cost *{h.cost}*" for n, h in zip(names, hooks))
    return f"`ptt tune`: a candidate through its `TUNE` hook ({checks})."


def _card(t: Trick) -> list[str]:
    sections = parse_card(t.card)
    out = [
        f"### `{t.name}` {{#{t.name}}}",
        "",
        f"**{escape_md(t.summary)}**",
        "",
        f"where: {t.where} · gains: {', '.join(t.info.gains)} · phase: {', '.join(t.info.phase)} · "
        f"exact: {'yes' if t.info.exact else 'no'} · needs: {', '.join(t.info.needs) or '-'}",
        "",
    ]
    for title in CARD_SECTIONS:
        if sections.get(title):
            out += [f"**{title}:** {escape_md(sections[title])}", ""]
    if t.exports:
        page = api_page_of(t.module)
        calls = ", ".join(f"[`ptt.{name}`](api/{page}.md#{t.module}.{name})" for name in t.exports)
        out += [f"Call: {calls}. Module: `{t.module}`.", ""]
    out += [_tune_line(t), ""]
    return out


def render() -> str:
    """The whole page, from ``catalogue.discover()``: the ``ptt list`` table, then each card by where it acts."""
    tricks = list(catalogue.discover())
    lines = [
        "# The catalogue",
        "",
        f"{len(tricks)} tricks. Each is one file `src/pytorchtricks/tricks/<where>/<name>.py`; this page is "
        "generated from those files' cards (their module docstrings) when the site is built, so there is no "
        "second copy to keep in step. The same table: `ptt list` (or `ptt list --markdown`); one card: "
        "`ptt show NAME`.",
        "",
        "| trick | where | gains | exact | what it does |",
        "|---|---|---|---|---|",
    ]
    for t in tricks:
        lines.append(
            f"| [`{t.name}`](#{t.name}) | {t.where} | {', '.join(t.info.gains)} | "
            f"{'yes' if t.info.exact else 'no'} | {escape_md(t.summary)} |"
        )
    lines.append("")
    for where in catalogue.WHERE:
        group = [t for t in tricks if t.where == where]
        if not group:
            continue
        lines += [f"## {WHERE_TITLES.get(where, where)} {{#{where}}}", ""]
        for t in group:
            lines += _card(t)
    return "\n".join(lines)
