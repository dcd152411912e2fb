"""Checkpoint planner vs brute force: peak memory of a training step of a 64-block residual MLP, every plan.

For every uniform segmentation (1..64 segments, all checkpointed) and for the planner's default plan, one training
step (forward, backward, SGD step) is measured exactly: live CPU tensor bytes replayed from allocator events
(``cpu_tracked_peak_bytes``, recomputation included). Also reports the planner's planned vs measured numbers and
the step time of unchecked vs default plan (interleaved). Writes ``results/<cpu class>/checkpoint_planner-cpu.{jsonl,md}``.
"""

from __future__ import annotations

import argparse
import copy
import os

import torch
from torch import nn

import pytorchtricks as ptt
from pytorchtricks.clock import compare, cpu_tracked_peak_bytes, environment, write_jsonl
from pytorchtricks.hardware import cpu_caps
from pytorchtricks.tricks.loop.checkpoint_activations import _Residual

HERE = os.path.dirname(os.path.abspath(__file__))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--depth", type=int, default=64)
    p.add_argument("--width", type=int, default=32)
    p.add_argument("--batch", type=int, default=512)
    p.add_argument("--out", default=os.path.join(HERE, "..", "results", cpu_caps().cpu_class))
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    torch.manual_seed(0)
    base = nn.Sequential(*[_Residual(args.width) for _ in range(args.depth)])
    x = torch.randn(args.batch, args.width)

    def stepper(m: nn.Module):
        opt = torch.optim.SGD(m.parameters(), lr=0.01)

        def step() -> None:
            m(x).square().mean().backward()
            opt.step()
            opt.zero_grad(set_to_none=True)

        step()  # the default plan is made here (first training forward)
        return step

    peaks = {}
    for k in range(1, args.depth + 1):
        peaks[k] = cpu_tracked_peak_bytes(
            stepper(ptt.checkpoint_activations_(copy.deepcopy(base), segments=k))
        )
    default = ptt.checkpoint_activations_(copy.deepcopy(base))
    default_step = stepper(default)
    default_peak = cpu_tracked_peak_bytes(default_step)
    unchecked_step = stepper(copy.deepcopy(base))
    unchecked_peak = cpu_tracked_peak_bytes(unchecked_step)
    plan = ptt.checkpoint_plan(default)
    best = min(peaks, key=peaks.__getitem__)
    cmp = compare({"baseline": unchecked_step, "default plan": default_step}, rounds=5, min_run_time_s=0.2)
    env = environment("cpu")
    row = {
        "kind": "checkpoint_planner",
        "depth": args.depth,
        "width": args.width,
        "batch": args.batch,
        "uniform_peak_bytes": peaks,
        "best_uniform_segments": best,
        "best_uniform_peak_bytes": peaks[best],
        "default_peak_bytes": default_peak,
        "default_vs_best": default_peak / peaks[best],
        "unchecked_peak_bytes": unchecked_peak,
        "default_runs": plan.runs,
        "planned_saved_bytes": plan.planned_saved_bytes,
        "measured_saved_bytes": plan.measured_saved_bytes,
        "planned_peak_bytes": plan.planned_peak_bytes,
        "measured_peak_bytes": plan.measured_peak_bytes,
        "time_ratio_default_vs_unchecked": cmp["default plan"].ratio,
        "time_ratio_q1": cmp["default plan"].ratio_q1,
        "time_ratio_q3": cmp["default plan"].ratio_q3,
        "rounds": cmp.rounds,
        "interleaved": True,
        "env": env,
    }
    os.makedirs(args.out, exist_ok=True)
    write_jsonl(os.path.join(args.out, "checkpoint_planner-cpu.jsonl"), [row])
    mib = 2**20
    lines = [
        f"Checkpoint planner on a {args.depth}-block residual MLP (width {args.width}, batch {args.batch}, fp32), "
        f"{env['cpu']}, 1 thread, torch {env['torch']}, git {env['git_sha']}. Peak = live tensor bytes of one training "
        "step (forward+backward+SGD step, recomputation included) from allocator events (cpu_tracked, exact).",
        "",
        "| plan | segments | step peak MiB | vs best uniform |",
        "|---|---:|---:|---:|",
        f"| no checkpointing | - | {unchecked_peak / mib:.2f} | {unchecked_peak / peaks[best]:.2f}x |",
        f"| best uniform (brute force over 1..{args.depth}) | {best} | {peaks[best] / mib:.2f} | 1.00x |",
        f"| Chen sqrt(N) uniform | {round(args.depth**0.5)} | {peaks[round(args.depth**0.5)] / mib:.2f} | "
        f"{peaks[round(args.depth**0.5)] / peaks[best]:.2f}x |",
        f"| every block its own segment | {args.depth} | {peaks[args.depth] / mib:.2f} | "
        f"{peaks[args.depth] / peaks[best]:.2f}x |",
        f"| **planner default** | {plan.checkpointed_segments}+1 | {default_peak / mib:.2f} | "
        f"{default_peak / peaks[best]:.3f}x |",
        "",
        f"Planner report: `{plan}`.",
        "",
        f"Step time, default plan vs no checkpointing (interleaved, {cmp.rounds} rounds): speed ratio "
        f"{cmp['default plan'].ratio:.2f} [{cmp['default plan'].ratio_q1:.2f}-{cmp['default plan'].ratio_q3:.2f}] "
        "(below 1 = slower: the price of recomputation).",
    ]
    md = "\n".join(lines) + "\n"
    with open(os.path.join(args.out, "checkpoint_planner-cpu.md"), "w", encoding="utf-8") as fh:
        fh.write(md)
    print(md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
