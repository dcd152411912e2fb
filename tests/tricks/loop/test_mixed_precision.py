"""mixed_precision: bf16 autocast on CPU, fp16 loss scaling with skip-on-overflow reported, misuse errors."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import pytorchtricks as ptt

# CPU-sensitive (kernels differ by ISA): make test runs these again with the kernels limited to AVX2
pytestmark = pytest.mark.isa


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))


def test_bf16_autocast_runs_matmuls_in_bf16_and_tracks_fp32() -> None:
    ref, m = _model(), _model()
    mp = ptt.mixed_precision("cpu", "bf16")
    assert not mp.uses_scaler
    x, y = torch.randn(64, 16), torch.randn(64, 4)
    with mp.autocast():
        out = m(x)
    assert out.dtype == torch.bfloat16
    loss = (out.float() - y).square().mean()
    mp.backward(loss)
    ref_loss = (ref(x) - y).square().mean()
    ref_loss.backward()
    # named error bound: bf16 keeps 8 mantissa bits -> ~1e-2 relative error on loss and gradients
    assert abs(loss.item() - ref_loss.item()) / ref_loss.item() < 2e-2
    g, rg = m[0].weight.grad, ref[0].weight.grad
    assert ((g - rg).norm() / rg.norm()).item() < 5e-2
    assert g.dtype == torch.float32


def test_fp16_overflow_step_is_skipped_and_reported() -> None:
    m = _model()
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    mp = ptt.mixed_precision("cpu", "fp16")
    assert mp.uses_scaler
    before = copy.deepcopy(m.state_dict())
    with mp.autocast():
        loss = m(torch.randn(8, 16)).float().mean() * 1e38  # scaled by 65536: inf gradients
    mp.backward(loss)
    assert mp.step(opt) is False
    assert mp.last_step_skipped and mp.skipped_steps == 1
    for k, v in m.state_dict().items():
        torch.testing.assert_close(v, before[k], rtol=0, atol=0)
    opt.zero_grad()
    with mp.autocast():
        loss = m(torch.randn(8, 16)).float().square().mean()
    mp.backward(loss)
    assert mp.step(opt) is True and mp.skipped_steps == 1
    assert not torch.equal(m[0].weight, before["0.weight"])


def test_fp16_unscale_before_clipping_gives_true_gradients() -> None:
    ref, m = _model(), _model()
    mp = ptt.mixed_precision("cpu", "fp16")
    x = torch.randn(8, 16)
    mp.backward(m(x).square().mean())  # no autocast: only the scaling is tested
    ref(x).square().mean().backward()
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    mp.unscale_(opt)
    torch.testing.assert_close(m[0].weight.grad, ref[0].weight.grad, rtol=1e-5, atol=1e-6)


def test_disabled_is_plain_fp32() -> None:
    mp = ptt.mixed_precision("cpu", enabled=False)
    with mp.autocast():
        assert _model()(torch.randn(2, 16)).dtype == torch.float32


def test_misuse() -> None:
    with pytest.raises(ptt.PttError, match="bf16"):
        ptt.mixed_precision("cpu", "int8")
    mp = ptt.mixed_precision("cpu")
    with pytest.raises(ptt.PttError, match="scalar"):
        mp.backward(torch.ones(3, requires_grad=True))
