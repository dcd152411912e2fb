"""ptt tune receipt: Ultralytics YOLO `yolo train model=yolov8n.yaml data=/tmp/ptt-ultra/photos-x6/data.yaml imgsz=640 epochs=1 batch=8 workers=2 device=cpu plots=False val=False project=/tmp/yrun name=t exist_ok=True` (detect, 270 training images, batch 8, 0 loader workers), Intel(R) Xeon(R) Processor (amx), 2026-12-05.

Recommended: ptt.ultralytics.accelerate(model): its data pipeline 1.88x stock (quartiles 1.75-1.97x over 49 interleaved rounds), pixels 38.4 dB PSNR (median) against the stock load.
The step, projected with the declared 60 ms accelerator step: 1.77x.
The yolo CLI form: ptt yolo train model=yolov8n.yaml data=/tmp/ptt-ultra/photos-x6/data.yaml imgsz=640 epochs=1 batch=8 workers=2 device=cpu plots=False val=False project=/tmp/yrun name=t exist_ok=True
Measured (images/s through its dataset and loader, mosaic on; PSNR against the stock load): stock 13.4; accelerate 25.7 (38.4 dB); accelerate-speed 27.1 (36.5 dB).
`python apply.py --check` measures stock and the recommendation again on this machine.
"""
import sys

from ultralytics import YOLO

import pytorchtricks as ptt


def train() -> None:
    model = YOLO('yolov8n.yaml')
    ptt.ultralytics.accelerate(model)
    model.train(batch=8, data='/tmp/ptt-ultra/photos-x6/data.yaml', device='cpu', epochs=1, exist_ok=True, imgsz=640, name='t', plots=False, project='/tmp/yrun', val=False, workers=2)


if __name__ == "__main__":
    if "--check" in sys.argv[1:]:
        import os

        from pytorchtricks.tune.reproduce import main

        sys.exit(main(os.path.join(os.path.dirname(os.path.abspath(__file__)), "receipt.json"), sys.argv[1:]))
    train()
