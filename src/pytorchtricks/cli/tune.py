"""``ptt tune``: measure the catalogue on a model and data, recommend the fastest correct setup."""

from __future__ import annotations

import argparse
from typing import Any

from pytorchtricks.cli._common import MODEL_SPEC_HELP, _console, add_split


def _add_tune(sub: Any) -> None:
    p = sub.add_parser(
        "tune", help="diagnose, A/B-measure every applicable trick, combine the winners, write a receipt"
    )
    p.add_argument(
        "--model",
        help=MODEL_SPEC_HELP + " (default: ResNet-18)",
    )
    p.add_argument(
        "--data",
        help="an image folder, a `ptt pack` folder, a COCO / YOLO / VOC root (with --task detection), or "
        "`synthetic` (default: built-in wallpaper photo set)",
    )
    add_split(p)
    p.add_argument(
        "--batch-size",
        type=_batch_arg,
        default=None,
        help="default: 32; auto (with --memory-budget SIZE): the fastest batch that fits",
    )
    p.add_argument(
        "--input-shape",
        default=None,
        metavar="C,H,W",
        help="one sample's shape, e.g. 1,28,28 for MNIST (default: the model's first conv's channels, 64 px)",
    )
    p.add_argument("--input-size", type=int, default=None, help="just the image side in pixels (default: 64)")
    p.add_argument(
        "--num-workers",
        type=int,
        default=2,
        help="DataLoader workers your loop uses today: the baseline loads with them (default: 2, the common -j 2)",
    )
    p.add_argument(
        "--goal",
        default="speed",
        choices=("speed", "memory", "both"),
        help="speed (default); memory: the smallest step peak within 10%% of the best speed (memory tricks)",
    )
    p.add_argument(
        "--memory-budget",
        default=None,
        metavar="SIZE",
        help="the step peak to fit: 24GiB, 1.5G (a bare K/M/G is binary), 300MB, bytes, or 50%% of the baseline's "
        "measured peak; tune then recommends the fastest configuration of the memory tricks that fits (the batch "
        "stays --batch-size: only gradient accumulation splits it, with the same update)",
    )
    p.add_argument("--for", dest="for_", default="train", choices=("train", "inference"))
    p.add_argument("--time-budget", type=float, default=None, help="seconds for the whole run (default: 175)")
    p.add_argument("--device", default="cpu", help="cpu or cuda")
    p.add_argument(
        "--task",
        default="classification",
        choices=("classification", "detection"),
        help="detection: a torchvision detector (--model torchvision:NAME, default "
        "fasterrcnn_mobilenet_v3_large_320_fpn, random weights) on a COCO / YOLO / VOC root (--data; default: the "
        "built-in 2-24 MP photos with boxes); --input-size is the shortest side",
    )
    p.add_argument(
        "--device-step-ms",
        type=float,
        default=None,
        metavar="MS",
        help="your accelerator's training step in milliseconds (from your logs, or `ptt doctor run` on the GPU "
        "machine): each loader is timed feeding a stand-in step that holds the training process that long "
        "without using the CPU's cores; the receipt is a projection for that step (model tricks are not measured)",
    )
    p.add_argument(
        "--accuracy-steps",
        type=int,
        default=0,
        metavar="N",
        help="after the recommendation, train N steps of the baseline and of the recommended pipeline from one "
        "initialisation (--accuracy-seeds seeds each) and say whether the recommended loss stays inside the "
        "baseline's seed-to-seed band: 'faster, and it learns the same' (extra time, outside --time-budget; "
        "default: 0, no check)",
    )
    p.add_argument(
        "--accuracy-seeds",
        type=int,
        default=3,
        metavar="K",
        help="seeds per pipeline for --accuracy-steps; each drives the data order and augmentation (default: 3, "
        "the fewest that give a usable band)",
    )
    p.add_argument(
        "--out", default="tune-out", help="receipt folder, replaced atomically (default: %(default)s)"
    )
    p.set_defaults(handler=_cmd_tune)


def _batch_arg(text: str) -> int | str:
    if text.strip().lower() == "auto":
        return "auto"
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"a positive integer or auto, not {text!r}") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"a positive integer or auto, not {text!r}")
    return n


def _cmd_tune(args: argparse.Namespace) -> int:
    from pytorchtricks.tune.console import RichProgress, memory_table, receipt_table, summary_lines
    from pytorchtricks.tune.engine import tune_model

    console = _console()
    res = tune_model(
        args.model, args.data, batch_size=args.batch_size, input_size=args.input_size,
        input_shape=args.input_shape, num_workers=args.num_workers, goal=args.goal, for_=args.for_,
        time_budget_s=args.time_budget, device=args.device, out=args.out, progress=RichProgress(console),
        memory_budget=args.memory_budget, device_step_ms=args.device_step_ms, task=args.task, split=args.split,
        accuracy_steps=args.accuracy_steps, accuracy_seeds=args.accuracy_seeds,
    )  # fmt: skip
    console.print(receipt_table(res))
    if res.memory is not None:
        console.print(memory_table(res))
    for line in summary_lines(res, args.out):
        console.print(line, highlight=False)
    return 130 if res.interrupted else 0
