"""to_inplace_abn_: gradients equal BN + LeakyReLU within 1e-5 (train and eval, 1-D/2-D, channels_last), running
statistics equal, saved bytes measured lower, ReLU refused, NoEffectWarning."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import pytorchtricks as ptt
from pytorchtricks.clock import SavedTensorMeter
from pytorchtricks.fixtures import randomize_bn_

# CPU-sensitive (kernels differ by ISA): make test runs these again with the kernels limited to AVX2
pytestmark = pytest.mark.isa


def _net(slope: float = 0.01, momentum: float | None = 0.1, affine: bool = True) -> nn.Module:
    torch.manual_seed(0)
    m = nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1, bias=False),
        nn.BatchNorm2d(8, momentum=momentum, affine=affine),
        nn.LeakyReLU(slope),
        nn.Conv2d(8, 8, 3, padding=1, bias=False),
        nn.BatchNorm2d(8),  # feeds a conv directly: identity ABN
        nn.Conv2d(8, 4, 1),
    )
    return randomize_bn_(m)


def _close(b: torch.Tensor, a: torch.Tensor, tol: float = 1e-5) -> None:
    """Equal within ``tol`` relative to the tensor's scale (weight gradients here reach ~1e2: fp32 sums round)."""
    torch.testing.assert_close(b, a, rtol=0, atol=tol * max(1.0, a.abs().max().item()))


def _grads(m: nn.Module, x: torch.Tensor) -> list[torch.Tensor]:
    x = x.clone().requires_grad_(True)
    out = m(x)
    (out * torch.linspace(-1, 2, out.numel()).view_as(out)).sum().backward()  # non-uniform upstream gradient
    return [x.grad] + [p.grad.clone() for p in m.parameters()]


@pytest.mark.parametrize("slope,momentum,affine", [(0.01, 0.1, True), (0.2, None, True), (0.01, 0.1, False)])
@pytest.mark.parametrize("channels_last", [False, True])
def test_gradients_and_stats_equal_bn_leakyrelu(slope, momentum, affine, channels_last) -> None:
    ref = _net(slope, momentum, affine)
    m = ptt.to_inplace_abn_(copy.deepcopy(ref))
    assert type(m[1]).__name__ == "InPlaceABN" and isinstance(m[2], nn.Identity)
    assert type(m[4]).__name__ == "InPlaceABN" and m[4].activation_slope == 1.0
    assert list(m.state_dict()) == list(ref.state_dict())
    x = torch.randn(4, 3, 7, 9) * 2 + 0.3
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
        ref, m = ref.to(memory_format=torch.channels_last), m.to(memory_format=torch.channels_last)
    for _ in range(2):
        for a, b in zip(_grads(ref, x), _grads(m, x)):
            _close(b, a)
        ref.zero_grad()
        m.zero_grad()
    for (k, a), b in zip(ref.state_dict().items(), m.state_dict().values()):
        torch.testing.assert_close(b, a, rtol=1e-6, atol=1e-6, msg=k)
    ref.eval()
    m.eval()
    for a, b in zip(_grads(ref, x), _grads(m, x)):
        _close(b, a)


def test_float64_is_exact_up_to_rounding() -> None:
    """In float64 the inversion matches BN + LeakyReLU to ~1e-12: the fp32 differences above are rounding only."""
    ref = _net().double()
    m = ptt.to_inplace_abn_(copy.deepcopy(ref))
    x = torch.randn(4, 3, 7, 9, dtype=torch.float64) * 2 + 0.3
    for a, b in zip(_grads(ref, x), _grads(m, x)):
        _close(b, a, tol=1e-12)


def test_batchnorm1d_mlp() -> None:
    torch.manual_seed(0)
    ref = randomize_bn_(nn.Sequential(nn.Linear(6, 5), nn.BatchNorm1d(5), nn.LeakyReLU(0.1), nn.Linear(5, 2)))
    m = ptt.to_inplace_abn_(copy.deepcopy(ref))
    x = torch.randn(9, 6)
    for a, b in zip(_grads(ref, x), _grads(m, x)):
        _close(b, a)


def test_saves_fewer_bytes() -> None:
    ref = _net()
    m = ptt.to_inplace_abn_(copy.deepcopy(ref))
    x = torch.randn(8, 3, 16, 16)
    sizes = []
    for model in (ref, m):
        with SavedTensorMeter() as meter:
            model(x)
        sizes.append(meter.saved_bytes)
    act = 8 * 8 * 16 * 16 * 4  # one activation-sized fp32 tensor
    assert sizes[0] - sizes[1] >= 2 * act, (
        sizes
    )  # BN input + BN output (LeakyReLU input) + 2nd BN input no longer kept


def test_relu_is_refused_or_kept() -> None:
    m = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Conv2d(4, 4, 1))
    with pytest.raises(ptt.PttError, match="not invertible"):
        ptt.to_inplace_abn_(m)
    with pytest.warns(ptt.NoEffectWarning):
        ptt.to_inplace_abn_(m, on_relu="keep")
    assert type(m[1]) is nn.BatchNorm2d


def test_no_effect_and_bad_option() -> None:
    with pytest.warns(ptt.NoEffectWarning):
        ptt.to_inplace_abn_(nn.Sequential(nn.Linear(2, 2)))
    with pytest.raises(ptt.PttError, match="on_relu"):
        ptt.to_inplace_abn_(nn.Linear(2, 2), on_relu="drop")
