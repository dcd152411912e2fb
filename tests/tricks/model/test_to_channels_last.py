"""to_channels_last_: weights become NHWC, outputs unchanged, grouped-conv warning, NoEffectWarning."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import pytorchtricks as ptt


def test_weights_nhwc_and_outputs_equal() -> None:
    torch.manual_seed(0)
    ref = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU(), nn.Conv2d(8, 4, 1)).eval()
    treated = ptt.to_channels_last_(copy.deepcopy(ref))
    assert treated[0].weight.is_contiguous(memory_format=torch.channels_last)
    assert not ref[0].weight.is_contiguous(memory_format=torch.channels_last)
    x = torch.randn(2, 3, 10, 7)
    out = treated(x.contiguous(memory_format=torch.channels_last))
    torch.testing.assert_close(out, ref(x), rtol=1e-5, atol=1e-5)
    assert out.is_contiguous(memory_format=torch.channels_last)


def test_conv3d_uses_channels_last_3d() -> None:
    m = ptt.to_channels_last_(nn.Conv3d(2, 4, 3))
    assert m.weight.is_contiguous(memory_format=torch.channels_last_3d)


def test_warns_on_depthwise() -> None:
    with pytest.warns(UserWarning, match="depthwise"):
        ptt.to_channels_last_(nn.Sequential(nn.Conv2d(8, 8, 3, groups=8)))


def test_no_effect_on_mlp() -> None:
    with pytest.warns(ptt.NoEffectWarning):
        ptt.to_channels_last_(nn.Sequential(nn.Linear(4, 4)))
