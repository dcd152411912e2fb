"""`ptt optimize`: the pipeline runs every step safety-checked, prints the table, saves state dict + recipe."""

from __future__ import annotations

import json
import os

import pytest
import torch
from torch import nn

import pytorchtricks as ptt
from pytorchtricks.cli import main
from pytorchtricks.fixtures import randomize_bn_
from pytorchtricks.infer.pipeline import optimize


class Net(nn.Module):
    """Shared ReLU, a RepVGG block and a Conv->BN pair: every fp32 step has something to do."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8))
        self.relu = nn.ReLU()
        self.block = ptt.RepVGGBlock(8, 8)
        self.conv, self.bn = nn.Conv2d(8, 8, 3, padding=1), nn.BatchNorm2d(8)
        self.head = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.block(self.relu(self.stem(x)))
        return self.head(self.relu(self.bn(self.conv(x))).mean((2, 3)))


def build() -> nn.Module:
    torch.manual_seed(0)
    return randomize_bn_(Net())


def test_pipeline_steps_exact_without_compile() -> None:
    model = build().eval()
    x = torch.randn(2, 3, 12, 12)
    ref = model(x).detach()
    res = optimize(model, x, compile=False)
    assert [s.status for s in res.steps[1:]] == ["applied", "applied", "applied"]
    assert all(s.max_abs_diff < 1e-5 for s in res.steps)
    torch.testing.assert_close(res.model(x), ref, atol=1e-5, rtol=1e-5)
    assert not any(isinstance(m, nn.BatchNorm2d) for m in res.fp32_model.modules())


def test_cli_optimize_writes_state_dict_and_recipe(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    src = tmp_path / "net.py"
    here = os.path.dirname(__file__)
    src.write_text(f"import sys\nsys.path.insert(0, {here!r})\nfrom test_optimize import build\n")
    out = tmp_path / "m.pt"
    rc = main(
        [
            "optimize",
            f"{src}:build",
            "--input-shape",
            "2,3,12,12",
            "--no-compile",
            "--rounds",
            "1",
            "--out",
            str(out),
        ]
    )
    assert rc == 0
    text = capsys.readouterr().out
    assert "fuse_conv_bn" in text and "reparameterize" in text
    recipe = json.loads((tmp_path / "m.pt.json").read_text())
    assert recipe["model"].endswith(":build") and recipe["steps"][2]["name"] == "fuse_conv_bn"
    state = torch.load(out, weights_only=True)
    assert any(k.startswith("block.reparam") for k in state)


def test_cli_bad_input_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["optimize", "torch.nn:Identity", "--input-shape", "1,x"]) == 2
    assert main(["optimize", "torch.nn:Identity", "--export", "onnx"]) == 2
    assert "--out" in capsys.readouterr().err


@pytest.mark.slow
def test_cli_optimize_int8_saves_a_loadable_aot_package(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("torchao")
    src = tmp_path / "net.py"
    here = os.path.dirname(__file__)
    src.write_text(f"import sys\nsys.path.insert(0, {here!r})\nfrom test_optimize import build\n")
    out = tmp_path / "m.pt"
    args = [
        "optimize",
        f"{src}:build",
        "--input-shape",
        "2,3,12,12",
        "--int8",
        "--rounds",
        "1",
        "--out",
        str(out),
    ]
    assert main(args) == 0
    from pytorchtricks.tricks.model._onednn_plan import onednn_available

    # the head averages the float ReLU output (no int8 form in the graph): no oneDNN plan, and the CLI says why;
    # the int8 graph runs as the AOTInductor package
    out = capsys.readouterr().out
    assert "quantize int8 + AOTInductor" in out
    if onednn_available():
        assert "note: no oneDNN plan for the int8 graph: mean" in out and "no int8 form" in out
    recipe = json.loads((tmp_path / "m.pt.json").read_text())
    assert "compile='aot'" in recipe["rebuild"][-1]
    assert recipe["package"]["file"] == "m.pt.pt2" and recipe["package"]["input_shapes"] == [[2, 3, 12, 12]]
    package = torch._inductor.aoti_load_package(str(tmp_path / "m.pt.pt2"))  # no model code needed
    x = torch.randn(2, 3, 12, 12)
    with torch.no_grad():
        ref = build().eval()(x)
        got = package(x)
    got = got[0] if isinstance(got, list | tuple) else got
    assert got.shape == ref.shape and torch.isfinite(got).all()
    noise = (got - ref).pow(2).sum() / ref.pow(2).sum()
    assert (
        noise < 0.1
    )  # int8 of a random net: > 10 dB SQNR (the pipeline checks its own floor on the example)
