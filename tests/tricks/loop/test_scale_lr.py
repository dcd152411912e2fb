"""scale_lr and warmup_schedule: the rules, the ramp (Goyal et al.), the follow-on schedule, errors."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

import pytorchtricks as ptt


def test_rules() -> None:
    assert ptt.scale_lr(0.1, 256, 8192) == pytest.approx(3.2)  # Goyal et al.: 0.1 x k
    assert ptt.scale_lr(1e-3, 64, 16, rule="sqrt") == pytest.approx(5e-4)
    assert ptt.scale_lr(0.1, 256, 256) == pytest.approx(0.1)


def test_warmup_ramps_linearly_then_follows_after() -> None:
    lr = ptt.scale_lr(0.1, 256, 1024)
    opt = torch.optim.SGD(nn.Linear(2, 2).parameters(), lr=lr)
    sched = ptt.warmup_schedule(opt, 5, start_factor=0.1 / lr, after=lambda s: 0.5 ** (s // 2))
    seen = []
    for _ in range(10):
        seen.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert seen[0] == pytest.approx(0.1)
    assert seen[5] == pytest.approx(lr)
    diffs = [b - a for a, b in zip(seen[:5], seen[1:6])]
    assert all(math.isclose(d, diffs[0]) for d in diffs)
    assert seen[7] == pytest.approx(lr / 2) and seen[9] == pytest.approx(lr / 4)


def test_misuse() -> None:
    with pytest.raises(ptt.PttError, match="rule"):
        ptt.scale_lr(0.1, 256, 512, rule="cubic")
    with pytest.raises(ptt.PttError, match="positive"):
        ptt.scale_lr(0.1, 0, 512)
    opt = torch.optim.SGD(nn.Linear(2, 2).parameters(), lr=0.1)
    with pytest.raises(ptt.PttError, match="start_factor"):
        ptt.warmup_schedule(opt, 3, start_factor=0.0)
