"""ptt.ultralytics.accelerate: Ultralytics' datasets read through our decode, packs and arena, proved equivalent to
the stock load on real photos: the same files, labels and batch shapes; pixels >= 35 dB PSNR of the stock
``load_image`` on >= 8 MP photos; a 30-step training (mosaic on) whose losses stay inside the stock seeds' spread;
nothing written into the data's folders; a dataset it cannot read refused with the fix, nothing changed.

Run where Ultralytics is installed (``make pytest-ultralytics`` installs it outside the main venv, in
``.yolo-site``); skipped with the reason elsewhere.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import types
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest

os.environ.setdefault("YOLO_OFFLINE", "1")  # nothing downloads; settings kept out of the user's home
os.environ.setdefault(
    "YOLO_CONFIG_DIR", os.path.join(tempfile.gettempdir(), f"ptt-yolo-config-{os.getuid()}")
)
pytest.importorskip(
    "ultralytics",
    reason="Ultralytics is not installed here: `make pytest-ultralytics` installs it (.yolo-site) and runs these",
)

from pytorchtricks.core import NoEffectWarning, PttError
from pytorchtricks.data.decode import image_size
from pytorchtricks.data.photoset import wallpaper_sources
from pytorchtricks.integrations import ultralytics as ptt_yolo
from pytorchtricks.integrations.ultralytics_data import _ArenaImages
from pytorchtricks.tune import yolo as ptt_yolo_tune

N_BIG = 6  # >= 8 MP photos, as they are: the stock load decodes each at full size


def _big_photos() -> list[str]:
    found = []
    for _, p in wallpaper_sources():
        with open(p, "rb") as fh:
            h, w = image_size(fh.read(1 << 20))
        if h * w >= 8_000_000 and p.lower().endswith((".jpg", ".jpeg")):
            found.append(p)
    if len(found) < 2:
        pytest.skip("fewer than 2 wallpaper photos of >= 8 MP installed (make system-deps)")
    step = max(1, len(found) // N_BIG)
    return found[::step][:N_BIG]


def _write_root(root: Path, photos: list[str], seed: int = 47) -> Path:
    """A YOLO root (images/{train,val} + labels/, data.yaml) of ``photos`` copied as they are, seeded boxes."""
    rng = np.random.default_rng(seed)
    for split, files in (("train", photos), ("val", photos[:2])):
        (root / "images" / split).mkdir(parents=True, exist_ok=True)
        (root / "labels" / split).mkdir(parents=True, exist_ok=True)
        for k, src in enumerate(files):
            shutil.copyfile(src, root / "images" / split / f"{split}{k:03d}.jpg")
            lines = []
            for _ in range(int(rng.integers(1, 5))):
                bw, bh = rng.uniform(0.05, 0.5), rng.uniform(0.05, 0.5)
                cx, cy = rng.uniform(bw / 2, 1 - bw / 2), rng.uniform(bh / 2, 1 - bh / 2)
                lines.append(f"{int(rng.integers(0, 3))} {cx:.6f} {cy:.6f} {bw:.6f} {bh:.6f}")
            (root / "labels" / split / f"{split}{k:03d}.txt").write_text("\n".join(lines) + "\n")
    (root / "data.yaml").write_text(
        f"path: {root}\ntrain: images/train\nval: images/val\nnames:\n  0: cat\n  1: dog\n  2: tree\n"
    )
    return root


@pytest.fixture(scope="module")
def yolo_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _write_root(tmp_path_factory.mktemp("yolo"), _big_photos())


@pytest.fixture(autouse=True)
def _ptt_cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PTT_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "ptt-cache"))


def _build(root: Path, imgsz: int, *, ours: bool, mode: str = "val", **over: Any) -> Any:
    from ultralytics.cfg import get_cfg
    from ultralytics.data.build import build_yolo_dataset
    from ultralytics.data.utils import check_det_dataset

    data = check_det_dataset(str(root / "data.yaml"))
    path = over.pop("img_path", data[mode if mode == "val" else "train"])
    cfg = get_cfg(overrides={"imgsz": imgsz, "task": "detect", **over})
    if not ours:
        return build_yolo_dataset(cfg, path, 2, data, mode=mode, rect=mode == "val")
    with ptt_yolo._dataset_class_swapped(None, "stock"):
        return build_yolo_dataset(cfg, path, 2, data, mode=mode, rect=mode == "val")


def _psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = float(np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2))
    return float("inf") if mse == 0 else 10 * np.log10(255.0**2 / mse)


def _snapshot(root: Path) -> dict[str, tuple[int, int]]:
    return {str(p): (p.stat().st_size, p.stat().st_mtime_ns) for p in root.rglob("*")}


@pytest.mark.slow
@pytest.mark.parametrize("imgsz", [320, 640])
def test_same_labels_shapes_and_pixels_within_35db(yolo_root: Path, imgsz: int) -> None:
    stock = _build(yolo_root, imgsz, ours=False, mode="train")
    ours = _build(yolo_root, imgsz, ours=True, mode="train")
    assert type(ours).__name__ == "PttYOLODataset" and type(stock).__name__ == "YOLODataset"
    assert ours.im_files == stock.im_files
    for a, b in zip(ours.labels, stock.labels, strict=True):
        assert a["im_file"] == b["im_file"] and a["shape"] == b["shape"]
        np.testing.assert_array_equal(a["cls"], b["cls"])
        np.testing.assert_array_equal(a["bboxes"], b["bboxes"])
    for i in range(len(stock)):
        im_s, hw0_s, hw_s = stock.load_image(i)
        im_o, hw0_o, hw_o = ours.load_image(i)
        assert (hw0_o, hw_o, im_o.shape, im_o.dtype) == (hw0_s, hw_s, im_s.shape, im_s.dtype)
        assert _psnr(im_o, im_s) >= 35.0, f"{stock.im_files[i]}: {_psnr(im_o, im_s):.1f} dB"
    # what the trainer's batches hold: the validation transform (letterbox into the rect batch shapes) and collate
    vs, vo = _build(yolo_root, imgsz, ours=False), _build(yolo_root, imgsz, ours=True)
    np.testing.assert_array_equal(vo.batch_shapes, vs.batch_shapes)
    bs, bo = vs.collate_fn([vs[i] for i in range(len(vs))]), vo.collate_fn([vo[i] for i in range(len(vo))])
    assert bo["img"].shape == bs["img"].shape
    np.testing.assert_array_equal(bo["bboxes"].numpy(), bs["bboxes"].numpy())
    np.testing.assert_array_equal(bo["cls"].numpy(), bs["cls"].numpy())


def test_nothing_written_into_the_data(tmp_path: Path) -> None:
    root = _write_root(tmp_path / "data", _big_photos()[:2])
    before = _snapshot(root)
    ds = _build(root, 320, ours=True)
    ds.load_image(0)
    assert _snapshot(root) == before  # stock writes labels/val.cache beside the labels
    cache = Path(os.environ["PTT_CACHE_DIR"]) / "ultralytics" / "labels"
    assert any(p.name.endswith("val.cache") for p in cache.iterdir())
    again = _build(root, 320, ours=True)  # the scan is read back from our cache
    assert again.im_files == ds.im_files and _snapshot(root) == before


def test_a_task_it_cannot_read_changes_nothing_and_says_so() -> None:
    def stock_build(*a: Any) -> None:
        return None

    trainer = types.SimpleNamespace(args=types.SimpleNamespace(task="classify"), build_dataset=stock_build)
    with pytest.warns(NoEffectWarning, match="changes nothing for task=classify"):
        assert ptt_yolo.install(trainer) is False
    assert trainer.build_dataset is stock_build


def test_a_pack_it_cannot_read_is_refused_with_the_fix(yolo_root: Path, tmp_path: Path) -> None:
    import pytorchtricks as ptt

    pack = tmp_path / "pack160"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ptt.pack(yolo_root, pack, split="val", max_side=160, workers=0)
    with pytest.raises(PttError, match="--max-side 320"):
        _build(yolo_root, 320, ours=True, img_path=str(pack))


@pytest.mark.slow
def test_pack_for_imgsz_reads_the_same_labels_without_the_files(yolo_root: Path, tmp_path: Path) -> None:
    import pytorchtricks as ptt

    pack = tmp_path / "pack320"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ptt.pack(yolo_root, pack, split="train", max_side=320, workers=0)
    # a val-mode (rect) dataset: Ultralytics reorders its images by aspect ratio, the pack's reads must follow
    stock = _build(yolo_root, 320, ours=False, img_path=str(yolo_root / "images" / "train"))
    ours = _build(yolo_root, 320, ours=True, img_path=str(pack))
    aspects = {round(h / w, 3) for h, w in (image_size(Path(f).read_bytes()) for f in stock.im_files)}
    assert len(ours) == len(stock) and len(aspects) > 1
    # each side's own order (its stored sizes round differently, so ties sort apart): pair them by the photo,
    # the pack's image id being the photo's place in the root's sorted listing
    listing = sorted(os.path.basename(f) for f in stock.im_files)
    mine = {int(Path(f).stem): i for i, f in enumerate(ours.im_files)}
    pairs = [(mine[listing.index(os.path.basename(f))], i) for i, f in enumerate(stock.im_files)]
    assert sorted(o for o, _ in pairs) == list(range(len(ours)))
    for o, i in pairs:
        np.testing.assert_array_equal(ours.labels[o]["cls"], stock.labels[i]["cls"])
        np.testing.assert_allclose(ours.labels[o]["bboxes"], stock.labels[i]["bboxes"], atol=2e-6)
    for o, i in pairs:
        im_s, _, hw_s = stock.load_image(i)
        im_o, _, hw_o = ours.load_image(o)
        # the pack stores the size rounded (180 px), Ultralytics' load of the original rounds up (181 px)
        assert abs(hw_o[0] - hw_s[0]) <= 1 and abs(hw_o[1] - hw_s[1]) <= 1 and max(hw_o) == max(hw_s) == 320
        # the pack stores an area-averaged resize re-encoded at quality 90; theirs is a bilinear shrink of the
        # full decode: the bound is the JPEG's and the filters' difference, not the decode's
        import cv2

        assert _psnr(cv2.resize(im_o, (hw_s[1], hw_s[0]), interpolation=cv2.INTER_LINEAR), im_s) >= 30.0


@pytest.mark.slow
def test_cache_ram_is_the_node_shared_arena(yolo_root: Path) -> None:
    import pytorchtricks as ptt

    plain = _build(yolo_root, 320, ours=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cached = _build(yolo_root, 320, ours=True, cache="ram")
    assert isinstance(cached.ims, _ArenaImages)
    try:
        for i in range(len(plain)):
            a, hw0, hw = cached.load_image(i)
            b, hw0_p, hw_p = plain.load_image(i)
            assert (hw0, hw) == (hw0_p, hw_p)
            np.testing.assert_array_equal(a, b)  # the arena holds what the decode gives
            a[:] = 0  # a private copy: the shared arena is never written through it
            assert cached.load_image(i)[0].any()
    finally:
        ptt.remove_arenas([cached.ims.cached.path])


def _train_losses(root: Path, seed: int, accelerate: bool, project: Path) -> np.ndarray:
    from ultralytics import YOLO

    model = YOLO("yolov8n.yaml")
    if accelerate:
        ptt_yolo.accelerate(model)
    losses: list[float] = []
    model.add_callback(
        "on_train_batch_end", lambda tr: losses.append(sum(float(v) for v in tr.loss_items.values()))
    )
    model.train(
        data=str(root / "data.yaml"), imgsz=128, epochs=10, batch=4, workers=0, device="cpu", seed=seed,
        deterministic=True, plots=False, val=False, close_mosaic=0, mosaic=1.0, project=str(project),
        name=f"s{seed}-{accelerate}", exist_ok=True, verbose=False, amp=False, save=False,
    )  # fmt: skip
    return np.array(losses[:30])


@pytest.mark.slow
def test_30_steps_of_training_stay_inside_the_stock_seed_spread(tmp_path: Path) -> None:
    from pytorchtricks.data.photoset import load_source

    # 12 photos at 1600 px (a quick run), 3 batches of 4 per epoch, mosaic on every step
    small = tmp_path / "small"
    small.mkdir()
    srcs = [p for _, p in wallpaper_sources() if p.lower().endswith((".jpg", ".jpeg"))][:12]
    for k, p in enumerate(srcs):
        load_source(p, 1600).save(small / f"p{k:02d}.jpg", quality=92)
    root = _write_root(tmp_path / "yolo", sorted(str(p) for p in small.iterdir()))
    stock = np.stack([_train_losses(root, s, False, tmp_path / "runs") for s in (0, 1, 2)])
    ours = _train_losses(root, 0, True, tmp_path / "runs")
    assert stock.shape == (3, 30) and ours.shape == (30,)
    win = 5  # windowed means: one step's loss depends on the boxes its mosaic happened to draw
    s = stock.reshape(3, -1, win).mean(2)
    o = ours.reshape(-1, win).mean(1)
    spread = s.max(0) - s.min(0)
    lo, hi = s.min(0) - spread, s.max(0) + spread
    assert np.all((o >= lo) & (o <= hi)), f"ours {o.round(3)} vs stock {s.round(3)}"
    # the same seed draws the same mosaics and augmentations: only the pixels differ, so ours stays nearer the stock
    # seed-0 run than the seeds are to each other (a reader that turned every image upside down left the spread's
    # bounds above intact but missed this by 2.4x in the last window)
    assert np.all(np.abs(o - s[0]) <= spread), f"ours {o.round(3)} vs stock seed 0 {s[0].round(3)}"


@pytest.mark.slow
def test_ptt_yolo_runs_their_cli_accelerated(yolo_root: Path, tmp_path: Path) -> None:
    import subprocess
    import sys

    cmd = [sys.executable, "-m", "pytorchtricks.cli", "yolo", "train", "model=yolov8n.yaml",
           f"data={yolo_root / 'data.yaml'}", "imgsz=64", "epochs=1", "batch=2", "workers=0", "device=cpu",
           "plots=False", "val=False", f"project={tmp_path}", "name=cli", "exist_ok=True"]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=dict(os.environ))
    log = done.stdout + done.stderr
    assert done.returncode == 0, log[-3000:]
    assert "ptt: datasets read through pytorchtricks" in log and "ptt: workers=" in log
    assert (tmp_path / "cli" / "weights" / "last.pt").is_file()


def test_ranks_other_than_0_read_through_ptt(yolo_root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import ultralytics.data.build as build
    from ultralytics import YOLO

    monkeypatch.setattr(build, "YOLODataset", build.YOLODataset)  # put back after the test
    monkeypatch.setenv("RANK", "1")  # torchrun's rank 1: Ultralytics runs no pretrain callbacks there
    model = ptt_yolo.accelerate(YOLO("yolov8n.yaml"))
    assert sum(isinstance(h, ptt_yolo._Accelerate) for h in model.callbacks["on_pretrain_routine_start"]) == 1
    assert type(_build(yolo_root, 320, ours=False)).__name__ == "PttYOLODataset"


def test_an_accelerated_dataset_pickles_for_spawned_workers(yolo_root: Path) -> None:
    import pickle

    ours = _build(yolo_root, 160, ours=True)
    back = pickle.loads(pickle.dumps(ours))
    assert type(back) is type(ours) and back.im_files == ours.im_files
    np.testing.assert_array_equal(back.load_image(0)[0], ours.load_image(0)[0])


def test_tune_arguments_sends_their_trainer_to_its_own_tune(yolo_root: Path) -> None:
    from pytorchtricks.analysis.script_run import tune_arguments

    run = types.SimpleNamespace(
        captured={"dataset": _build(yolo_root, 160, ours=False)}, model={}, input_shape=()
    )
    with pytest.raises(PttError, match=r"ptt doctor run --tune -- yolo train"):
        tune_arguments(run)  # type: ignore[arg-type]


@pytest.mark.slow
def test_doctor_run_tune_on_their_trainer_measures_the_one_line_and_writes_it(
    yolo_root: Path, tmp_path: Path
) -> None:
    """`ptt doctor run --tune` on an unmodified Ultralytics training script: the split names its optimizer and
    loader, tune measures stock vs accelerate on its dataset and loader, and the receipt's apply.py is the training
    call with the one line before it (`python apply.py --check` reads the same receipt)."""
    import json
    import subprocess
    import sys

    script = tmp_path / "train.py"
    script.write_text(
        "from ultralytics import YOLO\n"
        f"YOLO('yolov8n.yaml').train(data={str(yolo_root / 'data.yaml')!r}, imgsz=64, epochs=3, batch=2, workers=0, "
        f"device='cpu', plots=False, val=False, project={str(tmp_path / 'runs')!r}, name='t', exist_ok=True)\n"
    )
    out = tmp_path / "receipt"
    cmd = [sys.executable, "-m", "pytorchtricks", "doctor", "run", "--steps", "5", "--warmup", "1", "--tune",
           "--time-budget", "6", "--tune-out", str(out), "--out", str(tmp_path / "doctor"), "--", str(script)]  # fmt: skip
    done = subprocess.run(
        cmd, capture_output=True, text=True, timeout=600, env=dict(os.environ, COLUMNS="200")
    )
    log = done.stdout + done.stderr
    assert done.returncode == 0, log[-3000:]
    assert (
        "optimizer at" in log
        and "AdamW" in log
        and "3 parameter groups" in log
        and "InfiniteDataLoader" in log
    )
    assert "tune on Ultralytics' trainer" in log and "ptt.ultralytics.accelerate(model)" in log
    p = json.loads((out / "receipt.json").read_text())
    assert p["kind"] == "ultralytics" and [r["candidate"] for r in p["candidates"]] == list(
        ptt_yolo_tune.CANDIDATES
    )
    by = {r["candidate"]: r for r in p["candidates"]}
    assert by["accelerate"]["psnr_db_median"] >= 35 and by["accelerate"]["rounds"] >= 3
    assert all(r["images_per_s"] > 0 for r in p["candidates"])
    apply_py = (out / "apply.py").read_text()
    compile(apply_py, "apply.py", "exec")
    body = apply_py.split('"""', 2)[2]
    line = ptt_yolo_tune.LINES[p["recommended"]] if p["recommended"] else "# ptt tune: the stock loader stays"
    assert body.index(line) < body.index("model.train(") and "imgsz=64" in body
    assert {"results.jsonl", "report.html"} <= {f.name for f in out.iterdir()}


def test_the_receipt_of_a_yolo_cli_run_is_its_call_and_its_cli_form() -> None:
    rows = [
        {"candidate": n, "line": ptt_yolo_tune.LINES.get(n), "ratio": 1.0 + k, "ratio_q1": 0.9 + k,
         "ratio_q3": 1.1 + k, "psnr_db_median": None if k == 0 else 40.0, "images_per_s": 10.0 * (1 + k),
         "projected_gain": 1.0 + k / 2, "rounds": 5}
        for k, n in enumerate(ptt_yolo_tune.CANDIDATES)
    ]  # fmt: skip
    cmd = [
        "yolo",
        "train",
        "model=yolov8s.yaml",
        "data=coco.yaml",
        "imgsz=1280",
        "close_mosaic=0",
        "cache=ram",
    ]
    p = {"candidates": rows, "recommended": "accelerate", "why": "w", "step_from": "s", "env": {},
         "workload": {"args": {}, "command": cmd, "trainer": "detect", "images": 9, "batch": 8, "workers": 2}}  # fmt: skip
    text = ptt_yolo_tune.apply_yolo(p)
    assert "model = YOLO('yolov8s.yaml')" in text
    assert "model.train(cache='ram', close_mosaic=0, data='coco.yaml', imgsz=1280)" in text
    assert "ptt yolo train model=yolov8s.yaml data=coco.yaml imgsz=1280 close_mosaic=0 cache=ram" in text
