"""Safety check: catches input mutation, aliasing, wrong outputs; passes a faithful transform."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from pytorchtricks.safety import SafetyError, check_transform, reference_outputs, sqnr_db


class MutatesInput(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.add_(1.0) * 2  # a buggy "optimised" model writing into the caller's tensor


class ReturnsInput(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x


def test_mutating_module_is_caught_and_input_restored() -> None:
    x = torch.randn(3, 4)
    keep = x.clone()
    ref = reference_outputs(lambda t: (t + 1.0) * 2, x)
    with pytest.raises(SafetyError, match="modified the caller's input") as info:
        check_transform(MutatesInput(), x, ref)
    assert not info.value.report.inputs_unchanged
    assert torch.equal(x, keep)


def test_alias_is_caught() -> None:
    x = torch.randn(3)
    with pytest.raises(SafetyError, match="shares memory"):
        check_transform(ReturnsInput(), x, reference_outputs(nn.Identity(), x))


def test_wrong_output_bounds() -> None:
    torch.manual_seed(0)
    m = nn.Linear(4, 4)
    x = torch.randn(8, 4)
    ref = reference_outputs(m, x)
    with torch.no_grad():
        m.weight.add_(0.01)
    rep = check_transform(m, x, ref, raise_on_failure=False, max_abs_diff=1e-6)
    assert not rep.ok and rep.max_abs_diff > 1e-6 and 10 < rep.sqnr_db < 80
    with pytest.raises(SafetyError, match="SQNR"):
        check_transform(m, x, ref, min_sqnr_db=90)


def test_faithful_transform_passes() -> None:
    m = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
    x = (torch.randn(2, 4),)
    rep = check_transform(m, x, reference_outputs(m, x), max_abs_diff=0.0)
    assert rep.ok and rep.inputs_unchanged and rep.sqnr_db == math.inf


def test_sqnr_formula() -> None:
    ref = torch.tensor([3.0, 4.0])
    assert sqnr_db(ref, ref + torch.tensor([0.3, 0.4])) == pytest.approx(20.0)
