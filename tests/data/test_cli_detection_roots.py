"""The CLI on standard detection roots (a COCO root with train2017 + val2017, YOLO's and VOC's train + val): `ptt
pack`, `ptt inspect`, `ptt doctor data` and `ptt tune --task detection` read the train split and say so, `--split`
picks the other, and no message advises a Python keyword (`split=...`) on the command line."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from pytorchtricks.cli import main
from pytorchtricks.shards.dataset import ShardDataset

FORMATS = ("coco", "yolo", "voc")
# a Python keyword as advice (`split='val2017'`, `pass on_error=`), or a call of the library's API
PYTHON_ADVICE = re.compile(r"(?<![-\w])[a-z_]+=|\bptt\.[a-z_]+\(")


@pytest.fixture(scope="module", params=FORMATS)
def root(request, photo_set, writers, tmp_path_factory):
    """(format, root, train split, val split): 3 photos in train, 3 in val."""
    fmt = request.param
    path = tmp_path_factory.mktemp(fmt)
    train, val = writers.splits(fmt, path, photo_set)
    return fmt, path, train, val


def run(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    assert not PYTHON_ADVICE.search(err), err
    return code, " ".join(out.split()), " ".join(err.split())


def test_pack_reads_the_train_split_and_split_picks_the_other(root, photo_set, capsys, tmp_path):
    _, path, train, val = root
    code, out, err = run(capsys, "pack", path, tmp_path / "a", "--workers", "0")
    assert code == 0 and "packed 3 of 3 files" in out, out
    assert f"using split {train}" in err and f"--split {val} picks the other" in err, err
    code, out, err = run(capsys, "pack", path, tmp_path / "b", "--workers", "0", "--split", val)
    assert code == 0 and "packed 3 of 3 files" in out and "using split" not in err
    ids = {}
    for name in ("a", "b"):
        ds = ShardDataset(tmp_path / name, decode=None)
        ids[name] = sorted(len(ds.read_raw(i)[2]["target"]["boxes"]) for i in range(len(ds)))
    boxes = [len(p["boxes"]) for p in photo_set]
    assert ids == {"a": sorted(boxes[:3]), "b": sorted(boxes[3:])}


def test_inspect_shows_the_split_it_read(root, capsys):
    fmt, path, train, val = root
    code, out, err = run(capsys, "inspect", path)
    assert code == 0 and f"a {fmt.upper()} root, split {train} (splits: " in out and "3 images" in out, out
    assert "files: ok" in out and "boxes per class" in out and f"using split {train}" in err
    code, out, err = run(capsys, "inspect", path, "--split", val, "--no-verify")
    assert code == 0 and f"split {val}" in out and not err


def test_doctor_data_times_the_detection_loader_on_a_split(root, capsys):
    _, path, train, val = root
    args = (
        "doctor",
        "data",
        path,
        "--batch-size",
        "1",
        "--batches",
        "1",
        "--workers",
        "0",
        "--recipe",
        "ssd",
    )
    code, out, err = run(capsys, *args)
    assert code == 0 and "decode" in out and "verdict: unknown" in out and "--step-time" in out, out
    assert f"using split {train}" in err
    code, out, err = run(capsys, *args, "--split", val)
    assert code == 0 and "verdict:" in out and not err
    code, _, err = run(capsys, *args[:3], "--split", val, "--batch-size", "2")  # 3 images: too few
    assert code == 2 and "Lower --batch-size or --batches" in err, err


@pytest.fixture
def captured(monkeypatch):
    """`ptt tune` up to its workload: the run itself (minutes on a detector) is stubbed."""
    from pytorchtricks.tune import engine

    got = {}

    class Stop(Exception):
        pass

    def stub(w, **_kw):
        got["w"] = w
        raise Stop

    monkeypatch.setattr(engine, "run_tune", stub)
    return got, Stop


def test_tune_trains_on_train2017_and_says_so(photo_set, writers, tmp_path, capsys, captured):
    got, stop = captured
    writers.splits("coco", tmp_path / "coco", photo_set)
    argv = ["tune", "--task", "detection", "--data", tmp_path / "coco", "--batch-size", "2", "--input-size", "96",
            "--num-workers", "0", "--time-budget", "1", "--out", tmp_path / "out"]  # fmt: skip
    for split, extra in (("train2017", []), ("val2017", ["--split", "val2017"])):
        with pytest.raises(stop):
            main([str(a) for a in argv + extra])
        w = got["w"]
        err = " ".join(capsys.readouterr().err.split())
        assert w.split == split and f"(split {split})" in w.data_desc, w.data_desc
        assert all(f"/{split}/" in f for f in w.files) and len(w.files) == 3
        said = "using split train2017 (annotations/instances_train2017.json); --split val2017 picks the other"
        assert (said in err) == (split == "train2017"), err
        assert not PYTHON_ADVICE.search(err), err


def test_the_tune_pack_reads_the_split_tune_read(photo_set, writers, tmp_path):
    from pytorchtricks.tricks.data.pack import _tune_pack
    from pytorchtricks.tunable import TuneSetup

    writers.splits("coco", tmp_path / "coco", photo_set)
    setup = TuneSetup(model=None, optimizer=("sgd", {}), device="cpu", train=True, example=None, batch_size=2,
                      input_size=96, source=str(tmp_path / "coco"), split="val2017", cache_dir=str(tmp_path),
                      dataset=[0, 1, 2], task="detection")  # fmt: skip
    state = _tune_pack(setup, None)
    ds = ShardDataset(state["path"], decode=None)
    got = sorted(ds.read_raw(i)[2]["target"]["image_id"] for i in range(len(ds)))
    assert got == [100, 101, 102]  # val2017's three images (ids from 100 in each split)
    assert sum(len(ds.read_raw(i)[2]["target"]["boxes"]) for i in range(len(ds))) == sum(
        len(p["boxes"]) for p in photo_set[3:]
    )


def _no_train_split(photo_set, writers, root: Path) -> None:
    writers.coco(root, photo_set[:3], "val2017")
    writers.coco(root, photo_set[3:], "test2017")


def test_no_cli_message_advises_a_python_keyword(photo_set, writers, tmp_path, capsys, captured):
    """Every refusal these roots can meet, on every verb: the options are spelt as flags (tune's run is stubbed,
    it is never reached)."""
    coco, yolo, pack = tmp_path / "coco", tmp_path / "yolo", tmp_path / "pack"
    _no_train_split(photo_set, writers, coco)
    writers.yolo(yolo, photo_set)  # one set of images, no splits
    writers.splits("voc", tmp_path / "voc", photo_set)
    writers.splits("coco", tmp_path / "std", photo_set)
    assert main(["pack", str(tmp_path / "std"), str(pack), "--workers", "0"]) == 0
    capsys.readouterr()
    verbs = {
        "pack": lambda p, *a: ["pack", p, tmp_path / "out", "--workers", "0", *a],
        "inspect": lambda p, *a: ["inspect", p, *a],
        "doctor": lambda p, *a: [
            "doctor",
            "data",
            p,
            "--batch-size",
            "1",
            "--batches",
            "1",
            "--workers",
            "0",
            *a,
        ],
        "tune": lambda p, *a: ["tune", "--task", "detection", "--data", p, "--num-workers", "0", *a],
    }
    cases = [
        (coco, (), "holds 2 splits (test2017, val2017) and no train split: pass --split test2017 to choose one"),
        (coco, ("--split", "train2017"), "has no split 'train2017' (annotations/instances_train2017.json); its "
         "splits: test2017, val2017"),
        (yolo, ("--split", "val"), "holds one set of images, no images/SPLIT/: leave out --split"),
        (tmp_path / "voc", ("--split", "test"), "has no split 'test' (ImageSets/Main/test.txt); its splits: train, val"),
    ]  # fmt: skip
    for verb, argv in verbs.items():
        for path, extra, said in cases:
            code, _, err = run(capsys, *argv(path, *extra))
            assert code == 2 and said in err, (verb, err)
        if verb in ("inspect", "doctor"):  # a pack has no splits
            code, _, err = run(capsys, *argv(pack, "--split", "val2017"))
            assert code == 2 and "leave out --split" in err, (verb, err)
    code, _, err = run(capsys, "tune", "--data", coco, "--split", "val2017")  # no --task detection
    assert code == 2 and "tune a detector on it with --task detection" in err, err
    code, _, err = run(capsys, "tune", "--data", pack)
    assert code == 2 and "with --task detection" in err, err
    ann = coco / "annotations" / "instances_val2017.json"
    ann.write_text('{"images": [')
    for verb, argv in verbs.items():
        code, _, err = run(capsys, *argv(coco, "--split", "val2017"))
        assert code == 2 and "not valid JSON" in err and "(fix it)" in err, (verb, err)


def test_tune_leaves_bad_annotations_out_and_says_so(photo_set, writers, tmp_path, capsys, captured):
    got, stop = captured
    writers.splits("coco", tmp_path / "coco", photo_set)
    ann = tmp_path / "coco" / "annotations" / "instances_train2017.json"
    doc = json.loads(ann.read_text())
    doc["annotations"][0]["bbox"] = ["a", "b", "c", "d"]
    ann.write_text(json.dumps(doc))
    with pytest.raises(stop):
        main(["tune", "--task", "detection", "--data", str(tmp_path / "coco"), "--num-workers", "0"])
    err = " ".join(capsys.readouterr().err.split())
    assert "1 bad annotation(s) left out" in err and "bbox holds 'a', which is not a number" in err, err
    assert not PYTHON_ADVICE.search(err) and len(got["w"].dataset.rejects) == 1
