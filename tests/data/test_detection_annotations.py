"""Annotation values: every field of a COCO, YOLO or VOC annotation is type-checked. A string, a list of the wrong
length, a bool, a nested list, NaN or inf is an AnnotationError naming the file, the annotation and the field; with
on_error="skip" it is listed and the rest kept; a pack lists it in its rejects and loads the rest. Two COCO images
sharing one id are refused naming both, and both left out under skip."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

import pytorchtricks as ptt
from pytorchtricks.data.detection import AnnotationError, open_detection
from pytorchtricks.shards.dataset import ShardDataset

NAN = float("nan")


def _ann(i: int = 0, **kv: Any) -> Any:
    return lambda d: d["annotations"][i].update(kv)


def _img(i: int = 0, **kv: Any) -> Any:
    return lambda d: d["images"][i].update(kv)


# (case, edit of the COCO document, the field named, what the message says, what skip leaves out: "box" or "image")
COCO_CASES = [
    ("bbox strings", _ann(bbox=["a", "b", "c", "d"]), "bbox", "bbox holds 'a', which is not a number", "box"),
    ("bbox of 3", _ann(bbox=[1, 2, 3]), "bbox", "bbox [1, 2, 3] is not [x, y, width, height]", "box"),
    ("bbox of 5", _ann(bbox=[1, 2, 3, 4, 5]), "bbox", "is not [x, y, width, height]", "box"),
    ("bbox bool", _ann(bbox=[True, 2, 30, 40]), "bbox", "bbox holds True, which is not a number", "box"),
    ("bbox nested", _ann(bbox=[[1], 2, 30, 40]), "bbox", "bbox holds [1], which is not a number", "box"),
    ("bbox NaN", _ann(bbox=[NAN, 2, 30, 40]), "bbox", "bbox holds nan, which is not finite", "box"),
    ("bbox inf", _ann(bbox=[1, 2, float("inf"), 40]), "bbox", "bbox holds inf, which is not finite", "box"),
    ("bbox a string", _ann(bbox="1 2 3 4"), "bbox", "is not [x, y, width, height]", "box"),
    ("category_id string", _ann(category_id="1"), "category_id", "category_id '1' is not an integer", "box"),
    ("category_id bool", _ann(category_id=True), "category_id", "category_id True is not an integer", "box"),
    ("image_id string", _ann(image_id="100"), "image_id", "image_id '100' is not an integer", "box"),
    ("image_id list", _ann(image_id=[100]), "image_id", "image_id [100] is not an integer", "box"),
    ("iscrowd bool", _ann(iscrowd=True), "iscrowd", "iscrowd True is not an integer", "box"),
    ("iscrowd 2", _ann(iscrowd=2), "iscrowd", "iscrowd 2 is not 0 or 1", "box"),
    ("area string", _ann(area="big"), "area", "area holds 'big', which is not a number", "box"),
    ("area NaN", _ann(area=NAN), "area", "area holds nan, which is not finite", "box"),
    ("id float", _ann(id=1.5), "id", "id 1.5 is not an integer", "box"),
    ("id string", _ann(id="one"), "id", "id 'one' is not an integer", "box"),
    ("segmentation nested", _ann(segmentation=[[[1, 2]]]), "segmentation", "is not a flat list", "box"),
    ("segmentation strings", _ann(segmentation=[["a", "b"]]), "segmentation", "which is not a number", "box"),
    ("segmentation odd", _ann(segmentation=[[1, 2, 3]]), "segmentation", "is not a flat list", "box"),
    ("segmentation RLE", _ann(segmentation={"counts": "x", "size": [1]}), "segmentation", "[height, width]", "box"),
    ("width string", _img(width="640"), "width", "width '640' is not an integer", "image"),
    ("height bool", _img(height=True), "height", "height True is not an integer", "image"),
    ("height NaN", _img(height=NAN), "height", "height nan is not an integer", "image"),
    ("width zero", _img(width=0), "width", "width 0 is below 1", "image"),
    ("file_name number", _img(file_name=5), "file_name", "file_name 5 is not a file name", "image"),
    ("image id string", _img(id="100"), "id", "id '100' is not an integer", "image"),
    ("image id bool", _img(id=True), "id", "id True is not an integer", "image"),
]  # fmt: skip


def _coco(photo_set, writers, root: Path, edit: Any) -> tuple[Path, dict[str, Any]]:
    writers.coco(root, photo_set)
    ann = root / "annotations" / "instances_val.json"
    doc = json.loads(ann.read_text())
    edit(doc)
    ann.write_text(json.dumps(doc))  # NaN / Infinity as Python's json writes (and reads) them
    return ann, doc


def _packed(root: Path, dst: Path) -> tuple[dict[str, Any], dict[int, int]]:
    """The pack's summary and what it loads back: image id -> its number of boxes."""
    s = ptt.pack(root, dst, workers=0)
    ds = ShardDataset(dst, decode=None)
    loaded = {}
    for i in range(len(ds)):
        t = ds.read_raw(i)[2]["target"]
        loaded[t["image_id"]] = len(t["boxes"])
    return s, loaded


@pytest.mark.parametrize("case, edit, field, said, lost", COCO_CASES, ids=[c[0] for c in COCO_CASES])
def test_a_bad_coco_value_is_named_listed_and_packed_without(photo_set, writers, tmp_path, case, edit, field, said,
                                                            lost):  # fmt: skip
    ann, _ = _coco(photo_set, writers, tmp_path / "coco", edit)
    with pytest.raises(AnnotationError) as err:
        open_detection(tmp_path / "coco")
    e = err.value
    assert said in str(e) and str(ann) in str(e) and e.field == field, str(e)
    first = photo_set[0]
    if lost == "box":  # named by its annotation id (or its place, when the id itself is bad)
        assert e.annotation_id in (1, "annotations[0]") and "annotation " in str(e)
    else:  # an image entry: named by its id or its place
        assert e.annotation_id is None and ("image 100" in str(e) or "images[0]" in str(e) or field == "id")
    ds = open_detection(tmp_path / "coco", on_error="skip")
    assert ds.rejects[0]["field"] == field and said in ds.rejects[0]["reason"]
    # an image entry without a valid id: its boxes cannot be attributed, each one is listed as well
    orphans = len(first["boxes"]) if field == "id" and lost == "image" else 0
    assert len(ds.rejects) == 1 + orphans and all("not listed" in r["reason"] for r in ds.rejects[1:])
    n_boxes = sum(len(p["boxes"]) for p in photo_set)
    want = {100 + n: len(p["boxes"]) for n, p in enumerate(photo_set)}
    if lost == "box":
        want[100] -= 1
    else:
        del want[100]
    assert len(ds) == len(want) and len(ds.boxes) == sum(want.values()) <= n_boxes
    s, loaded = _packed(tmp_path / "coco", tmp_path / "pack")
    assert loaded == want and len(s["rejects"]) == 1 + orphans and said in s["rejects"][0]["reason"]
    named = field not in ("image_id", "file_name")  # the reject names the image where the entry says which
    assert s["rejects"][0]["path"] == (first["name"] if named else str(ann))


def test_two_images_sharing_an_id_are_named_and_both_left_out(photo_set, writers, tmp_path):
    """The probe's case: image 1 took image 0's id; its boxes were checked against image 0's size."""
    _coco(photo_set, writers, tmp_path / "coco", _img(2, id=100))
    with pytest.raises(AnnotationError) as err:
        open_detection(tmp_path / "coco")
    a, b = photo_set[0]["name"], photo_set[2]["name"]
    assert f"image id 100 is given to 2 images, '{a}' and '{b}'" in str(err.value) and err.value.field == "id"
    assert "outside" not in str(err.value)
    ds = open_detection(tmp_path / "coco", on_error="skip")
    names = [ds.file(i) for i in range(len(ds))]
    assert a not in names and b not in names and len(ds) == len(photo_set) - 2
    dup = [r for r in ds.rejects if r["field"] == "id"]
    assert sorted(r["image"] for r in dup) == [a, b]
    # image 2's own annotations still say image_id 102, now listed nowhere: each is named, none is attributed
    orphans = [r for r in ds.rejects if r["field"] == "image_id"]
    assert len(orphans) == len(photo_set[2]["boxes"]) and all("102" in r["reason"] for r in orphans)
    s, loaded = _packed(tmp_path / "coco", tmp_path / "pack")
    assert 100 not in loaded and 102 not in loaded and len(loaded) == len(photo_set) - 2
    assert {r["path"] for r in s["rejects"] if "given to 2 images" in r["reason"]} == {a, b}


def test_whole_file_errors_do_not_offer_skip(photo_set, writers, tmp_path):
    _coco(photo_set, writers, tmp_path / "coco", lambda d: d.update(annotations={"id": 1}))
    for on_error in ("raise", "skip"):
        with pytest.raises(AnnotationError, match=r"'annotations' is .*, not a list") as err:
            open_detection(tmp_path / "coco", on_error=on_error)
        assert "on_error" not in str(err.value) and "(fix it)" in str(err.value)


YOLO_CASES = [
    ("class string", "x 0.5 0.5 0.1 0.1", "class", "class 'x' is not a non-negative integer"),
    ("class float", "1.0 0.5 0.5 0.1 0.1", "class", "class '1.0' is not a non-negative integer"),
    ("class negative", "-1 0.5 0.5 0.1 0.1", "class", "class '-1' is not a non-negative integer"),
    ("cx string", "0 abc 0.5 0.1 0.1", "cx", "cx 'abc' is not a number"),
    ("w NaN", "0 0.5 0.5 nan 0.1", "w", "w 'nan' is not finite"),
    ("h inf", "0 0.5 0.5 0.1 inf", "h", "h 'inf' is not finite"),
    ("4 fields", "0 0.5 0.5 0.1", "line", "4 fields, not 'class cx cy w h'"),
]


@pytest.mark.parametrize("case, line, field, said", YOLO_CASES, ids=[c[0] for c in YOLO_CASES])
def test_a_bad_yolo_value_is_named_listed_and_packed_without(
    photo_set, writers, tmp_path, case, line, field, said
):
    root = tmp_path / "yolo"
    writers.yolo(root, photo_set)
    lab = root / "labels" / "img00.txt"
    n = len(photo_set[0]["boxes"])
    lab.write_text(lab.read_text() + line + "\n")
    with pytest.raises(AnnotationError) as err:
        open_detection(root)
    e = err.value
    assert said in str(e) and str(lab) in str(e) and e.annotation_id == n + 1 and e.field == field, str(e)
    ds = open_detection(root, on_error="skip")
    assert [(r["annotation"], r["field"]) for r in ds.rejects] == [(n + 1, field)]
    assert len(ds) == len(photo_set) and len(ds.boxes) == sum(len(p["boxes"]) for p in photo_set)
    s, loaded = _packed(root, tmp_path / "pack")
    assert len(s["rejects"]) == 1 and said in s["rejects"][0]["reason"] and loaded[0] == n


VOC_CASES = [  # (case, the first tag's new text, the field, what the message says, what skip leaves out)
    ("xmin string", ("xmin", "abc"), "bndbox/xmin", "bndbox/xmin 'abc' is not a number", "box"),
    ("xmax inf", ("xmax", "inf"), "bndbox/xmax", "bndbox/xmax 'inf' is not finite", "box"),
    ("ymin empty", ("ymin", ""), "bndbox/ymin", "bndbox/ymin '' is not a number", "box"),
    ("width string", ("width", "wide"), "size/width", "size/width 'wide' is not a number", "image"),
    (
        "height fraction",
        ("height", "480.5"),
        "size/height",
        "size/height '480.5' is not a positive integer",
        "image",
    ),
]


@pytest.mark.parametrize("case, swap, field, said, lost", VOC_CASES, ids=[c[0] for c in VOC_CASES])
def test_a_bad_voc_value_is_named_listed_and_packed_without(photo_set, writers, tmp_path, case, swap, field, said,
                                                           lost):  # fmt: skip
    root = tmp_path / "voc"
    writers.voc(root, photo_set)
    xml = root / "Annotations" / "img00.xml"
    tag, text = swap
    xml.write_text(re.sub(f"<{tag}>[^<]*</{tag}>", f"<{tag}>{text}</{tag}>", xml.read_text(), count=1))
    with pytest.raises(AnnotationError) as err:
        open_detection(root)
    e = err.value
    assert said in str(e) and str(xml) in str(e) and e.field == field, str(e)
    assert e.annotation_id == (0 if lost == "box" else None)
    ds = open_detection(root, on_error="skip")
    assert [r["field"] for r in ds.rejects] == [field]
    n_boxes = sum(len(p["boxes"]) for p in photo_set)
    if lost == "box":
        assert len(ds) == len(photo_set) and len(ds.boxes) == n_boxes - 1
    else:
        assert len(ds) == len(photo_set) - 1 and len(ds.boxes) == n_boxes - len(photo_set[0]["boxes"])
    s, loaded = _packed(root, tmp_path / "pack")
    assert len(s["rejects"]) == 1 and said in s["rejects"][0]["reason"]
    assert sum(loaded.values()) == len(ds.boxes)
