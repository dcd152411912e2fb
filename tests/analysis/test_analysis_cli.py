"""`ptt lint` and `ptt profile` end to end on a small model given as path.py:factory."""

from __future__ import annotations

import os

import pytest
import torch

from pytorchtricks.cli import main

MODEL = """
import torch.nn as nn


def net():
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
        nn.Conv2d(16, 64, 3, padding=1, bias=False), nn.BatchNorm2d(64), nn.ReLU(inplace=True),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, 16),
    )


def gray():
    return nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                         nn.Linear(8, 10))


def mnist():
    return nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 28 * 28, 10))
"""


pytestmark = pytest.mark.usefixtures("one_thread")  # the root conftest's fixture


@pytest.fixture
def spec(tmp_path: object) -> str:
    path = os.path.join(str(tmp_path), "zoo_model.py")
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(MODEL)
    return f"{path}:net"


def test_lint_prints_findings_and_fix(spec: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["lint", spec, "--input-shape", "8,3,16,16"]) == 0
    out = capsys.readouterr().out
    assert (
        "PTL001 conv-bias-before-bn" in out
        and "PTL012 inplace-activation" in out
        and "1 MAC = 2 FLOPs" in out
    )
    assert main(["lint", spec, "--input-shape", "8,3,16,16", "--fix"]) == 0
    out = capsys.readouterr().out
    assert "applied: PTL001 remove_conv_bias_before_bn_" in out and "2 before, 0 after" in out
    assert main(["lint", spec, "--input-shape", "8,3,16,16", "--rules", "ptl001", "--details"]) == 0
    out = capsys.readouterr().out
    assert out.count("PTL0") == 1 and "at 0:" in out


def test_lint_bad_input_exits_2(spec: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["lint", spec, "--input-shape", "8,a"]) == 2
    assert main(["lint", spec, "--input-shape", "8,5,16,16"]) == 2  # wrong channel count: the forward fails
    assert "failed" in capsys.readouterr().err
    assert main(["lint", spec, "--input-shape", "8,3,16,16", "--rules", "PTL999"]) == 2
    assert "unknown lint rule" in capsys.readouterr().err


def test_profile_prints_split_and_verdict(spec: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["profile", spec, "--input-shape", "8,3,16,16", "--steps", "2", "--profile-steps", "1"]) == 0
    out = capsys.readouterr().out
    assert "verdict:" in out and "backward" in out and "top ops" in out


def test_flops_and_memory_commands(spec: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["flops", spec, "--input-shape", "2,3,16,16", "--top", "3"]) == 0
    out = capsys.readouterr().out
    assert "1 MAC = 2 FLOPs" in out and "MFLOPs" in out
    assert main(["memory", spec, "--input-shape", "8,3,16,16", "--optimizer", "sgd"]) == 0
    out = capsys.readouterr().out
    assert "activations (saved for backward)" in out and "measured peak" in out and "BatchNorm2d" in out


def test_lint_measure_fills_measured(capsys: pytest.CaptureFixture[str]) -> None:
    from torch import nn

    from pytorchtricks.analysis.design_rules import measure_findings
    from pytorchtricks.analysis.lint import lint

    model = nn.Sequential(nn.Conv2d(8, 64, 3, padding=1, bias=False), nn.Conv2d(64, 512, 1, bias=False))
    x = torch.randn(8, 8, 16, 16)
    report = lint(model, x, rules=["PTL004"])
    measure_findings(model, x, report.findings, rounds=1, min_run_time_s=0.01)
    assert report.findings and "the time of an equal-FLOPs 181->181 conv" in report.findings[0].measured


def test_default_shape_takes_the_models_channels(spec: str, capsys: pytest.CaptureFixture[str]) -> None:
    gray = spec.replace(":net", ":gray")
    assert main(["lint", gray, "--rules", "PTL002"]) == 0
    out = capsys.readouterr().out
    assert (
        "input 1x1x224x224" in out and "PTL002" not in out
    )  # 1 channel, and the 10-class head is no finding
    assert main(["profile", gray, "--input-shape", "2,1,16,16", "--steps", "1", "--profile-steps", "0"]) == 0


def test_profile_on_a_shape_the_model_does_not_take_says_which_to_pass(
    spec: str, capsys: pytest.CaptureFixture[str]
) -> None:
    rc = main(["profile", spec.replace(":net", ":mnist"), "--steps", "1", "--profile-steps", "0"])
    err = capsys.readouterr().err
    assert rc == 2 and err.startswith("error: ") and "--input-shape N,C,H,W" in err and "Traceback" not in err
