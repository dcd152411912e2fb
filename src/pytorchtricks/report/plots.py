"""Plots of a tune receipt as self-contained SVG strings (matplotlib, Agg backend, no files, no fonts fetched).

Each function takes plain numbers (as stored in ``results.jsonl``) and returns ``<svg>...</svg>`` text that
``report.html`` embeds inline. Output is deterministic (fixed hash salt, no date metadata).
"""

from __future__ import annotations

import io
from typing import Any

from pytorchtricks.core import require

KEPT, OTHER, BASE = "#2a9d8f", "#adb5bd", "#264653"


def _plt() -> Any:
    mpl = require("matplotlib", "report")
    mpl.use("Agg", force=True)
    mpl.rcParams["svg.hashsalt"] = "ptt"
    mpl.rcParams["svg.fonttype"] = "path"  # text as paths: renders the same without the fonts installed
    import matplotlib.pyplot as plt

    return plt


def _svg(fig: Any) -> str:
    plt = _plt()
    buf = io.StringIO()
    fig.savefig(buf, format="svg", bbox_inches="tight", metadata={"Date": None})
    plt.close(fig)
    text = buf.getvalue()
    return text[text.index("<svg") :]


def step_breakdown(
    before: dict[str, float],
    after: dict[str, float] | None,
    labels: tuple[str, str] = ("baseline", "recommended"),
) -> str:
    """Stacked horizontal bars: milliseconds per step in each stage, baseline vs recommended (or ``labels``)."""
    plt = _plt()
    rows = [(labels[0], before)] + ([(labels[1], after)] if after else [])
    stages = list(dict.fromkeys(k for _, d in rows for k in d))
    colors = plt.get_cmap("tab10")
    fig, ax = plt.subplots(figsize=(7.5, 0.9 + 0.6 * len(rows)))
    for i, (_, d) in enumerate(reversed(rows)):
        left = 0.0
        for j, st in enumerate(stages):
            v = d.get(st, 0.0) * 1e3
            ax.barh(i, v, left=left, color=colors(j), label=st if i == 0 else None)
            left += v
        ax.text(left, i, f" {left:.0f} ms", va="center", fontsize=9)
    ax.set_yticks(range(len(rows)), [r[0] for r in reversed(rows)])
    ax.set_xlabel("milliseconds per step (mean over timed steps)")
    ax.legend(fontsize=8, loc="center left", bbox_to_anchor=(1.01, 0.5), frameon=False)
    ax.margins(x=0.15)
    ax.set_title("Where a step's time goes", fontsize=11)
    return _svg(fig)


def throughput(rows: list[dict[str, Any]], unit: str = "images/s") -> str:
    """Bars of items/s per variant with error bars spanning its interquartile range over rounds.

    ``rows``: dicts with ``label``, ``median_s``, ``q1_s``, ``q3_s``, ``items`` (per call) and ``kept`` (bool).
    """
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7.5, 0.8 + 0.42 * len(rows)))
    labels = [r["label"] for r in rows]
    mid = [r["items"] / r["median_s"] for r in rows]
    lo = [m - r["items"] / r["q3_s"] for m, r in zip(mid, rows)]
    hi = [r["items"] / r["q1_s"] - m for m, r in zip(mid, rows)]
    colors = [BASE if r["label"].startswith("baseline") else KEPT if r.get("kept") else OTHER for r in rows]
    y = list(range(len(rows)))[::-1]
    ax.barh(y, mid, xerr=[lo, hi], color=colors, capsize=3, error_kw={"elinewidth": 1})
    for yi, m in zip(y, mid):
        ax.text(m, yi, f"  {m:.0f}", va="center", fontsize=8)
    ax.set_yticks(y, labels)
    ax.set_xlabel(f"{unit} (median; error bar: interquartile range over interleaved rounds)")
    ax.margins(x=0.15)
    ax.set_title("Throughput per configuration (green: kept)", fontsize=11)
    return _svg(fig)


def memory(rows: list[tuple[str, int]], method: str) -> str:
    """Bars of the measured step peak (MiB) per variant."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7.5, 0.8 + 0.42 * len(rows)))
    y = list(range(len(rows)))[::-1]
    vals = [b / 2**20 for _, b in rows]
    ax.barh(y, vals, color=[BASE if n == "baseline" else OTHER for n, _ in rows])
    for yi, v in zip(y, vals):
        ax.text(v, yi, f"  {v:.0f} MiB", va="center", fontsize=8)
    ax.set_yticks(y, [n for n, _ in rows])
    ax.set_xlabel(f"peak memory of one step, MiB ({method})")
    ax.margins(x=0.18)
    ax.set_title("Memory per configuration", fontsize=11)
    return _svg(fig)


def data_stages(stages_s: dict[str, float]) -> str:
    """Bars of the input pipeline's time per sample in each stage (microseconds)."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7.5, 0.8 + 0.42 * max(1, len(stages_s))))
    names = list(stages_s)
    vals = [stages_s[n] * 1e6 for n in names]
    y = list(range(len(names)))[::-1]
    ax.barh(y, vals, color="#e9c46a")
    for yi, v in zip(y, vals):
        ax.text(v, yi, f"  {v:.0f} us", va="center", fontsize=8)
    ax.set_yticks(y, names)
    ax.set_xlabel("microseconds per sample (one process)")
    ax.margins(x=0.18)
    ax.set_title("Input pipeline stages", fontsize=11)
    return _svg(fig)


def memory_frontier(points: list[dict[str, Any]], budget_bytes: int | None, recommended: str | None) -> str:
    """The speed/memory frontier of a memory search: images/s against the measured step peak, one point per
    measured configuration (error bar: its IQR over rounds), the budget a vertical line, the Pareto front (no
    point both faster and lower) a step line, the recommendation ringed.

    ``points``: dicts with ``label``, ``peak_bytes``, ``items_per_s``, ``lo``/``hi`` (IQR in items/s), ``front``.
    """
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7.5, 4.6))
    xs = [p["peak_bytes"] / 2**20 for p in points]
    ys = [p["items_per_s"] for p in points]
    err = [[y - p["lo"] for y, p in zip(ys, points)], [p["hi"] - y for y, p in zip(ys, points)]]
    colors = [
        BASE if p["label"] == "baseline" else KEPT if p["label"] == recommended else OTHER for p in points
    ]
    ax.errorbar(xs, ys, yerr=err, fmt="none", ecolor="#999999", elinewidth=1, capsize=2, zorder=1)
    ax.scatter(xs, ys, c=colors, s=36, zorder=2)
    front = sorted((x, y) for x, y, p in zip(xs, ys, points) if p.get("front"))
    if front:
        ax.step([x for x, _ in front], [y for _, y in front], where="post", color=KEPT, lw=1, alpha=0.6,
                label="Pareto front")  # fmt: skip
    for x, y, p in zip(xs, ys, points):
        ax.annotate(p["label"], (x, y), xytext=(4, 4), textcoords="offset points", fontsize=7)
        if p["label"] == recommended:
            ax.scatter([x], [y], s=180, facecolors="none", edgecolors=KEPT, linewidths=1.5, zorder=3,
                       label="recommended")  # fmt: skip
    if budget_bytes:
        ax.axvline(
            budget_bytes / 2**20,
            color="#e76f51",
            ls="--",
            lw=1,
            label=f"budget {budget_bytes / 2**20:.0f} MiB",
        )
    ax.set_xlabel("measured peak of one training step, MiB")
    ax.set_ylabel("images/s (median of interleaved rounds)")
    ax.set_xlim(left=0)
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=8, loc="lower right", frameon=False)
    ax.set_title("Speed vs memory: every measured configuration", fontsize=11)
    return _svg(fig)


def loss_band(acc: dict[str, Any]) -> str:
    """The parity check of ``ptt tune --accuracy-steps``: the baseline's seed-to-seed band of the smoothed loss
    (its [min, max] dark, widened by the rule light) and the recommended runs' smoothed seed mean, per step.

    ``acc``: the receipt's ``accuracy`` record (``tune.accuracy.AccuracyCheck`` as plain data).
    """
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7.5, 3.6))
    steps = list(range(1, len(acc["lower"]) + 1))
    ax.fill_between(steps, acc["lower"], acc["upper"], color=BASE, alpha=0.15, lw=0, label="band, widened")
    ax.fill_between(steps, acc["band_min"], acc["band_max"], color=BASE, alpha=0.4, lw=0,
                    label=f"baseline: min-max of {acc['seeds']} seeds")  # fmt: skip
    mean = [float(v) for v in acc["recommended_mean"]]  # "inf" (a diverged run) is not drawn
    ax.plot(steps, [v if v != float("inf") else float("nan") for v in mean],
            color=KEPT if acc["answer"] == "inside" else "#e76f51", lw=1.6, label="recommended: seed mean")  # fmt: skip
    ax.set_xlabel(f"training step (losses smoothed over {acc['window']} step(s))")
    ax.set_ylabel("training loss")
    ax.legend(fontsize=8, loc="best", frameon=False)
    ax.set_title(f"Learns the same? {acc['answer']}", fontsize=11)
    return _svg(fig)
