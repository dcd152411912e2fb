"""int8 without VNNI: what the AVX2 kernels' int16 saturation costs, and what each remedy gets back (accuracy only).

Without VNNI, oneDNN's AVX2 u8 x s8 kernels multiply with ``vpmaddubsw``, which adds each pair of products into
int16 with saturation: 2 * 255 * 127 > 32767. The ways to stay inside int16: 7-bit activations (0..127, what
``quantize`` does there: ``reduce_range``) or 7-bit weights (-64..63, what ONNX Runtime's ``reduce_range`` does).
ResNet-18 (random weights, randomized BN) at 160 px, PT2E int8 with torchao's X86InductorQuantizer (histogram
observer for activations, per-channel min/max for weights), calibrated on 16 Debian wallpaper photos; SQNR vs fp32
on 48 other photos, through the real oneDNN kernels (the oneDNN plan, built even where it saturates) and through the
reference int8 graph (float arithmetic on the int8 values: what the kernels would give without saturation).
No timing, so no benchmark lock. On a VNNI CPU run it with ``ONEDNN_MAX_CPU_ISA=AVX2`` to see the AVX2 kernels.

    make bench-int8-no-vnni       # writes results/<cpu class>/int8_no_vnni.{jsonl,md}
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import os
import sys
import warnings
from typing import Any

import torch

from pytorchtricks.clock import environment, publish
from pytorchtricks.hardware import cpu_caps
from pytorchtricks.safety import sqnr_db

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from inference_cpu import CALIBRATION, HELD_OUT, photos  # the same photos as bench-infer

# name -> (activation qmax, weight qmin, weight qmax)
SETTINGS = {
    "8-bit activations, 8-bit weights (saturates without VNNI)": (255, -128, 127),
    "7-bit activations (reduce_range: quantize's choice here)": (127, -128, 127),
    "7-bit weights (ONNX Runtime's reduce_range)": (255, -64, 63),
}


def _quantizer(act_qmax: int, w_qmin: int, w_qmax: int) -> Any:
    from torchao.quantization.pt2e.quantizer import x86_inductor_quantizer as xiq

    cfg = xiq.get_default_x86_inductor_quantization_config(reduce_range=act_qmax == 127)
    weight = dataclasses.replace(cfg.weight, quant_min=w_qmin, quant_max=w_qmax)
    q = xiq.X86InductorQuantizer()
    q.set_global(dataclasses.replace(cfg, weight=weight))
    return q


def run(px: int, threads: int) -> list[dict[str, Any]]:
    import torchvision
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    import pytorchtricks as ptt
    from pytorchtricks.fixtures import randomize_bn_
    from pytorchtricks.tricks.model._onednn_plan import build_plan

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    base = randomize_bn_(torchvision.models.resnet18(weights=None)).eval()
    calib = photos((1, 3, px, px), batches=CALIBRATION)
    held = photos((1, 3, px, px), batches=HELD_OUT + CALIBRATION)[CALIBRATION:]
    with torch.no_grad():
        ref = torch.cat([base(h) for h in held])
    caps, env, rows = cpu_caps(), environment("cpu"), []
    for name, (act_qmax, w_qmin, w_qmax) in SETTINGS.items():
        unshared = ptt.unshare_modules_(copy.deepcopy(base))  # resnet's one ReLU per block, called twice
        graph = torch.export.export(unshared, (calib[0],)).module()
        prepared = prepare_pt2e(graph, _quantizer(act_qmax, w_qmin, w_qmax))
        with torch.no_grad():
            for c in calib:
                prepared(c)
        int8 = convert_pt2e(prepared)
        plan = build_plan(int8, (calib[0],), min_sqnr_db=-100.0, allow_saturation=True)
        with torch.no_grad():
            kernels = torch.cat([plan(h) for h in held])
            reference = torch.cat([int8(h) for h in held])
        rows.append(
            {
                "kind": "bench",
                "benchmark": "int8_no_vnni",
                "setting": name,
                "activation_qmax": act_qmax,
                "weight_range": [w_qmin, w_qmax],
                "sqnr_kernels_db": float(sqnr_db(ref, kernels)),
                "sqnr_reference_db": float(sqnr_db(ref, reference)),
                "px": px,
                "vnni": caps.vnni,
                "cpu_class": caps.cpu_class,
                "env": env,
            }
        )
        print(f"{name}: kernels {rows[-1]['sqnr_kernels_db']:.2f} dB", flush=True)
    return rows


def to_markdown(rows: list[dict[str, Any]]) -> str:
    env = rows[0]["env"] if rows else {}
    out = [
        f"# int8 on this CPU ({rows[0]['cpu_class'] if rows else '?'}, VNNI {rows[0]['vnni'] if rows else '?'}): "
        "saturation and its remedies",
        "",
        f"{env.get('cpu')}, torch {env.get('torch')}. ResNet-18 (random weights, randomized BN), "
        f"{rows[0]['px'] if rows else '?'} px; SQNR vs fp32 over {HELD_OUT} held-out photos, calibrated on "
        f"{CALIBRATION} others. 'kernels': through oneDNN's int8 primitives (the oneDNN plan); 'reference': the same "
        "int8 graph in float arithmetic (no saturation).",
        "",
        "| setting | SQNR dB, kernels | SQNR dB, reference |",
        "|---|---|---|",
    ]
    for r in rows:
        out.append(f"| {r['setting']} | {r['sqnr_kernels_db']:.2f} | {r['sqnr_reference_db']:.2f} |")
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--px", type=int, default=160)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", default=os.path.join("results", cpu_caps().cpu_class, "int8_no_vnni"))
    args = p.parse_args(argv)
    warnings.filterwarnings("ignore")
    rows = run(args.px, args.threads)
    return publish(args.out, rows, to_markdown(rows))


if __name__ == "__main__":
    sys.exit(main())
