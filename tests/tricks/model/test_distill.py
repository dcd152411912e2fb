"""distill_ / distillation_loss: the Hinton loss formula, frozen teacher, student learns the teacher's function."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import pytorchtricks as ptt
from pytorchtricks.core import PttError


def test_loss_matches_formula() -> None:
    torch.manual_seed(0)
    s, t, y = torch.randn(5, 7), torch.randn(5, 7), torch.randint(0, 7, (5,))
    T, alpha = 3.0, 0.6
    p_t = F.softmax(t / T, dim=1)
    kl = (p_t * (p_t.log() - F.log_softmax(s / T, dim=1))).sum(1).mean() * T * T
    want = alpha * kl + (1 - alpha) * F.cross_entropy(s, y)
    torch.testing.assert_close(ptt.distillation_loss(s, t, y, T=T, alpha=alpha), want)
    torch.testing.assert_close(ptt.distillation_loss(s, t, None, T=T), kl)


def test_teacher_gets_no_gradient_and_student_approaches_teacher() -> None:
    torch.manual_seed(0)
    teacher = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    student = nn.Sequential(nn.Linear(8, 4))
    x = torch.randn(512, 8)
    y = teacher(x).argmax(1).detach()
    before = ptt.distillation_loss(student(x), teacher(x), None).item()
    ptt.distill_(student, teacher, x, y, epochs=4, lr=0.05, batch_size=64, alpha=1.0)
    after = ptt.distillation_loss(student(x), teacher(x), None).item()
    assert after < 0.7 * before
    assert all(p.grad is None for p in teacher.parameters())


def test_misuse() -> None:
    s = torch.randn(2, 3)
    with pytest.raises(PttError, match="temperature"):
        ptt.distillation_loss(s, s, T=0)
    with pytest.raises(PttError, match="alpha"):
        ptt.distillation_loss(s, s, alpha=2)
    with pytest.raises(PttError, match="differ"):
        ptt.distillation_loss(s, torch.randn(2, 4))


def test_config_is_the_keywords_as_one_value() -> None:
    torch.manual_seed(0)
    teacher, student = nn.Linear(8, 4), nn.Linear(8, 4)
    x, y = torch.randn(64, 8), torch.randint(0, 4, (64,))
    opts = {"epochs": 2.0, "lr": 0.1, "batch_size": 16, "T": 2.0, "alpha": 0.5, "seed": 3}
    by_kw = ptt.distill_(copy.deepcopy(student), teacher, x, y, **opts)
    by_cfg = ptt.distill_(copy.deepcopy(student), teacher, x, y, ptt.DistillConfig(**opts))
    for a, b in zip(by_kw.parameters(), by_cfg.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert not torch.equal(by_kw.weight, student.weight)  # it trained
    with pytest.raises(PttError, match=r"not both \(got T, epochs too\)"):
        ptt.distill_(student, teacher, x, y, ptt.DistillConfig(), epochs=3, T=1.0)
