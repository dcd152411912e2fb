"""``ptt yolo ...``: Ultralytics' ``yolo`` command with ``ptt.ultralytics.accelerate()`` installed for its trainers."""

from __future__ import annotations

import argparse
from typing import Any


def _add_yolo(sub: Any) -> None:
    p = sub.add_parser(
        "yolo",
        help="Ultralytics' yolo command (yolo train model=... data=... imgsz=...) with its datasets read through "
        "ptt: DCT-scaled decode, ptt packs, cache=ram as the node-shared arena (pip install "
        "'pytorchtricks[ultralytics]')",
        description="Runs Ultralytics' own `yolo` entry point on the arguments as `yolo` takes them, with "
        "ptt.ultralytics.accelerate() installed for every trainer it makes. Example: ptt yolo train "
        "model=yolov8n.yaml data=data.yaml imgsz=640 epochs=100",
    )
    p.add_argument(
        "--match",
        choices=("stock", "speed"),
        default="stock",
        help="stock: pixels within 35 dB of Ultralytics' own load (default); speed: the largest DCT scale, fewer "
        "pixels decoded (before the yolo arguments: ptt yolo --match speed train ...)",
    )
    p.add_argument("args", nargs=argparse.REMAINDER, help="what `yolo` takes: MODE key=value ...")
    p.set_defaults(handler=_cmd_yolo)


def _cmd_yolo(args: argparse.Namespace) -> int:
    from pytorchtricks.integrations.ultralytics import run_yolo

    return run_yolo(list(args.args), match=args.match)
