"""fast_optimizer: picks fused where torch has it (CPU, CUDA), else foreach; same math as the default loop."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import pytorchtricks as ptt
from pytorchtricks.tricks.loop.fast_optimizer import optimizer_impl

# CPU-sensitive (kernels differ by ISA): make test runs these again with the kernels limited to AVX2
pytestmark = pytest.mark.isa


@pytest.mark.parametrize("name", ["sgd", "adamw", "rmsprop"])
def test_same_updates_as_default_loop(name: str) -> None:
    torch.manual_seed(0)
    ref = nn.Sequential(nn.Linear(5, 7), nn.LayerNorm(7), nn.Linear(7, 3))
    m = copy.deepcopy(ref)
    kw = {"lr": 1e-2, "weight_decay": 1e-2} | ({"momentum": 0.9} if name == "sgd" else {})
    opt = ptt.fast_optimizer(m.parameters(), name, **kw)
    cls = type(opt)
    ref_opt = cls(ref.parameters(), foreach=False, **kw)
    expected = "foreach" if name == "rmsprop" else "fused"  # rmsprop has no fused kernel
    assert opt.defaults[expected] is True
    x = torch.randn(16, 5)
    for _ in range(3):
        for model, o in ((ref, ref_opt), (m, opt)):
            model(x).square().mean().backward()
            o.step()
            o.zero_grad()
        assert all(p.grad is None for p in m.parameters())  # set_to_none default
    for p, q in zip(ref.parameters(), m.parameters()):
        torch.testing.assert_close(q, p, rtol=1e-6, atol=1e-7)


def test_param_groups_and_explicit_choice_win() -> None:
    a, b = nn.Linear(2, 2), nn.Linear(2, 2)
    opt = ptt.fast_optimizer(
        [{"params": a.parameters()}, {"params": b.parameters(), "lr": 0.5}], "Adam", lr=0.1
    )
    assert len(opt.param_groups) == 2 and opt.param_groups[1]["lr"] == 0.5
    opt2 = ptt.fast_optimizer(a.parameters(), "sgd", lr=0.1, foreach=False)
    assert opt2.defaults["foreach"] is False


def test_impl_choice() -> None:
    assert optimizer_impl("adamw", [torch.zeros(1)]) == "fused"
    assert optimizer_impl("rmsprop", [torch.zeros(1)]) == "foreach"
    assert optimizer_impl("adamw", [torch.zeros(1, dtype=torch.int64)]) == "foreach"
    assert optimizer_impl("adamw", [torch.zeros(1, device="meta")]) == "foreach"
    assert optimizer_impl("adamw", []) == "foreach"


@pytest.mark.gpu
def test_fused_on_cuda() -> None:
    opt = ptt.fast_optimizer(nn.Linear(2, 2).cuda().parameters(), "adamw", lr=0.1)
    assert opt.defaults["fused"] is True


def test_misuse() -> None:
    with pytest.raises(ptt.PttError, match="unknown optimizer"):
        ptt.fast_optimizer(nn.Linear(2, 2).parameters(), "lion")
    with pytest.raises(ptt.PttError, match="no parameters"):
        ptt.fast_optimizer([], "sgd", lr=0.1)
