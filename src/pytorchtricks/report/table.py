"""Bench result rows as a terminal table (rich), Markdown or CSV."""

from __future__ import annotations

import csv
import io
import json
import os
from typing import Any

from pytorchtricks.core import PttError

COLUMNS = ("trick", "variant", "median", "IQR", "throughput", "ratio", "ratio IQR", "peak mem", "note")


def _fmt_s(s: float) -> str:
    if s >= 1:
        return f"{s:.3f} s"
    if s >= 1e-3:
        return f"{s * 1e3:.3f} ms"
    return f"{s * 1e6:.1f} us"


def _fmt_bytes(n: int | None) -> str:
    if n is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024  # type: ignore[assignment]
    return str(n)


def row_cells(row: dict[str, Any]) -> list[str]:
    return [
        row["trick"],
        row["variant"],
        _fmt_s(row["median_s"]),
        _fmt_s(row["iqr_s"]),
        f"{row['items_per_s']:.1f} {row.get('unit', 'calls')}/s",
        f"{row['ratio']:.2f}x",
        f"{row['ratio_q1']:.2f}-{row['ratio_q3']:.2f}",
        _fmt_bytes(row.get("peak_bytes")) + (f" ({row['peak_method']})" if row.get("peak_method") else ""),
        row.get("note", ""),
    ]


def render_rich(rows: list[dict[str, Any]], title: str | None = None) -> Any:
    from rich.table import Table

    table = Table(title=title)
    for col in COLUMNS:
        table.add_column(
            col, justify="right" if col not in ("trick", "variant", "note") else "left", no_wrap=col != "note"
        )
    for row in rows:
        table.add_row(*row_cells(row))
    return table


def to_markdown(rows: list[dict[str, Any]]) -> str:
    """Rows as a Markdown table, followed by the environment of the first row.

    Example:
        >>> print(to_markdown([]))
        | trick | variant | median | IQR | throughput | ratio | ratio IQR | peak mem | note |
        |---|---|---|---|---|---|---|---|---|
    """
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(row_cells(r)) + " |" for r in rows]
    if rows and "env" in rows[0]:
        e = rows[0]["env"]
        lines.append("")
        lines.append(
            f"Environment: {e.get('device_name')} ({e.get('device')}), {e.get('threads')} threads, "
            f"torch {e.get('torch')}, git {e.get('git_sha')}, {e.get('time_utc')}."
        )
    return "\n".join(lines)


def to_csv(rows: list[dict[str, Any]]) -> str:
    fields = [
        "trick",
        "variant",
        "size",
        "median_s",
        "q1_s",
        "q3_s",
        "iqr_s",
        "items_per_s",
        "unit",
        "ratio",
        "ratio_q1",
        "ratio_q3",
        "peak_bytes",
        "peak_method",
        "note",
    ]
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=fields, extrasaction="ignore")
    w.writeheader()
    for r in rows:
        w.writerow(r)
    return buf.getvalue()


def read_jsonl(path: str) -> list[dict[str, Any]]:
    """Read bench rows from a JSONL file; other kinds of rows are skipped. Bad lines raise with their number."""
    if not os.path.exists(path):
        raise PttError(f"no such results file: {path}. Run `ptt bench NAME --out DIR` to make one.")
    rows = []
    with open(path, encoding="utf-8") as fh:
        for i, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise PttError(
                    f"{path}:{i}: not valid JSON ({exc.msg}); is this a ptt results file?"
                ) from exc
            if isinstance(row, dict) and row.get("kind") == "bench":
                rows.append(row)
    return rows
