"""`ptt optimize`: every candidate checked from its own file, the choice logic, refusals with reasons, and the
winner loaded in a fresh process (without the model's code) giving the same outputs."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
from torch import nn

import pytorchtricks as ptt
from pytorchtricks.cli import main
from pytorchtricks.core import PttError
from pytorchtricks.fixtures import randomize_bn_, small_cnn
from pytorchtricks.infer import artefacts, picker
from pytorchtricks.infer.picker import Row, parse_engines, pick, pick_artefact

pytestmark = pytest.mark.usefixtures("one_thread")


def tiny() -> nn.Module:
    torch.manual_seed(0)
    return randomize_bn_(small_cnn(in_channels=3, width=8)).eval()


def inputs(n: int, seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(2, 3, 24, 24, generator=g) for _ in range(n)]


# -- the choice ---------------------------------------------------------------------------------------------------
def test_pick_takes_the_fastest_candidate_within_its_bound() -> None:
    rows = [
        Row("exact", "eager", "export", "fp32", sqnr_db=130.0, median_ms=9.0),
        Row("fast but noisy", "ort", "onnx", "int8", sqnr_db=28.0, median_ms=2.0),
        Row("int8 ok", "aoti", "aoti", "int8", sqnr_db=34.0, median_ms=3.0),
        Row(
            "broken fp32", "aoti", "aoti", "fp32", sqnr_db=45.0, median_ms=1.0
        ),  # fp32 must be exact (>= 60 dB)
        Row("failed", "onednn", "onednn", "int8", status="refused: no libdnnl2"),
    ]
    assert pick(rows).name == "int8 ok"  # default bound 30 dB
    assert rows[1].status == "refused: SQNR 28.0 dB < 30.0 dB"
    assert rows[3].status == "refused: SQNR 45.0 dB < 60.0 dB"
    assert rows[4].status == "refused: no libdnnl2"
    rows = [Row("a", "eager", "export", "fp32", sqnr_db=130.0, median_ms=9.0),
            Row("b", "aoti", "aoti", "int8", sqnr_db=34.0, median_ms=3.0)]  # fmt: skip
    assert pick(rows, min_sqnr_db=35.0).name == "a"  # a stricter bound: int8 refused, fp32 wins
    assert pick([Row("x", "ort", "onnx", "int8", sqnr_db=10.0, median_ms=1.0)]) is None


def test_parse_engines_and_bounds() -> None:
    assert parse_engines("torch,ort") == ("eager", "aoti", "onednn", "ort")
    assert parse_engines("ort,ort") == ("ort",)
    with pytest.raises(PttError, match="unknown engine 'tensorrt'"):
        parse_engines("tensorrt")
    with pytest.raises(PttError, match="names no engine"):
        parse_engines(",")
    assert picker.bound_for("fp32", 20.0) == picker.FP32_MIN_SQNR_DB
    assert picker.bound_for("int8", 40.0) == 40.0


# -- every candidate checked from the file it was written to -----------------------------------------------------------
def test_fp32_candidates_from_their_files_match_eager(tmp_path) -> None:
    model, held = tiny(), inputs(2)
    res = pick_artefact(model, held[0], held_out=held, precision="fp32", engines=("eager", "ort"), rounds=2,
                        min_run_time_s=0.02, workdir=str(tmp_path))  # fmt: skip
    rows = {r.name: r for r in res.rows}
    for name in ("eager fp32", "eager fp32 channels_last", "ORT fp32"):
        assert rows[name].status == "ok", rows[name].status
        assert rows[name].sqnr_db > 100 and rows[name].inputs_unchanged  # exact up to float reassociation
        assert rows[name].median_ms > 0 and rows[name].speedup > 0
    assert res.winner is not None and res.winner.name in rows
    cl = artefacts.load("export", rows["eager fp32 channels_last"].path, input_shapes=[(2, 3, 24, 24)])
    with torch.no_grad():
        torch.testing.assert_close(cl(held[1]), model(held[1]), rtol=1e-4, atol=1e-5)


@pytest.mark.slow
def test_int8_and_aoti_candidates_are_checked_and_refused_with_reasons(tmp_path, monkeypatch) -> None:
    pytest.importorskip("torchao")
    model, calib, held = tiny(), inputs(4), inputs(2, seed=1)
    res = pick_artefact(model, held[0], calibration=calib, held_out=held, precision="int8",
                        engines=("aoti", "onednn", "ort"), rounds=2, min_run_time_s=0.02, min_sqnr_db=20.0,
                        workdir=str(tmp_path))  # fmt: skip
    rows = {r.name: r for r in res.rows}
    for name in ("AOTInductor int8", "ORT int8 static"):
        assert rows[name].status == "ok" and 20 < rows[name].sqnr_db < 80, (name, rows[name])
    from pytorchtricks.tricks.model.onednn_plan import onednn_available

    if (
        onednn_available()
    ):  # 7-bit activations without VNNI (quantize's default there): the plan builds on both
        plan = rows["int8 oneDNN plan"]
        assert plan.status == "ok" and abs(plan.sqnr_db - rows["AOTInductor int8"].sqnr_db) < 6, plan
    assert res.winner is not None and res.winner.status == "ok"


def test_bf16_is_refused_without_native_bf16(tmp_path, monkeypatch) -> None:
    """(The AOTInductor fp32 candidates are built and checked like the int8 one above: write, load, check.)"""
    model, held = tiny(), inputs(2)
    monkeypatch.setattr(picker, "_bf16_missing", lambda: "no native bf16 (test)")
    res = pick_artefact(model, held[0], held_out=held, precision="bf16", engines=("aoti",), rounds=2,
                        min_run_time_s=0.02, workdir=str(tmp_path))  # fmt: skip
    assert [(r.name, r.status) for r in res.rows[1:]] == [
        ("AOTInductor bf16", "refused: no native bf16 (test)")
    ]
    assert res.winner is None


def test_a_candidate_that_fails_or_mutates_its_input_is_refused(tmp_path, monkeypatch) -> None:
    def broken(*_a, **_k):
        raise RuntimeError("the exporter fell over")

    monkeypatch.setattr(artefacts, "write_onnx", broken)
    monkeypatch.setattr(picker, "_onednn_missing", lambda: "the system oneDNN (libdnnl2) is not installed")
    model, held = tiny(), inputs(2)
    res = pick_artefact(model, held[0], held_out=held, precision="fp32", engines=("eager", "ort", "onednn"),
                        rounds=2, min_run_time_s=0.02, workdir=str(tmp_path))  # fmt: skip
    rows = {r.name: r for r in res.rows}
    assert rows["ORT fp32"].status == "refused: RuntimeError: the exporter fell over"
    assert "int8 oneDNN plan" not in rows  # fp32 only: no int8 candidate is built

    def mutating(fn):
        def run(*args):
            out = fn(*args)
            args[0].add_(1.0)  # what freezing's in-place sum did to callers' inputs
            return out

        return run

    real = artefacts.load
    monkeypatch.setattr(artefacts, "load", lambda kind, path, **kw: mutating(real(kind, path, **kw)))
    res = pick_artefact(model, held[0], held_out=held, precision="fp32", engines=("eager",), rounds=2,
                        min_run_time_s=0.02, workdir=str(tmp_path))  # fmt: skip
    assert all(r.status == "refused: it modified the caller's input" for r in res.rows[1:])
    assert res.winner is None


def test_load_artefact_needs_its_receipt(tmp_path) -> None:
    path = tmp_path / "m.onnx"
    path.write_bytes(b"not onnx")
    with pytest.raises(PttError, match="no receipt"):
        ptt.load_artefact(str(path))
    (tmp_path / "m.json").write_text(json.dumps({"format": "other"}))
    with pytest.raises(PttError, match="not a ptt optimize receipt"):
        ptt.load_artefact(str(path))


# -- the command, and the winner in a fresh process -------------------------------------------------------------------
LOAD = """
import sys, torch
import pytorchtricks as ptt
m = ptt.load_artefact(sys.argv[1])
x = torch.load(sys.argv[2], weights_only=True)
torch.save(m(x), sys.argv[3])
"""


@pytest.mark.slow
def test_cli_resnet18_winner_loads_in_a_fresh_process(tmp_path, capsys) -> None:
    pytest.importorskip("torchvision")
    pytest.importorskip("onnxruntime")
    out = tmp_path / "m"
    rc = main(["optimize", "torchvision:resnet18", "--input-shape", "1,3,160,160", "--engines", "eager,ort",
               "--rounds", "2", "--threads", "1", "--out", str(out)])  # fmt: skip
    text = capsys.readouterr().out
    assert rc == 0, text
    assert "winner:" in text and "ORT fp32" in text and "eager fp32 channels_last" in text
    receipt = json.loads((tmp_path / "m.json").read_text())
    win = receipt["winner"]
    path = tmp_path / win["file"]
    assert path.is_file() and receipt["input_shapes"] == [[1, 3, 160, 160]] and receipt["threads"] == 1
    assert {r["name"] for r in receipt["rows"]} >= {"ORT fp32", "eager fp32", "eager fp32 channels_last"}
    assert "ptt.load_artefact" in receipt["load"] and win["sqnr_db"] > 60
    x = torch.randn(1, 3, 160, 160)
    torch.save(x, tmp_path / "x.pt")
    here = artefacts.load(win["kind"], str(path), input_shapes=[(1, 3, 160, 160)], threads=1)(x)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    subprocess.run([sys.executable, "-c", LOAD, str(path), str(tmp_path / "x.pt"), str(tmp_path / "y.pt")],
                   check=True, env=env, cwd=str(tmp_path), timeout=300)  # fmt: skip
    torch.testing.assert_close(torch.load(tmp_path / "y.pt", weights_only=True), here, rtol=1e-6, atol=1e-6)


@pytest.mark.slow
def test_cli_int8_plan_winner_loads_in_a_fresh_process(tmp_path, capsys) -> None:
    """The int8 oneDNN plan (what --precision any hands back on both CPU classes) is a PT2E program whose
    quantize/dequantize ops exist only once their module is imported: a fresh process must still load it."""
    pytest.importorskip("torchao")
    from pytorchtricks.tricks.model.onednn_plan import onednn_available

    if not onednn_available():
        pytest.skip("no system oneDNN (apt-get install libdnnl2; make system-deps)")
    out = tmp_path / "m"
    rc = main(["optimize", "pytorchtricks.fixtures:small_cnn", "--input-shape", "2,1,28,28", "--precision", "int8",
               "--engines", "onednn", "--min-sqnr", "10", "--rounds", "1", "--threads", "1", "--out", str(out)])  # fmt: skip
    text = capsys.readouterr().out
    assert rc == 0, text
    win = json.loads((tmp_path / "m.json").read_text())["winner"]
    assert win["kind"] == "onednn" and win["file"] == "m.pt2", win
    x = torch.randn(2, 1, 28, 28)
    torch.save(x, tmp_path / "x.pt")
    here = artefacts.load("onednn", str(tmp_path / "m.pt2"), input_shapes=[(2, 1, 28, 28)], threads=1)(x)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    subprocess.run([sys.executable, "-c", LOAD, str(tmp_path / "m.pt2"), str(tmp_path / "x.pt"), str(tmp_path / "y.pt")],
                   check=True, env=env, cwd=str(tmp_path), timeout=300)  # fmt: skip
    torch.testing.assert_close(torch.load(tmp_path / "y.pt", weights_only=True), here, rtol=1e-6, atol=1e-6)


def test_cli_refuses_bad_arguments(capsys) -> None:
    assert main(["optimize", "torch.nn:Identity", "--input-shape", "1,three"]) == 2
    assert main(["optimize", "torch.nn:Identity", "--engines", "tensorrt"]) == 2
    assert "unknown engine" in capsys.readouterr().err
