"""CPU inference: ResNet-18 (random weights, randomized BN) at 160 px, batch 1 and 8, 1 and 2 threads.

Variants, timed interleaved per configuration (``clock.compare``): eager fp32, channels_last, fused
(``fuse_conv_bn_``), compile + freezing, bf16 (+ compile + freezing), int8 (ours: the staged
``infer.pipeline`` with the oneDNN plan), ONNX Runtime fp32 and static int8 (QDQ), 50% channels physically removed (eager), and RepVGG train vs
deploy form. int8 is calibrated on real photos (Debian wallpaper packages) and its SQNR vs fp32 is measured on them.
The picker's choice row is the file `ptt optimize --precision any` hands back for that batch and thread count.

    make bench-infer                      # full run; writes results/<cpu class>/inference_cpu.{jsonl,md}
    python benchmarks/inference_cpu.py --rounds 3 --quick
"""

from __future__ import annotations

import argparse
import copy
import glob
import os
import sys
import tempfile
import warnings
from typing import Any

import torch

from pytorchtricks.clock import compare, environment, publish
from pytorchtricks.hardware import cpu_caps
from pytorchtricks.safety import reference_outputs, sqnr_db

PHOTO_GLOBS = (
    "/usr/share/backgrounds/*.jpg",
    "/usr/share/backgrounds/mate/*/*.jpg",
    "/usr/share/wallpapers/*/*/*/*.jpg",
)
PICKED = "picker's choice (ptt optimize --precision any)"
CALIBRATION, HELD_OUT = 16, 48  # photos: the first 16 calibrate int8, the next 48 measure SQNR


def photos(shape: tuple[int, ...], batches: int) -> list[torch.Tensor]:
    from pytorchtricks.infer.pipeline import load_calibration

    tmp = tempfile.mkdtemp(prefix="ptt-calib-")
    files = sorted({f for g in PHOTO_GLOBS for f in glob.glob(g)})[: shape[0] * batches]
    for i, f in enumerate(files):
        os.symlink(f, os.path.join(tmp, f"{i:04d}.jpg"))
    if not files:
        print("warning: no wallpaper photos found; calibrating on random inputs", file=sys.stderr)
        return [torch.randn(*shape) for _ in range(batches)]
    return load_calibration(tmp, shape, limit=shape[0] * batches)


def build_variants(batch: int, px: int, quick: bool) -> tuple[dict[str, Any], dict[str, float], torch.Tensor]:
    import torchvision

    import pytorchtricks as ptt
    from pytorchtricks.fixtures import randomize_bn_
    from pytorchtricks.infer.pipeline import optimize
    from pytorchtricks.tricks.model._rep_blocks import repvgg_net
    from pytorchtricks.tricks.model.export_onnx import OnnxRunner, quantize_onnx_static

    torch.manual_seed(0)
    base = randomize_bn_(torchvision.models.resnet18(weights=None)).eval()
    calib = photos((batch, 3, px, px), batches=max(2, CALIBRATION // batch))
    x = calib[0]
    ref = reference_outputs(base, x)[0]
    fns: dict[str, Any] = {"eager fp32": base}
    fns["channels_last"] = ptt.to_channels_last_(copy.deepcopy(base))
    fused = ptt.fuse_conv_bn_(copy.deepcopy(base), x)
    fns["fused"] = fused
    if not quick:
        fns["compile+freezing"] = ptt.compile_(copy.deepcopy(fused), for_inference=True)
        fns["bf16 compile+freezing"] = ptt.quantize(copy.deepcopy(base), x, "bf16")
    opt = optimize(copy.deepcopy(base), x, int8=True, calibration=calib, compile=not quick)
    fns["int8 pipeline (oneDNN plan)"] = opt.model
    tmp = tempfile.mkdtemp(prefix="ptt-onnx-")
    fp32_path, int8_path = os.path.join(tmp, "r18.onnx"), os.path.join(tmp, "r18.int8.onnx")
    ptt.export_onnx(base, x, fp32_path)
    quantize_onnx_static(fp32_path, int8_path, calib)
    fns["ORT fp32"] = OnnxRunner(fp32_path)
    fns["ORT static int8"] = OnnxRunner(int8_path)
    fns["pruned 50% (eager)"] = ptt.prune_channels_(copy.deepcopy(base), 0.5)
    # SQNR over held-out photos (not among the calibration images), in batches of the benchmarked shape: one
    # image's SQNR moves by +-0.2 dB between two builds of the same int8 graph (rounding), 48 images do not
    held = torch.cat(photos((1, 3, px, px), batches=HELD_OUT + CALIBRATION)[CALIBRATION:]).split(batch)
    held = [h for h in held if h.shape[0] == batch]
    with torch.no_grad():
        refs = torch.cat([base(h) for h in held])
    sq: dict[str, float] = {}
    for name, fn in fns.items():
        with torch.no_grad():
            outs = [
                fn(h.contiguous(memory_format=torch.channels_last) if name == "channels_last" else h)
                for h in held
            ]
        sq[name] = sqnr_db(refs, torch.cat(outs)) if outs[0].shape == ref.shape else float("nan")
    sq["pruned 50% (eager)"] = float("nan")  # a different (smaller, untrained) model: accuracy lives in tests
    rep_train = randomize_bn_(repvgg_net(1000, widths=(48, 96, 192, 1280), depths=(2, 4, 14, 1))).eval()
    fns["RepVGG-A0 train form"] = rep_train
    fns["RepVGG-A0 deploy form"] = ptt.reparameterize_(copy.deepcopy(rep_train), x)
    with torch.no_grad():
        sq["RepVGG-A0 deploy form"] = sqnr_db(rep_train(x), fns["RepVGG-A0 deploy form"](x))
    warnings.simplefilter("default")
    return fns, sq, x, calib, held, base


def picker_choice(
    base: Any,
    x: torch.Tensor,
    calib: list[torch.Tensor],
    held: list[torch.Tensor],
    threads: int,
    workdir: str,
) -> tuple[str, Any, float]:
    """What ``ptt optimize --precision any`` hands back for this batch and thread count: (its name, the loaded
    file, its SQNR on the held-out photos).

    The candidates' files are built once per batch (``workdir``) and loaded, checked and timed at each thread count.
    """
    from pytorchtricks.infer import artefacts
    from pytorchtricks.infer.picker import pick_artefact

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        picked = pick_artefact(base, x, calibration=calib, held_out=held[:8], precision="any", threads=threads,
                               rounds=3, workdir=workdir, reuse_files=True)  # fmt: skip
    win = picked.winner
    if win is None or win.path is None:
        raise SystemExit(f"the picker found no candidate for batch {x.shape[0]}, {threads} threads")
    fn = artefacts.load(win.kind, win.path, input_shapes=[tuple(x.shape)], threads=threads)
    return win.name, fn, float(win.sqnr_db or float("nan"))


def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for batch in args.batches:
        fns, sq, x, calib, held, base = build_variants(batch, args.px, args.quick)
        x_cl = x.contiguous(memory_format=torch.channels_last)
        workdir = tempfile.mkdtemp(prefix=f"ptt-pick-b{batch}-")
        for threads in args.threads:
            torch.set_num_threads(threads)
            picked = None
            if not args.quick:  # the file ptt optimize writes, in the same interleaved run as every variant
                picked, fns[PICKED], sq[PICKED] = picker_choice(base, x, calib, held, threads, workdir)
            for name in (
                "ORT fp32",
                "ORT static int8",
            ):  # a session keeps its thread count: rebuild per count
                fns[name] = type(fns[name])(fns[name].path, threads=threads)

            def call(name: str, fn: Any, x: torch.Tensor = x, x_cl: torch.Tensor = x_cl) -> Any:
                inp = x_cl if name == "channels_last" else x

                def go() -> Any:
                    with torch.no_grad():
                        return fn(inp)

                return go

            variants = {("baseline" if n == "eager fp32" else n): call(n, f) for n, f in fns.items()}
            cmp = compare(
                variants, rounds=args.rounds, min_run_time_s=args.min_run_time_s, num_threads=threads
            )
            rep = cmp["RepVGG-A0 train form"].stats.median_s / cmp["RepVGG-A0 deploy form"].stats.median_s
            env = environment("cpu")
            for vname, res in cmp.variants.items():
                name = "eager fp32" if vname == "baseline" else vname
                rows.append(
                    {
                        "kind": "bench",
                        "benchmark": "inference_cpu",
                        "model": "RepVGG-A0" if name.startswith("RepVGG") else "resnet18",
                        "variant": name,
                        "batch": batch,
                        "px": args.px,
                        "threads": threads,
                        "median_s": res.stats.median_s,
                        "q1_s": res.stats.q1_s,
                        "q3_s": res.stats.q3_s,
                        "speedup_vs_eager": res.ratio,
                        "speedup_q1": res.ratio_q1,
                        "speedup_q3": res.ratio_q3,
                        "repvgg_deploy_vs_train": rep if name.startswith("RepVGG") else None,
                        "sqnr_db": sq.get(name),
                        "picked": picked if name == PICKED else None,
                        "rounds": cmp.rounds,
                        "env": env,
                    }
                )
            print(f"batch {batch} threads {threads}: done", flush=True)
    return rows


def to_markdown(rows: list[dict[str, Any]]) -> str:
    configs = sorted({(r["batch"], r["threads"]) for r in rows})
    names = list(dict.fromkeys(r["variant"] for r in rows))
    head = "| variant | SQNR dB | " + " | ".join(f"b{b} t{t}" for b, t in configs) + " |"
    out = [head, "|" + "---|" * (2 + len(configs))]
    for n in names:
        cells = []
        for b, t in configs:
            r = next((r for r in rows if r["variant"] == n and r["batch"] == b and r["threads"] == t), None)
            cell = "-" if r is None else f"{r['speedup_vs_eager']:.2f}x ({r['median_s'] * 1e3:.1f} ms)"
            if r is not None and r.get("picked"):
                cell += f": {r['picked']}, {r['sqnr_db']:.1f} dB"
            cells.append(cell)
        sq = next((r["sqnr_db"] for r in rows if r["variant"] == n), None)
        sq_s = "-" if sq is None or sq != sq else ("inf" if sq == float("inf") else f"{sq:.1f}")
        out.append(f"| {n} | {sq_s} | " + " | ".join(cells) + " |")
    env = rows[0]["env"] if rows else {}
    rep = [r for r in rows if r["variant"] == "RepVGG-A0 deploy form"]
    lines = [
        f"# CPU inference, ResNet-18 (random weights, randomized BN), {rows[0]['px'] if rows else '?'} px",
        "",
        f"{env.get('cpu')}, torch {env.get('torch')}, {env.get('cpu_count')} cores; speed-up = eager fp32 median / "
        f"variant median, per configuration (bB = batch, tT = threads), paired over {rows[0]['rounds'] if rows else 0} "
        "interleaved rounds (median time in brackets). RepVGG rows are vs ResNet-18 eager; "
        "deploy vs train form is listed below. SQNR vs eager fp32 over 48 held-out photos (int8 is calibrated on 16 others).",
        "",
        *out,
        "",
        "RepVGG-A0 deploy vs train form: "
        + ", ".join(f"b{r['batch']} t{r['threads']} {r['repvgg_deploy_vs_train']:.2f}x" for r in rep),
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    p.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    p.add_argument("--px", type=int, default=160)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--min-run-time-s", type=float, default=0.2)
    p.add_argument("--quick", action="store_true", help="no compile (smoke run of the script)")
    p.add_argument("--out", default=os.path.join("results", cpu_caps().cpu_class, "inference_cpu"))
    args = p.parse_args(argv)
    warnings.filterwarnings("ignore")
    rows = run(args)
    return publish(args.out, rows, to_markdown(rows))


if __name__ == "__main__":
    sys.exit(main())
