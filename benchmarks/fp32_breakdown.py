"""Where fp32 CPU inference time goes: PyTorch (eager channels_last, fused) vs ONNX Runtime, per op kind.

ResNet-18 (random weights, randomized BN, Conv-BN fused) at 160 px. PyTorch: ``torch.profiler`` self CPU time per
aten op over ``--calls`` calls, grouped into convolution kernels, layout reorders (copies, contiguous, to), pointwise
ops (ReLU, add), pooling, linear and the rest; the wall time per call minus the ops' time is framework overhead
(dispatch, Python). ONNX Runtime: its own profiler (``enable_profiling``), node time per op type, and its wall time.
Both at the same thread count. The shares say where a torch-native path can still catch up.

    make bench-fp32-breakdown      # writes results/<cpu class>/fp32_breakdown.{jsonl,md}
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import sys
import tempfile
import warnings
from collections import defaultdict
from typing import Any

import torch

from pytorchtricks.clock import environment, now_s, publish
from pytorchtricks.hardware import cpu_caps

GROUPS = {
    "convolution, oneDNN": ("mkldnn_convolution",),
    # ATen's own im2col + GEMM path, which its heuristic picks for batch 1, 3x3 kernels and < 20480 input elements
    # (ResNet-18's layer4 at 160 px: 512 x 5 x 5)
    "convolution, ATen native (slow_conv2d)": ("_slow_conv2d_forward", "thnn_conv2d", "slow_conv2d_forward"),
    "convolution dispatch": ("convolution", "_convolution", "conv2d"),
    "layout reorder": ("copy_", "contiguous", "to", "_to_copy", "clone", "empty_like", "as_strided"),
    "pointwise": ("relu", "relu_", "add", "add_", "clamp", "hardtanh"),
    "pooling": ("max_pool2d", "max_pool2d_with_indices", "adaptive_avg_pool2d", "mean", "avg_pool2d"),
    "linear": ("linear", "addmm", "mm", "matmul"),
}


def _group(op: str) -> str:
    name = op.split("::")[-1]
    return next((g for g, names in GROUPS.items() if name in names), "other ops")


def torch_breakdown(model: Any, x: torch.Tensor, calls: int) -> dict[str, float]:
    """ms per call: each op group's self CPU time (leaf ops), the wall time, and the overhead between them."""
    from torch.profiler import ProfilerActivity, profile

    with torch.no_grad():
        for _ in range(5):
            model(x)
        t0 = now_s()
        for _ in range(calls):
            model(x)
        wall = (now_s() - t0) / calls
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            t0 = now_s()
            for _ in range(calls):
                model(x)
            profiled = (now_s() - t0) / calls
    out: dict[str, float] = defaultdict(float)
    for ev in prof.key_averages():
        out[_group(ev.key)] += ev.self_cpu_time_total / 1e3 / calls
    return _result(out, wall, profiled)


def _result(ops: dict[str, float], wall: float, profiled: float) -> dict[str, float]:
    """Op groups (ms per profiled call), the rest of the profiled call as overhead, both walls."""
    result = dict(ops)
    result["framework overhead (wall - ops)"] = max(0.0, profiled * 1e3 - sum(ops.values()))
    result["wall (profiled)"] = profiled * 1e3
    result["wall"] = wall * 1e3
    return result


def ort_breakdown(path: str, x: torch.Tensor, threads: int, calls: int) -> dict[str, float]:
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads, opts.inter_op_num_threads = threads, 1
    folder = tempfile.mkdtemp(prefix="ptt-ortprof-")
    opts.profile_file_prefix = os.path.join(folder, "p")
    feed = {"": x.numpy()}

    def session(profiling: bool) -> Any:
        opts.enable_profiling = profiling
        sess = ort.InferenceSession(path, sess_options=opts, providers=["CPUExecutionProvider"])
        feed.clear()
        feed[sess.get_inputs()[0].name] = x.numpy()
        for _ in range(5):
            sess.run(None, feed)
        return sess

    def timed(sess: Any) -> float:
        t0 = now_s()
        for _ in range(calls):
            sess.run(None, feed)
        return (now_s() - t0) / calls

    wall = timed(session(False))
    sess = session(True)
    profiled = timed(sess)
    with open(sess.end_profiling(), encoding="utf-8") as fh:
        events = json.load(fh)
    out: dict[str, float] = defaultdict(float)
    for ev in events:
        if ev.get("cat") == "Node" and ev.get("name", "").endswith("_kernel_time"):
            out["ORT " + ev["args"].get("op_name", "?")] += ev["dur"] / 1e3 / (5 + calls)
    return _result(out, wall, profiled)


def run(px: int, batches: list[int], threads: int, calls: int) -> list[dict[str, Any]]:
    import torchvision

    import pytorchtricks as ptt
    from pytorchtricks.fixtures import randomize_bn_

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    base = randomize_bn_(torchvision.models.resnet18(weights=None)).eval()
    env, rows = environment("cpu"), []
    for batch in batches:
        x = torch.randn(batch, 3, px, px)
        fused = ptt.fuse_conv_bn_(copy.deepcopy(base), x)
        cl = ptt.to_channels_last_(copy.deepcopy(fused))
        path = os.path.join(tempfile.mkdtemp(prefix="ptt-fp32-"), "r18.onnx")
        ptt.export_onnx(fused, x, path)
        engines = {
            "torch eager channels_last (fused)": torch_breakdown(
                cl, x.contiguous(memory_format=torch.channels_last), calls
            ),
            "torch eager NCHW (fused)": torch_breakdown(fused, x, calls),
            "ONNX Runtime fp32": ort_breakdown(path, x, threads, calls),
        }
        for engine, parts in engines.items():
            rows.append({"kind": "bench", "benchmark": "fp32_breakdown", "engine": engine, "batch": batch,
                         "px": px, "threads": threads, "calls": calls, "ms": parts, "env": env})  # fmt: skip
        print(f"batch {batch}: done", flush=True)
    return rows


def to_markdown(rows: list[dict[str, Any]]) -> str:
    env = rows[0]["env"] if rows else {}
    out = [
        f"# Where fp32 inference time goes: ResNet-18, {rows[0]['px'] if rows else '?'} px, "
        f"{rows[0]['threads'] if rows else '?'} thread(s)",
        "",
        f"{env.get('cpu')} ({cpu_caps().cpu_class}), torch {env.get('torch')}; ms per call over "
        f"{rows[0]['calls'] if rows else '?'} profiled calls (shares of the profiled call; the unprofiled wall beside it).",
        "",
    ]
    for batch in sorted({r["batch"] for r in rows}):
        out += [
            f"## batch {batch}",
            "",
            "| engine | part | ms per call | share of wall |",
            "|---|---|---|---|",
        ]
        for r in (r for r in rows if r["batch"] == batch):
            wall = r["ms"]["wall (profiled)"]
            parts = sorted(
                ((k, v) for k, v in r["ms"].items() if not k.startswith("wall")), key=lambda kv: -kv[1]
            )
            out.append(
                f"| {r['engine']} | **wall** (not profiled: {r['ms']['wall']:.2f}) | **{wall:.2f}** | 100% |"
            )
            for k, v in parts:
                if v >= 0.005 * wall:
                    out.append(f"| | {k} | {v:.2f} | {100 * v / wall:.0f}% |")
        out.append("")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--px", type=int, default=160)
    p.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--calls", type=int, default=30)
    p.add_argument("--out", default=os.path.join("results", cpu_caps().cpu_class, "fp32_breakdown"))
    args = p.parse_args(argv)
    warnings.filterwarnings("ignore")
    rows = run(args.px, args.batches, args.threads, args.calls)
    return publish(args.out, rows, to_markdown(rows))


if __name__ == "__main__":
    sys.exit(main())
