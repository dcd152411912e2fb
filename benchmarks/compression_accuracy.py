"""Accuracy on the Fashion-MNIST test set (10,000 images) after each compression, vs the fp32 model.

fp32: ``fmnist_cnn`` (16/32/64 channels) trained on the first ``--train-subset`` training images (cached);
int8: ``quantize`` static int8 (PT2E x86 + compile + freezing), calibrated on 1,024 training images;
W4A4: DoReFa 4-bit weights and activations, 1 epoch of QAT; pruned: 50% of channels removed, fine-tuned for as many
epochs as the fp32 model trained. No timing here (accuracy only), so it needs no benchmark lock.

    make bench-compression      # writes results/<cpu class>/compression_accuracy.{jsonl,md}
"""

from __future__ import annotations

import argparse
import copy
import os
import sys
import warnings
from typing import Any

import torch

import pytorchtricks as ptt
from pytorchtricks import fashion_mnist as fm
from pytorchtricks.clock import environment, write_results
from pytorchtricks.hardware import cpu_caps


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--train-subset", type=int, default=20000, help="0 = all 60,000 training images")
    p.add_argument("--epochs", type=float, default=3.0)
    p.add_argument("--out", default=os.path.join("results", cpu_caps().cpu_class, "compression_accuracy"))
    args = p.parse_args(argv)
    warnings.filterwarnings("ignore")
    subset = args.train_subset or None
    model = fm.trained_small_cnn(train_subset=subset, epochs=args.epochs)
    tx, ty = fm.load("train")
    if subset:
        tx, ty = tx[:subset], ty[:subset]
    ex, ey = fm.load("test")
    acc: dict[str, float] = {"fp32": fm.evaluate(model, ex, ey)}
    calib = [tx[i : i + 128] for i in range(0, 1024, 128)]
    q = ptt.quantize(copy.deepcopy(model), ex[:64], ptt.QuantConfig(calibration=calib))
    acc["int8 PTQ (PT2E x86, compiled)"] = fm.evaluate(q, ex, ey)
    low = ptt.quantize_lowbit_(copy.deepcopy(model), 4, 4)
    fm.train(low, tx, ty, epochs=1.0, lr=0.05, batch_size=256)
    acc["DoReFa W4A4 QAT (1 epoch)"] = fm.evaluate(low, ex, ey)
    pruned = ptt.prune_channels_(copy.deepcopy(model), 0.5)
    fm.train(pruned, tx, ty, epochs=args.epochs, lr=0.2, batch_size=256)
    acc[f"50% channels pruned + fine-tune ({args.epochs:g} epochs)"] = fm.evaluate(pruned, ex, ey)
    env = environment("cpu")
    rows: list[dict[str, Any]] = [
        {
            "kind": "accuracy",
            "benchmark": "compression_accuracy",
            "variant": k,
            "top1_pct": v,
            "drop_pts": acc["fp32"] - v,
            "train_subset": subset or 60000,
            "epochs": args.epochs,
            "torch_threads": torch.get_num_threads(),
            "env": env,
        }
        for k, v in acc.items()
    ]
    lines = [
        "# Fashion-MNIST test accuracy after compression",
        "",
        f"fmnist_cnn trained on {subset or 60000} training images for {args.epochs:g} epochs; test set 10,000 images.",
        "",
        "| variant | top-1 % | drop (points) |",
        "|---|---|---|",
        *[f"| {r['variant']} | {r['top1_pct']:.2f} | {r['drop_pts']:+.2f} |" for r in rows],
        "",
    ]
    write_results(args.out, rows, "\n".join(lines))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
