"""`ptt tune --task detection`: a torchvision detector on a COCO root of real photos - built offline, stepped on its
loss dict through the reference's pipeline and ours, our loader checked before it is timed."""

from __future__ import annotations

import json
import math

import pytest
import torch

from pytorchtricks.core import PttError
from pytorchtricks.tunable import TuneFacts
from pytorchtricks.tune.candidates import check, why_not
from pytorchtricks.tune.hooks import by_name
from pytorchtricks.tune.runner import Runner
from pytorchtricks.tune.workload import build_workload

DETECTOR = "torchvision:fasterrcnn_mobilenet_v3_large_320_fpn"


@pytest.fixture(scope="module")
def coco(tmp_path_factory):
    """A COCO root of 8 real photos (Debian wallpapers downscaled to ~200-300 px, landscape and portrait) with
    1-3 boxes each."""
    from PIL import Image

    from pytorchtricks.data.photoset import wallpaper_sources

    src = wallpaper_sources()
    if len(src) < 3:
        pytest.skip("Debian wallpaper packages not installed (make system-deps)")
    root = tmp_path_factory.mktemp("coco")
    (root / "train").mkdir()
    (root / "annotations").mkdir()
    images, anns = [], []
    for i in range(8):
        im = Image.open(src[i % len(src)][1]).convert("RGB")
        im.thumbnail((300, 300) if i % 3 else (200, 300))
        w, h = im.size
        im.save(root / "train" / f"{i}.jpg", quality=90)
        images.append({"id": i, "file_name": f"{i}.jpg", "width": w, "height": h})
        for k in range(1 + i % 3):
            anns.append({"id": len(anns) + 1, "image_id": i, "category_id": 1 + k % 2, "iscrowd": 0,
                         "bbox": [5 + 30 * k, 8 + 20 * k, w / 4, h / 4], "area": w * h / 16})  # fmt: skip
    cats = [{"id": 1, "name": "a"}, {"id": 2, "name": "b"}]
    doc = {"images": images, "annotations": anns, "categories": cats}
    (root / "annotations" / "instances_train.json").write_text(json.dumps(doc))
    return str(root)


@pytest.fixture(scope="module")
def workload(coco):
    return build_workload(DETECTOR, coco, batch_size=2, input_size=96, num_workers=0, task="detection")


def test_a_detection_workload_is_built_offline_from_a_coco_root(workload, coco):
    w = workload
    assert w.task == "detection" and w.input_size == 96 and w.max_size and len(w.dataset) == 8
    assert w.num_outputs == 3  # categories 1, 2 and the background
    m = w.model_factory()
    assert type(m).__name__ == "FasterRCNN" and m.transform.min_size == (96,)
    with pytest.raises(PttError, match="not a detection root"):
        build_workload(DETECTOR, str(coco) + "/train", task="detection")
    with pytest.raises(PttError, match="GeneralizedRCNNTransform"):
        build_workload("torchvision:resnet18", coco, task="detection")


@pytest.mark.parametrize("tricks", [(), ("make_loader",)])
def test_the_step_is_the_detectors_loss_dict_through_either_loader(workload, tricks):
    r = Runner(workload, tricks)
    try:
        loss = r.step()
        assert loss.ndim == 0 and math.isfinite(loss.item()) and loss.item() > 0
        xb, yb = r.next_batch()
        outs, total = r.loss_on(xb, yb)  # the loss dict as a vector (what a correctness check compares)
        assert outs.shape == (4,) and torch.allclose(outs.sum(), total)
    finally:
        r.close()


def test_our_detection_loader_is_checked_before_it_is_timed(workload):
    c = check(workload, ("make_loader",))
    assert c.passed, c.detail
    assert "each once" in c.detail and "dB" in c.detail and c.metrics["psnr_db"] >= 30


def test_tricks_that_serve_only_classification_are_skipped_with_the_reason():
    facts = TuneFacts(verdict="input-bound", data_kind="files", task="detection", has_conv2d=True)
    assert "not measured on detection" in (why_not(by_name("remove_conv_bias_before_bn"), facts) or "")
    assert "not measured on detection" in (why_not(by_name("dataset_on_device"), facts) or "")
    assert why_not(by_name("make_loader"), facts) is None and why_not(by_name("cache_in_ram"), facts) is None


def test_the_two_loaders_own_rates_are_measured_side_by_side(workload):
    from pytorchtricks.tune.detection import loader_rates

    rates = loader_rates(workload, batches=2)
    assert len(rates) == 2 and any("reference" in k for k in rates) and "ptt.make_detection_loader" in rates
    # CPU time comes in 10 ms ticks: over a few small images it can read 0, never less
    assert all(r["images_per_s"] > 0 and r["cpu_s_per_image"] >= 0 for r in rates.values())


@pytest.mark.parametrize("trick", ["fast_optimizer", "mixed_precision"])
def test_model_tricks_are_checked_on_the_detectors_loss_dict(workload, trick):
    """The same random anchors on both sides (the detector samples them in its training forward): an exact trick
    gives the same losses, gradients and update; bf16 stays within the loss-parity bound."""
    from pytorchtricks.hardware import cpu_caps

    if trick == "mixed_precision" and not cpu_caps().native_bf16:
        pytest.skip("bf16 is emulated on this CPU: tune skips mixed precision here")
    c = check(workload, (trick,))
    assert c.passed, c.detail
    if trick == "fast_optimizer":
        assert c.metrics["out_rel"] == 0.0 and c.metrics["param_rel"] <= 1e-6


@pytest.mark.parametrize(
    "recommended",
    [["make_loader"], [], ["accumulate_gradients[2]"], ["accumulate_gradients[2]", "make_loader"],
     ["pack[resize]", "make_loader"], ["cache_in_ram", "make_loader"]],
)  # fmt: skip
def test_apply_py_of_a_detection_receipt_runs_with_its_loop(
    workload, coco, recommended, tmp_path, monkeypatch
):
    """apply.py of a detection receipt is the user's code: apply() over ptt.open_detection(root) builds the
    recommended loader, and the loop its comments give (images cut to their sizes, the loss dict summed) steps the
    detector on a batch of it (a line naming an undefined variable, or a classification loop, fails here)."""
    import re
    import textwrap

    import pytorchtricks as ptt
    from pytorchtricks.tune import receipt

    payload = {
        "recommended": recommended,
        "workload": {"for": "train", "model": DETECTOR, "batch_size": 2, "input_size": 96, "input_shape": [3, 96, 96],
                     "num_workers": 0, "task": "detection", "max_size": workload.max_size, "source": coco},
        "combined": {"ratio": 2.0, "ratio_q1": 1.9, "ratio_q3": 2.1} if recommended else None,
        "env": {"device_name": "cpu", "threads": 2, "torch": torch.__version__},
        "candidates": [],
    }  # fmt: skip
    code = receipt.apply_snippet(payload)
    assert ("ROOT = " in code) == ("pack[resize]" in recommended) and "loss_fn" not in code
    monkeypatch.chdir(tmp_path)  # the pack line writes ./pack-out
    monkeypatch.setattr("pytorchtricks.tricks.data.cache_in_ram.DEFAULT_DIR", str(tmp_path / "shm"))
    if "cache_in_ram" in recommended:
        assert f"dataset = ptt.cache_in_ram(dataset, 96, max_size={workload.max_size})" in code
    ns: dict = {}
    exec(compile(code, "apply.py", "exec"), ns)
    dataset = ptt.open_detection(coco)
    model, optimizer, loader, mp = ns["apply"](workload.model_factory(), dataset, 2)
    head = "# Your loop" if "accumulate_gradients[2]" in recommended else "# In your loop"
    loop = code[code.index(head) :].split("\n\n")[0].split("\n")
    body = textwrap.dedent("\n".join(ln[1:] for ln in loop if re.match(r"#\s{5}", ln)))
    batch = next(iter(loader))
    env = {"model": model, "optimizer": optimizer, "mp": mp, "device": "cpu", "torch": torch, "ptt": ptt}
    if "make_loader" in recommended:
        assert batch.images.dtype == torch.uint8 and min(batch.sizes.tolist()[0]) == 96
        env["batch"], env["loader"] = batch, [batch]
    else:  # the reference's list collate over our dataset: (bytes, target) pairs, decoded as the reference does
        from torchvision.io import decode_jpeg

        images = [
            decode_jpeg(torch.frombuffer(bytearray(raw), dtype=torch.uint8)).float() / 255 for raw in batch[0]
        ]
        targets = [{k: torch.as_tensor(t[k]) for k in ("boxes", "labels")} for t in batch[1]]
        env["batch"] = (images, targets)
        env["loader"] = [env["batch"]]
    before = [p.detach().clone() for p in model.parameters()]
    exec(compile(body, "loop", "exec"), env)
    assert torch.isfinite(env["loss"]) and any(
        not torch.equal(a, p) for a, p in zip(before, model.parameters())
    )


def test_a_detectors_memory_candidates_checkpoint_its_backbone_exactly(coco):
    """--memory-budget on a detector: the backbone + FPN checkpointed (outputs, gradients and the update equal: exact)
    at a lower measured peak; K micro-batches step every parameter, with the measured difference a detector's
    per-batch sampling, normalisation and padding make (the caveat the search carries). The whole search runs in
    the acceptance run (docs/guides/detection.md): at this size it takes minutes."""
    from pytorchtricks.tune.memory import measure_peak
    from pytorchtricks.tune.runner import stage_batches

    w = build_workload(DETECTOR, coco, batch_size=4, input_size=96, num_workers=0, task="detection")
    ck = check(w, ("checkpoint_activations",), samples=4)
    assert ck.passed and ck.metrics["grad_rel"] == 0 and ck.metrics["param_rel"] == 0, ck.detail
    acc = check(w, ("accumulate_gradients[2]",), samples=4)
    assert acc.passed and acc.metrics["update_rel_detection"] > 0, acc.detail  # not the whole batch's update
    batches = stage_batches(w, 1)
    said: list[str] = []
    base, _, _, _ = measure_peak(w, (), batches)
    ckpt, _, _, err = measure_peak(w, ("checkpoint_activations",), batches, said)
    assert not err and base and ckpt and ckpt < base
    assert any("checkpoint plan of the backbone" in s for s in said)


@pytest.mark.parametrize("trick", ["pack", "pack[resize]", "cache_in_ram"])
def test_a_detection_root_packs_for_tune_with_its_boxes(coco, trick, tmp_path, monkeypatch):
    """The pack and RAM-cache candidates serve a detector: the root packed (or decoded into the arena) once,
    resized to the training size for pack[resize] and the cache, the boxes scaled with it, and read by our loader;
    the data check compares its batches with the source images and boxes (pixels >= 30 dB, boxes within 1 px)."""
    monkeypatch.setenv("PTT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr("pytorchtricks.tricks.data.cache_in_ram.DEFAULT_DIR", str(tmp_path / "shm"))
    # 160 px: re-encoded at 96 px (JPEG quality 90) these small photos lose 29.9 dB, under the bound (measured)
    w = build_workload(DETECTOR, coco, batch_size=2, input_size=160, num_workers=0, task="detection")
    assert "detection" in by_name(trick).hook.tasks
    got = check(w, (trick, "make_loader"))
    assert got.passed and "boxes within" in got.detail and "of the source" in got.detail, got.detail
    r = Runner(w, (trick, "make_loader"))
    try:
        assert type(r.setup.dataset).__name__ != "DetectionDataset"  # the pack or the arena, not the root
        if (
            trick == "cache_in_ram"
        ):  # decoded at the detector's size: short side 160, long side at most its cap
            for i in range(len(w.dataset)):  # (never enlarged: a photo smaller than that stays as it is)
                hw, hw0 = r.setup.dataset.read_raw(i)[0].shape[:2], w.dataset.image_hw(i)
                assert min(hw) == min(160, *hw0) and max(hw) <= w.max_size
        r.step()
    finally:
        r.close()


def test_an_exact_trick_on_a_detector_is_rechecked_in_float64(workload):
    """A detector picks proposals by score, so fp32 rounding can swap one and move the heads' gradients (measured:
    channels_last at 320 px, gradients 0.08-0.17 apart in fp32); the exact check then compares again in float64,
    where the step runs end to end (images, boxes, model and optimizer in float64) and the trick's math is what
    differs: nothing, to ~1e-10."""
    from pytorchtricks.tune.candidates import _exact
    from pytorchtricks.tune.runner import stage_batches

    x, y = stage_batches(workload, 1)[0]
    got = _exact(workload, ("to_channels_last",), x, y, fp64=True)
    assert got.passed and got.kind.endswith("(float64)") and got.metrics["grad_rel"] < 1e-9, got.detail


def test_ptt_profile_profiles_a_detectors_training_step(coco, capsys):
    """`ptt profile --task detection`: the detector's loss-dict step on real images with boxes (nothing downloaded),
    its time split and top ops; --input-shape, which a detector's images of many sizes cannot have, is refused."""
    from pytorchtricks.cli import main

    args = [
        "profile",
        DETECTOR,
        "--task",
        "detection",
        "--data",
        coco,
        "--input-size",
        "96",
        "--batch-size",
        "2",
    ]
    assert main([*args, "--steps", "2", "--profile-steps", "1"]) == 0
    out = capsys.readouterr().out
    assert "(detection, batch 2, shortest side 96" in out and "verdict:" in out and "backward" in out
    assert "top ops" in out
    assert main([*args, "--input-shape", "2,3,96,96"]) == 2
    assert "takes --input-size" in capsys.readouterr().err
    assert main(["profile", DETECTOR, "--data", coco]) == 2  # --data without --task detection
    assert "--task detection" in capsys.readouterr().err
    assert main(["profile", DETECTOR, "--steps", "1"]) == 2  # a detector profiled as a classifier
    err = capsys.readouterr().err
    assert "is a detector" in err and "profile its training step with --task detection" in err
