from __future__ import annotations

import copy
import warnings

import pytest
import torch
from torch import nn

import pytorchtricks as ptt
from pytorchtricks.core import NoEffectWarning, PttError
from pytorchtricks.fixtures import randomize_bn_
from pytorchtricks.tricks.model.inplace_activations import bench_case, safe_inplace_candidates

pytestmark = pytest.mark.usefixtures("one_thread")  # the root conftest's fixture


class Mixed(nn.Module):
    """Safe sites (after BN, after linear, after an add) and unsafe ones (skip connection, sigmoid input, input)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(8)
        self.act1 = nn.ReLU()  # safe: BN output used only here
        self.conv2 = nn.Conv2d(8, 8, 3, padding=1)
        self.act_skip = nn.ReLU()  # unsafe: conv2's output is also the skip connection
        self.act_add = nn.LeakyReLU(0.1)  # safe: output of an add, used only here
        self.act_sig = nn.ReLU()  # unsafe: sigmoid saves its output for backward
        self.act_in = nn.ReLU6()  # unsafe: model input
        self.fc = nn.Linear(8, 4)
        self.act_fc = nn.Hardtanh()  # safe

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.act_in(x) * 0.0
        y = self.act1(self.bn1(self.conv1(x)))
        z = self.conv2(y)
        s = self.act_skip(z)
        y = self.act_add(s + z)
        y = self.act_sig(torch.sigmoid(y)) + torch.sigmoid(y)
        return self.act_fc(self.fc(y.mean((2, 3))))


def _grads(model: nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    model.zero_grad(set_to_none=True)
    out = model(x)
    (out * torch.arange(out.numel(), dtype=out.dtype).view_as(out)).sum().backward()
    return out.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def test_only_provably_safe_sites_are_switched_and_results_are_exact() -> None:
    torch.manual_seed(0)
    model = randomize_bn_(Mixed())
    assert sorted(safe_inplace_candidates(model)) == ["act1", "act_add", "act_fc"]
    treated = ptt.inplace_activations_(copy.deepcopy(model))
    assert [n for n, m in treated.named_modules() if getattr(m, "inplace", False)] == [
        "act1",
        "act_add",
        "act_fc",
    ]
    x = torch.randn(3, 3, 9, 7)
    for mode in ("train", "eval"):
        model.train(mode == "train")
        treated.train(mode == "train")
        out_a, g_a = _grads(model, x)
        out_b, g_b = _grads(treated, x)
        torch.testing.assert_close(out_b, out_a, rtol=0, atol=0)
        for name in g_a:
            torch.testing.assert_close(g_b[name], g_a[name], rtol=0, atol=0)


def test_unsafe_site_would_really_break() -> None:
    """The skip-connection site excluded above is a real hazard: forcing it in place changes the result."""
    torch.manual_seed(0)
    model = Mixed().eval()
    forced = copy.deepcopy(model)
    forced.act_skip.inplace = True
    x = torch.randn(2, 3, 6, 6)
    with torch.no_grad():
        assert not torch.allclose(model(x), forced(x))


def test_reused_activation_needs_every_site_safe() -> None:
    class Shared(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b, self.relu = nn.Linear(4, 4), nn.Linear(4, 4), nn.ReLU()

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = self.a(x)
            return self.relu(self.b(self.relu(h) + h))  # second site safe, first not (h reused)

    assert safe_inplace_candidates(Shared()) == []


def test_no_effect_warning_and_misuse() -> None:
    with pytest.warns(NoEffectWarning):
        ptt.inplace_activations_(nn.Sequential(nn.Conv2d(3, 4, 1), nn.ReLU(inplace=True)))

    class Untraceable(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x.relu() if x.sum() > 0 else x

    with pytest.raises(PttError, match="inplace=True by hand"):
        ptt.inplace_activations_(Untraceable())
    with pytest.raises(PttError, match=r"torch\.nn\.Module"):
        ptt.inplace_activations_("model")  # type: ignore[arg-type]


def test_bench_case_check_passes() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error", NoEffectWarning)
        case = bench_case("smoke")
    assert case.check is not None
    case.check(case.baseline(), case.treated())
