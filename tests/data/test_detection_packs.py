"""Detection packs: a COCO root packed as ptt, tar and lmdb reads back byte-identical JPEGs and equal targets (JSON
metadata, never pickle); --resize / --max-side scale the boxes exactly; ptt inspect shows the detection summary;
webdataset reads our detection tar with its JSON target; a path,label,boxes list follows --resize too."""

from __future__ import annotations

import json

import numpy as np
import pytest

import pytorchtricks as ptt
from pytorchtricks.data.decode import image_size
from pytorchtricks.data.detection import open_detection
from pytorchtricks.shards.dataset import ShardDataset
from pytorchtricks.shards.writer import pack


def _by_image_id(ds):
    return {ds[i][1]["image_id"]: ds[i] for i in range(len(ds))}


@pytest.mark.parametrize("fmt", ["ptt", "lmdb", "tar"])
def test_coco_packs_read_back_identical(coco_root, tmp_path, fmt):
    src = open_detection(coco_root)
    want = _by_image_id(src)
    s = pack(coco_root, tmp_path / "p", format=fmt, workers=0, shard_size="200KB")
    assert s["count"] == len(src) and not s["rejects"]
    det = s["detection"]
    assert det["images"] == len(src) and det["boxes"] == len(src.boxes) and det["images_without_boxes"] == 1
    assert sum(det["boxes_per_class"].values()) == len(src.boxes)
    assert set(det["boxes_per_class"]) <= {"cat", "dog", "tree"}
    if fmt == "tar":
        wds = pytest.importorskip("webdataset")
        url = str(tmp_path / "p" / s["pattern"])
        got = {}
        for sample in wds.WebDataset(url, shardshuffle=False, empty_check=False):
            t = json.loads(sample["json"])["target"]
            got[t["image_id"]] = (sample["jpg"], t)
    else:
        ds = ShardDataset(tmp_path / "p", decode=None)
        got = {}
        for i in range(len(ds)):
            raw, _, extras = ds.read_raw(i)
            got[extras["target"]["image_id"]] = (raw, extras["target"])
    assert set(got) == set(want)
    for iid, (raw, t) in got.items():
        wraw, wt = want[iid]
        assert raw == wraw  # byte-identical JPEG
        assert t["boxes"] == wt["boxes"].tolist() and t["labels"] == wt["labels"].tolist()
        assert t["area"] == wt["area"].tolist() and t["iscrowd"] == wt["iscrowd"].tolist()
        assert t.get("segmentation") == wt.get("segmentation") and t["size"] == list(image_size(raw))


def test_pack_resize_scales_boxes_exactly_and_loader_reads_the_pack(coco_root, tmp_path):
    src = open_detection(coco_root)
    want = _by_image_id(src)
    s = pack(coco_root, tmp_path / "p", resize=300, max_side=480, workers=0)
    ds = ShardDataset(tmp_path / "p", decode=None)
    for i in range(len(ds)):
        raw, _, extras = ds.read_raw(i)
        t = extras["target"]
        h, w = image_size(raw)
        assert min(h, w) <= 300 and max(h, w) <= 480 and t["size"] == [h, w]
        wb = want[t["image_id"]][1]["boxes"].numpy().astype(np.float64)
        h0, w0 = image_size(want[t["image_id"]][0])
        want_b = (wb * [w / w0, h / h0, w / w0, h / h0]).reshape(-1, 4)
        np.testing.assert_allclose(np.asarray(t["boxes"]).reshape(-1, 4), want_b, rtol=0, atol=1e-9)
    assert s["detection"]["height"]["max"] <= 480 and s["detection"]["width"]["max"] <= 480
    batch = next(
        iter(
            ptt.make_detection_loader(str(tmp_path / "p"), 2, "ssd", ptt.DetectionLoaderConfig(num_workers=0))
        )
    )
    assert batch.images.shape == (2, 3, 300, 300) and all("boxes" in t for t in batch.targets)


def test_inspect_shows_the_detection_summary(coco_root, tmp_path, capsys):
    from pytorchtricks.cli import main

    pack(coco_root, tmp_path / "p", workers=0)
    r = ptt.inspect_shards(tmp_path / "p")
    assert r["problems"] == [] and r["detection"]["images"] == r["count"]
    assert main(["inspect", str(tmp_path / "p")]) == 0
    out = capsys.readouterr().out
    assert "boxes per class" in out and "without boxes" in out and "boxes per image" in out


def test_a_box_list_follows_resize(photo_set, tmp_path):
    """The issue's case: a path,label,boxes JSONL packed with --resize kept boxes in the original pixels."""
    rows = []
    for p in photo_set[:3]:
        (tmp_path / p["name"]).write_bytes(p["jpeg"])
        rows.append({"path": p["name"], "label": 0, "boxes": p["boxes"].tolist()})
    lst = tmp_path / "list.jsonl"
    lst.write_text("".join(json.dumps(r) + "\n" for r in rows))
    pack(lst, tmp_path / "p", resize=200, workers=0, shuffle=False)
    ds = ShardDataset(tmp_path / "p", decode=None)
    for i, p in enumerate(photo_set[:3]):
        raw, _, extras = ds.read_raw(i)
        h, w = image_size(raw)
        h0, w0 = p["hw"]
        assert min(h, w) == 200 and extras["size"] == [h, w]
        want = p["boxes"].astype(np.float64) * [w / w0, h / h0, w / w0, h / h0]
        np.testing.assert_allclose(np.asarray(extras["boxes"]).reshape(-1, 4), want.reshape(-1, 4), atol=1e-9)


def test_a_file_that_disagrees_with_its_annotation_is_a_reject(coco_root, tmp_path):
    import shutil

    from PIL import Image

    root = tmp_path / "coco"
    shutil.copytree(coco_root, root)
    name = sorted((root / "val").iterdir())[0]
    Image.new("RGB", (64, 48)).save(name, "JPEG")
    s = pack(root, tmp_path / "p", workers=0)
    assert len(s["rejects"]) == 1 and "disagree" in s["rejects"][0]["reason"]
    assert s["count"] == len(open_detection(coco_root)) - 1
    with pytest.raises(ptt.PttError, match="disagree"):
        pack(root, tmp_path / "q", workers=0, strict=True)


def test_a_ptt_detection_pack_lists_every_target_in_one_checked_file(coco_root, tmp_path):
    """targets.npz holds each record's stored target (the one its record carries, boxes scaled by --resize), in
    record order; the same pack written twice has the same bytes; a changed file is refused; read_extras (the
    records' metadata only) gives what read_raw gives."""
    from pytorchtricks.data.errors import ShardError
    from pytorchtricks.shards.targets import read_targets

    s = pack(coco_root, tmp_path / "p", resize=300, workers=0, shard_size="200KB")
    again = pack(coco_root, tmp_path / "q", resize=300, workers=0, shard_size="200KB")
    entry = s["detection"]["targets"]
    assert entry == again["detection"]["targets"] and entry["file"] == "targets.npz"
    ds = ShardDataset(tmp_path / "p", decode=None)
    cols = read_targets(str(tmp_path / "p"), entry)
    extras = [ds.read_raw(i)[2] for i in range(len(ds))]
    assert ds.read_extras() == extras
    start = np.concatenate([[0], np.cumsum(cols["count"])])
    for i, e in enumerate(extras):
        t = e["target"]
        assert cols["image_id"][i] == t["image_id"] and cols["size"][i].tolist() == t["size"]
        assert cols["boxes"][start[i] : start[i + 1]].tolist() == t["boxes"]
        assert cols["labels"][start[i] : start[i + 1]].tolist() == t["labels"]
    blob = bytearray((tmp_path / "p" / "targets.npz").read_bytes())
    blob[-30] ^= 1
    (tmp_path / "p" / "targets.npz").write_bytes(bytes(blob))
    with pytest.raises(ShardError, match="checksum"):
        read_targets(str(tmp_path / "p"), entry)
    from pytorchtricks.shards.inspect import verify_shards

    assert any("targets.npz" in p and "checksum" in p for p in verify_shards(str(tmp_path / "p")))
    assert verify_shards(str(tmp_path / "q")) == []


def test_a_classification_pack_has_no_targets_file_and_clears_a_stale_one(coco_root, tmp_path):
    from PIL import Image

    s = pack(coco_root, tmp_path / "p", workers=0)
    assert (tmp_path / "p" / "targets.npz").is_file() and "targets" in s["detection"]
    for k in range(2):
        (tmp_path / "folder" / f"c{k}").mkdir(parents=True)
        Image.new("RGB", (16, 12), (40 * k, 9, 9)).save(tmp_path / "folder" / f"c{k}" / "a.jpg")
    (tmp_path / "q").mkdir()  # a detection pack abandoned there before its manifest: its targets.npz is stale
    (tmp_path / "q" / "targets.npz").write_bytes((tmp_path / "p" / "targets.npz").read_bytes())
    (tmp_path / "q" / "notes.txt").write_text("kept")
    s = pack(tmp_path / "folder", tmp_path / "q", workers=0)
    assert "detection" not in s and not (tmp_path / "q" / "targets.npz").exists()
    assert (tmp_path / "q" / "notes.txt").read_text() == "kept"
