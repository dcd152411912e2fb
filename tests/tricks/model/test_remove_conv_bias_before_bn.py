"""remove_conv_bias_before_bn_: exact in eval and train (bias folded into running_mean), only sole-consumer pairs."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import pytorchtricks as ptt
from pytorchtricks.fixtures import randomize_bn_


def _biased_net() -> nn.Module:
    torch.manual_seed(0)
    m = nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1),
        nn.BatchNorm2d(8),
        nn.ReLU(),
        nn.Conv2d(8, 6, 3, stride=2),
        nn.BatchNorm2d(6, momentum=None),  # cumulative average: uses num_batches_tracked
        nn.ReLU(),
    )
    with torch.no_grad():
        for c in (m[0], m[3]):
            c.bias.normal_(0, 2.0)  # big biases: a wrong fold shows
    return randomize_bn_(m)


class _Residual(nn.Module):
    """Not a Sequential: conv1 -> bn1 found by fx; conv2's output is also returned (must keep its bias)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(4, 4, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(4)
        self.conv2 = nn.Conv2d(4, 4, 1)
        self.bn2 = nn.BatchNorm2d(4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv2(torch.relu(self.bn1(self.conv1(x))))
        return self.bn2(y) + y


@pytest.mark.parametrize("channels_last", [False, True])
def test_exact_in_train_and_eval(channels_last: bool) -> None:
    ref = _biased_net()
    treated = ptt.remove_conv_bias_before_bn_(copy.deepcopy(ref))
    assert treated[0].bias is None and treated[3].bias is None
    assert "0.bias" not in treated.state_dict()
    x = torch.randn(5, 3, 11, 13)
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    for _ in range(3):  # train steps update running stats in both
        torch.testing.assert_close(treated.train()(x), ref.train()(x), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(treated.eval()(x), ref.eval()(x), rtol=1e-5, atol=1e-5)
    assert int(treated[4].num_batches_tracked) == int(ref[4].num_batches_tracked) == 3


def test_eval_first_is_exact() -> None:
    ref = _biased_net().eval()
    treated = ptt.remove_conv_bias_before_bn_(copy.deepcopy(ref))
    x = torch.randn(2, 3, 9, 9)
    torch.testing.assert_close(treated(x), ref(x), rtol=1e-5, atol=1e-5)


def test_non_sequential_model_keeps_shared_output_bias() -> None:
    torch.manual_seed(1)
    ref = randomize_bn_(_Residual())
    treated = ptt.remove_conv_bias_before_bn_(copy.deepcopy(ref))
    assert treated.conv1.bias is None
    assert treated.conv2.bias is not None  # its output also feeds the residual add
    x = torch.randn(3, 4, 8, 8)
    torch.testing.assert_close(treated.train()(x), ref.train()(x), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(treated.eval()(x), ref.eval()(x), rtol=1e-5, atol=1e-5)


def test_reused_conv_is_left_alone() -> None:
    conv = nn.Conv2d(3, 3, 1)
    m = nn.Sequential(conv, nn.BatchNorm2d(3), conv)
    with pytest.warns(ptt.NoEffectWarning):
        ptt.remove_conv_bias_before_bn_(m)
    assert conv.bias is not None


def test_no_effect_warning() -> None:
    with pytest.warns(ptt.NoEffectWarning):
        ptt.remove_conv_bias_before_bn_(nn.Sequential(nn.Conv2d(3, 3, 1, bias=False), nn.BatchNorm2d(3)))
