"""The Ultralytics benchmark's own logic on known inputs (no Ultralytics needed): the 100K root's links and labels,
per-round ratios against stock, the page and its files, the stage split's exclusive times, the PSNR."""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from types import ModuleType
from typing import Any

import numpy as np
import pytest

from pytorchtricks.clock import hold_s

_BENCH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks")


def _load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, os.path.join(_BENCH, name + ".py"))
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


sets = _load("_ultralytics_sets")
report = _load("_ultralytics_report")
_load("_ultralytics_systems")
parts = _load("_ultralytics_parts")


def _source_root(root: str, n: int) -> str:
    for sub in ("images/train", "labels/train"):
        os.makedirs(os.path.join(root, sub))
    for k in range(n):
        with open(os.path.join(root, "images/train", f"p{k}.jpg"), "wb") as f:
            f.write(bytes([k]))
        with open(os.path.join(root, "labels/train", f"p{k}.txt"), "w") as f:
            f.write(f"{k} 0.5 0.5 0.1 0.1\n")
    return root


def test_linked_root_links_images_with_their_own_labels_in_turn(tmp_path: Any) -> None:
    src = _source_root(str(tmp_path / "src"), 3)
    yaml = sets.linked_root(str(tmp_path / "big"), 7, src)
    big = os.path.dirname(yaml)
    imgs = sorted(os.listdir(os.path.join(big, "images/train")))
    assert len(imgs) == 7 and len(os.listdir(os.path.join(big, "labels/train"))) == 7
    for i, name in enumerate(imgs):
        img = os.path.join(big, "images/train", name)
        lab = os.path.join(big, "labels/train", name.replace(".jpg", ".txt"))
        assert os.path.islink(img) and os.path.islink(lab)  # links, not copies
        with open(img, "rb") as f:
            k = f.read()[0]
        assert k == i % 3
        with open(lab) as f:
            assert f.read().split()[0] == str(k)  # the photo's own label file
    with open(yaml) as f:
        assert "train: images/train" in f.read()
    before = os.stat(os.path.join(big, "images/train", imgs[0]), follow_symlinks=False).st_mtime_ns
    sets.linked_root(big, 7, src)  # same parameters: reused, not rebuilt
    assert os.stat(os.path.join(big, "images/train", imgs[0]), follow_symlinks=False).st_mtime_ns == before


def _row(case: str, system: str, rnd: int, v: float) -> dict[str, Any]:
    return {"case": case, "system": system, "round": rnd, "images_per_s": v}


def test_ratios_are_per_round_against_stock_and_skip_errors() -> None:
    rows = [
        _row("a", "stock", 0, 10.0),
        _row("a", "ptt-pack", 0, 30.0),
        _row("a", "stock", 1, 20.0),
        _row("a", "ptt-pack", 1, 30.0),
        _row("a", "stock", 2, 5.0),
        {"case": "a", "system": "ptt-pack", "round": 2, "error": "boom"},
        _row("b", "stock", 0, 1.0),
    ]
    got = sorted(report.ratios(rows, "a", "ptt-pack", lambda r: r["images_per_s"]))
    assert got == pytest.approx([1.5, 3.0])
    assert report.values(rows, "a", "stock", lambda r: r["images_per_s"]) == [10.0, 20.0, 5.0]


def test_report_writes_the_page_environment_and_command(tmp_path: Any) -> None:
    env = {"cpu": "X", "cpu_count": 2, "cpu_class": "amx", "command": "bench --part load", "time_utc": "t"}
    rows = [
        {**_row("imgsz 640", "stock", 0, 2.0), "images_per_s_8mp": 1.0, "env": env},
        {
            **_row("imgsz 640", "ptt-pack", 0, 100.0),
            "images_per_s_8mp": 50.0,
            "psnr_db_median": 36.0,
            "psnr_db_min": 30.0,
            "env": env,
        },
        {"case": "imgsz 640", "system": "ptt-files", "round": 0, "error": "not installed", "env": env},
    ]
    with open(tmp_path / "load.jsonl", "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    page = report.write_report(str(tmp_path), {})
    assert "| imgsz 640 | ptt-pack | 100 | 50 | 50x | 50x | -x / -x | 36.0 dB, 30.0 dB |" in page
    assert "`ptt-files`, imgsz 640: not installed" in page
    assert json.loads((tmp_path / "environment.json").read_text())["cpu_class"] == "amx"
    assert "bench --part load" in (tmp_path / "command.txt").read_text()


def test_stage_split_does_not_count_loads_inside_a_stage() -> None:
    class Dataset:
        def load_image(self, i: int) -> int:
            hold_s(0.02)
            return i

    class Mosaic:
        def __init__(self, ds: Dataset) -> None:
            self.ds = ds

        def __call__(self, x: int) -> int:
            return sum(self.ds.load_image(k) for k in range(3))

    class Compose:
        def __init__(self, transforms: list[Any]) -> None:
            self.transforms = transforms

    ds = Dataset()
    st = parts._Stages()
    st.wrap_load(ds)
    comp = Compose([Compose([Mosaic(ds)])])
    st.wrap(comp)
    assert comp.transforms[0].transforms[0](0) == 3
    assert st.loads == 3 and st.load_s >= 0.06
    assert st.s["Mosaic"] < 0.02  # its own time only: the three loads are the load stage's


def test_psnr_resizes_a_pixel_off_shape_and_is_infinite_when_equal() -> None:
    a = np.full((4, 6, 3), 100, np.uint8)
    assert parts._psnr(a, a.copy()) == float("inf")
    b = a.copy()
    b[0, 0, 0] = 110  # one value off by 10 in 72: MSE 100/72
    assert parts._psnr(a, b) == pytest.approx(10 * np.log10(255**2 / (100 / 72)))
    assert parts._psnr(np.full((5, 6, 3), 100, np.uint8), a) == float("inf")
