"""flatten_parameters_: views into one buffer, same training trajectory as unflattened, misuse detected."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import pytorchtricks as ptt


def _net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(5, 7), nn.LayerNorm(7), nn.ReLU(), nn.Linear(7, 3))


@pytest.mark.parametrize("opt_name", ["sgd", "adamw"])
def test_same_trajectory_and_grads_in_buffer(opt_name: str) -> None:
    ref = _net()
    m = ptt.flatten_parameters_(copy.deepcopy(ref))
    for a, b in zip(ref.state_dict().values(), m.state_dict().values()):
        torch.testing.assert_close(b, a, rtol=0, atol=0)
    (flat,) = ptt.flat_parameters(m)
    assert flat.numel() == sum(p.numel() for p in ref.parameters())
    kw = {"lr": 0.05, "momentum": 0.9} if opt_name == "sgd" else {"lr": 0.01, "weight_decay": 0.1}
    ref_opt = ptt.fast_optimizer(ref.parameters(), opt_name, foreach=False, **kw)
    opt = ptt.fast_optimizer([flat], opt_name, foreach=False, **kw)
    x = torch.randn(16, 5)
    for _ in range(3):
        ref(x).square().mean().backward()
        ref_opt.step()
        ref_opt.zero_grad()
        m(x).square().mean().backward()
        for p in m.parameters():
            assert p.grad.untyped_storage().data_ptr() == flat.grad.untyped_storage().data_ptr()
        opt.step()
        opt.zero_grad(set_to_none=False)
    for p, q in zip(ref.parameters(), m.parameters()):
        torch.testing.assert_close(q, p, rtol=1e-5, atol=1e-6)
        assert q.untyped_storage().data_ptr() == flat.untyped_storage().data_ptr()


def test_tied_weights_flattened_once() -> None:
    emb = nn.Embedding(10, 4)
    head = nn.Linear(4, 10, bias=False)
    head.weight = emb.weight
    m = ptt.flatten_parameters_(nn.ModuleDict({"emb": emb, "head": head}))
    assert ptt.flat_parameters(m)[0].numel() == 40


def test_set_to_none_is_detected() -> None:
    m = ptt.flatten_parameters_(_net())
    m(torch.randn(2, 5)).sum().backward()
    m.zero_grad(set_to_none=True)
    m(torch.randn(2, 5)).sum().backward()
    with pytest.raises(ptt.PttError, match="set_to_none=False"):
        ptt.flat_parameters(m)


def test_misuse_and_no_effect() -> None:
    m = ptt.flatten_parameters_(_net())
    with pytest.raises(ptt.PttError, match="already"):
        ptt.flatten_parameters_(m)
    with pytest.raises(ptt.PttError, match="not flattened"):
        ptt.flat_parameters(_net())
    with pytest.warns(ptt.NoEffectWarning):
        ptt.flatten_parameters_(ptt.freeze_(_net()))
