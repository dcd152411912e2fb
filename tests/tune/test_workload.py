"""Workload construction: model specs, data folders, the built-in image set, and the one-paragraph errors."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from pytorchtricks.cli import main
from pytorchtricks.core import PttError
from pytorchtricks.tune.engine import tune_model
from pytorchtricks.tune.workload import DEFAULT_MIN_MP, SyntheticImages, build_workload, default_image_folder


def test_folder_workload_reads_through_the_library(models_file, jpeg_folder):
    """One data road: the workload's dataset is ptt's JpegFolder; its example batch comes from make_loader."""
    from pytorchtricks.data.folder import JpegFolder

    w = build_workload(f"{models_file}:tiny", jpeg_folder, batch_size=4, input_size=24)
    assert isinstance(w.dataset, JpegFolder) and w.data_kind == "files" and w.source == jpeg_folder
    x, y = w.example_batch()
    assert x.dtype == torch.uint8 and x.shape == (4, 3, 24, 24) and y.tolist() == w.labels[:4].tolist()
    assert len(w.files) == len(w.dataset) == 24 and w.dataset.classes == ["c0", "c1"]


def test_imagenet_style_root_trains_on_its_train_split(tmp_path, models_file, jpegs):
    jpegs(str(tmp_path / "root" / "train"), classes=2, per_class=6, px=32)
    jpegs(str(tmp_path / "root" / "val"), classes=2, per_class=2, px=32)
    w = build_workload(f"{models_file}:tiny", str(tmp_path / "root"), batch_size=4, input_size=16)
    assert w.dataset.classes == ["c0", "c1"] and len(w.dataset) == 12 and "train split" in w.data_desc


def test_a_tar_pack_is_refused_with_the_fix(tmp_path, models_file, jpeg_folder):
    """open_data reads a tar pack as a ShardStream (in order); tune samples by index, so it says to re-pack."""
    from pytorchtricks.shards.writer import pack

    pack(jpeg_folder, tmp_path / "tar", format="tar", workers=0)
    with pytest.raises(PttError, match=r"tar pack, read in order.*--format ptt"):
        build_workload(f"{models_file}:tiny", str(tmp_path / "tar"), batch_size=4, input_size=16)


def test_synthetic_is_deterministic():
    a, b = SyntheticImages(8, 16), SyntheticImages(8, 16)
    assert torch.equal(a[3][0], b[3][0]) and not torch.equal(a[3][0], a[4][0])


@pytest.mark.slow
def test_default_image_folder_is_high_resolution_and_cached(tmp_path):
    from PIL import Image

    folder, desc = default_image_folder(count=6, root=str(tmp_path))
    files = sorted(os.path.join(d, f) for d, _, fs in os.walk(folder) for f in fs if f.endswith(".jpg"))
    assert len(files) == 6 and "MP" in desc
    assert all(Image.open(f).size[0] * Image.open(f).size[1] >= DEFAULT_MIN_MP * 1e6 for f in files)
    again, _ = default_image_folder(count=6, root=str(tmp_path))
    assert again == folder and [Path(f).read_bytes() for f in files] == [
        Path(f).read_bytes()
        for f in sorted(os.path.join(d, f) for d, _, fs in os.walk(again) for f in fs if f.endswith(".jpg"))
    ]


def test_workload_from_file_factory(models_file, jpeg_folder):
    w = build_workload(f"{models_file}:tiny", jpeg_folder, batch_size=4, input_size=16)
    assert (w.num_outputs, w.num_classes, w.batch_size) == (10, 2, 4)
    m1, m2 = w.model_factory(), w.model_factory()
    assert m1 is not m2
    torch.testing.assert_close(m1.state_dict(), m2.state_dict())  # same initial weights every time


def test_workload_is_frozen_and_each_run_writes_its_own_state(models_file, monkeypatch):
    """The workload is the run's input: its fields cannot be assigned. What a run writes (notes, one-time builds,
    staged batches) lives in a RunState of the run's own, so a second run on the same workload starts clean and
    the workload itself is left as it was."""
    import dataclasses

    from pytorchtricks.tune import engine

    w = build_workload(f"{models_file}:tiny", "synthetic", batch_size=2, input_size=16)
    with pytest.raises(dataclasses.FrozenInstanceError):
        w.batch_size = 8
    with pytest.raises(dataclasses.FrozenInstanceError):
        w.notes = ("changed",)
    states = []

    def diagnose_then_interrupt(wr, budget_s):  # a run that writes into its state, then is stopped (Ctrl-C)
        states.append(wr.run)
        wr.run.notes.append(f"run {len(states)} built something")
        wr.run.prepared["something"] = len(states)
        raise KeyboardInterrupt

    monkeypatch.setattr(engine, "diagnose", diagnose_then_interrupt)
    first = engine.run_tune(w, time_budget_s=5)
    second = engine.run_tune(w, time_budget_s=5)
    assert len(states) == 2 and states[0] is not states[1] and all(s is not w.run for s in states)
    assert first.notes[: len(w.notes)] == list(w.notes)  # the workload's own notes first, then the run's
    assert first.notes[-1] == "run 1 built something" and "run 1 built something" not in second.notes
    assert second.notes[-1] == "run 2 built something" and states[1].prepared == {"something": 2}
    assert w.run.notes == [] and w.run.prepared == {} and w.run.staged == []


def test_selfcheck_gives_the_model_tunes_head_in_a_new_workload(models_file):
    from pytorchtricks.tune.selfcheck import _with_head

    w = build_workload(f"{models_file}:tiny", "synthetic", batch_size=2, input_size=16)
    wide = _with_head(w, 3)
    assert (wide.num_outputs, w.num_outputs) == (3, 10) and wide.model_factory()[-1].out_features == 3
    assert w.model_factory()[-1].out_features == 10  # the workload it was made from is unchanged


@pytest.mark.parametrize(
    ("model", "data", "size", "needle", "fix"),
    [
        ("no_such_pkg_xyz.models:net", "synthetic", 32, "cannot import module", "fix the spec"),
        ("{f}:fails_small", "synthetic", 48, "fails on inputs of shape (2, 3, 48, 48)", "--input-size"),
        ("{f}:tiny", "{empty}", 32, "holds no images", "--data synthetic"),
        ("{f}:tiny", "{missing}", 32, "does not exist", "--data"),
    ],
)
def test_bad_input_is_one_paragraph_and_writes_nothing(tmp_path, models_file, model, data, size, needle, fix):
    empty = tmp_path / "empty"
    empty.mkdir()
    data = data.format(empty=empty, missing=tmp_path / "missing")
    out = tmp_path / "out"
    with pytest.raises(PttError) as err:
        tune_model(model.format(f=models_file), data, input_size=size, batch_size=4, out=str(out))
    msg = str(err.value)
    assert needle in msg and fix in msg
    assert "\n" not in msg  # one paragraph
    assert not out.exists() and not [p for p in os.listdir(tmp_path) if p.startswith(".out")]


def test_cli_bad_input_exits_2_with_the_fix(tmp_path, models_file, capsys):
    out = tmp_path / "out"
    rc = main(["tune", "--model", f"{models_file}:fails_small", "--data", "synthetic", "--input-size", "40",
               "--out", str(out)])  # fmt: skip
    assert rc == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "--input-size" in err
    assert not out.exists()


def test_workload_from_a_ptt_pack(tmp_path, models_file, jpeg_folder):
    import pytorchtricks as ptt

    dst = str(tmp_path / "pack")
    ptt.pack(jpeg_folder, dst, workers=0)
    w = build_workload(f"{models_file}:tiny", dst, batch_size=4, input_size=16)
    x, y = w.example_batch()
    assert x.dtype == torch.uint8 and x.shape == (4, 3, 16, 16) and w.num_classes == 2
    assert "ptt pack" in w.data_desc and set(y.tolist()) <= {0, 1}


def test_input_shape_is_the_whole_shape_channels_included(models_file, jpeg_folder):
    # the official MNIST example: 1 channel, 28x28; tune used to feed it 3 channels
    w = build_workload(f"{models_file}:mnist", "synthetic", batch_size=4, input_shape="1,28,28")
    x, _ = w.example_batch()
    assert x.shape == (4, 1, 28, 28) and w.input_shape == (1, 28, 28) and w.shape_text() == "1x28x28"
    w = build_workload(f"{models_file}:mnist", jpeg_folder, input_shape=(6, 1, 28, 28))  # N,C,H,W: batch too
    assert w.example_batch()[0].shape == (6, 1, 28, 28) and w.batch_size == 6
    # without --input-shape the channels are the model's (its first conv), the side --input-size's
    w = build_workload(f"{models_file}:gray", jpeg_folder, batch_size=2, input_size=16)
    assert w.example_batch()[0].shape == (2, 1, 16, 16)
    assert build_workload(f"{models_file}:tiny", "synthetic", batch_size=2, input_size=16).channels == 3


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"input_shape": "1,28"}, "not an image shape"),
        ({"input_shape": "1,28,28", "input_size": 32}, "disagrees"),
        ({"input_shape": "8,1,28,28", "batch_size": 4}, "disagrees"),
        ({"input_shape": "1,64,64"}, "--input-shape 1,64,64"),  # the MNIST Linear needs 28x28
    ],
)
def test_bad_input_shapes_explain_the_fix(models_file, kwargs, needle):
    with pytest.raises(PttError, match="input-shape") as err:
        build_workload(f"{models_file}:mnist", "synthetic", **kwargs)
    assert needle in str(err.value) and "\n" not in str(err.value)


def test_default_shape_failure_says_where_the_shape_came_from(models_file):
    with pytest.raises(PttError) as err:
        build_workload(f"{models_file}:mnist", "synthetic", batch_size=2)
    msg = str(err.value)
    assert "(2, 1, 64, 64)" in msg and "first convolution" in msg and "--input-shape C,H,W" in msg


def test_cli_tune_takes_input_shape_and_num_workers():
    from pytorchtricks.cli import build_parser

    args = build_parser().parse_args(["tune", "--input-shape", "1,28,28", "--num-workers", "2"])
    assert (args.input_shape, args.num_workers) == ("1,28,28", 2)


@pytest.mark.parametrize(
    ("spec", "needle"),
    [
        ("os:abort", "built-in function"),  # would abort the process if called
        ("sys:exit", "built-in function"),  # would exit 0 without a word
        ("collections:OrderedDict", "not an nn.Module"),
    ],
)
def test_model_specs_that_are_not_factories_are_refused_before_any_call(spec, needle):
    from pytorchtricks.bench.workloads import load_model
    from pytorchtricks.core import PttError

    with pytest.raises(PttError, match=needle):
        load_model(spec)


def test_a_factory_that_exits_is_an_error_not_an_exit(tmp_path, capsys):
    from pytorchtricks.bench.workloads import load_model
    from pytorchtricks.core import PttError

    script = tmp_path / "train.py"
    script.write_text(
        "import argparse\n\ndef main():\n    argparse.ArgumentParser().parse_args(['--nope'])\n",
        encoding="utf-8",
    )
    with pytest.raises(PttError, match="tried to exit the process") as err:
        load_model(f"{script}:main")
    assert f"ptt doctor run --tune -- python {script} ARGS" in str(err.value)
    assert "usage:" not in capsys.readouterr().err  # the script's own argparse usage is not printed as ours
    noisy = tmp_path / "noisy.py"
    noisy.write_text(
        "import sys, torch\n\ndef build():\n    print('said', file=sys.stderr)\n    return torch.nn.Linear(2, 2)\n",
        encoding="utf-8",
    )
    load_model(f"{noisy}:build")
    assert capsys.readouterr().err == "said\n"  # a factory that returns keeps what it printed


def test_tune_given_a_script_says_to_run_it_under_the_doctor(capsys):
    from pytorchtricks.cli import main

    assert main(["tune", "train.py"]) == 2
    assert "ptt doctor run --tune -- python train.py ARGS" in capsys.readouterr().err


def test_a_torchvision_detector_is_built_offline(monkeypatch, tmp_path):
    """weights=None is not enough for a detector: its builder downloads the ImageNet backbone unless
    weights_backbone=None too. With no network and an empty hub folder nothing may be fetched."""
    from pytorchtricks.bench.workloads import load_model

    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "hub"))
    m = load_model("torchvision:fasterrcnn_mobilenet_v3_large_320_fpn")
    assert type(m).__name__ == "FasterRCNN"
    assert not (tmp_path / "hub").exists()  # nothing was downloaded, no empty cache folder left behind
