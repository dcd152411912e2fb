"""README.md of this folder from the runs beside it: `python3 make_readme.py > README.md` (run.sh made them, in the
order chain.sh gives)."""

import glob
import json
import os
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "..", "benchmarks"))
from demo_receipts import _summary  # noqa: E402


def runs(label: str) -> list[str]:
    return sorted(d for d in glob.glob(os.path.join(HERE, f"{label}-*")) if os.path.isdir(d))


def ratios(label: str, name: str, base: str, key: str) -> dict[str, list[float]]:
    """system -> images/s over ``base``'s in the same round, each epoch of each run."""
    out: dict[str, list[float]] = {}
    for d in runs(label):
        p = os.path.join(d, name)
        if not os.path.exists(p):
            continue
        rows = [json.loads(x) for x in open(p)]
        by = {(r["round"], r["system"]): r[key] for r in rows if key in r}
        for (rd, s), v in by.items():
            b = by.get((rd, base))
            if b and s != base:
                out.setdefault(s, []).extend(v[e] / b[e] for e in range(min(len(v), len(b))))
    return out


def fmt(v: list[float]) -> str:
    return f"{statistics.median(v):.2f} ({min(v):.2f}-{max(v):.2f}, n={len(v)})" if v else "-"


def overlap(a: list[float], b: list[float]) -> str:
    return "yes" if a and b and min(a) <= max(b) and min(b) <= max(a) else "no"


def table(title: str, note: str, b: dict[str, list[float]], a: dict[str, list[float]]) -> list[str]:
    out = ["", title, "", note, "", "| system | before | after | ranges overlap |", "|---|---|---|---|"]
    for s in a:
        out.append(f"| {s} | {fmt(b.get(s, []))} | {fmt(a[s])} | {overlap(b.get(s, []), a[s])} |")
    return out


def main() -> None:
    sha = {lab: open(os.path.join(runs(lab)[0], "commit.txt")).read()[:7] for lab in ("before", "after")}
    order = [ln.split(" start ")[1].strip() for ln in open(os.path.join(HERE, "chain.log")) if " start " in ln]
    lines = [
        f"# Issue 49 before/after check: the data wing redesigned ({sha['before']} vs {sha['after']})",
        "",
        "Intel Xeon with AMX (cpu_class amx), 2 cores, 24 GiB; each run under the exclusive `flock "
        f"/tmp/ptt-bench.lock`, nothing of ours beside it. `before` = {sha['before']} (the tree before this "
        "session's issue-49 work: the typed source, the one loader runtime, config first, the package floors, the "
        f"function splits); `after` = {sha['after']} (main). Each run is `run.sh KIND TREE LABEL` from a worktree of "
        "its commit (`PYTHONPATH=<tree>/src`, the same venv), before and after alternated (ABBA) in this order: "
        + "; ".join(order)
        + ". Raw rows: the folders here. This page: `python3 make_readme.py > README.md`.",
    ]
    lines += table(
        "## make bench-data, the core systems (2000 photos of 0.3-1 MP, RandomResizedCrop 224 + flip, batch 256, "
        "2 workers)",
        "x ImageFolder in the same round; median (min-max) over every epoch of every run (2 epochs a run). "
        "`ptt-files` / `ptt-shards` / `ptt-ram-cache` are make_loader's classification path: `before` already had "
        "the reused batch slots (issue 50); `after` runs them through the one loader runtime.",
        ratios("before", "data_loading-2000.jsonl", "imagefolder", "images_per_s"),
        ratios("after", "data_loading-2000.jsonl", "imagefolder", "images_per_s"),
    )
    lines += table(
        "## make bench-detection-data, make_detection_loader vs torchvision's reference (60 photos of 2-24 MP, "
        "shortest side 800 max 1333 + flip, batch 4, 2 workers)",
        "x the reference (`tv-hflip`) in the same round; median (min-max) over every epoch of every run.",
        ratios("before", "detection_data-60.jsonl", "tv-hflip", "images_per_s"),
        ratios("after", "detection_data-60.jsonl", "tv-hflip", "images_per_s"),
    )
    demo = []
    for lab in ("before", "after"):
        for d in runs(lab):
            if os.path.exists(os.path.join(d, "tune-out", "results.jsonl")):
                demo.append(_summary(os.path.basename(d), os.path.join(d, "tune-out")))
    if demo:
        lines += [
            "",
            "## make demo (`ptt tune` on its built-in workload; caches cleared before each run)",
            "",
            "| run | commit | verdict | recommended | verify ratio (IQR) | self-check ratio | unreliable | elapsed s |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for r in demo:
            ratio = "-" if r["ratio"] is None else f"{r['ratio']:.2f}x ({r['ratio_q1']:.2f}-{r['ratio_q3']:.2f})"
            lines.append(
                f"| {r['run']} | {r['git_sha'][:7]} | {r['verdict']} | {', '.join(r['recommended'] or []) or 'keep'} "
                f"| {ratio} | {r['self_check_ratio']} | {len(r['unreliable'])} | {r['elapsed_s']:.0f} |"
            )
    print("\n".join(lines))


if __name__ == "__main__":
    main()
