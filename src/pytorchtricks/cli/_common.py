"""What every ``ptt`` subcommand shares: the exit status for bad input, the model-spec help, the console."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any

EXIT_USAGE = 2
# --input-shape defaults: C is the model's channels (its first convolution's in_channels; 3 without one)
_SHAPE_NOTE = "{}, C the model's input channels"
MODEL_SPEC_HELP = (
    "torchvision:NAME, package.module:factory or path/to/file.py:factory; the last two EXECUTE code (import the "
    "module or run the file's top-level code, then call the factory): give only code you trust. The factory must "
    "return an nn.Module; built-ins and other callables are refused"
)

Handler = Callable[[argparse.Namespace], int]
SPLIT_HELP = (
    "the split of a root that has several: a COCO root's annotations/instances_SPLIT.json, a YOLO root's "
    "images/SPLIT/, a VOC root's ImageSets/Main/SPLIT.txt, an ImageNet-style root's train/ or val/ (default: its "
    "train split, said when it has others)"
)


def add_split(p: argparse.ArgumentParser) -> None:
    p.add_argument("--split", default=None, metavar="NAME", help=SPLIT_HELP)


def _console() -> Any:
    from rich.console import Console

    # Piped output (CI logs, files) gets a wide fixed width so tables are not squeezed to 80 columns.
    return Console(width=None if sys.stdout.isatty() else 160)


def _model_and_input(spec: str, shape: str | None, default: str) -> tuple[Any, Any]:
    """The model and a random input: ``--input-shape`` as given, or ``default`` with the model's own channels
    (its first convolution's ``in_channels``: a 1-channel MNIST model gets 1 channel, not 3)."""
    import torch

    from pytorchtricks.bench.workloads import load_model, parse_shape
    from pytorchtricks.tune.workload import model_in_channels

    model = load_model(spec)
    dims = parse_shape(shape or default)
    channels = model_in_channels(model)
    if shape is None and channels is not None and len(dims) >= 2:
        dims = (dims[0], channels, *dims[2:])
    return model, torch.randn(dims)
