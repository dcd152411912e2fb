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


def test_the_options_are_the_config_or_its_fields_as_keywords():
    import io

    import pytest
    from PIL import Image

    import pytorchtricks as ptt

    buf = io.BytesIO()
    Image.new("RGB", (64, 48), (90, 10, 10)).save(buf, "JPEG")
    ds = [(buf.getvalue(), {"boxes": torch.tensor([[4.0, 5.0, 30.0, 40.0]]), "labels": torch.tensor([i])})
          for i in range(4)]  # fmt: skip
    recipe = ptt.DetectionRecipe.shortest_side(32, flip=0.0)
    opts = {"num_workers": 0, "shuffle": True, "seed": 3, "drop_last": False}
    by_kw = [b.targets for b in ptt.make_detection_loader(ds, 2, recipe, **opts)]
    by_cfg = [b.targets for b in ptt.make_detection_loader(ds, 2, recipe, ptt.DetectionLoaderConfig(**opts))]
    labels = [[int(t["labels"][0]) for t in ts] for ts in by_kw]
    assert labels == [[int(t["labels"][0]) for t in ts] for ts in by_cfg]
    assert sorted(x for batch in labels for x in batch) == [0, 1, 2, 3]
    with pytest.raises(ptt.PttError, match="unknown option 'num_worker': did you mean 'num_workers'"):
        ptt.make_detection_loader(ds, 2, recipe, num_worker=0)
    with pytest.raises(ptt.PttError, match=r"not both \(got seed too\)"):
        ptt.make_detection_loader(ds, 2, recipe, ptt.DetectionLoaderConfig(), seed=1)
