"""``data_source``: a data path is read once for what it is; the typed ``DataSource`` says its kind, its sample
shape and why a verb refuses it, and opens it; tune, the data doctor and ``open_data`` take it and read the path
no second time (counted on each road).

Inputs are tiny and real: JPEGs written by PIL, packs written by ``pack``, a COCO root by the data-wing writer.
"""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest

import pytorchtricks as ptt
from pytorchtricks.core import PttError
from pytorchtricks.data import detection as detection_mod
from pytorchtricks.data.folder import JpegFolder
from pytorchtricks.road import DataSource, data_source
from pytorchtricks.shards import remote as remote_mod
from pytorchtricks.shards.writer import pack


def _jpeg(seed: int, hw: tuple[int, int] = (40, 48)) -> bytes:
    from PIL import Image

    arr = np.random.default_rng(seed).integers(0, 255, (*hw, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, "JPEG", quality=85)
    return buf.getvalue()


def _image_folder(root: Path, per_class: int = 3) -> Path:
    for c, name in enumerate(("cat", "dog")):
        (root / name).mkdir(parents=True)
        for i in range(per_class):
            (root / name / f"{i}.jpg").write_bytes(_jpeg(10 * c + i))
    return root


@pytest.fixture(scope="module")
def sources(tmp_path_factory: pytest.TempPathFactory, writers) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("sources")
    folder = _image_folder(base / "photos")
    _image_folder(base / "splits" / "train", per_class=2)
    _image_folder(base / "splits" / "val", per_class=1)
    for fmt in ("ptt", "tar"):
        pack(folder, base / fmt, format=fmt, workers=0)
    photos = [
        {
            "name": f"img{i}.jpg",
            "jpeg": _jpeg(i, (48, 64)),
            "hw": (48, 64),
            "boxes": np.array([[4, 6, 30, 40]], np.float32),
            "labels": np.array([i % 3], np.int64),
        }
        for i in range(3)
    ]
    writers.coco(base / "coco", photos)
    pack(base / "coco", base / "coco-pack", workers=0)
    return {
        "folder": folder,
        "splits": base / "splits",
        "ptt": base / "ptt",
        "tar": base / "tar",
        "coco": base / "coco",
        "coco-pack": base / "coco-pack",
    }


def test_each_kind_is_said_with_its_sample_shape(sources):
    assert ptt.data_source is data_source and ptt.DataSource is DataSource  # one export line each
    got = {k: data_source(p) for k, p in sources.items()}
    assert {k: (s.kind, s.format, s.task) for k, s in got.items()} == {
        "folder": ("folder", "imagefolder", "classification"),
        "splits": ("folder", "imagefolder", "classification"),
        "ptt": ("pack", "ptt", "classification"),
        "tar": ("pack", "tar", "classification"),
        "coco": ("detection_root", "coco", "detection"),
        "coco-pack": ("pack", "ptt", "detection"),
    }
    assert got["splits"].folder == str(sources["splits"] / "train") and set(got["splits"].splits) == {
        "train",
        "val",
    }
    assert got["folder"].sample == "(image, class label)"
    assert (
        got["coco"].sample.startswith("(image, target dict") and got["coco-pack"].sample == got["coco"].sample
    )
    assert not got["tar"].by_index and got["ptt"].by_index
    assert data_source(got["ptt"]) is got["ptt"]  # a DataSource passes through


def test_refusals_name_the_verb_and_the_fix(sources):
    coco, tar, cpack = (data_source(sources[k]) for k in ("coco", "tar", "coco-pack"))
    assert "would read its folders as classes" in coco.refusal("ptt tune", task="classification")
    assert "ptt tune reads samples by index" in tar.refusal("ptt tune", by_index=True)
    assert "reads files, not packs" in cpack.refusal("tune", packs=False)
    assert "classification pack" in data_source(sources["ptt"]).refusal("x", task="detection")
    assert coco.refusal("x", task="detection") is None and tar.refusal("x") is None
    with pytest.raises(PttError, match="is a pack: it holds the one split"):
        data_source(sources["ptt"], split="val")
    with pytest.raises(PttError, match="not a detection root"):
        data_source(sources["folder"], task="detection")
    with pytest.raises(PttError, match="COCO detection root"):
        data_source(sources["coco"], task="classification")


def test_opened_is_what_open_data_gives(sources):
    for key in ("folder", "splits", "ptt", "coco"):
        src = data_source(sources[key])
        a = src.open(on_error="skip")
        b = ptt.open_data(sources[key], task="auto", on_error="skip")
        assert type(a) is type(b) and len(a) == len(b)
    assert isinstance(data_source(sources["splits"], split="val").open(), JpegFolder)


def test_the_loaders_take_the_source(sources):
    x, y = next(
        iter(ptt.make_loader(data_source(sources["folder"]), 2, crop=16, num_workers=0, shuffle=False))
    )
    assert tuple(x.shape) == (2, 3, 16, 16) and len(y) == 2
    recipe = ptt.DetectionRecipe.shortest_side(32, 48, flip=0.0)
    b = next(
        iter(ptt.make_detection_loader(data_source(sources["coco"]), 2, recipe, num_workers=0, shuffle=False))
    )
    assert len(b.targets) == 2


@pytest.fixture
def counted(monkeypatch):
    """How often the layout probes run: ``detection_layout`` and ``is_url`` (through their modules' names, which
    every reader imports at call time)."""
    calls = {"detection_layout": 0, "is_url": 0}

    def wrap(mod, name):
        real = getattr(mod, name)

        def spy(*a, **k):
            calls[name] += 1
            return real(*a, **k)

        monkeypatch.setattr(mod, name, spy)

    wrap(detection_mod, "detection_layout")
    wrap(remote_mod, "is_url")
    return calls


def test_tune_reads_its_data_path_once(sources, counted):
    from pytorchtricks.tune.workload import _dataset

    _ds, desc, kind, _ = _dataset(str(sources["splits"]), (32, 32), 3, 4)
    assert kind == "files" and "the train split" in desc
    assert counted == {"detection_layout": 1, "is_url": 1}, counted


def test_detection_tune_and_the_doctor_read_their_path_once(sources, counted):
    from pytorchtricks.analysis.data_doctor import open_image_dataset
    from pytorchtricks.tune.detection import detection_data

    detection_data(str(sources["coco"]), "/nonexistent-cache")
    assert counted["detection_layout"] == 1, counted
    counted.update(detection_layout=0, is_url=0)
    open_image_dataset(str(sources["coco"]))
    assert counted == {"detection_layout": 1, "is_url": 1}, counted
