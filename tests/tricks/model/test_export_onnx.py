"""export_onnx: ONNX Runtime equals PyTorch; dynamic batch; ORT static int8 keeps SQNR; misuse errors."""

from __future__ import annotations

import os
import sys

import pytest
import torch
from torch import nn

import pytorchtricks as ptt
from pytorchtricks.core import MissingExtraError, PttError
from pytorchtricks.fixtures import randomize_bn_, small_cnn
from pytorchtricks.safety import reference_outputs, sqnr_db

pytest.importorskip("onnxruntime")
pytest.importorskip("onnxscript")


def test_export_matches_pytorch_and_dynamic_batch(tmp_path) -> None:
    torch.manual_seed(0)
    model = randomize_bn_(small_cnn(in_channels=3, width=8)).eval()
    x = torch.randn(2, 3, 16, 16)
    path = str(tmp_path / "m.onnx")
    report = ptt.export_onnx(model, x, path, dynamic_batch=True)
    assert report.ok and report.max_abs_diff < 1e-4 and os.path.getsize(path) > 0
    x5 = torch.randn(5, 3, 16, 16)
    torch.testing.assert_close(ptt.OnnxRunner(path)(x5), model(x5).detach(), atol=1e-4, rtol=1e-4)


def test_ort_static_int8_keeps_sqnr(tmp_path) -> None:
    from pytorchtricks.tricks.model.export_onnx import quantize_onnx_static

    torch.manual_seed(0)
    model = randomize_bn_(small_cnn(in_channels=3, width=8)).eval()
    x = torch.randn(8, 3, 16, 16)
    fp32, int8 = str(tmp_path / "m.onnx"), str(tmp_path / "m8.onnx")
    ptt.export_onnx(model, x, fp32)
    quantize_onnx_static(fp32, int8, [torch.randn(8, 3, 16, 16) for _ in range(4)])
    out = ptt.OnnxRunner(int8)(x)
    assert sqnr_db(reference_outputs(model, x)[0], out) > 15


def test_misuse(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(PttError, match="eval"):
        ptt.export_onnx(nn.Linear(2, 2).train(), torch.randn(1, 2), str(tmp_path / "a.onnx"))
    monkeypatch.setitem(sys.modules, "onnxscript", None)
    with pytest.raises(MissingExtraError, match=r"pytorchtricks\[infer\]"):
        ptt.export_onnx(nn.Linear(2, 2).eval(), torch.randn(1, 2), str(tmp_path / "b.onnx"))


def test_onnx_runtime_failure_is_a_ptt_error(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    from pytorchtricks.tricks.model import export_onnx as mod

    def refuse(*_a, **_k):
        raise RuntimeError("[ONNXRuntimeError] : 10 : INVALID_GRAPH")

    monkeypatch.setattr(mod, "OnnxRunner", refuse)
    with pytest.raises(PttError, match=r"ONNX Runtime cannot run.*INVALID_GRAPH"):
        ptt.export_onnx(nn.Linear(2, 2).eval(), torch.randn(1, 2), str(tmp_path / "c.onnx"))
