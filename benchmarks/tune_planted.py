"""`ptt tune` on a workload with three planted problems, run twice: does it find and fix each, and is the
combination better than each single fix? Do two runs recommend the same tricks with agreeing speedups?

Planted: conv layers with a bias feeding BatchNorm; fp32 on a CPU with native bf16; an input-bound loader
(num_workers=0, PNG photos decoded per sample). Writes results/<cpu class>/tune-planted.jsonl (every receipt row, with the
environment) and results/<cpu class>/tune-planted.md. Run with `make bench-tune` (under flock: one benchmark at a time).
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile

from torch import nn

SIZE = 32
BATCH = 16


def planted() -> nn.Module:
    """A small CNN whose convs all carry a bias before their BatchNorm."""

    def block(cin: int, cout: int, stride: int) -> list[nn.Module]:
        return [nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=True), nn.BatchNorm2d(cout), nn.ReLU()]

    return nn.Sequential(
        *block(3, 64, 1),
        *block(64, 128, 2),
        *block(128, 128, 1),
        *block(128, 256, 2),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(256, 4),
    )


def png_photos(root: str, classes: int = 4, per_class: int = 24) -> str:
    """Real photos (``data.photoset``, 512-1024 px) re-saved as PNG: no reduced-scale decode possible."""
    from PIL import Image

    from pytorchtricks.data.photoset import build_photo_set

    src = os.path.join(root, "jpeg")
    build_photo_set(src, classes * per_class, max_sources=classes)
    out = os.path.join(root, "png")
    for cls in sorted(os.listdir(src)):
        os.makedirs(os.path.join(out, cls), exist_ok=True)
        if not os.path.isdir(os.path.join(src, cls)):
            continue
        for f in sorted(os.listdir(os.path.join(src, cls))):
            with Image.open(os.path.join(src, cls, f)) as im:
                im.save(os.path.join(out, cls, f.replace(".jpg", ".png")))
    return out


def _verify_table(res: dict) -> list[str]:
    lines = ["| variant | tricks | images/s | speedup vs baseline | IQR |", "|---|---|---|---|---|"]
    for m in res["final"]:
        lines.append(
            f"| {m['label']} | {' + '.join(m['tricks']) or '-'} | {m['items_per_s']:.1f} | {m['ratio']:.2f}x | "
            f"{m['ratio_q1']:.2f}-{m['ratio_q3']:.2f} |"
        )
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    from pytorchtricks.hardware import cpu_caps  # results are filed by CPU class

    ap.add_argument("--out", default=os.path.join("results", cpu_caps().cpu_class))
    ap.add_argument("--budget", type=float, default=150.0, help="seconds per tune run")
    args = ap.parse_args()

    from pytorchtricks.clock import write_jsonl
    from pytorchtricks.tune.engine import tune_model
    from pytorchtricks.tune.receipt import payload, rows

    os.makedirs(args.out, exist_ok=True)
    spec = f"{os.path.abspath(__file__)}:planted"
    runs = []
    with tempfile.TemporaryDirectory(prefix="ptt-tune-planted-") as tmp:
        data = png_photos(tmp)
        for _ in range(2):
            res = tune_model(
                spec, data, batch_size=BATCH, input_size=SIZE, time_budget_s=args.budget, out=None
            )
            runs.append(payload(res))
    jsonl = os.path.join(args.out, "tune-planted.jsonl")
    if os.path.exists(jsonl):
        os.remove(jsonl)
    for i, p in enumerate(runs):
        write_jsonl(jsonl, [{"run": i + 1, **r} for r in rows(p)])
    env = runs[0]["env"]
    md = [
        "# `ptt tune` on planted problems",
        "",
        f"Model: 4 conv blocks with conv bias before BN (`benchmarks/tune_planted.py:planted`), batch {BATCH}, "
        f"{SIZE} px, training; data: 96 real-photo PNG tiles (384 px) decoded per sample by a num_workers=0 loader.",
        f"Hardware: {env['device_name']}, {env['threads']} threads, torch {env['torch']}, flags "
        f"{', '.join(env['cpu_flags'])}; git {env['git_sha']}; {env['time_utc']}; load average at the start of "
        f"each run: {', '.join(str(p['workload']['loadavg_1m_at_start']) for p in runs)} "
        f"(OMP_WAIT_POLICY={runs[0]['workload']['omp_wait_policy']}).",
        "Model tricks are A/B-measured on the compute step (batches staged in memory), loader settings on the "
        "whole step; the combination and verify runs time the whole step.",
        "Ratios: median of paired per-round ratios over interleaved rounds (IQR in brackets); 'combined' is "
        "re-measured in the same rounds as each single trick, never multiplied.",
        "",
    ]
    for i, p in enumerate(runs):
        ids = [f["id"] for f in (p["diagnosis"] or {}).get("findings", [])]
        md += [
            f"## Run {i + 1}: {p['elapsed_s']:.0f} s of a {p['budget_s']:.0f} s budget",
            "",
            f"Diagnosis: {p['diagnosis']['verdict'] if p['diagnosis'] else '-'}; findings: {', '.join(ids) or '-'}.",
            f"Recommended: **{', '.join(p['recommended']) or 'nothing'}**.",
            "",
            *_verify_table(p),
            "",
            "Candidates: "
            + "; ".join(
                f"`{c['name']}` {c['status']} ({c['reason']})"
                for c in p["candidates"]
                if c["status"] != "skipped"
            ),
            "",
        ]
    a, b = runs
    same = a["recommended"] == b["recommended"]
    md.append(
        f"Same recommendation in both runs: **{'yes' if same else 'no'}** "
        f"({', '.join(a['recommended']) or '-'} / {', '.join(b['recommended']) or '-'})."
    )
    if a["combined"] and b["combined"]:
        ca, cb = a["combined"], b["combined"]
        overlap = not (ca["ratio_q3"] < cb["ratio_q1"] or cb["ratio_q3"] < ca["ratio_q1"])
        md.append(
            f"Headline speedups {ca['ratio']:.2f}x [{ca['ratio_q1']:.2f}-{ca['ratio_q3']:.2f}] and "
            f"{cb['ratio']:.2f}x [{cb['ratio_q1']:.2f}-{cb['ratio_q3']:.2f}]: spreads "
            f"{'overlap' if overlap else 'do NOT overlap'}."
        )
    with open(os.path.join(args.out, "tune-planted.md"), "w", encoding="utf-8") as fh:
        fh.write("\n".join(md) + "\n")
    print("\n".join(md))
    print(json.dumps({"jsonl": jsonl}))


if __name__ == "__main__":
    main()
