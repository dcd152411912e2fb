"""Every model transform on torchvision classification models: it works (exact ones match eager) or raises PttError.

Random init, BN statistics randomized (folding bugs show), 2 x 3 x 64 x 64 inputs. The list covers reused module
instances (ResNet's shared ReLU), depthwise and grouped convs, channel shuffle, squeeze-excite with hardswish,
concatenating branches (Inception, Fire) and inverted residuals; ~65 s on 2 idle cores.
"""

from __future__ import annotations

import copy
import os
import warnings
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn

import pytorchtricks as ptt
from pytorchtricks.core import PttError
from pytorchtricks.fixtures import randomize_bn_

torchvision = pytest.importorskip("torchvision")
pytest.importorskip("torchao")
pytest.importorskip("onnxscript")

MODELS = ["resnet18", "mobilenet_v3_small", "shufflenet_v2_x0_5", "squeezenet1_0", "googlenet"]
KWARGS: dict[str, dict[str, Any]] = {"googlenet": {"aux_logits": False, "init_weights": True}}
EXACT = {"rtol": 1e-4, "atol": 1e-4}  # fp32: folding in float64 then casting moves outputs by ~1e-6


def _model(name: str) -> nn.Module:
    torch.manual_seed(0)
    model = getattr(torchvision.models, name)(weights=None, **KWARGS.get(name, {}))
    return randomize_bn_(model).eval()


def _works_or_ptt_error(step: str, fn: Callable[[], Any]) -> Any:
    """``fn()``'s result, or None when it raised PttError; any other exception fails the test, naming the step."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # NoEffectWarning (nothing to reparameterize), untied-weight notes
        try:
            return fn()
        except PttError:
            return None
        except Exception as exc:
            pytest.fail(f"{step} raised {type(exc).__name__} (not a PttError): {str(exc)[:400]}")


@pytest.mark.slow
@pytest.mark.parametrize("name", MODELS)
def test_model_transforms_work_or_raise_ptt_error(name: str, tmp_path) -> None:
    model = _model(name)
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        ref = model(x)

    def exact(step: str, transform: Callable[[nn.Module], Any]) -> None:
        treated = copy.deepcopy(model)
        if _works_or_ptt_error(step, lambda: transform(treated)) is not None:
            with torch.no_grad():
                torch.testing.assert_close(treated(x), ref, **EXACT, msg=lambda m: f"{name} {step}: {m}")

    exact("unshare_modules_", ptt.unshare_modules_)
    exact("fuse_conv_bn_", lambda m: ptt.fuse_conv_bn_(m, x))
    exact("reparameterize_", lambda m: ptt.reparameterize_(m, x))
    path = os.path.join(tmp_path, f"{name}.onnx")
    report = _works_or_ptt_error("export_onnx", lambda: ptt.export_onnx(copy.deepcopy(model), x, path))
    if report is not None:
        torch.testing.assert_close(ptt.OnnxRunner(path)(x), ref, **EXACT)

    # int8 is approximate: quantize bounds its SQNR itself (>= 20 dB on x, else SafetyError, a PttError)
    q = _works_or_ptt_error("quantize", lambda: ptt.quantize(model, x, ptt.QuantConfig(engine="eager")))
    if q is not None:
        assert q.safety_report.ok and q(x).shape == ref.shape
    with torch.no_grad():  # int8 works on a copy: the caller's model is untouched
        torch.testing.assert_close(model(x), ref, rtol=0, atol=0)

    for step, transform in (
        ("prune_channels_", lambda m: ptt.prune_channels_(m, 0.5)),
        ("quantize_lowbit_", lambda m: ptt.quantize_lowbit_(m, 4, 4)),
    ):
        treated = _works_or_ptt_error(step, lambda t=transform: t(copy.deepcopy(model)))
        if treated is not None:
            with torch.no_grad():
                assert treated(x).shape == ref.shape, step  # approximate: the output shape is what they keep
