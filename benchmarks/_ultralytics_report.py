"""The Ultralytics benchmark's page: every part's JSONL under the results folder read back into README.md (the
tables, ratios per round against stock, the issue's bounds with the measured numbers), environment.json and
command.txt."""

from __future__ import annotations

import json
import os
import statistics
from collections.abc import Callable
from typing import Any

PARTS = ("load", "pipeline", "first-batch", "epoch", "ram")
MIB = 1 << 20


def read(out: str) -> dict[str, list[dict[str, Any]]]:
    rows: dict[str, list[dict[str, Any]]] = {}
    for part in PARTS:
        path = os.path.join(out, f"{part}.jsonl")
        if os.path.exists(path):
            with open(path) as f:
                rows[part] = [json.loads(line) for line in f if line.strip()]
    return rows


def _med(v: list[float]) -> str:
    if not v:
        return "-"
    if len(v) == 1:
        return f"{v[0]:.3g}"
    return f"{statistics.median(v):.3g} ({min(v):.3g}-{max(v):.3g})"


def values(
    rows: list[dict[str, Any]], case: str, system: str, key: Callable[[dict[str, Any]], Any]
) -> list[float]:
    out = []
    for r in rows:
        if r["case"] == case and r["system"] == system and "error" not in r:
            v = key(r)
            if v is not None:
                out.append(float(v))
    return out


def ratios(
    rows: list[dict[str, Any]], case: str, system: str, key: Callable[[dict[str, Any]], Any]
) -> list[float]:
    """``system`` over ``stock`` in each round where both ran (higher key = faster)."""
    by = {(r["round"], r["system"]): key(r) for r in rows if r["case"] == case and "error" not in r}
    out = []
    for (rnd, s), v in by.items():
        base = by.get((rnd, "stock"))
        if s == system and v is not None and base:
            out.append(float(v) / float(base))
    return out


def _cases(rows: list[dict[str, Any]]) -> list[str]:
    return list(dict.fromkeys(r["case"] for r in rows))


def _systems(rows: list[dict[str, Any]]) -> list[str]:
    return list(dict.fromkeys(r["system"] for r in rows))


def _errors(rows: list[dict[str, Any]]) -> list[str]:
    seen = dict.fromkeys(f"`{r['system']}`, {r['case']}: {r['error']}" for r in rows if "error" in r)
    return [f"- {e}" for e in seen]


def load_table(rows: list[dict[str, Any]]) -> list[str]:
    out = [
        "| case | system | img/s, all photos | img/s, >= 8 MP | vs stock, all | vs stock, >= 8 MP | "
        "vs stock, >= 8 MP baseline / progressive JPEG | PSNR vs stock (median, min) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for c in _cases(rows):
        for s in _systems(rows):
            ps = values(rows, c, s, lambda r: r.get("psnr_db_median"))
            pm = values(rows, c, s, lambda r: r.get("psnr_db_min"))
            out.append(
                f"| {c} | {s} | {_med(values(rows, c, s, lambda r: r['images_per_s']))} | "
                f"{_med(values(rows, c, s, lambda r: r['images_per_s_8mp']))} | "
                f"{_med(ratios(rows, c, s, lambda r: r['images_per_s']))}x | "
                f"{_med(ratios(rows, c, s, lambda r: r['images_per_s_8mp']))}x | "
                f"{_med(ratios(rows, c, s, lambda r: r.get('images_per_s_8mp_baseline')))}x / "
                f"{_med(ratios(rows, c, s, lambda r: r.get('images_per_s_8mp_progressive')))}x | "
                + (f"{statistics.median(ps):.1f} dB, {min(pm):.1f} dB |" if ps else "- |")
            )
    return out


SPLIT = {
    "load": "load",
    "Mosaic": "mosaic",
    "RandomPerspective": "affine",
    "RandomHSV": "HSV",
    "Format": "format",
}


def _split(r: dict[str, Any]) -> dict[str, float]:
    """A row's stage split (ms per image) as the page shows it: the named stages, the rest summed."""
    got = r.get("split_ms_per_image") or {}
    out = {v: float(got.get(k, 0.0)) for k, v in SPLIT.items()}
    out["rest"] = sum(float(v) for k, v in got.items() if k not in SPLIT)
    return out


def pipeline_table(rows: list[dict[str, Any]]) -> list[str]:
    cols = [*SPLIT.values(), "rest"]
    out = [
        "| case | system | img/s (loader, 2 workers) | vs stock | build s | "
        + " | ".join(f"{k} ms" for k in cols)
        + " |",
        "|---|---|---|---|---|" + "---|" * len(cols),
    ]
    for c in _cases(rows):
        for s in _systems(rows):
            split = []
            for k in cols:
                v = [
                    _split(r)[k]
                    for r in rows
                    if r["case"] == c and r["system"] == s and "split_ms_per_image" in r
                ]
                split.append(f"{statistics.median(v):.3g}" if v else "-")
            out.append(
                f"| {c} | {s} | {_med(values(rows, c, s, lambda r: r['images_per_s']))} | "
                f"{_med(ratios(rows, c, s, lambda r: r['images_per_s']))}x | "
                f"{_med(values(rows, c, s, lambda r: r['build_s']))} | " + " | ".join(split) + " |"
            )
    return out


def first_batch_table(rows: list[dict[str, Any]]) -> list[str]:
    out = ["| system | case | images | dataset built s | first batch s |", "|---|---|---|---|---|"]
    for r in rows:
        if "error" in r:
            continue
        out.append(
            f"| {r['system']} | {r['case']} | {r['images']} | {r['dataset_s']:.2f} | {r['first_batch_s']:.2f} |"
        )
    return out


def epoch_table(rows: list[dict[str, Any]]) -> list[str]:
    out = [
        "| case | system | images | epoch s | img/s | vs stock | data wait share |",
        "|---|---|---|---|---|---|---|",
    ]
    for c in _cases(rows):
        for s in _systems(rows):
            v = values(rows, c, s, lambda r: r["epoch_s"])
            if not v:
                continue
            n = next(r["images"] for r in rows if r["case"] == c and r["system"] == s and "error" not in r)
            out.append(
                f"| {c} | {s} | {n} | {_med(v)} | {_med(values(rows, c, s, lambda r: r['images_per_s']))} | "
                f"{_med(ratios(rows, c, s, lambda r: r['images_per_s']))}x | "
                f"{_med(values(rows, c, s, lambda r: r.get('data_wait_share')))} |"
            )
    return out


def ram_table(rows: list[dict[str, Any]]) -> list[str]:
    out = [
        "| system | images | cache | cache MiB per rank | processes | USS sum MiB | PSS sum MiB | per rank USS / PSS MiB |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if "error" in r:
            continue
        per = ", ".join(f"{x['uss'] / MIB:.0f} / {x['pss'] / MIB:.0f}" for x in r["ranks"])
        cache = ", ".join(f"{b / MIB:.0f}" for b in r["cache_bytes_per_rank"])
        out.append(
            f"| {r['system']} | {r['images']} | {r['cache']} | {cache} | {r['processes']} | "
            f"{r['uss_sum_bytes'] / MIB:.0f} | {r['pss_sum_bytes'] / MIB:.0f} | {per} |"
        )
    return out


def _bound(name: str, got: list[float], bound: float) -> str:
    if not got:
        return f"- {name}: not measured (see the tables' notes)"
    med = statistics.median(got)
    verdict = "met" if med >= bound else "MISSED"
    return f"- {name}: {_med(got)}x, bound >= {bound:g}x: **{verdict}**"


def _first(rows: list[dict[str, Any]], system: str, case: str) -> float | None:
    got = [
        r["first_batch_s"] for r in rows if r["system"] == system and r["case"] == case and "error" not in r
    ]
    return got[0] if got else None


def acceptance(rows: dict[str, list[dict[str, Any]]]) -> list[str]:
    """The issue's bounds, each with the measured median (min-max) over rounds and whether it is met."""
    out = []
    load = rows.get("load", [])
    out.append(
        _bound(
            "load stage, >= 8 MP photos from the original files, imgsz 640 (ptt-files vs stock)",
            ratios(load, "imgsz 640", "ptt-files", lambda r: r["images_per_s_8mp"]),
            1.8,
        )
    )
    out.append(
        _bound(
            "load stage, >= 8 MP photos from a pack written for 640 (ptt-pack vs stock)",
            ratios(load, "imgsz 640", "ptt-pack", lambda r: r["images_per_s_8mp"]),
            8,
        )
    )
    ps = values(load, "imgsz 640", "ptt-pack", lambda r: r.get("psnr_db_median"))
    pm = values(load, "imgsz 640", "ptt-pack", lambda r: r.get("psnr_db_min"))
    if ps:
        out.append(
            f"- the pack's PSNR against the stock load at 640: median {statistics.median(ps):.1f} dB, "
            f"lowest photo {min(pm):.1f} dB"
        )
    pipe = rows.get("pipeline", [])
    out.append(
        _bound(
            "whole data pipeline from the pack, imgsz 640, cache none (ptt-pack vs stock)",
            ratios(pipe, "imgsz 640, cache none", "ptt-pack", lambda r: r["images_per_s"]),
            2,
        )
    )
    fb = rows.get("first-batch", [])
    scan, cached = _first(fb, "stock", "first run: label scan"), _first(fb, "stock", "with its labels cache")
    for case in ("first open: its index and targets read cold", "opened again"):
        pk = _first(fb, "ptt-pack", case)
        if scan and pk:
            out.append(
                _bound(
                    f"time to first batch at 100K, pack ({case}) vs stock's first-run label scan",
                    [scan / pk],
                    10,
                )
                + (f"; vs stock with its labels cache {cached / pk:.3g}x" if cached else "")
            )
    ep = rows.get("epoch", [])
    for c in _cases(ep):
        if c.startswith("declared"):
            out.append(
                _bound(
                    f"epoch with a {c} (projection), ptt-pack vs stock",
                    ratios(ep, c, "ptt-pack", lambda r: r["images_per_s"]),
                    2,
                )
            )
    ram = [r for r in rows.get("ram", []) if "error" not in r]
    stock = next((r for r in ram if r["system"] == "stock"), None)
    for r in ram:
        if r["system"] != "stock":
            pss = (
                f"; every process of the node together (PSS sum: what the node holds) {r['pss_sum_bytes'] / MIB:.0f} "
                f"MiB vs stock's {stock['pss_sum_bytes'] / MIB:.0f} MiB, "
                f"{(stock['pss_sum_bytes'] - r['pss_sum_bytes']) / MIB:.0f} MiB less (one copy of the cache is "
                f"{r['cache_bytes_per_rank'][0] / MIB:.0f} MiB)"
                if stock
                else ""
            )
            out.append(
                f"- cache='ram', 2 ranks, {r['system']}: {len(r['arenas'])} arena for the node, mapped by both ranks "
                f"({', '.join(f'{b / MIB:.0f}' for b in r['cache_bytes_per_rank'])} MiB as each rank sees it); "
                f"stock: one {stock['cache_bytes_per_rank'][0] / MIB if stock else 0:.0f} MiB buffer per rank"
                + pss
            )
    return out


TABLES = {
    "load": ("The load stage: bytes to an image at imgsz", load_table),
    "pipeline": ("The whole data pipeline: its dataset, augmentations and loader", pipeline_table),
    "first-batch": ("Time to the first batch", first_batch_table),
    "epoch": ("The training epoch", epoch_table),
    "ram": ("cache='ram' under torchrun, 2 ranks", ram_table),
}


def write_report(out: str, args: dict[str, Any]) -> str:
    """README.md, environment.json and command.txt under ``out`` from the parts' JSONL; returns the page."""
    rows = read(out)
    env = next((r["env"] for part in rows.values() for r in part), {})
    lines = [
        "# Stock Ultralytics YOLO vs with ptt (issue 47 part 5)",
        "",
        f"{env.get('cpu')} ({env.get('cpu_count')} cores, class {env.get('cpu_class')}), torch {env.get('torch')}, "
        f"Ultralytics 8.4.190 in its own venv (`make ultralytics-env`), git {env.get('git_sha')}. Photos: the Debian "
        "wallpapers of 2-24 MP, linked (not copied) under /tmp with seeded YOLO boxes. Each measurement in its own "
        "child process; rounds interleave the systems; ratios are per round against `stock`, median (min-max).",
        "",
    ]
    lines += [
        "## The issue's bounds (imgsz 640, same workers, same machine, interleaved)",
        "",
        *acceptance(rows),
        "",
    ]
    for part, (title, table) in TABLES.items():
        if part not in rows:
            continue
        part_env = rows[part][0]["env"]
        lines += [
            f"## {title}",
            "",
            f"Run {part_env.get('time_utc')}, load average at its start {part_env.get('loadavg_1m_at_start')}.",
            "",
            *table(rows[part]),
            "",
        ]
        errs = _errors(rows[part])
        if errs:
            lines += ["Not measured:", "", *errs, ""]
    notes = os.path.join(out, "notes.md")  # what limits a number, written by hand after reading the run
    if os.path.exists(notes):
        with open(notes) as f:
            lines += ["## Reading the numbers", "", f.read().strip(), ""]
    page = "\n".join(lines)
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "README.md"), "w") as f:
        f.write(page)
    with open(os.path.join(out, "environment.json"), "w") as f:
        json.dump(env, f, indent=1)
    with open(os.path.join(out, "command.txt"), "w") as f:
        f.write("make ultralytics-env && make bench-ultralytics\n")
        for part in rows:
            f.write(f"{rows[part][0]['env'].get('command')}\n")
    return page
