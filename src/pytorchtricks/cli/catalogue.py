"""The catalogue commands: ``ptt list``, ``ptt show``, ``ptt bench``, ``ptt report``."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from pytorchtricks.cli._common import _console
from pytorchtricks.core import PttError


def _add_list(sub: Any) -> None:
    p = sub.add_parser("list", help="list the tricks in the catalogue")
    p.add_argument("--where", choices=None, help="data, loop, model or runtime")
    p.add_argument("--gains", help="speed, memory, reproducibility or accuracy")
    p.add_argument("--phase", help="train or infer")
    p.add_argument("--markdown", action="store_true", help="print the table as Markdown")
    p.set_defaults(handler=_cmd_list)


def _cmd_list(args: argparse.Namespace) -> int:
    from rich.table import Table

    from pytorchtricks import catalogue

    tricks = catalogue.select(where=args.where, gains=args.gains, phase=args.phase)
    if args.markdown:
        sys.stdout.write(catalogue.to_markdown(tricks))
        return 0
    table = Table(title=f"pytorchtricks catalogue ({len(tricks)} tricks)")
    for col in ("trick", "where", "gains", "phase", "exact", "needs"):
        table.add_column(col, no_wrap=True)
    table.add_column("what it does", min_width=20)
    for t in tricks:
        table.add_row(
            t.name,
            t.where,
            ", ".join(t.info.gains),
            ", ".join(t.info.phase),
            "yes" if t.info.exact else "no",
            ", ".join(t.info.needs) or "-",
            t.summary,
        )
    _console().print(table)
    return 0


def _add_show(sub: Any) -> None:
    p = sub.add_parser("show", help="print a trick's card")
    p.add_argument("name")
    p.set_defaults(handler=_cmd_show)


def _cmd_show(args: argparse.Namespace) -> int:
    from pytorchtricks import catalogue

    t = catalogue.get(args.name)
    print(
        f"{t.name}  [{t.where}]  gains: {', '.join(t.info.gains)}  phase: {', '.join(t.info.phase)}  "
        f"exact: {'yes' if t.info.exact else 'no'}  needs: {', '.join(t.info.needs) or '-'}"
    )
    print(f"call: {', '.join('ptt.' + e for e in t.exports)}")
    print()
    print(t.card.strip())
    return 0


def _add_bench(sub: Any) -> None:
    p = sub.add_parser("bench", help="measure tricks against their baseline (interleaved A/B)")
    p.add_argument("names", nargs="*", help="trick names (see `ptt list`)")
    p.add_argument("--all", action="store_true", help="every trick in the catalogue")
    p.add_argument("--size", default="smoke", help="smoke (seconds) or full")
    p.add_argument("--device", default="cpu", help="cpu or cuda")
    p.add_argument(
        "--out", default="bench-results", help="folder for the JSONL results (default: %(default)s)"
    )
    p.set_defaults(handler=_cmd_bench)


def _cmd_bench(args: argparse.Namespace) -> int:
    from pytorchtricks import catalogue
    from pytorchtricks.bench.run import bench_many
    from pytorchtricks.core import resolve_device
    from pytorchtricks.report.table import render_rich

    resolve_device(args.device)
    names = catalogue.names() if args.all else list(args.names)
    if not names:
        raise PttError("name at least one trick (see `ptt list`) or pass --all.")
    rows, path = bench_many(names, size=args.size, device=args.device, out_dir=args.out)
    console = _console()
    console.print(render_rich(rows, title=f"ptt bench ({args.size}, {args.device})"))
    env = rows[0]["env"] if rows else {}
    console.print(
        f"ratio = baseline median / variant median (>1 is faster); medians and IQR over interleaved rounds. "
        f"{env.get('device_name')}, {env.get('threads')} threads, torch {env.get('torch')}."
    )
    if path:
        console.print(f"results appended to {path}")
    return 0


def _add_report(sub: Any) -> None:
    p = sub.add_parser("report", help="render a results JSONL file as a table, Markdown or CSV")
    p.add_argument("file")
    p.add_argument("--format", default="table", choices=("table", "md", "csv"))
    p.set_defaults(handler=_cmd_report)


def _cmd_report(args: argparse.Namespace) -> int:
    from pytorchtricks.report.table import read_jsonl, render_rich, to_csv, to_markdown

    rows = read_jsonl(args.file)
    if args.format == "md":
        print(to_markdown(rows))
    elif args.format == "csv":
        sys.stdout.write(to_csv(rows))
    else:
        _console().print(render_rich(rows, title=args.file))
    return 0
