"""``open_data``: each kind of path opens as its reader, in the documented order, and each refusal names the fix.

Inputs are tiny and real, built here: JPEGs written by PIL, packs written by ``pack``, a COCO root by the
data-wing tests' writer.
"""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest

import pytorchtricks as ptt
from pytorchtricks.core import PttError
from pytorchtricks.data.detection import DetectionDataset
from pytorchtricks.data.folder import JpegFolder
from pytorchtricks.road import open_data
from pytorchtricks.shards.dataset import ShardDataset
from pytorchtricks.shards.stream import ShardStream
from pytorchtricks.shards.writer import pack


def _jpeg(seed: int, hw: tuple[int, int] = (40, 48)) -> bytes:
    from PIL import Image

    arr = np.random.default_rng(seed).integers(0, 255, (*hw, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, "JPEG", quality=85)
    return buf.getvalue()


def _image_folder(root: Path, classes: tuple[str, ...] = ("cat", "dog"), per_class: int = 3) -> Path:
    for c, name in enumerate(classes):
        (root / name).mkdir(parents=True)
        for i in range(per_class):
            (root / name / f"{i}.jpg").write_bytes(_jpeg(10 * c + i))
    return root


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _image_folder(tmp_path_factory.mktemp("open") / "photos")


@pytest.fixture(scope="module")
def packs(folder: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("packs")
    for fmt in ("ptt", "tar"):
        pack(folder, base / fmt, format=fmt, workers=0)
    return {"ptt": base / "ptt", "tar": base / "tar"}


@pytest.fixture
def coco(tmp_path: Path, writers) -> Path:
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
    writers.coco(tmp_path / "coco", photos)
    return tmp_path / "coco"


def test_an_image_folder_is_a_jpeg_folder(folder):
    ds = open_data(folder)
    assert isinstance(ds, JpegFolder) and ds.classes == ["cat", "dog"] and len(ds) == 6
    assert ptt.open_data is open_data  # one export line
    assert isinstance(open_data(str(folder)), JpegFolder)


def test_a_split_root_opens_its_train_split(tmp_path):
    _image_folder(tmp_path / "root" / "train", per_class=2)
    _image_folder(tmp_path / "root" / "val", per_class=1)
    ds = open_data(tmp_path / "root")
    assert isinstance(ds, JpegFolder) and ds.root == str(tmp_path / "root" / "train") and len(ds) == 4


def test_packs_open_as_their_format_reads(packs, folder):
    ds = open_data(packs["ptt"])
    assert isinstance(ds, ShardDataset) and len(ds) == 6 and ds.classes == ["cat", "dog"]
    raw = open_data(packs["ptt"], decode=None)[0][0]
    assert isinstance(raw, bytes | memoryview | np.ndarray)
    stream = open_data(packs["tar"], decode=None, stream=ptt.StreamConfig(shuffle=False))
    assert isinstance(stream, ShardStream)
    assert sorted(int(item[1]) for item in stream) == [0, 0, 0, 1, 1, 1]
    order = ptt.StreamConfig(shuffle=False, rank=1, world_size=2, decode="auto")  # open_data's decode wins
    half = open_data(packs["tar"], decode=None, stream=order)
    assert half.rank_world() == (1, 2) and half.decode is None and len(list(half)) == 3
    url = open_data(packs["ptt"].as_uri())  # file:// is a URL that needs no cache
    assert isinstance(url, ShardDataset) and len(url) == 6


def test_a_detection_root_opens_for_detection_and_is_refused_for_classification(coco):
    ds = open_data(coco, task="detection")
    assert isinstance(ds, DetectionDataset) and len(ds) == 3
    js = open_data(coco / "annotations" / "instances_val.json", task="detection")
    assert isinstance(js, DetectionDataset) and len(js) == 3
    with pytest.raises(PttError, match=r"COCO detection root.*open_detection"):
        open_data(coco)
    with pytest.raises(PttError, match=r"COCO detection root"):
        open_data(coco / "annotations" / "instances_val.json")


def test_refusals_say_what_to_pass(tmp_path, folder, packs):
    with pytest.raises(PttError, match=r"does not exist; pass an ImageFolder tree"):
        open_data(tmp_path / "nope")
    with pytest.raises(PttError, match=r"does not exist; pass a COCO, YOLO or VOC root"):
        open_data(tmp_path / "nope", task="detection")
    with pytest.raises(PttError, match="task must be classification, detection or auto"):
        open_data(folder, task="segmentation")
    (tmp_path / "empty" / "cat").mkdir(parents=True)
    with pytest.raises(PttError, match=r"not a pack \(no manifest.json\) and holds no ImageFolder tree"):
        open_data(tmp_path / "empty")
    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(PttError, match="is a file; pass an ImageFolder tree"):
        open_data(tmp_path / "notes.txt")
    with pytest.raises(PttError, match=r"not a detection root: task='detection' reads COCO"):
        open_data(folder, task="detection")
    with pytest.raises(PttError, match=r"classification pack \(no targets\)"):
        open_data(packs["ptt"], task="detection")


def test_a_detection_pack_is_refused_for_classification(coco, tmp_path):
    pack(coco, tmp_path / "det", workers=0)
    with pytest.raises(PttError, match=r"detection pack.*task='detection'"):
        open_data(tmp_path / "det")
    ds = open_data(tmp_path / "det", task="detection", decode=None)
    assert isinstance(ds, ShardDataset) and len(ds) == 3
    pack(coco, tmp_path / "det-tar", format="tar", workers=0)
    with pytest.raises(PttError, match=r"tar pack \(sequential\)"):
        open_data(tmp_path / "det-tar", task="detection")


def test_make_loader_opens_a_path_through_open_data(folder, packs):
    x, y = next(iter(ptt.make_loader(str(folder), 2, crop=16, num_workers=0, mode="eval")))
    assert tuple(x.shape) == (2, 3, 16, 16) and y.tolist() == [0, 0]
    x, _ = next(iter(ptt.make_loader(str(packs["ptt"]), 2, crop=16, num_workers=0, mode="eval")))
    assert tuple(x.shape) == (2, 3, 16, 16)


def test_auto_reads_detection_data_as_detection(coco, folder, tmp_path):
    assert isinstance(open_data(coco, task="auto"), DetectionDataset)
    assert isinstance(open_data(folder, task="auto"), JpegFolder)
    pack(coco, tmp_path / "det", workers=0)
    assert isinstance(open_data(tmp_path / "det", task="auto", decode=None), ShardDataset)


def test_split_picks_a_split_of_a_root_and_is_refused_elsewhere(folder, packs, tmp_path):
    root = tmp_path / "imagenet"
    _image_folder(root / "train")
    _image_folder(root / "val", per_class=1)
    assert len(open_data(root)) == 6 and len(open_data(root, split="val")) == 2
    assert len(open_data(root, split="validation")) == 2  # the names split_folders reads as val
    with pytest.raises(PttError, match=r"has no split 'test'; its splits: train, val"):
        open_data(root, split="test")
    with pytest.raises(
        PttError, match=r"is one ImageFolder tree, not a root of splits .*: leave out split\."
    ):
        open_data(folder, split="val")
    with pytest.raises(PttError, match=r"is a pack: .* leave out split\.") as err:
        open_data(packs["ptt"], split="val")
    assert ptt.core.for_cli(err.value).endswith("leave out --split.")
