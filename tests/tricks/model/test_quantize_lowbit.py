"""quantize_lowbit_: quantizer math, straight-through gradients, layer swap, exact BN folding for binary nets, real-data QAT."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import pytorchtricks as ptt
from pytorchtricks.core import NoEffectWarning, PttError
from pytorchtricks.fixtures import randomize_bn_
from pytorchtricks.tricks.model.quantize_lowbit import act_quant, quantize_k, weight_quant


def test_dorefa_levels_and_ste() -> None:
    w = torch.randn(8, 4, 3, 3, requires_grad=True)
    q = weight_quant(w, 2, "dorefa")
    assert len(torch.unique(q.detach())) <= 4 and q.detach().abs().max() <= 1.0 + 1e-6
    q.sum().backward()
    assert w.grad is not None and w.grad.abs().sum() > 0  # straight-through: gradients flow
    x = torch.linspace(-1, 2, 101)
    qa = act_quant(x, 3)
    assert qa.min() == 0 and qa.max() == 1 and len(torch.unique(qa)) == 8
    torch.testing.assert_close(quantize_k(torch.tensor([0.49, 0.51]), 1), torch.tensor([0.0, 1.0]))


def test_twn_is_ternary_per_channel_and_xnor_binary() -> None:
    torch.manual_seed(0)
    w = torch.randn(6, 5)
    t = weight_quant(w, 2, "twn")
    for row, orig in zip(t, w):
        vals = torch.unique(row.abs())
        assert (len(vals) <= 2 and 0.0 in vals.tolist()) or len(vals) == 1
        delta = 0.7 * orig.abs().mean()
        torch.testing.assert_close(row.abs().max(), orig.abs()[orig.abs() > delta].mean())
    b = weight_quant(w, 1, "xnor")
    torch.testing.assert_close(b.abs(), w.abs().mean(1, keepdim=True).expand_as(w))


def test_bnn_activation_gradient_zero_outside_unit_interval() -> None:
    x = torch.tensor([-2.0, -0.5, 0.5, 2.0], requires_grad=True)
    act_quant(x, 1).sum().backward()
    torch.testing.assert_close(x.grad, torch.tensor([0.0, 1.0, 1.0, 0.0]))


def _net() -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(1, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
        nn.Conv2d(8, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8), nn.ReLU(),
        nn.Conv2d(8, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 3),
    )  # fmt: skip


def test_swap_keeps_state_dict_and_skips_first_last() -> None:
    net = _net()
    keys = list(net.state_dict())
    ptt.quantize_lowbit_(net, 4, 4)
    assert list(net.state_dict()) == keys
    kinds = [type(m).__name__ for m in net.modules() if isinstance(m, nn.Conv2d | nn.Linear)]
    assert kinds == ["Conv2d", "LowBitConv2d", "LowBitConv2d", "Linear"]


def test_fold_bn_binary_exact_and_weights_pm1() -> None:
    torch.manual_seed(0)
    net = randomize_bn_(ptt.quantize_lowbit_(_net(), 1, 32, method="xnor")).eval()
    x = torch.randn(2, 1, 7, 7)
    with torch.no_grad():
        ref = net(x)
    ptt.fold_bn_binary_(net)
    with torch.no_grad():
        torch.testing.assert_close(net(x), ref, atol=1e-5, rtol=1e-5)
    assert isinstance(net[4], nn.Identity) and isinstance(net[1], nn.BatchNorm2d)  # first layer stays fp32
    assert set(net[3].weight.unique().tolist()) == {-1.0, 1.0}


def test_misuse() -> None:
    with pytest.raises(PttError, match="method"):
        ptt.quantize_lowbit_(_net(), 4, 4, method="pact")
    with pytest.raises(PttError, match="bits"):
        ptt.quantize_lowbit_(_net(), 0, 4)
    with pytest.raises(PttError, match="eval"):
        ptt.fold_bn_binary_(_net())
    with pytest.warns(NoEffectWarning):
        ptt.quantize_lowbit_(nn.Sequential(nn.Linear(2, 2)), 4, 4)


@pytest.mark.slow
def test_dorefa_w4a4_qat_fashion_mnist_within_2_points(fmnist) -> None:
    from pytorchtricks.fashion_mnist import evaluate, train

    student = ptt.quantize_lowbit_(copy.deepcopy(fmnist.model), 4, 4)
    train(student, fmnist.train_x, fmnist.train_y, epochs=1.0, lr=0.05, batch_size=256)
    acc = evaluate(student, fmnist.test_x, fmnist.test_y)
    assert fmnist.fp32_acc - acc <= 2.0, (fmnist.fp32_acc, acc)


def test_a_reused_layer_is_converted_once() -> None:
    conv = nn.Conv2d(4, 4, 3, padding=1)
    net = nn.Sequential(nn.Conv2d(3, 4, 1), conv, nn.ReLU(), conv, nn.Conv2d(4, 2, 1))
    ptt.quantize_lowbit_(net, 4, 4)
    assert type(net[1]).__name__ == "LowBitConv2d" and net[1] is net[3]  # one module, one conversion
    assert net(torch.randn(1, 3, 8, 8)).shape == (1, 2, 8, 8)
