"""ShuffleNetV2's guideline experiments G1-G4 on this machine: theoretical MAC ratio next to measured speed.

For each experiment the variants have equal FLOPs (within rounding) and differ in memory access cost (MAC: bytes
read + written, ``ptt.count_flops``). All variants of an experiment are timed forward-only, interleaved in rotating
order round after round (``clock.compare``); the table shows each variant's MAC and time relative to the
experiment's first variant (the guideline-following one). A guideline "reproduces" here when more MAC also means
more time. Run under ``flock /tmp/ptt-bench.lock`` (``make bench-design``) so benchmarks do not overlap.

    make bench-design                                  # full size (batch 8, 56x56), also on CUDA when present
    .venv/bin/python benchmarks/design_rules.py --size smoke --rounds 3
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

from pytorchtricks.analysis.design_rules import experiments
from pytorchtricks.clock import compare, environment, write_jsonl
from pytorchtricks.hardware import cpu_caps


def run(size: str, rounds: int, device: str) -> list[dict[str, object]]:
    env = environment(device)
    rows: list[dict[str, object]] = []
    for exp, variants in experiments(size).items():
        for v in variants:
            v.module.to(device)
            v.x = v.x.to(device)
        res = compare(
            {v.name: v.fn() for v in variants}, baseline=variants[0].name, rounds=rounds, device=device
        )
        base = variants[0]
        for v in variants:
            r = res[v.name]
            rows.append(
                {
                    "experiment": exp,
                    "variant": v.name,
                    "device": device,
                    "size": size,
                    "flops": v.flops,
                    "mac_bytes": v.mac_bytes,
                    "mac_ratio": v.mac_bytes / base.mac_bytes,
                    "flops_ratio": v.flops / base.flops,
                    "median_s": r.stats.median_s,
                    "iqr_s": r.stats.iqr_s,
                    "time_ratio": 1 / r.ratio,  # > 1: slower than the baseline variant
                    "time_ratio_q1": 1 / r.ratio_q3,
                    "time_ratio_q3": 1 / r.ratio_q1,
                    "rounds": rounds,
                    "env": env,
                }
            )
            print(
                f"{exp:<24} {v.name:<40} MAC x{v.mac_bytes / base.mac_bytes:5.2f}  time x{1 / r.ratio:5.2f}",
                flush=True,
            )
    return rows


def to_markdown(rows: list[dict[str, object]]) -> str:
    env = rows[0]["env"] if rows else {}
    assert isinstance(env, dict)
    lines = [
        f"# ShuffleNetV2 guidelines G1-G4 on {env.get('device_name')} (threads: {env.get('threads')}, torch "
        f"{env.get('torch')})",
        "",
        "Equal-FLOPs variants per experiment; ratios are relative to the first variant of the experiment. Time ratios "
        "are medians of paired per-round ratios over interleaved rounds, with their IQR; forward only, no grad.",
        "",
        "| experiment | variant | device | GFLOPs | MAC (MiB) | MAC ratio | time ratio [IQR] |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['experiment']} | {r['variant']} | {r['device']} | {float(r['flops']) / 1e9:.3f} | "  # type: ignore[arg-type]
            f"{float(r['mac_bytes']) / 2**20:.1f} | {float(r['mac_ratio']):.2f} | "  # type: ignore[arg-type]
            f"{float(r['time_ratio']):.2f} [{float(r['time_ratio_q1']):.2f}-{float(r['time_ratio_q3']):.2f}] |"  # type: ignore[arg-type]
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size", default="full", choices=("smoke", "full"))
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--out", default=os.path.join("results", cpu_caps().cpu_class))
    p.add_argument("--threads", type=int, default=None, help="intra-op threads (default: torch's choice)")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    rows = []
    for device in devices:
        rows += run(args.size, args.rounds, device)
    os.makedirs(args.out, exist_ok=True)
    jsonl = os.path.join(args.out, "design_rules.jsonl")
    write_jsonl(jsonl, rows)
    md = os.path.join(args.out, "design_rules.md")
    tmp = md + ".tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write(to_markdown(rows))
    os.replace(tmp, md)
    print(f"wrote {jsonl} and {md}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
