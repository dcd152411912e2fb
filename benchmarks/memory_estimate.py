"""How close ``ptt.estimate_memory`` comes to the measured peak of a training step, and what find_batch_size picks.

For each model x optimizer: the estimate (params + grads + optimizer state + saved activations + the workspace
measured on the probe step: backward's transient peak, or the optimizer step's) next to the measured peak of live
tensor bytes during a steady-state step on CPU (allocator events replayed, ``clock.peak_memory``). The
workspace is the backend's (oneDNN's scratchpads depend on the ISA and the thread count, both in every row's
environment). Then ``find_batch_size`` on ResNet-18 at 64 px under a 256 MiB budget: every fitting multiple of 8
timed, the fastest kept. Run under ``flock /tmp/ptt-bench.lock`` (``make
bench-memory``) because the batch-size search times training steps.

    make bench-memory
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable

import torch
from torch import nn

import pytorchtricks as ptt
from pytorchtricks.bench.workloads import load_model
from pytorchtricks.clock import environment, write_jsonl
from pytorchtricks.fixtures import small_cnn
from pytorchtricks.hardware import cpu_caps

MiB = 2**20

MODELS: dict[str, tuple[Callable[[], nn.Module], tuple[int, ...]]] = {
    "small_cnn (Fashion-MNIST 28 px)": (small_cnn, (64, 1, 28, 28)),
    "resnet18 (128 px)": (lambda: load_model("torchvision:resnet18"), (8, 3, 128, 128)),
    "mobilenet_v3_small (128 px)": (lambda: load_model("torchvision:mobilenet_v3_small"), (16, 3, 128, 128)),
    "mlp 512-2048-2048-10": (
        lambda: nn.Sequential(
            nn.Linear(512, 2048), nn.ReLU(), nn.Linear(2048, 2048), nn.GELU(), nn.Linear(2048, 10)
        ),
        (64, 512),
    ),
}
OPTIMIZERS: dict[str, Callable[[nn.Module], torch.optim.Optimizer]] = {
    "adamw": lambda m: torch.optim.AdamW(m.parameters()),
    "sgd+momentum": lambda m: torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9),
}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=os.path.join("results", cpu_caps().cpu_class))
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--skip-search", action="store_true", help="bytes only: no find_batch_size (no timing)")
    p.add_argument("--search-only", action="store_true", help="only the find_batch_size run")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    env = environment("cpu")
    rows = []
    md = [
        f"# estimate_memory vs measured peak, {env['device_name']} (threads: {env['threads']}, torch {env['torch']})",
        "",
        "| model | batch | optimizer | params | grads | opt. state | activations | workspace | estimate | measured peak | error |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, (factory, shape) in ({} if args.search_only else MODELS).items():
        for opt_name, make_opt in OPTIMIZERS.items():
            model = factory()
            b = ptt.memory_breakdown(model, torch.randn(shape), make_opt(model))
            assert b.measured_peak_bytes is not None
            err = b.total_bytes / b.measured_peak_bytes - 1
            rows.append({"kind": "estimate", "model": name, "shape": shape, "optimizer": opt_name, "env": env,
                         **{k: getattr(b, k) for k in ("param_bytes", "grad_bytes", "optimizer_state_bytes",
                                                       "activation_bytes", "input_bytes", "workspace_bytes",
                                                       "backward_workspace_bytes", "optimizer_workspace_bytes",
                                                       "total_bytes", "measured_peak_bytes")}, "error": err})  # fmt: skip
            md.append(
                f"| {name} | {shape[0]} | {opt_name} | {b.param_bytes / MiB:.1f} | {b.grad_bytes / MiB:.1f} | "
                f"{b.optimizer_state_bytes / MiB:.1f} | {b.activation_bytes / MiB:.1f} | {b.workspace_bytes / MiB:.1f} | "
                f"{b.total_bytes / MiB:.1f} | {b.measured_peak_bytes / MiB:.1f} | {err:+.1%} |"
            )
            print(md[-1], flush=True)
    md += [
        "",
        "MiB; workspace = measured transient above the activations at the step's peak (backward, or the optimizer",
        "step when larger); measured peak = live tensor bytes before the step + CPU allocator peak during it",
        "(cpu_tracked).",
        "",
    ]
    if not args.skip_search:
        model = load_model("torchvision:resnet18", num_classes=10)
        budget = 256 * MiB
        r = ptt.find_batch_size(
            model,
            lambda n: torch.randn(n, 3, 64, 64),
            torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
            budget_bytes=budget,
            max_batch=256,
            min_run_time_s=1.0,
        )
        rows.append({"kind": "find_batch_size", "model": "resnet18 (64 px)", "budget_bytes": budget, "env": env,
                     "batch_size": r.batch_size, "samples_per_s": r.samples_per_s, "candidates": r.rows})  # fmt: skip
        md += ["## find_batch_size: ResNet-18 at 64 px, SGD, budget 256 MiB", "", "```", str(r), "```", ""]
        print(r)
    os.makedirs(args.out, exist_ok=True)
    write_jsonl(os.path.join(args.out, "memory_estimate.jsonl"), rows)
    path = os.path.join(args.out, "memory_estimate.md")
    with open(path + ".tmp", "w", encoding="utf-8") as fh:
        fh.write("\n".join(md))
    os.replace(path + ".tmp", path)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
