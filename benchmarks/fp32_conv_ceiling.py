"""Could a oneDNN fp32 plan beat ONNX Runtime? ResNet-18's convolutions alone, as oneDNN fp32 primitives, against
ORT's whole fp32 model.

The int8 oneDNN plan (``QuantConfig(engine="onednn")``) wins by removing PyTorch's per-op set-up around oneDNN's
kernels. The same idea for fp32 (every conv one primitive built once, weights reordered once, ReLU fused, no
framework between them) can be at best as fast as its convolutions. This times exactly those: every conv of the
Conv-BN-fused ResNet-18 as a system-oneDNN (``libdnnl2``) fp32 forward-inference primitive with a fused ReLU and
prepacked weights, run back to back - no residual adds, pooling, linear or layout changes, so it is a lower bound of
any such plan - in two layouts (NHWC activations as PyTorch's channels_last, and the blocked layout oneDNN picks
with ``format_tag any``), interleaved (``clock.compare``) with ONNX Runtime running the whole model (fp32, full
graph optimisation). A ratio near 1.0x means the kernels themselves are level with MLAS's: no fp32 plan built on
them can reach 1.1x ORT on this CPU.

    make bench-fp32-conv-ceiling      # writes results/<cpu class>/fp32_conv_ceiling.{jsonl,md}
"""

from __future__ import annotations

import argparse
import copy
import ctypes
import os
import sys
import tempfile
import warnings
from typing import Any

import torch
from torch import nn

from pytorchtricks.clock import compare, environment, publish
from pytorchtricks.hardware import cpu_caps

QUERY_SRC_MD, QUERY_DST_MD = 129, 133  # dnnl_query_src_md / dst_md (oneDNN 2.x dnnl_types.h)
ORT = "ORT fp32, whole model"
LAYOUTS = {"oneDNN fp32 convs only, NHWC": False, "oneDNN fp32 convs only, blocked": True}


def _conv_shapes(
    model: nn.Module, x: torch.Tensor
) -> list[tuple[nn.Conv2d, tuple[int, ...], tuple[int, ...]]]:
    found: list[tuple[nn.Conv2d, tuple[int, ...], tuple[int, ...]]] = []

    def keep(mod: Any, inp: Any, out: Any) -> None:
        found.append((mod, tuple(inp[0].shape), tuple(out.shape)))

    hooks = [m.register_forward_hook(keep) for m in model.modules() if isinstance(m, nn.Conv2d)]
    with torch.no_grad():
        model(x)
    for h in hooks:
        h.remove()
    return found


def conv_chain(model: nn.Module, x: torch.Tensor, blocked: bool) -> tuple[Any, list[str]]:
    """A callable that runs every conv of ``model`` once as a oneDNN fp32 primitive (inputs of ``x``'s shapes), and
    the kernels oneDNN chose."""
    from pytorchtricks.tricks.model.onednn_plan.binding import _DESC_BYTES as DESC_BYTES
    from pytorchtricks.tricks.model.onednn_plan.binding import (
        ARG_BIAS,
        ARG_DST,
        ARG_SRC,
        ARG_WEIGHTS,
        CONVOLUTION_DIRECT,
        ELTWISE_RELU,
        F32,
        FORWARD_INFERENCE,
        QUERY_WEIGHTS_MD,
        _check,
        _dims,
        _ExecArg,
        _load,
    )
    from pytorchtricks.tricks.model.onednn_plan.executor import OnednnPlan

    lib = _load()
    plan = OnednnPlan(lib)  # only for its handles' lifetime and its memory-descriptor helpers

    def nhwc(d: tuple[int, ...]) -> tuple[int, ...] | None:
        return None if blocked else (d[1] * d[2] * d[3], 1, d[3] * d[1], d[1])

    steps = []
    for conv, src_dims, dst_dims in _conv_shapes(model, x):
        w = conv.weight.detach().contiguous()
        b = (conv.bias.detach() if conv.bias is not None else torch.zeros(w.shape[0])).contiguous()
        w_user = plan._md(tuple(w.shape), F32, tuple(w.stride()))
        b_md = plan._md((w.shape[0],), F32, (1,))
        desc = ctypes.create_string_buffer(DESC_BYTES)
        plan._keep.append(desc)
        _check(
            lib.dnnl_dilated_convolution_forward_desc_init(
                desc,
                FORWARD_INFERENCE,
                CONVOLUTION_DIRECT,
                plan._md(src_dims, F32, nhwc(src_dims)),
                plan._md(tuple(w.shape), F32, None),
                b_md,
                plan._md(dst_dims, F32, nhwc(dst_dims)),
                _dims(conv.stride),
                _dims([d - 1 for d in conv.dilation]),
                _dims(conv.padding),
                _dims(conv.padding),
            ),
            "a convolution",
        )
        pd, prim = plan._primitive(
            desc, plan._attr(None, 0, post=[("eltwise", ELTWISE_RELU, 0.0, 0.0)]), "conv"
        )
        mds = [
            lib.dnnl_primitive_desc_query_md(pd, q, 0) for q in (QUERY_SRC_MD, QUERY_DST_MD, QUERY_WEIGHTS_MD)
        ]
        src, dst, wts = (
            plan._memory(md, torch.zeros(int(lib.dnnl_memory_desc_get_size(md)), dtype=torch.uint8))
            for md in mds
        )
        reorder = plan._reorder(
            w_user, mds[2], 0, "the weight reorder"
        )  # weights prepacked once, as a plan would
        plan._run_now(reorder, [(ARG_SRC, plan._memory(w_user, w)), (ARG_DST, wts)], "the weight reorder")
        args = (_ExecArg * 4)(
            _ExecArg(ARG_SRC, src),
            _ExecArg(ARG_WEIGHTS, wts),
            _ExecArg(ARG_BIAS, plan._memory(b_md, b)),
            _ExecArg(ARG_DST, dst),
        )
        plan._keep.append(args)
        steps.append((prim, args))

    def run() -> None:
        for prim, args in steps:
            lib.dnnl_primitive_execute(prim, plan._stream, 4, args)
        lib.dnnl_stream_wait(plan._stream)

    run.plan = plan  # type: ignore[attr-defined]  # keeps the handles alive as long as the callable
    return run, sorted(set(plan.kernels))


def run(px: int, batches: list[int], threads: list[int], rounds: int) -> list[dict[str, Any]]:
    import onnxruntime as ort
    import torchvision

    import pytorchtricks as ptt
    from pytorchtricks.fixtures import randomize_bn_

    torch.manual_seed(0)
    base = randomize_bn_(torchvision.models.resnet18(weights=None)).eval()
    from pytorchtricks.tricks.model.onednn_plan.binding import _load

    ver = _load().dnnl_version().contents
    env = {
        **environment("cpu"),
        "onednn": f"{ver.major}.{ver.minor}.{ver.patch}",
        "onnxruntime": ort.__version__,
    }
    rows: list[dict[str, Any]] = []
    for batch in batches:
        x = torch.randn(batch, 3, px, px)
        fused = ptt.fuse_conv_bn_(copy.deepcopy(base), x)
        path = os.path.join(tempfile.mkdtemp(prefix="ptt-fp32-ceiling-"), "r18.onnx")
        ptt.export_onnx(fused, x, path)
        for t in threads:
            torch.set_num_threads(t)
            opts = ort.SessionOptions()
            opts.intra_op_num_threads, opts.inter_op_num_threads = t, 1
            opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
            sess = ort.InferenceSession(path, sess_options=opts, providers=["CPUExecutionProvider"])
            feed = {sess.get_inputs()[0].name: x.numpy()}
            variants: dict[str, Any] = {ORT: lambda sess=sess, feed=feed: sess.run(None, feed)}
            kernels: dict[str, list[str]] = {}
            for (
                name,
                blocked,
            ) in LAYOUTS.items():  # built after set_num_threads: oneDNN fixes threads per primitive
                variants[name], kernels[name] = conv_chain(fused, x, blocked)
            result = compare(variants, baseline=ORT, rounds=rounds, min_run_time_s=0.2)
            for name, v in result.variants.items():
                rows.append({"kind": "bench", "benchmark": "fp32_conv_ceiling", "variant": name, "batch": batch,
                             "px": px, "threads": t, "rounds": result.rounds, "median_s": v.stats.median_s,
                             "q1_s": v.stats.q1_s, "q3_s": v.stats.q3_s, "vs_ort": v.ratio,
                             "vs_ort_q1": v.ratio_q1, "vs_ort_q3": v.ratio_q3, "kernels": kernels.get(name, []),
                             "onednn": env["onednn"], "env": {**env, "threads": t}})  # fmt: skip
            print(f"batch {batch} threads {t}: done", flush=True)
    return rows


def to_markdown(rows: list[dict[str, Any]]) -> str:
    env = rows[0]["env"] if rows else {}
    configs = sorted({(r["batch"], r["threads"]) for r in rows})
    out = [
        f"# oneDNN fp32 convolutions alone vs ONNX Runtime's whole model: ResNet-18, {rows[0]['px'] if rows else '?'} px",
        "",
        f"{env.get('cpu')} ({cpu_caps().cpu_class}; flags {', '.join(env.get('cpu_flags', []))}), torch "
        f"{env.get('torch')}, system oneDNN {env.get('onednn')}, onnxruntime {env.get('onnxruntime')}, "
        f"{env.get('cpu_count')} cores; median ms over {rows[0]['rounds'] if rows else '?'} "
        "interleaved rounds, and ORT's time / this one (paired per round, IQR): above 1.0x is faster than ORT. "
        "The conv rows run only the convolutions (fused ReLU, prepacked weights): a lower bound of a oneDNN fp32 "
        "plan's call.",
        "",
        "| variant | " + " | ".join(f"b{b} t{t}" for b, t in configs) + " |",
        "|---|" + "---|" * len(configs),
    ]
    for name in [ORT, *LAYOUTS]:
        cells = []
        for b, t in configs:
            r = next(r for r in rows if r["variant"] == name and (r["batch"], r["threads"]) == (b, t))
            cells.append(
                f"{r['median_s'] * 1e3:.1f} ms, {r['vs_ort']:.2f}x ({r['vs_ort_q1']:.2f}-{r['vs_ort_q3']:.2f})"
            )
        out.append(f"| {name} | " + " | ".join(cells) + " |")
    kernels = sorted({k for r in rows for k in r["kernels"]})
    out += ["", f"oneDNN {rows[0].get('onednn', '?') if rows else '?'} kernels: {', '.join(kernels)}", ""]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--px", type=int, default=160)
    p.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    p.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--out", default=os.path.join("results", cpu_caps().cpu_class, "fp32_conv_ceiling"))
    args = p.parse_args(argv)
    warnings.filterwarnings("ignore")
    rows = run(args.px, args.batches, args.threads, args.rounds)
    return publish(args.out, rows, to_markdown(rows))


if __name__ == "__main__":
    sys.exit(main())
