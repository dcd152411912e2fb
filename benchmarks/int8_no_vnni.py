"""int8 without VNNI: what the AVX2 kernels' int16 saturation costs, and what each remedy gets back (accuracy only).

Without VNNI, oneDNN's AVX2 u8 x s8 kernels multiply with ``vpmaddubsw``, which adds each pair of products into
int16 with saturation: 2 * 255 * 127 > 32767. The ways to stay inside int16: 7-bit activations (0..127,
``reduce_range``), 7-bit weights (-64..63, what ONNX Runtime's ``reduce_range`` does), or any split in between
(2 * act * weight <= 32767), chosen per layer (``balance_ranges_``: what ``quantize`` does there), plus the remedies
that do not touch the bit split: the histogram's range search for the real level count, MSE weight ranges, bias
correction, more calibration photos. Every setting tried is a row.
ResNet-18 (random weights, randomized BN) at 160 px, PT2E int8 with torchao's X86InductorQuantizer (histogram
observer for activations, per-channel min/max for weights), calibrated on 16 Debian wallpaper photos; SQNR vs fp32
on 48 other photos, through the real oneDNN kernels (the oneDNN plan: built with ``allow_saturation`` only for the
8-bit row; every other row must pass the plan's exactness check) and through the reference int8 graph (float
arithmetic on the int8 values: what the kernels would give without saturation).
No timing, but it computes for minutes: run it under the benchmark lock on a shared box. On a VNNI CPU run it with
``ONEDNN_MAX_CPU_ISA=AVX2`` to see the AVX2 kernels.

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
from pytorchtricks.tricks.model._int8_ranges import ACT_QMAX_CHOICES

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from inference_cpu import CALIBRATION, HELD_OUT, photos  # the same photos as bench-infer

# name -> (activation qmax, weight qmin, weight qmax): torchao's quantizer configured globally
SETTINGS = {
    "8-bit activations, 8-bit weights (saturates without VNNI)": (255, -128, 127),
    "7-bit activations everywhere (reduce_range=True; quantize's choice here before balancing)": (
        127,
        -128,
        127,
    ),
    "7-bit weights (ONNX Runtime's reduce_range)": (255, -64, 63),
}
# name -> how the observers of one 8-bit calibration are set before convert: act = activation qmax or "balanced"
# (balance_ranges_), matched = the histogram's range search for the real level count, more = extra calibration
# photos, clip = MSE weight ranges, bias = bias correction, grid = activation levels balance_ranges_ tries.
# Activations that no conv/linear reads keep 0..255.
BASE = {
    "act": "balanced",
    "matched": True,
    "more": 0,
    "clip": False,
    "bias": False,
    "grid": ACT_QMAX_CHOICES,
    "int16": True,
}
REMEDIES = {
    "7-bit activations, histogram range search for 128 levels (torchao searches for 256)": {
        **BASE,
        "act": 127,
    },
    "one split everywhere: activations 0..191, weights -85..85": {**BASE, "act": 191},
    "balanced per layer: each conv/linear input's levels by its own output error": BASE,
    "balanced per layer, levels 127..255 in steps of 8": {**BASE, "grid": tuple(range(127, 256, 8))},
    "balanced per layer + MSE weight ranges": {**BASE, "clip": True},
    "balanced per layer + bias correction": {**BASE, "bias": True},
    "balanced per layer + MSE weight ranges + bias correction": {**BASE, "clip": True, "bias": True},
    "7-bit activations + bias correction": {**BASE, "grid": (127,), "bias": True},
    "7-bit activations + MSE weight ranges + bias correction": {
        **BASE,
        "grid": (127,),
        "clip": True,
        "bias": True,
    },
    "8-bit everywhere + MSE weight ranges + bias correction (saturates here; 'reference' is what VNNI computes)": {
        **BASE,
        "grid": (255,),
        "clip": True,
        "bias": True,
        "int16": False,
    },
    "balanced per layer, calibrated on 64 photos": {**BASE, "more": 48},
    "balanced + MSE weight ranges + bias correction, calibrated on 64 photos": {
        **BASE,
        "clip": True,
        "bias": True,
        "more": 48,
    },
}
# what quantize does on a CPU without VNNI (``int8_range`` -> "balanced", ``_static_int8``)
CHOICE = "balanced per layer + MSE weight ranges + bias correction"


def _quantizer(act_qmax: int, w_qmin: int, w_qmax: int) -> Any:
    from torchao.quantization.pt2e.quantizer import x86_inductor_quantizer as xiq

    cfg = xiq.get_default_x86_inductor_quantization_config(reduce_range=act_qmax == 127)
    weight = dataclasses.replace(cfg.weight, quant_min=w_qmin, quant_max=w_qmax)
    q = xiq.X86InductorQuantizer()
    q.set_global(dataclasses.replace(cfg, weight=weight))
    return q


def _row(
    name: str, held: list[torch.Tensor], ref: torch.Tensor, int8: Any, calib: list[torch.Tensor]
) -> dict:
    from pytorchtricks.tricks.model.onednn_plan import build_plan

    # remedies are built without allow_saturation: the plan refuses (and its self-check fails) unless they are exact
    saturates = (name in SETTINGS and SETTINGS[name][0] == 255 and SETTINGS[name][2] == 127) or (
        name in REMEDIES and not REMEDIES[name]["int16"]
    )
    plan = build_plan(
        int8, (calib[0],), min_sqnr_db=-100.0 if saturates else None, allow_saturation=saturates
    )
    with torch.no_grad():
        kernels = torch.cat([plan(h) for h in held])
        reference = torch.cat([int8(h) for h in held])
    return {
        "setting": name,
        "sqnr_kernels_db": float(sqnr_db(ref, kernels)),
        "sqnr_reference_db": float(sqnr_db(ref, reference)),
    }


def run(px: int, threads: int) -> list[dict[str, Any]]:
    import torchvision
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    import pytorchtricks as ptt
    from pytorchtricks.fixtures import randomize_bn_
    from pytorchtricks.tricks.model._int8_ranges import (
        BALANCE_SAMPLES,
        _matmul_sites,
        _set_levels,
        balance_ranges_,
        capture_inputs,
        weight_absmax_for,
    )

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    base = randomize_bn_(torchvision.models.resnet18(weights=None)).eval()
    every = photos((1, 3, px, px), batches=CALIBRATION + HELD_OUT + max(r["more"] for r in REMEDIES.values()))
    calib, held = every[:CALIBRATION], every[CALIBRATION : CALIBRATION + HELD_OUT]
    extra = every[CALIBRATION + HELD_OUT :]
    with torch.no_grad():
        ref = torch.cat([base(h) for h in held])
    caps, env, rows = cpu_caps(), environment("cpu"), []

    def record(row: dict[str, Any], **more: Any) -> None:
        row.update(
            kind="bench", benchmark="int8_no_vnni", px=px, vnni=caps.vnni, cpu_class=caps.cpu_class, env=env
        )
        row.update(more)
        rows.append(row)
        print(
            f"{row['setting']}: kernels {row['sqnr_kernels_db']:.2f} dB, reference "
            f"{row['sqnr_reference_db']:.2f} dB",
            flush=True,
        )

    def prepared_graph(quantizer: Any) -> Any:
        unshared = ptt.unshare_modules_(copy.deepcopy(base))  # resnet's one ReLU per block, called twice
        return prepare_pt2e(torch.export.export(unshared, (calib[0],)).module(), quantizer)

    for name, (act_qmax, w_qmin, w_qmax) in SETTINGS.items():
        prepared = prepared_graph(_quantizer(act_qmax, w_qmin, w_qmax))
        with torch.no_grad():
            for c in calib:
                prepared(c)
        record(
            _row(name, held, ref, convert_pt2e(prepared), calib),
            activation_qmax=act_qmax,
            weight_range=[w_qmin, w_qmax],
        )
    calibrated: dict[int, tuple[Any, dict[str, torch.Tensor]]] = {}
    for name, r in REMEDIES.items():
        act, more = r["act"], r["more"]
        if more not in calibrated:  # one 8-bit calibration per photo count; the remedies set its observers
            prepared = prepared_graph(_quantizer(255, -128, 127))
            captured, handles = capture_inputs(prepared, BALANCE_SAMPLES)
            with torch.no_grad():
                for c in calib + extra[:more]:
                    prepared(c)
            for h in handles:
                h.remove()
            calibrated[more] = (prepared, {k: torch.cat(v) for k, v in captured.items()})
        prepared = copy.deepcopy(calibrated[more][0])
        if act == "balanced":
            with torch.no_grad():
                levels = balance_ranges_(
                    prepared,
                    calibrated[more][1],
                    clip_weights=r["clip"],
                    correct_bias=r["bias"],
                    choices=r["grid"],
                    int16=r["int16"],
                )
        else:
            levels = {}
            for obs, consumers in _matmul_sites(prepared).items():
                _set_levels(prepared, obs, int(act), [w for _, w in consumers])
                if not r["matched"]:
                    prepared.get_submodule(obs).dst_nbins = 256
                levels.update({n.name: (int(act), weight_absmax_for(int(act))) for n, _ in consumers})
        record(
            _row(name, held, ref, convert_pt2e(prepared), calib),
            activation_qmax=sorted({a for a, _ in levels.values()}),
            levels={k: list(v) for k, v in levels.items()},
            calibration_photos=CALIBRATION + more,
        )
    return rows


def to_markdown(rows: list[dict[str, Any]]) -> str:
    env = rows[0]["env"] if rows else {}
    out = [
        f"# int8 on this CPU ({rows[0]['cpu_class'] if rows else '?'}, VNNI {rows[0]['vnni'] if rows else '?'}): "
        "saturation and its remedies",
        "",
        f"{env.get('cpu')}, torch {env.get('torch')}. ResNet-18 (random weights, randomized BN), "
        f"{rows[0]['px'] if rows else '?'} px; SQNR vs fp32 over {HELD_OUT} held-out photos, calibrated on "
        f"{CALIBRATION} others (unless the setting says more). 'kernels': through oneDNN's int8 primitives (the "
        "oneDNN plan; every row but the first is built only where its sums cannot saturate int16 and passes the "
        "plan's self-check against the int8 graph); 'reference': the same int8 graph in float arithmetic (no "
        "saturation).",
        "",
        "| setting | SQNR dB, kernels | SQNR dB, reference |",
        "|---|---|---|",
    ]
    for r in rows:
        name = (
            f"**{r['setting']}** (quantize's default without VNNI)"
            if r["setting"] == CHOICE
            else r["setting"]
        )
        out.append(f"| {name} | {r['sqnr_kernels_db']:.2f} | {r['sqnr_reference_db']:.2f} |")
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
