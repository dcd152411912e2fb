"""`ptt doctor run -- python train.py`: the unmodified script, timed per step, its objects captured."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from pytorchtricks.analysis.script_run import STAGES, run_script
from pytorchtricks.cli import main
from pytorchtricks.core import PttError

SCRIPTS = Path(__file__).parent / "scripts"


@pytest.fixture
def photos(tmp_path):
    from PIL import Image

    rng = np.random.default_rng(0)
    for k in range(2):
        (tmp_path / "photos" / f"c{k}").mkdir(parents=True)
        for j in range(12):
            img = rng.integers(0, 255, (96, 128, 3), dtype=np.uint8)
            Image.fromarray(img).save(tmp_path / "photos" / f"c{k}" / f"{j}.jpg")
    return str(tmp_path / "photos")


def test_run_splits_the_steps_and_captures_the_scripts_objects(photos, monkeypatch, tmp_path):
    import torch

    monkeypatch.chdir(tmp_path)
    script = str(SCRIPTS / "train_planted.py")
    before = (
        torch.backends.cudnn.benchmark,
        torch.backends.cudnn.deterministic,
        torch.random.get_rng_state(),
    )
    r = run_script(["python", script, photos, "-j", "0", "--steps", "50"], steps=3, warmup=1)
    # the script set cudnn.benchmark/deterministic and seeded torch: the process gets its own state back
    after = (torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic, torch.random.get_rng_state())
    assert before[:2] == after[:2] and torch.equal(before[2], after[2])
    assert r.ended.startswith("stopped after 4 optimizer steps") and len(r.steps) == 3
    for st in r.steps:  # the stages partition the step (other = what no hook saw)
        assert set(st) == {*STAGES, "step"} and all(v >= 0 for v in st.values())
        assert sum(st[s] for s in STAGES) == pytest.approx(st["step"], rel=0.05)
    train = r.loaders[0]
    assert train["dataset"] == "ImageFolder" and train["samples"] == 24 and train["batch_size"] == 8
    assert train["num_workers"] == 0 and train["pin_memory"] is True
    assert r.model["class"] == "ResNet" and r.model["params"] > 1e6
    assert r.optimizer == {
        "class": "SGD",
        "lr": 0.1,
        "momentum": 0.9,
        "weight_decay": 1e-4,
        "nesterov": False,
    }
    where = dict(r.syncs)
    assert where.get("train_planted.py:76 .item()") == 1.0 and where.get("train_planted.py:77 .item()") == 1.0
    assert (
        r.verdict in ("input-bound", "compute-bound", "optimizer-bound")
        and "data wait" in r.evidence
        and r.fix
    )


def _losses(cmd: list[str], cwd: str) -> tuple[list[str], str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env, cwd=cwd)
    assert p.returncode == 0, p.stderr[-2000:]
    return re.findall(r"step \d+ loss [0-9.]+", p.stdout), p.stdout


@pytest.mark.slow
def test_the_doctor_changes_nothing_but_time(photos, tmp_path):
    """The script under the doctor prints the same losses as without it (same seed), and ends on its own."""
    script = str(SCRIPTS / "train_planted.py")
    args = [script, photos, "-j", "0", "--steps", "3"]
    plain, _ = _losses([sys.executable, *args], str(tmp_path))
    ptt = [sys.executable, "-m", "pytorchtricks.cli", "doctor", "run", "--steps", "5", "--warmup", "0", "--out",
           str(tmp_path / "out"), "--", "python", *args]  # fmt: skip
    doctored, out = _losses(ptt, str(tmp_path))
    assert len(plain) == 3 and doctored == plain
    assert "the script ended after 3 optimizer step(s)" in out and "verdict:" in out
    rows = [json.loads(x) for x in Path(tmp_path / "out" / "results.jsonl").read_text().splitlines()]
    assert [r["kind"] for r in rows] == ["doctor-run", *["doctor-step"] * 3, "doctor-summary"]
    assert rows[-1]["loaders"][0]["num_workers"] == 0 and rows[0]["env"]["torch"]


def test_bad_commands_are_refused_with_the_fix(tmp_path, capsys):
    with pytest.raises(PttError, match="no such script"):
        run_script(["python", str(tmp_path / "missing.py")])
    with pytest.raises(PttError, match="give the command"):
        run_script(["python"])
    failing = tmp_path / "fails.py"
    failing.write_text("import sys\nsys.exit(3)\n", encoding="utf-8")
    assert main(["doctor", "run", "--", "python", str(failing)]) != 0
    assert "exited with status 3" in capsys.readouterr().err


@pytest.mark.slow
def test_doctor_run_tune_uses_the_scripts_own_objects(photos, tmp_path, monkeypatch):
    """--tune hands tune the script's model, its optimizer with its hyper-parameters (weight decay kept) and its
    ImageFolder's root; the receipt's apply.py builds that optimizer."""
    monkeypatch.chdir(tmp_path)
    out = str(tmp_path / "tune")
    script = str(SCRIPTS / "train_planted.py")
    rc = main(["doctor", "run", "--steps", "2", "--warmup", "1", "--tune", "--time-budget", "25", "--tune-out", out,
               "--out", str(tmp_path / "doc"), "--", "python", script, photos, "-j", "0", "--steps", "20"])  # fmt: skip
    assert rc == 0
    receipt = json.loads(Path(out, "receipt.json").read_text())
    wl = receipt["workload"]
    assert wl["model"] == "captured ResNet" and wl["batch_size"] == 8 and wl["input_shape"] == [3, 32, 32]
    assert wl["optimizer"] == [
        "sgd",
        {"lr": 0.1, "momentum": 0.9, "weight_decay": 1e-4, "dampening": 0, "nesterov": False},
    ]
    code = Path(out, "apply.py").read_text()
    assert (
        "torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, dampening=0, weight_decay=0.0001" in code
    )


def test_compare_says_what_changed_between_two_runs(tmp_path):
    from pytorchtricks.analysis.script_run import RunReport, compare_runs, write_run

    loader = {"dataset": "ImageFolder", "batch_size": 8, "num_workers": 0, "pin_memory": True}
    slow = RunReport(["python", "t.py"], steps=[{"data wait": 0.6, "forward": 0.1, "backward": 0.2, "optimizer": 0.05,
                                                "other": 0.05, "step": 1.0}], loaders=[loader], verdict="input-bound")  # fmt: skip
    before = write_run(slow, str(tmp_path / "a"))
    fast = RunReport(["python", "t.py"], steps=[{"data wait": 0.01, "forward": 0.1, "backward": 0.2, "optimizer": 0.05,
                                                "other": 0.04, "step": 0.4}], loaders=[{**loader, "num_workers": 2}],
                     verdict="compute-bound")  # fmt: skip
    lines = compare_runs(before, fast)
    assert lines[0] == "step 1000 -> 400 ms (2.50x the speed)"
    assert "data wait: 60% -> 2% of the step (600 -> 10 ms)" in lines
    assert "loader num_workers: 0 -> 2" in lines and "verdict: input-bound -> compute-bound" in lines
    assert compare_runs(before, slow) == [
        "step 1000 -> 1000 ms (1.00x the speed)",
    ]
    with pytest.raises(PttError, match="no such file"):
        compare_runs(str(tmp_path / "none.jsonl"), fast)
