"""The command-line reference: every ``ptt`` subcommand's help, taken from the argparse parsers themselves."""

from __future__ import annotations

import argparse
import os
from collections.abc import Iterator

from pytorchtricks.cli import build_parser

WIDTH = "100"  # argparse wraps help to $COLUMNS: fixed, so the page does not depend on the terminal


def _subparsers(parser: argparse.ArgumentParser) -> Iterator[tuple[str, str, argparse.ArgumentParser]]:
    """(name, one-line help, parser) of each direct subcommand, in the order they were added."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help or "" for a in action._choices_actions}
            for name, sub in action.choices.items():
                yield name, helps.get(name, ""), sub


def walk(
    parser: argparse.ArgumentParser | None = None, prefix: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], str, argparse.ArgumentParser]]:
    """Every subcommand, depth first: (``("doctor", "run")``, help, parser)."""
    parser = parser or build_parser()
    for name, help_, sub in _subparsers(parser):
        path = (*prefix, name)
        yield path, help_, sub
        yield from walk(sub, path)


def anchor(path: tuple[str, ...]) -> str:
    """``("doctor", "run")`` -> ``ptt-doctor-run``."""
    return "-".join(("ptt", *path))


def _help_text(parser: argparse.ArgumentParser) -> str:
    old = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = WIDTH
    try:
        return parser.format_help()
    finally:
        if old is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = old


def render() -> str:
    """The page: a table of every command, then each one's ``--help``."""
    commands = list(walk())
    lines = [
        "# Command line",
        "",
        "`ptt` (also `pytorchtricks`, or `python -m pytorchtricks`) is thin: it parses, calls the library and "
        "prints. This page is generated from its argparse parsers when the site is built: what is here is what "
        "`ptt COMMAND --help` prints. Bad input exits with status 2 and one line that names the fix.",
        "",
        "| command | what it does |",
        "|---|---|",
    ]
    for path, help_, _sub in commands:
        cell = help_.replace("|", "\\|")  # a bar would end the table cell
        lines.append(f"| [`ptt {' '.join(path)}`](#{anchor(path)}) | {cell} |")
    lines.append("")
    for path, help_, sub in commands:
        level = "#" * (1 + len(path))
        lines += [f"{level} `ptt {' '.join(path)}` {{#{anchor(path)}}}", ""]
        if help_:
            lines += [help_[0].upper() + help_[1:] + ".", ""]
        lines += ["```text", _help_text(sub).rstrip(), "```", ""]
    return "\n".join(lines)
