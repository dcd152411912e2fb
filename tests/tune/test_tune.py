"""End to end: a reduced tune (tiny model, 20-second budget), the planted-problem diagnosis, Ctrl-C, atomic output."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch

import pytorchtricks.tune.receipt as receipt
from pytorchtricks.hardware import cpu_caps
from pytorchtricks.tune.diagnose import diagnose
from pytorchtricks.tune.engine import tune_model
from pytorchtricks.tune.hooks import by_name
from pytorchtricks.tune.measuring import Progress
from pytorchtricks.tune.runner import Runner, stage_batches
from pytorchtricks.tune.workload import build_workload


def _rows(out):
    with open(os.path.join(out, "results.jsonl"), encoding="utf-8") as fh:
        return [json.loads(line) for line in fh]


@pytest.mark.slow
def test_reduced_tune_end_to_end(tmp_path, models_file):
    out = str(tmp_path / "out")
    res = tune_model(
        f"{models_file}:planted", "synthetic", batch_size=8, input_size=16, time_budget_s=20, out=out
    )
    assert sorted(os.listdir(out)) == ["apply.py", "receipt.json", "report.html", "results.jsonl"]
    rows = _rows(out)
    assert rows[0]["kind"] == "tune-run" and rows[0]["env"]["torch"] and rows[0]["interleaved"]
    assert rows[-1]["kind"] == "tune-summary"
    cands = [r for r in rows if r["kind"] == "tune-candidate"]
    assert len(cands) == len(res.candidates) and all(r["reason"] for r in cands if r["status"] != "kept")
    assert all(r["status"] in ("kept", "rejected", "skipped", "failed") for r in cands)
    for r in cands:  # every measured candidate passed its check first and carries its spread
        if r["measured"]:  # loader settings timed on the whole step, model tricks on the compute step
            assert r["measured"]["scope"] == by_name(r["name"]).scope
            assert (
                r["check"]["passed"]
                and r["measured"]["ratio_q1"] <= r["measured"]["ratio"] <= r["measured"]["ratio_q3"]
            )
    if res.recommended:  # the headline number is a measurement of exactly the recommended set
        assert res.combined is not None and set(res.combined.tricks) == set(res.recommended)
    html = Path(os.path.join(out, "report.html")).read_text(encoding="utf-8")
    assert html.count("<svg") >= 2 and "<script" not in html
    # apply.py is valid Python and applies the tricks to a fresh model
    code = Path(os.path.join(out, "apply.py")).read_text(encoding="utf-8")
    ns: dict = {}
    exec(compile(code, "apply.py", "exec"), ns)
    w = build_workload(f"{models_file}:planted", "synthetic", batch_size=8, input_size=16)
    _model, optimizer, loader, mp = ns["apply"](w.model_factory(), w.dataset, 8)
    assert optimizer is not None and mp is not None and len(loader) > 0
    assert res.elapsed_s < 20 + 15  # the budget drives the plan (slack for a loaded machine)


def test_planted_problems_are_diagnosed(tmp_path, models_file, jpegs):
    # input-bound by construction: 192 px PNGs (no reduced-scale decode) per sample for a 2-conv model at 16 px
    data = jpegs(str(tmp_path / "big"), classes=2, per_class=16, px=192, ext="png")
    w = build_workload(f"{models_file}:planted", data, batch_size=16, input_size=16)
    diag = diagnose(w, budget_s=8)
    found = {(f.id, f.name) for f in diag.findings}  # one id per concept, lint's or the diagnosis' own
    assert ("PTL001", "conv-bias-before-bn") in found
    assert diag.verdict == "input-bound" and ("PTD001", "input-bound") in found
    assert diag.conv_bias_pairs == ["0", "3"]
    if cpu_caps().native_bf16:
        assert ("PTD003", "fp32-on-bf16-cpu") in found
    assert set(diag.split_s) == {"data wait", "host->device", "forward", "backward", "optimizer"}
    assert diag.memory["params_bytes"] > 0 and diag.memory["activations_bytes"] > 0
    assert {"read file", "decode", "resize", "collate"} <= set(diag.data_stages_s)
    doc = diag.data_doctor  # ptt.doctor_data ran on the PNG folder with make_loader's pipeline
    assert doc is not None and set(doc["stages_ms_per_batch"]) == {
        "read",
        "decode",
        "augment",
        "collate",
        "host_to_device",
    }
    assert doc["stages_ms_per_batch"]["decode"] > 0 and doc["loader_images_per_s"] > 0 and doc["verdict"]


def test_synthetic_data_has_no_data_doctor(models_file):
    w = build_workload(f"{models_file}:tiny", "synthetic", batch_size=8, input_size=16)
    diag = diagnose(w, budget_s=4)
    assert diag.data_doctor is None and any("data doctor not run" in n for n in diag.notes)


def test_staged_runner_cycles_its_batches_without_a_loader(models_file):
    w = build_workload(f"{models_file}:tiny", "synthetic", batch_size=4, input_size=16)
    staged = stage_batches(w, 2)
    r = Runner(w, (), batches=staged)
    try:
        assert r._loader is None
        got = [r.next_batch() for _ in range(5)]
        assert [g is staged[i % 2] for i, g in enumerate(got)] == [True] * 5
        again = stage_batches(w, 1)  # the user's pipeline, read in-process: the same first batch every time
        assert torch.equal(staged[0][0], again[0][0])
        r.step()
    finally:
        r.close()


class _StopAt(Progress):
    def phase(self, name, total):
        if name.startswith("measure"):
            raise KeyboardInterrupt


def test_ctrl_c_writes_what_was_measured(tmp_path, models_file):
    out = str(tmp_path / "out")
    res = tune_model(f"{models_file}:tiny", "synthetic", batch_size=8, input_size=16, time_budget_s=30, out=out,
                     progress=_StopAt())  # fmt: skip
    assert res.interrupted and res.diagnosis is not None
    rows = _rows(out)
    assert rows[0]["interrupted"] and any(r["kind"] == "tune-diagnosis" for r in rows)
    assert "Interrupted" in Path(os.path.join(out, "report.html")).read_text(encoding="utf-8")


def test_receipt_write_is_atomic(tmp_path, models_file, monkeypatch):
    out = str(tmp_path / "out")
    res = tune_model(f"{models_file}:tiny", "synthetic", batch_size=8, input_size=16, time_budget_s=30, out=out,
                     progress=_StopAt())  # fmt: skip
    before = {n: Path(os.path.join(out, n)).read_bytes() for n in os.listdir(out)}

    def boom(_p):
        raise RuntimeError("disk full")

    monkeypatch.setattr("pytorchtricks.report.html.render", boom)
    with pytest.raises(RuntimeError):
        receipt.write_receipt(res, out)
    assert {n: Path(os.path.join(out, n)).read_bytes() for n in os.listdir(out)} == before
    assert sorted(os.listdir(tmp_path)) == ["models.py", "out"]  # no temp folders left behind
    # a folder that holds more than a receipt (--out ., a log written beside it) keeps what is not the receipt's
    monkeypatch.undo()
    Path(out, "tune.log").write_text("the run's console\n", encoding="utf-8")
    os.remove(os.path.join(out, "apply.py"))
    receipt.write_receipt(res, out)
    assert sorted(os.listdir(out)) == sorted([*receipt.RECEIPT_FILES, "tune.log"])
    assert Path(out, "tune.log").read_text(encoding="utf-8") == "the run's console\n"
    assert Path(out, "apply.py").read_text(encoding="utf-8").startswith('"""Generated by `ptt tune`')
    assert sorted(os.listdir(tmp_path)) == ["models.py", "out"]


def test_cli_runs_tune(tmp_path, models_file):
    out = str(tmp_path / "cli-out")
    env = dict(os.environ, OMP_NUM_THREADS="1", OMP_WAIT_POLICY="PASSIVE")
    proc = subprocess.run(
        [sys.executable, "-m", "pytorchtricks.cli", "tune", "--model", f"{models_file}:tiny", "--data", "synthetic",
         "--batch-size", "8", "--input-size", "16", "--time-budget", "6", "--out", out],
        capture_output=True, text=True, timeout=120, env=env,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "ptt tune" in proc.stdout and "receipt:" in proc.stdout
    assert os.path.exists(os.path.join(out, "report.html"))


def test_findings_describe_the_workload_not_the_lint_probe(models_file):
    # lint runs on a 4-sample probe; the receipt must speak of the user's batch
    for batch, flagged in ((32, False), (12, True)):
        w = build_workload(f"{models_file}:tiny", "synthetic", batch_size=batch, input_size=16)
        diag = diagnose(w, budget_s=4)
        batch_findings = [f for f in diag.findings if f.id == "PTL003"]
        text = " ".join(f.message for f in diag.findings)
        assert "batch size 4 " not in text
        assert bool(batch_findings) is flagged
        if flagged:  # once, in lint's words, with the workload's batch
            assert len(batch_findings) == 1 and f"batch size {batch} " in batch_findings[0].message
        assert all(f"at batch {batch}" in line for line in diag.memory.get("top_modules", []))


def test_one_interleaved_run_holds_both_baselines():
    from pytorchtricks.tune.engine import _one_run
    from pytorchtricks.tune.measuring import STEP_BASELINE

    run = _one_run(["to_channels_last", "make_loader"], step_s=0.02, compute_s=0.01, budget_s=20)
    assert run is not None
    _, variants, whole, _ = run
    assert list(variants) == ["baseline", "to_channels_last", STEP_BASELINE, "make_loader"]
    assert whole == (STEP_BASELINE, "make_loader")  # read through the loader; the rest staged
    only_loader = _one_run(["make_loader"], step_s=0.02, compute_s=0.01, budget_s=20)
    assert only_loader is not None and list(only_loader[1]) == [STEP_BASELINE, "make_loader"]


def test_apply_keeps_the_users_loader_and_gives_no_bf16_advice_it_did_not_measure():
    payload = {
        "recommended": [],
        "workload": {"for": "train", "model": "m", "batch_size": 8, "input_size": 28, "input_shape": [1, 28, 28],
                     "num_workers": 2},
        "combined": None,
        "env": {"device_name": "cpu", "threads": 2, "torch": torch.__version__},
        "candidates": [{"name": "mixed_precision", "status": "skipped",
                        "reason": "this device has no native bf16: bf16 would be emulated and slower"}],
    }  # fmt: skip
    code = receipt.apply_snippet(payload)
    assert "num_workers=2" in code and "1x28x28" in code
    assert 'dtype="bf16"' not in code and "mixed_precision(device, enabled=False)" in code


def test_apply_check_rebuilds_the_workload_and_remeasures(tmp_path, models_file):
    """`python apply.py --check`: the receipt's rebuild record gives back the workload; both variants re-measured."""
    from pytorchtricks.core import PttError
    from pytorchtricks.tune.reproduce import check_receipt

    rebuild = {"model": f"{models_file}:planted", "data": "synthetic", "batch_size": 8, "input_shape": [3, 16, 16],
               "num_workers": 0, "for": "train", "device": "cpu"}  # fmt: skip
    receipt = {"workload": {"rebuild": rebuild}, "recommended": ["remove_conv_bias_before_bn"],
               "combined": {"ratio": 1.0}}  # fmt: skip
    path = tmp_path / "receipt.json"
    path.write_text(json.dumps(receipt), encoding="utf-8")
    r = check_receipt(str(path), steps=1, budget_s=4)
    assert r["recommended"] == ["remove_conv_bias_before_bn"] and r["baseline_images_per_s"] > 0
    assert r["ratio_q1"] <= r["ratio"] <= r["ratio_q3"] and r["receipt_ratio"] == 1.0
    path.write_text(json.dumps({"workload": {}, "recommended": []}), encoding="utf-8")
    with pytest.raises(PttError, match="rebuild"):
        check_receipt(str(path))
    # the default model (--model not given) is rebuilt; a script's own model object cannot be
    default = dict(rebuild, model=None, optimizer=["sgd", {"lr": 0.01}], model_object=False)
    path.write_text(json.dumps(dict(receipt, workload={"rebuild": default})), encoding="utf-8")
    assert check_receipt(str(path), steps=1, budget_s=4)["baseline_images_per_s"] > 0
    for record in ({"rebuild": dict(default, model_object=True)}, {"rebuild": default, "script": "train.py"}):
        del_flag = {
            k: v for k, v in record["rebuild"].items() if "script" not in record or k != "model_object"
        }
        path.write_text(json.dumps(dict(receipt, workload=dict(record, rebuild=del_flag))), encoding="utf-8")
        with pytest.raises(PttError, match="script's own model"):
            check_receipt(str(path))


@pytest.mark.parametrize("recommended", [["cache_in_ram"], ["pack"], ["pack[resize]"], ["autotune_loader"]])
def test_apply_py_of_a_data_trick_runs_on_the_users_folder(recommended, tmp_path, monkeypatch, jpegs):
    """The receipt's lines are the user's code: apply() over their JpegFolder builds the recommended data road
    and its loader gives batches of the input size (a line naming an undefined variable would fail here)."""
    import pytorchtricks as ptt
    from pytorchtricks.tricks.data import cache_in_ram

    folder = jpegs(
        str(tmp_path / "imgs"), classes=2, per_class=12, px=48
    )  # autotune_loader times 4 batches + 1
    monkeypatch.setattr(cache_in_ram, "DEFAULT_DIR", str(tmp_path / "arenas"))  # not /dev/shm
    monkeypatch.chdir(tmp_path)  # the pack lines write ./pack-out
    payload = {
        "recommended": recommended,
        "workload": {"for": "train", "model": "m", "batch_size": 4, "input_size": 16, "input_shape": [3, 16, 16],
                     "num_workers": 0},
        "combined": {"ratio": 2.0, "ratio_q1": 1.9, "ratio_q3": 2.1},
        "env": {"device_name": "cpu", "threads": 2, "torch": torch.__version__},
        "candidates": [],
    }  # fmt: skip
    code = receipt.apply_snippet(payload)
    ns: dict = {}
    exec(compile(code, "apply.py", "exec"), ns)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "the arena stays in ...": said to the user, not checked here
        _model, optimizer, loader, _mp = ns["apply"](torch.nn.Linear(2, 2), ptt.JpegFolder(folder), 4)
    x, y = next(iter(loader))
    assert x.dtype == torch.uint8 and tuple(x.shape) == (4, 3, 16, 16) and len(y) == 4
    assert optimizer is not None


def test_tune_takes_a_config_or_its_fields_as_keywords():
    from pytorchtricks.core import PttError
    from pytorchtricks.tune.config import TuneConfig

    cfg = TuneConfig("torchvision:resnet18", "synthetic", batch_size=8, device_step_ms=60.0)
    assert cfg.num_workers == 2 and cfg.out == "tune-out"  # the CLI's defaults
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.batch_size = 16  # type: ignore[misc]
    with pytest.raises(PttError, match="not both"):
        tune_model(cfg, "photos/")
    with pytest.raises(PttError, match="TuneConfig's fields"):
        tune_model("torchvision:resnet18", "synthetic", batch=8)
