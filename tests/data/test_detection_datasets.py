"""COCO, YOLO and VOC roots built from one annotation set read into the same targets; every kind of bad annotation
gets an AnnotationError naming the file and the annotation, or a reject with on_error="skip"."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import pytorchtricks as ptt
from pytorchtricks.data.detection import AnnotationError, detection_layout, open_detection


def _by_name(ds: Any) -> dict[str, tuple[np.ndarray, list[str]]]:
    out = {}
    for i in range(len(ds)):
        raw, t = ds[i]
        names = [ds.categories[int(lab)] for lab in t["labels"]]
        out[Path(ds.file(i)).name] = (t["boxes"].numpy(), names, raw)
    return out


def test_coco_yolo_voc_read_the_same_targets(photo_set, writers, tmp_path):
    writers.coco(tmp_path / "coco", photo_set)
    writers.yolo(tmp_path / "yolo", photo_set)
    writers.voc(tmp_path / "voc", photo_set)
    sets = {f: open_detection(tmp_path / f) for f in ("coco", "yolo", "voc")}
    assert {f: detection_layout(tmp_path / f) for f in sets} == {"coco": "coco", "yolo": "yolo", "voc": "voc"}
    got = {f: _by_name(ds) for f, ds in sets.items()}
    for p in photo_set:
        want_names = [writers.classes[lab] for lab in p["labels"].tolist()]
        for f in sets:
            boxes, names, raw = got[f][p["name"]]
            assert raw == p["jpeg"]  # the file's bytes, untouched
            assert names == want_names, f
            # YOLO stores normalised floats with 8 decimals: 1e-8 x 1200 px; COCO/VOC are exact
            np.testing.assert_allclose(boxes, p["boxes"], atol=1e-3 if f == "yolo" else 0, err_msg=f)
    coco = sets["coco"]
    assert sorted(coco.categories) == writers.coco_ids and len(coco) == len(
        photo_set
    )  # the image with no box is kept
    empty = [coco[i][1] for i in range(len(coco)) if len(coco[i][1]["boxes"]) == 0]
    assert len(empty) == 1 and empty[0]["boxes"].shape == (0, 4)
    t = coco[0][1]
    assert t["boxes"].dtype.is_floating_point and str(t["labels"].dtype) == "torch.int64"
    assert "segmentation" in t and len(t["segmentation"]) == len(t["boxes"])
    assert t["image_id"] == 100 and t["iscrowd"].tolist() == [0] * len(t["boxes"])


def _coco_doc(root: Path) -> tuple[Path, dict[str, Any]]:
    ann = root / "annotations" / "instances_val.json"
    return ann, json.loads(ann.read_text())


@pytest.mark.parametrize(
    "kind, edit, needle",
    [
        ("outside", lambda d: d["annotations"][0].update(bbox=[-50, 0, 20, 20]), "outside"),
        ("empty", lambda d: d["annotations"][0].update(bbox=[5, 5, 0, 10]), "non-positive"),
        ("category", lambda d: d["annotations"][0].update(category_id=99), "unknown category_id 99"),
        ("missing", lambda d: d["images"][0].update(file_name="gone.jpg"), "missing"),
    ],
)
def test_bad_coco_annotations_are_named_or_rejected(photo_set, writers, tmp_path, kind, edit, needle):
    writers.coco(tmp_path, photo_set)
    ann, doc = _coco_doc(tmp_path)
    edit(doc)
    ann.write_text(json.dumps(doc))
    with pytest.raises(AnnotationError, match=needle) as err:
        open_detection(tmp_path)
    assert str(ann) in str(err.value) and isinstance(err.value, ptt.PttError)
    if kind != "missing":
        assert err.value.annotation_id == doc["annotations"][0]["id"]
    ds = open_detection(tmp_path, on_error="skip")
    assert len(ds.rejects) == 1 and needle.split()[0] in ds.rejects[0]["reason"]
    n_boxes = sum(len(p["boxes"]) for p in photo_set)
    if kind == "missing":  # that image and its boxes go; nothing else
        assert len(ds) == len(photo_set) - 1 and len(ds.boxes) == n_boxes - len(photo_set[0]["boxes"])
    else:  # only the bad box goes
        assert len(ds) == len(photo_set) and len(ds.boxes) == n_boxes - 1


def test_unparsable_json_and_xml_and_yolo_lines(photo_set, writers, tmp_path):
    writers.coco(tmp_path / "coco", photo_set)
    ann, _ = _coco_doc(tmp_path / "coco")
    ann.write_text('{"images": [')
    with pytest.raises(AnnotationError, match="not valid JSON") as err:
        open_detection(tmp_path / "coco")
    assert str(ann) in str(err.value)
    writers.voc(tmp_path / "voc", photo_set)
    bad = tmp_path / "voc" / "Annotations" / "img00.xml"
    bad.write_text("<annotation><object>")
    with pytest.raises(AnnotationError, match="cannot parse the XML"):
        open_detection(tmp_path / "voc")
    assert len(open_detection(tmp_path / "voc", on_error="skip")) == len(photo_set) - 1
    writers.yolo(tmp_path / "yolo", photo_set)
    lab = tmp_path / "yolo" / "labels" / "img00.txt"
    lab.write_text(lab.read_text() + "9 0.5 0.5 0.1 0.1\n0 0.5 0.5\n")
    with pytest.raises(AnnotationError, match="unknown class 9"):
        open_detection(tmp_path / "yolo")
    ds = open_detection(tmp_path / "yolo", on_error="skip")
    assert [r["annotation"] for r in ds.rejects] == [
        len(photo_set[0]["boxes"]) + 1,
        len(photo_set[0]["boxes"]) + 2,
    ]
    assert len(ds[0][1]["boxes"]) == len(photo_set[0]["boxes"])


def test_size_mismatch_and_exif_rotation_are_said(photo_set, writers, tmp_path):
    from PIL import Image

    writers.coco(tmp_path, photo_set)
    ann, doc = _coco_doc(tmp_path)
    h, w = photo_set[0]["hw"]
    img = Image.new("RGB", (w, h))
    exif = Image.Exif()
    exif[0x0112] = 6  # rotate 90: a viewer shows it h x w
    img.save(tmp_path / "val" / photo_set[0]["name"], "JPEG", exif=exif.tobytes())
    doc["images"][0].update(width=h, height=w)  # annotated on the rotated image
    for a in doc["annotations"]:
        if a["image_id"] == doc["images"][0]["id"]:
            a["bbox"] = [0, 0, 5, 5]
    ann.write_text(json.dumps(doc))
    ds = open_detection(tmp_path)
    with pytest.raises(AnnotationError, match="EXIF orientation"):
        ds[0]


def test_coco_root_is_not_an_imagefolder(coco_root, tmp_path):
    shutil.copytree(coco_root / "val", tmp_path / "coco" / "train2017")
    shutil.copytree(coco_root / "annotations", tmp_path / "coco" / "annotations")
    with pytest.raises(ptt.PttError, match="COCO"):
        ptt.JpegFolder(tmp_path / "coco")


def test_tables_are_the_keywords_as_one_value(tmp_path):
    from PIL import Image

    from pytorchtricks.core import PttError
    from pytorchtricks.data.annotations import read_coco

    (tmp_path / "img").mkdir()
    for name in ("a.jpg", "b.jpg"):
        Image.new("RGB", (64, 48)).save(tmp_path / "img" / name)
    coco = {
        "images": [
            {"id": i, "file_name": n, "width": 64, "height": 48} for i, n in enumerate(("a.jpg", "b.jpg"))
        ],
        "annotations": [
            {"id": 1, "image_id": 0, "category_id": 3, "bbox": [4, 5, 10, 20], "iscrowd": 0, "area": 200},
            {"id": 2, "image_id": 1, "category_id": 5, "bbox": [1, 2, 30, 40], "iscrowd": 1, "area": 1200},
        ],
        "categories": [{"id": 3, "name": "cat"}, {"id": 5, "name": "dog"}],
    }
    (tmp_path / "ann.json").write_text(json.dumps(coco))
    fields = read_coco(tmp_path / "img", tmp_path / "ann.json")
    by_kw = ptt.DetectionDataset(**fields)
    by_tables = ptt.DetectionDataset(ptt.DetectionTables(**fields))
    assert len(by_kw) == len(by_tables) == 2 and by_kw.categories == by_tables.categories == {
        3: "cat",
        5: "dog",
    }
    for i in range(2):
        (raw_a, t_a), (raw_b, t_b) = by_kw[i], by_tables[i]
        assert raw_a == raw_b and t_a.keys() == t_b.keys() and t_a["image_id"] == t_b["image_id"] == i
        for k in ("boxes", "labels", "iscrowd", "area"):
            assert t_a[k].tolist() == t_b[k].tolist(), k
    assert by_tables[1][1]["boxes"].tolist() == [[1.0, 2.0, 31.0, 42.0]]
    with pytest.raises(PttError, match=r"not both \(got format, root too\)"):
        ptt.DetectionDataset(ptt.DetectionTables(**fields), root=str(tmp_path), format="coco")
    with pytest.raises(PttError, match=r"missing image_ids, .*format"):
        ptt.DetectionDataset(root=str(tmp_path), files=["a.jpg"])


@pytest.mark.parametrize("fmt", ["coco", "yolo", "voc"])
def test_a_standard_root_opens_its_train_split_and_says_so(photo_set, writers, tmp_path, fmt):
    """COCO's train2017 + val2017 (YOLO's and VOC's train + val): the train split, said with the other's name;
    ``split`` picks the other; a root with no train split is refused, naming its splits."""
    train, val = writers.splits(fmt, tmp_path / fmt, photo_set)
    with pytest.warns(ptt.PttWarning, match=f"using split {train} .*; split='{val}' picks the other") as said:
        ds = open_detection(tmp_path / fmt)
    assert ptt.core.for_cli(said[0].message).endswith(f"--split {val} picks the other")
    other = open_detection(tmp_path / fmt, split=val)
    assert (ds.split, other.split) == (train, val) and len(ds) == len(other) == 3
    assert {Path(ds.file(i)).name for i in range(3)} == {p["name"] for p in photo_set[:3]}
    assert {Path(other.file(i)).name for i in range(3)} == {p["name"] for p in photo_set[3:]}
    assert len(ds.boxes) == sum(len(p["boxes"]) for p in photo_set[:3])
    with pytest.raises(ptt.PttError, match=f"has no split 'test'.*its splits: {train}, {val}"):
        open_detection(tmp_path / fmt, split="test")


def test_a_root_without_a_train_split_is_refused_naming_its_splits(photo_set, writers, tmp_path):
    writers.coco(tmp_path, photo_set[:3], "val2017")
    writers.coco(tmp_path, photo_set[3:], "test2017")
    with pytest.raises(ptt.PttError, match=r"holds 2 splits \(test2017, val2017\) and no train split: pass "
                       r"split='test2017' to choose one") as err:  # fmt: skip
        open_detection(tmp_path)
    assert "pass --split test2017 to choose one" in ptt.core.for_cli(err.value)
    assert len(open_detection(tmp_path, split="val2017")) == 3
