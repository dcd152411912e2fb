"""freeze_: no gradients, BN pinned in eval even after model.train(), keep= heads, unfreeze_, warnings."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import pytorchtricks as ptt


def _net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 4, 3),
        nn.BatchNorm2d(4),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(4, 2),
    )


def test_frozen_bn_statistics_do_not_move_and_head_trains() -> None:
    m = ptt.freeze_(_net(), keep=["5"])
    m.train()  # the classic bug: this would put BN back into train mode
    assert not m[1].training and m[5].training
    stats = (m[1].running_mean.clone(), m[1].running_var.clone(), int(m[1].num_batches_tracked))
    opt = torch.optim.SGD([p for p in m.parameters() if p.requires_grad], lr=0.1)
    w_conv, w_head = m[0].weight.clone(), m[5].weight.clone()
    m(torch.randn(8, 3, 9, 9) * 3 + 1).sum().backward()
    opt.step()
    assert m[0].weight.grad is None
    torch.testing.assert_close(m[0].weight, w_conv, rtol=0, atol=0)
    assert not torch.equal(m[5].weight, w_head)
    torch.testing.assert_close(m[1].running_mean, stats[0], rtol=0, atol=0)
    torch.testing.assert_close(m[1].running_var, stats[1], rtol=0, atol=0)
    assert int(m[1].num_batches_tracked) == stats[2]


def test_frozen_model_equals_eval_model_and_survives_deepcopy() -> None:
    ref = _net().eval()
    m = copy.deepcopy(ptt.freeze_(_net())).train()
    x = torch.randn(2, 3, 7, 7)
    torch.testing.assert_close(m(x), ref(x))
    assert not m[1].training


def test_unfreeze_restores_training() -> None:
    m = ptt.unfreeze_(ptt.freeze_(_net())).train()
    assert m[1].training and all(p.requires_grad for p in m.parameters())


def test_bad_keep_name_and_no_effect() -> None:
    with pytest.raises(ptt.PttError, match="no submodule"):
        ptt.freeze_(_net(), keep=["head"])
    m = ptt.freeze_(nn.Linear(2, 2))
    with pytest.warns(ptt.NoEffectWarning):
        ptt.freeze_(m)
