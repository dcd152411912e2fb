"""`ptt doctor run --tune` on torchvision's detection reference script, unmodified (issue 32's acceptance check).

The reference (``references/detection`` of pytorch/vision: train.py, coco_utils.py, presets.py, transforms.py,
engine.py, utils.py, group_by_aspect_ratio.py, coco_eval.py) is public code, not ours: it is never vendored here.
Give a checkout of it with ``--references DIR``; this script builds the COCO root it reads (``train2017/``,
``val2017/``, ``annotations/instances_{train,val}2017.json``) from tune's built-in detection set - the 2-24 MP
Debian wallpaper photos with seeded boxes - and runs, as a user would::

    ptt doctor run --tune --device-step-ms 60 -- python DIR/train.py --data-path ROOT \\
        --model fasterrcnn_mobilenet_v3_large_320_fpn --device cpu -b 4 -j 2 --epochs 1

COCO's own annotation files hold a segmentation polygon per box (the reference's default v1 path reads it); the
built-in set's boxes get the box's own rectangle as their polygon. Its output (the doctor's split and report,
tune's receipt and apply.py, the log) goes to ``--out``. Run it alone (``make check-detection-reference``).

    python benchmarks/detection_reference.py --references vision/references/detection --out results/<cpu>/...
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from typing import Any

FILES = ("train.py", "coco_utils.py", "presets.py", "transforms.py", "engine.py", "utils.py",
         "group_by_aspect_ratio.py", "coco_eval.py")  # fmt: skip
VAL_IMAGES = 8  # the reference builds its evaluation loader at start; the doctor stops before it runs


def reference_root(dst: str) -> str:
    """The built-in detection set as a COCO root in the layout of COCO 2017, under ``dst``; returns ``dst``."""
    from pytorchtricks.core import cache_root
    from pytorchtricks.tune.detection import builtin_root

    ann = builtin_root(cache_root())
    images = os.path.join(os.path.dirname(ann), "images")
    os.makedirs(os.path.join(dst, "annotations"), exist_ok=True)
    for split in ("train2017", "val2017"):
        link = os.path.join(dst, split)
        if not os.path.lexists(link):
            os.symlink(images, link)
    with open(ann, encoding="utf-8") as fh:
        coco: dict[str, Any] = json.load(fh)
    for a in coco["annotations"]:
        x, y, w, h = a["bbox"]
        a.setdefault("segmentation", [[x, y, x + w, y, x + w, y + h, x, y + h]])
    keep = {im["id"] for im in coco["images"][:VAL_IMAGES]}
    val = {
        "images": [im for im in coco["images"] if im["id"] in keep],
        "annotations": [a for a in coco["annotations"] if a["image_id"] in keep],
        "categories": coco["categories"],
    }
    for name, body in (("train", coco), ("val", val)):
        path = os.path.join(dst, "annotations", f"instances_{name}2017.json")
        with open(path + ".tmp", "w", encoding="utf-8") as fh:
            json.dump(body, fh)
        os.replace(path + ".tmp", path)
    return dst


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--references", required=True, help="a checkout of pytorch/vision's references/detection")
    ap.add_argument("--out", required=True)
    ap.add_argument("--work", default=None, help="where the COCO root goes (default: OUT/../coco-root)")
    ap.add_argument("--model", default="fasterrcnn_mobilenet_v3_large_320_fpn")
    ap.add_argument("--device-step-ms", type=float, default=60.0)
    ap.add_argument("--time-budget", type=int, default=300)
    ap.add_argument("--use-v2", action="store_true", help="the reference's --use-v2 path (transforms v2)")
    args = ap.parse_args(argv)
    refs = os.path.abspath(args.references)
    missing = [f for f in FILES if not os.path.isfile(os.path.join(refs, f))]
    if missing:
        print(
            f"{refs} lacks {', '.join(missing)}: give references/detection of pytorch/vision", file=sys.stderr
        )
        return 2
    out = os.path.abspath(args.out)
    os.makedirs(out, exist_ok=True)
    root = reference_root(os.path.abspath(args.work or os.path.join(os.path.dirname(out), "coco-root")))
    script = [
        "python", os.path.join(refs, "train.py"), "--data-path", root, "--model", args.model, "--device", "cpu",
        "-b", "4", "-j", "2", "--epochs", "1", "--output-dir", "",
        *(["--use-v2"] if args.use_v2 else []),
    ]  # fmt: skip
    cmd = [
        sys.executable, "-m", "pytorchtricks.cli", "doctor", "run", "--steps", "6", "--warmup", "2",
        "--out", os.path.join(out, "doctor"), "--tune", "--time-budget", str(args.time_budget),
        "--device-step-ms", f"{args.device_step_ms:g}", "--tune-out", os.path.join(out, "tune"), "--", *script,
    ]  # fmt: skip
    with open(os.path.join(out, "command.txt"), "w", encoding="utf-8") as fh:
        fh.write("ptt " + " ".join(cmd[3:]) + "\n")  # `python -m pytorchtricks.cli` is the `ptt` command
    with open(os.path.join(out, "run.log"), "w", encoding="utf-8") as log:
        rc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=out, check=False).returncode
    print(f"exit {rc}; the log: {os.path.join(out, 'run.log')}")
    return rc


if __name__ == "__main__":
    sys.exit(main())
