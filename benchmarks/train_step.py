"""Training-step throughput on CPU: naive fp32 eager vs each loop/model trick vs the best combination.

Models: torchvision ResNet-18 (weights=None) at 128 px, batch 64, and a ViT-tiny (torchvision VisionTransformer,
patch 16, 12 layers, 3 heads, width 192, MLP 768) at 128 px, batch 64. One call = one full step (forward,
cross-entropy, backward, SGD-momentum step, zero_grad). Variants run interleaved in rotating order
(``clock.compare``); ratios are paired per round (median and IQR); peak memory is the live-tensor peak of
one step from allocator events (``cpu_tracked``). Writes ``results/<cpu class>/train_step-cpu.jsonl`` and ``.md``.

Run: ``make bench-train`` (takes the shared benchmark lock). Few rounds on purpose: a 2-core step takes seconds and
each compiled variant compiles its forward and backward first.
"""

from __future__ import annotations

import argparse
import copy
import math
import os
import sys
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

import pytorchtricks as ptt
from pytorchtricks.clock import compare, environment, peak_memory, write_jsonl
from pytorchtricks.hardware import cpu_caps

HERE = os.path.dirname(os.path.abspath(__file__))


def resnet18() -> nn.Module:
    from torchvision.models import resnet18 as rn

    return rn(weights=None, num_classes=1000)


def vit_tiny(px: int) -> nn.Module:
    from torchvision.models.vision_transformer import VisionTransformer

    return VisionTransformer(
        image_size=px,
        patch_size=16,
        num_layers=12,
        num_heads=3,
        hidden_dim=192,
        mlp_dim=768,
        num_classes=1000,
    )


def make_step(
    base: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    bf16: bool,
    channels_last: bool,
    compiled: bool,
    fast_opt: bool,
) -> Callable[[], float]:
    """One variant: its own copy of the model and optimizer; returns a zero-argument training step."""
    model = copy.deepcopy(base).train()
    inp = x
    if channels_last:
        ptt.to_channels_last_(model)
        inp = x.contiguous(memory_format=torch.channels_last)
    if fast_opt:
        opt = ptt.fast_optimizer(model.parameters(), "sgd", lr=0.01, momentum=0.9)
    else:
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)  # default: per-tensor loop on CPU
    if compiled:
        ptt.compile_(model)
    mp = ptt.mixed_precision("cpu", "bf16", enabled=bf16)
    last: list[torch.Tensor] = []

    def step() -> float:
        with mp.autocast():
            loss = nn.functional.cross_entropy(model(inp), y)
        mp.backward(loss)
        mp.step(opt)
        opt.zero_grad(set_to_none=True)
        last[:] = [loss.detach()]
        return 0.0

    def checked() -> float:
        step()
        if not math.isfinite(float(last[0])):
            raise RuntimeError("non-finite loss")
        return float(last[0])

    step.checked = checked  # type: ignore[attr-defined]
    return step


VARIANTS: dict[str, dict[str, bool]] = {
    "baseline": {},
    "channels_last": {"channels_last": True},
    "bf16_autocast": {"bf16": True},
    "fast_optimizer": {"fast_opt": True},
    "compile": {"compiled": True},
    "bf16+channels_last": {"bf16": True, "channels_last": True},
    "bf16+compile+fast_opt": {"bf16": True, "compiled": True, "fast_opt": True},
    "best: bf16+channels_last+compile+fast_opt": {
        "bf16": True,
        "channels_last": True,
        "compiled": True,
        "fast_opt": True,
    },
}


def run_model(
    name: str, base: nn.Module, batch: int, px: int, rounds: int, variants: list[str]
) -> list[dict]:
    torch.manual_seed(0)
    x = torch.randn(batch, 3, px, px)
    y = torch.randint(0, 1000, (batch,))
    is_cnn = name.startswith("resnet")
    steps: dict[str, Callable[[], float]] = {}
    for v in variants:
        flags = dict(VARIANTS[v])
        label = v
        if not is_cnn and flags.get("channels_last"):
            if not v.startswith("best"):
                continue  # a ViT's only 4-D weight is the patch conv: nothing to measure
            flags["channels_last"] = False
            label = v.replace("+channels_last", "")
        keys = ("bf16", "channels_last", "compiled", "fast_opt")
        steps[label] = make_step(base, x, y, **{k: flags.get(k, False) for k in keys})
    for v, s in steps.items():
        print(f"[{name}] warm-up {v}: loss {s.checked():.3f}", flush=True)  # type: ignore[attr-defined]
    cmp = compare(
        steps,
        rounds=rounds,
        min_run_time_s=0.5,
        warmup=1,
        on_round=lambda r: print(f"[{name}] round {r + 1}/{rounds}", flush=True),
    )
    env = environment("cpu")
    rows = []
    for v, res in cmp.variants.items():
        mem = peak_memory(steps[v], "cpu")
        rows.append(
            {
                "kind": "train_step",
                "model": name,
                "variant": v,
                "batch": batch,
                "px": px,
                "images_per_s": batch / res.stats.median_s,
                "median_s": res.stats.median_s,
                "q1_s": res.stats.q1_s,
                "q3_s": res.stats.q3_s,
                "ratio": res.ratio,
                "ratio_q1": res.ratio_q1,
                "ratio_q3": res.ratio_q3,
                "rounds": cmp.rounds,
                "interleaved": True,
                "note": res.note,
                "peak_bytes": mem.peak_bytes,
                "peak_method": mem.method,
                "env": env,
            }
        )
        print(
            f"[{name}] {v}: {rows[-1]['images_per_s']:.1f} img/s, x{res.ratio:.2f}, peak {mem.peak_bytes / 2**20:.0f} MiB",
            flush=True,
        )
    return rows


def to_markdown(rows: list[dict[str, Any]]) -> str:
    env = rows[0]["env"]
    out = [
        f"Training step on CPU: {env['cpu']} ({env['threads']} threads), torch {env['torch']}, git {env['git_sha']}, "
        f"{env['time_utc']}. Interleaved rounds ({rows[0]['rounds']}); ratio = paired per-round speed-up vs baseline "
        "(median [IQR]); peak = live tensor bytes of one step (cpu_tracked).",
        "",
        "| model | variant | images/s | speed-up vs naive fp32 | peak MiB |",
        "|---|---|---:|---:|---:|",
    ]
    for r in rows:
        out.append(
            f"| {r['model']} | {r['variant']} | {r['images_per_s']:.1f} | {r['ratio']:.2f}x "
            f"[{r['ratio_q1']:.2f}-{r['ratio_q3']:.2f}] | {r['peak_bytes'] / 2**20:.0f} |"
        )
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="resnet18,vit_tiny")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--px", type=int, default=128)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--variants", default=",".join(v for v in VARIANTS if v != "bf16+compile+fast_opt"))
    p.add_argument("--out", default=os.path.join(HERE, "..", "results", cpu_caps().cpu_class))
    args = p.parse_args(argv)
    variants = [
        v for v in VARIANTS if v in args.variants.split(",") or v.split(":")[0] in args.variants.split(",")
    ]
    if "baseline" not in variants:
        variants.insert(0, "baseline")
    rows: list[dict] = []
    for name in args.models.split(","):
        base = {"resnet18": resnet18, "vit_tiny": lambda: vit_tiny(args.px)}[name]()
        rows += run_model(name, base, args.batch, args.px, args.rounds, variants)
    os.makedirs(args.out, exist_ok=True)
    jsonl = os.path.join(args.out, "train_step-cpu.jsonl")
    write_jsonl(jsonl, rows)
    md = to_markdown(rows)
    with open(os.path.join(args.out, "train_step-cpu.md"), "w", encoding="utf-8") as fh:
        fh.write(md)
    sys.stdout.write(md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
