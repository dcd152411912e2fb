"""tune.yolo's rules, without Ultralytics: which candidate a measured receipt recommends (pixels within 35 dB of the
stock load, a lower-quartile ratio above stock, match="speed" only when faster beyond the spread), the step it
projects, the receipt's files (atomic, as every tune receipt), and that a refusal says why."""

from __future__ import annotations

import json
import math
import types

import numpy as np
import pytest
import torch

from pytorchtricks.core import PttError
from pytorchtricks.tune import yolo


def _row(name: str, ratio: float, q1: float, psnr: float | None) -> dict:
    return {"candidate": name, "line": yolo.LINES.get(name), "ratio": ratio, "ratio_q1": q1, "ratio_q3": ratio + 0.1,
            "psnr_db_median": psnr, "rounds": 5}  # fmt: skip


def test_a_candidate_is_recommended_only_within_35db_and_beyond_the_spread():
    stock = _row("stock", 1.0, 1.0, None)
    assert yolo._recommend(
        [stock, _row("accelerate", 1.4, 1.2, 40.0), _row("accelerate-speed", 1.5, 1.3, 33.0)]
    ) == (
        "accelerate"  # speed is faster but its pixels are 33 dB from the stock load
    )
    assert (
        yolo._recommend(
            [stock, _row("accelerate", 1.05, 0.97, 40.0), _row("accelerate-speed", 1.1, 0.99, 36)]
        )
        is None
    )
    # speed faster, but its lower quartile does not beat the default's median: the closer pixels win
    assert yolo._recommend(
        [stock, _row("accelerate", 1.4, 1.2, 40.0), _row("accelerate-speed", 1.5, 1.35, 36)]
    ) == ("accelerate")
    assert yolo._recommend(
        [stock, _row("accelerate", 1.4, 1.2, 40.0), _row("accelerate-speed", 2.0, 1.8, 36)]
    ) == ("accelerate-speed")
    why = yolo._why(
        [stock, _row("accelerate", 1.05, 0.97, 40.0), _row("accelerate-speed", 1.1, 0.9, 30.0)], None
    )
    assert "0.97x not above stock" in why and "30.0 dB, under 35 dB" in why


def test_the_step_projection_adds_with_0_workers_and_overlaps_with_workers():
    v = types.SimpleNamespace(stats=types.SimpleNamespace(median_s=0.2, q1_s=0.18, q3_s=0.22), ratio=1.0,
                              ratio_q1=1.0, ratio_q3=1.0)  # fmt: skip
    w0 = yolo.YoloWorkload(args={}, img_path="x", batch=8, workers=0, stride=32, images=10)
    w2 = yolo.YoloWorkload(args={}, img_path="x", batch=8, workers=2, stride=32, images=10)
    r0 = yolo._row("stock", v, None, w0, step_s=0.25, rounds=3)  # 2 batches per call: 0.1 s per batch
    r2 = yolo._row("stock", v, None, w2, step_s=0.25, rounds=3)
    assert math.isclose(r0["projected_step_s"], 0.35) and math.isclose(r2["projected_step_s"], 0.25)
    assert math.isclose(r0["images_per_s"], 80.0)


def test_psnr_of_equal_and_of_different_images():
    from pytorchtricks.tune.datacheck import psnr_db  # the one tune.yolo compares pixels with

    a = np.full((4, 4, 3), 100, np.uint8)
    assert psnr_db(a, a) == math.inf
    b = a.copy()
    b[0, 0, 0] = 110
    assert math.isclose(psnr_db(a, b), 10 * math.log10(255**2 / (100 / 48)))
    assert math.isclose(psnr_db(torch.from_numpy(a), torch.from_numpy(b)), psnr_db(a, b))
    with pytest.raises(PttError, match="cannot be compared"):
        psnr_db(a, a[:2])


def test_a_run_whose_model_carries_no_trainer_arguments_is_refused_with_the_reason():
    ds = types.SimpleNamespace(img_path="images/train", batch_size=4, stride=32)
    with pytest.raises(PttError, match=r"model\.args"):
        yolo.yolo_workload(ds, object(), {}, ["yolo", "train"], 0.1)


def test_the_receipt_is_written_whole_and_reads_back(tmp_path):
    from pytorchtricks.report.html import render_yolo

    rows = [_row("stock", 1.0, 1.0, None), _row("accelerate", 1.4, 1.2, 40.0)]
    for r in rows:
        r.update(images_per_s=10.0 * r["ratio"], batch_s_median=0.1, batch_s_q1=0.09, batch_s_q3=0.11,
                 psnr_db_min=None if r["psnr_db_median"] is None else 38.0, projected_gain=r["ratio"],
                 recommended=r["candidate"] == "accelerate", match=yolo.CANDIDATES[r["candidate"]])  # fmt: skip
    p = {"kind": "ultralytics", "candidates": rows, "recommended": "accelerate", "why": yolo._why(rows, "accelerate"),
         "step_from": "a declared 60 ms step", "rounds": 5, "env": {"cpu": "x", "cpu_class": "avx2"},
         "workload": {"args": {"imgsz": 64, "data": "<d>.yaml"}, "command": ["train.py"], "images": 6, "batch": 2,
                      "workers": 0, "trainer": "detect"}}  # fmt: skip
    page = render_yolo(p)
    assert "&lt;d&gt;.yaml" in page and "<d>" not in page  # escaped
    (tmp_path / "r" / "keep.txt").parent.mkdir()
    (tmp_path / "r" / "keep.txt").write_text("mine")
    from pytorchtricks.tune.receipt import write_receipt_files

    write_receipt_files(str(tmp_path / "r"), rows, {"apply.py": "x = 1\n", "report.html": page,
                                                     "receipt.json": json.dumps(p)})  # fmt: skip
    assert (tmp_path / "r" / "keep.txt").read_text() == "mine"
    assert [json.loads(x)["candidate"] for x in (tmp_path / "r" / "results.jsonl").read_text().splitlines()] == [
        "stock", "accelerate",
    ]  # fmt: skip
    with pytest.raises(ValueError, match="a receipt is"):
        write_receipt_files(str(tmp_path / "s"), rows, {"apply.py": ""})


def test_a_task_the_integration_does_not_read_has_no_candidate_and_says_so():
    ds = types.SimpleNamespace(img_path="images/train", batch_size=4, stride=32)
    model = types.SimpleNamespace(args=types.SimpleNamespace(task="classify", imgsz=224))
    with pytest.raises(PttError, match=r"classify trainer.*no candidate"):
        yolo.yolo_workload(ds, model, {}, ["yolo", "train"], 0.1)


def test_a_run_that_reads_a_pack_already_has_nothing_to_compare_and_says_so(tmp_path):
    (tmp_path / "manifest.json").write_text('{"detection": {"format": "yolo"}}')
    ds = types.SimpleNamespace(img_path=str(tmp_path), batch_size=4, stride=32)
    model = types.SimpleNamespace(args=types.SimpleNamespace(task="detect", imgsz=640))
    with pytest.raises(PttError, match="stock loader cannot read a pack"):
        yolo.yolo_workload(ds, model, {}, ["yolo", "train"], 0.1)
