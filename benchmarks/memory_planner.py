"""Fit a model into an activation budget: ptt's module-tree planner vs uniform per-block checkpointing vs
torch.compile's ``activation_memory_budget``, training steps on the CPU.

For each model and each budget (70/50/30% of the untreated forward + backward activation peak); ResNet-50 and
ViT-B/16 also at sizes where the activations hold most of the step (b32 160 px, b16 224 px), where the whole step
can come under half:
- ``ptt``: ``ptt.checkpoint_activations_(model, budget=share)`` (regions, runs, selective recompute, measured);
- ``uniform``: ``torch.utils.checkpoint`` around each of the model's blocks (ResNet blocks, ViT encoder blocks, the
  FPN body's blocks; BatchNorm statistics then update twice - the known trap - which moves neither memory nor
  time), the first n in call order; the smallest n whose measured peak fits (binary search over n, every probe
  measured);
- ``compile``: ``torch.compile`` with ``torch._functorch.config.activation_memory_budget = share`` (the min-cut
  partitioner's knob; private).
Measured per variant: the activation peak (forward + backward above what was live, gradients allocated, as every
step but the first: allocator events, ``cpu_tracked``), the whole step's peak (parameters, momentum, the input
and the step's own peak), the step time (``clock.compare``: interleaved rounds with the untreated step, median and
IQR of the per-round ratio), and the gradients of one step against the untreated step's (max |diff| / max |g|).
``recompute_s`` is a variant's median step time less the untreated one's. Writes
``results/<cpu class>/memory_planner.{jsonl,md}`` (after every model, so a long run leaves what it finished).
"""

from __future__ import annotations

import argparse
import copy
import functools
import json
import os
import sys
import traceback
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.utils._pytree import tree_flatten
from torch.utils.checkpoint import checkpoint

import pytorchtricks as ptt
from pytorchtricks.bench.alloc_events import quiet_peak_memory
from pytorchtricks.clock import compare, environment, now_s, write_results
from pytorchtricks.hardware import cpu_caps

HERE = os.path.dirname(os.path.abspath(__file__))
MiB = 2**20
STEP_HALF = "step50"
BLOCKS = ("BasicBlock", "Bottleneck", "EncoderBlock")


def _loss(out: Any) -> torch.Tensor:
    return sum(t.float().mean() for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor))  # type: ignore[return-value]


def _models(names: list[str]) -> dict[str, tuple[Callable[[], nn.Module], torch.Tensor, str]]:
    import torchvision
    from torchvision.models.detection.backbone_utils import resnet_fpn_backbone

    g = torch.Generator().manual_seed(0)
    table = {
        "resnet18": (
            lambda: torchvision.models.resnet18(),
            torch.randn(64, 3, 128, 128, generator=g),
            "b64 128px",
        ),
        "resnet50": (
            lambda: torchvision.models.resnet50(),
            torch.randn(16, 3, 128, 128, generator=g),
            "b16 128px",
        ),
        "vit_b_16": (
            lambda: torchvision.models.vit_b_16(weights=None, image_size=96),
            torch.randn(16, 3, 96, 96, generator=g),
            "b16 96px",
        ),
        # sizes where the activations, not the parameters, gradients and momentum, hold most of the step's peak
        # (as on a GPU at training batch sizes): only there can checkpointing bring the whole step under half
        "resnet50_b32": (
            lambda: torchvision.models.resnet50(),
            torch.randn(32, 3, 160, 160, generator=g),
            "b32 160px",
        ),
        "vit_b_16_224": (
            lambda: torchvision.models.vit_b_16(weights=None),
            torch.randn(16, 3, 224, 224, generator=g),
            "b16 224px",
        ),
        "resnet18_fpn": (
            lambda: resnet_fpn_backbone(backbone_name="resnet18", weights=None, trainable_layers=5),
            torch.randn(8, 3, 256, 256, generator=g),
            "b8 256px, FrozenBatchNorm",
        ),
    }
    return {n: table[n] for n in names}


def _act_peak(m: nn.Module, x: torch.Tensor) -> int:
    for p in m.parameters():
        p.grad = torch.zeros_like(p)
    return quiet_peak_memory(lambda: _loss(m(x)).backward()).peak_bytes


def _stepper(m: nn.Module, x: torch.Tensor) -> tuple[Callable[[], None], torch.optim.Optimizer]:
    opt = torch.optim.SGD(m.parameters(), lr=1e-3, momentum=0.9)

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        _loss(m(x)).backward()
        opt.step()

    return step, opt


def _step_peak(m: nn.Module, x: torch.Tensor) -> int:
    step, opt = _stepper(m, x)
    step()
    step()  # momentum exists, plans and compilations made
    opt.zero_grad(set_to_none=True)
    held = sum(p.nbytes for p in m.parameters()) + x.nbytes
    held += sum(t.nbytes for s in opt.state.values() for t in s.values() if isinstance(t, torch.Tensor))
    return held + quiet_peak_memory(step).peak_bytes


def _grads(m: nn.Module, x: torch.Tensor) -> list[torch.Tensor]:
    m.zero_grad(set_to_none=True)
    torch.manual_seed(7)
    _loss(m(x)).backward()
    return [p.grad.detach().clone() for p in m.parameters() if p.grad is not None]


def _grad_diff(ref: list[torch.Tensor], got: list[torch.Tensor]) -> float:
    scale = max(float(g.abs().max()) for g in ref) or 1.0
    return max(float((a - b).abs().max()) for a, b in zip(ref, got)) / scale


def _uniform(base: nn.Module, x: torch.Tensor, budget: int) -> tuple[nn.Module | None, int, int, list[int]]:
    """Smallest prefix of blocks (full checkpoints) whose measured activation peak fits; (model, n, of, probes)."""
    blocks = [p for p, m in base.named_modules() if type(m).__name__ in BLOCKS]
    probes: dict[int, int] = {}

    def build(n: int) -> nn.Module:
        m = copy.deepcopy(base)
        for p in blocks[:n]:  # what a user writes: each block's forward under torch's checkpoint
            blk = m.get_submodule(p)
            blk.forward = functools.partial(checkpoint, blk.forward, use_reentrant=False)
        return m

    def peak(n: int) -> int:
        if n not in probes:
            probes[n] = _act_peak(build(n), x)
        return probes[n]

    lo, hi = 1, len(blocks)
    if peak(hi) > budget:  # out of reach: every block checkpointed, marked not fitting
        return build(hi), len(blocks), len(blocks), list(probes.values())
    while lo < hi:
        mid = (lo + hi) // 2
        if peak(mid) <= budget:
            hi = mid
        else:
            lo = mid + 1
    return build(lo), lo, len(blocks), list(probes.values())


def _compiled(base: nn.Module, x: torch.Tensor, share: float) -> tuple[nn.Module | None, str, float]:
    import torch._dynamo
    import torch._functorch.config as fconfig

    torch._dynamo.reset()
    fconfig.activation_memory_budget = share
    m = copy.deepcopy(base)
    t0 = now_s()
    try:
        cm = torch.compile(m)
        _loss(cm(x)).backward()  # compiles forward and backward with this budget
        return cm, "", now_s() - t0
    except Exception as exc:
        return None, f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}", now_s() - t0
    finally:
        fconfig.activation_memory_budget = 1.0


def run_model(name: str, make: Callable[[], nn.Module], x: torch.Tensor, size: str, args: Any) -> list[dict]:
    torch.manual_seed(0)
    base = make().train()
    base_act = _act_peak(copy.deepcopy(base), x)
    base_step = _step_peak(copy.deepcopy(base), x)
    ref_grads = _grads(copy.deepcopy(base), x)
    rows: list[dict] = []
    print(
        f"{name} {size}: activation peak {base_act / MiB:.0f} MiB, step peak {base_step / MiB:.0f} MiB",
        flush=True,
    )
    held = 3 * sum(p.nbytes for p in base.parameters()) + x.nbytes  # parameters, gradients, momentum, input
    for label in args.budgets:
        # "step50": the activation budget that puts the whole step at half the untreated step's peak
        share = (0.5 * base_step - held) / base_act if label == STEP_HALF else float(label)
        budget = int(share * base_act)
        variants: dict[str, nn.Module] = {}
        info: dict[str, dict] = {}
        t0 = now_s()
        try:
            ours = ptt.checkpoint_activations_(copy.deepcopy(base), budget=share, example_inputs=x)
            plan = ptt.checkpoint_plan(ours)
            variants["ptt"] = ours
            info["ptt"] = {"plan": str(plan), "regions": plan.regions, "plan_s": now_s() - t0}
        except (
            ptt.PttError
        ) as exc:  # the budget is out of reach: the lowest peak it plans, marked not fitting
            ours = ptt.checkpoint_activations_(copy.deepcopy(base), budget="min", example_inputs=x)
            plan = ptt.checkpoint_plan(ours)
            variants["ptt"] = ours
            info["ptt"] = {
                "error": str(exc),
                "plan": str(plan),
                "regions": plan.regions,
                "plan_s": now_s() - t0,
            }
        um, n, of, probes = _uniform(base, x, budget)
        info["uniform"] = {"blocks_checkpointed": n, "blocks": of, "probe_peaks_bytes": probes}
        if um is not None:
            variants["uniform"] = um
        if args.compile:
            cm, err, secs = _compiled(base, x, share)
            info["compile"] = {"compile_s": secs}
            if cm is None:
                info["compile"]["error"] = err
            else:
                variants["compile"] = cm
        # gradients first: the timed steps below move the weights
        diffs = {k: _grad_diff(ref_grads, _grads(m, x)) for k, m in variants.items()}
        steps = {"baseline": _stepper(copy.deepcopy(base), x)[0]}
        for k, m in variants.items():
            steps[k] = _stepper(m, x)[0]
        cmp = compare(steps, rounds=args.rounds, min_run_time_s=0.05, warmup=1)
        base_med = cmp["baseline"].stats.median_s
        for k in ["ptt", "uniform", "compile"]:
            if k not in info:
                continue
            row: dict[str, Any] = {
                "kind": "memory_planner", "model": name, "size": size, "method": k, "budget_share": share, "budget_label": label,
                "budget_bytes": budget, "baseline_act_peak_bytes": base_act, "baseline_step_peak_bytes": base_step,
                "baseline_median_s": base_med, **info[k],
            }  # fmt: skip
            if k in variants:
                m = variants[k]
                act = _act_peak(m, x)
                r = cmp[k]
                row |= {
                    "act_peak_bytes": act,
                    "act_peak_share": act / base_act,
                    "fits": act <= budget,
                    "step_peak_bytes": _step_peak(m, x),
                    "median_s": r.stats.median_s,
                    "q1_s": r.stats.q1_s,
                    "q3_s": r.stats.q3_s,
                    "speed_ratio": r.ratio,
                    "speed_ratio_q1": r.ratio_q1,
                    "speed_ratio_q3": r.ratio_q3,
                    "recompute_s": r.stats.median_s - base_med,
                    "grad_max_rel_diff": diffs[k],
                    "rounds": cmp.rounds,
                }
                row["step_peak_share"] = row["step_peak_bytes"] / base_step
            rows.append(row)
            print(_line(row), flush=True)
        del variants, steps
    return rows


def _line(r: dict) -> str:
    half = " (half the step)" if r.get("budget_label") == STEP_HALF else ""
    head = f"| {r['model']} ({r['size']}) | {r['budget_share']:.0%}{half} | {r['method']} |"
    if "act_peak_bytes" not in r:
        return head + f" - | - | - | - | - | {r.get('error', '')[:160]} |"
    return head + (
        f" {r['act_peak_bytes'] / MiB:.0f} ({r['act_peak_share']:.0%}){'' if r['fits'] else ' over'} |"
        f" {r['step_peak_bytes'] / MiB:.0f} ({r['step_peak_share']:.0%}) |"
        f" {r['speed_ratio']:.2f} [{r['speed_ratio_q1']:.2f}-{r['speed_ratio_q3']:.2f}] |"
        f" {r['recompute_s'] * 1e3:.0f} | {r['grad_max_rel_diff']:.1e} | {_note(r)} |"
    )


def _note(r: dict) -> str:
    if r["method"] == "ptt" and "error" in r:
        return "budget out of reach; the lowest-peak plan: " + _regions(r)
    if r["method"] == "uniform":
        return f"{r['blocks_checkpointed']} of {r['blocks']} blocks"
    if r["method"] == "compile":
        return f"compile {r['compile_s']:.0f} s"
    return _regions(r)


def _regions(r: dict) -> str:
    return f"{len(r['regions'])} regions: " + ", ".join(f"{n} {m[:3]}" for n, m, *_ in r["regions"])[:200]


def _markdown(rows: list[dict], env: dict) -> str:
    lines = [
        "# Memory planner: ptt vs uniform per-block checkpointing vs torch.compile activation_memory_budget",
        "",
        f"{env['cpu']} ({env['cpu_class']}), {env['threads']} threads, torch {env['torch']}, git "
        + ", ".join(
            sorted({f"{r['env']['git_sha']} ({r['model']})" for r in rows if "env" in r})
            or [str(env["git_sha"])]
        )
        + f", {env['time_utc']}. Training step (SGD momentum, fp32, train mode) on the CPU. The machine is shared with "
        "other agents' jobs (2 cores): step times move between runs; the ratios are per round, interleaved.",
        "",
        "Activation peak: forward + backward above what was live (gradients allocated), allocator events; "
        "its share of the untreated one in brackets. Step peak: parameters, momentum, input and the step's own "
        "peak. Speed: untreated step time / this one's (median [IQR] of the per-round ratios). Recompute ms: "
        "median step time less the untreated one's. Gradients: max |diff| / max |g| against the untreated step.",
        "",
        "| model | budget | method | act peak MiB | step peak MiB | speed | recompute ms | grads | plan |",
        "|---|---:|---|---:|---:|---:|---:|---:|---|",
    ]
    lines += [_line(r) for r in rows]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="resnet18,resnet50,vit_b_16,resnet50_b32,vit_b_16_224,resnet18_fpn")
    p.add_argument(
        "--budgets",
        default="0.7,0.5,0.3",
        help=f"shares of the untreated activation peak; {STEP_HALF}: the share that leaves the whole step at half its peak",
    )
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--no-compile", dest="compile", action="store_false")
    p.add_argument(
        "--keep",
        action="store_true",
        help="keep the rows of other models and budgets already in the results (a run in parts)",
    )
    p.add_argument("--out", default=os.path.join(HERE, "..", "results", cpu_caps().cpu_class))
    args = p.parse_args(argv)
    args.budgets = [b if b == STEP_HALF else str(float(b)) for b in args.budgets.split(",")]
    env = environment("cpu")
    rows: list[dict] = []
    stem = os.path.join(args.out, "memory_planner")
    if args.keep and os.path.exists(stem + ".jsonl"):
        with open(stem + ".jsonl", encoding="utf-8") as fh:
            old = [json.loads(line) for line in fh]
        redo = {(m, b) for m in args.models.split(",") for b in args.budgets}
        rows = [
            r for r in old if (r.get("model"), r.get("budget_label", str(r.get("budget_share")))) not in redo
        ]
    for name, (make, x, size) in _models(args.models.split(",")).items():
        try:
            got = run_model(name, make, x, size, args)
        except Exception:
            traceback.print_exc()
            got = [{"kind": "memory_planner", "model": name, "size": size, "method": "-", "budget_share": 0.0,
                    "error": traceback.format_exc().splitlines()[-1]}]  # fmt: skip
        rows += [r | {"env": env} for r in got]
        write_results(stem, rows, _markdown(rows, env))
    print(_markdown(rows, env))
    return 0


if __name__ == "__main__":
    sys.exit(main())
