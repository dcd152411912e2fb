"""make_detection_loader as a catalogue trick: its bench case builds the same sizes as the reference path, and its
pixels stay within the named bound of a full decode + resize (the recipes' geometry against torchvision v2, box by
box, is proved in tests/data/)."""

from __future__ import annotations

import torch

from pytorchtricks.tricks.data.make_detection_loader import bench_case
from pytorchtricks.tune.datacheck import psnr_db


def test_the_bench_case_images_match_the_reference_path():
    case = bench_case("smoke")
    ref, got = case.baseline(), case.treated()
    case.check(ref, got)  # the same output sizes
    assert len(got) == case.items_per_call and all(x.dtype == torch.uint8 for x in got)
    worst = min(psnr_db(a.float(), b.float()) for a, b in zip(ref, got, strict=True))
    assert worst >= 30.0, worst  # the DCT-scaled decode's bound
