"""compile_: in place, per-device settings, shape-churn warning, misuse errors; one real inductor run (slow)."""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
from torch import nn

import pytorchtricks as ptt
from pytorchtricks.tricks.model.compile import compile_settings


def test_settings_per_device() -> None:
    assert compile_settings("cpu", True)["options"] == {"freezing": True}
    assert compile_settings("cpu", False)["options"] == {}
    assert compile_settings("cuda", True)["mode"] == "max-autotune"


def test_in_place_same_state_dict_and_outputs() -> None:
    ref = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    m = copy.deepcopy(ref)
    assert ptt.compile_(m, backend="eager") is m
    assert list(m.state_dict()) == list(ref.state_dict())
    x = torch.randn(3, 4)
    torch.testing.assert_close(m(x), ref(x))


def test_shape_churn_warns_once() -> None:
    m = ptt.compile_(nn.Linear(4, 2), backend="eager", warn_after=3)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for b in (1, 2, 2, 1):
            m(torch.randn(b, 4))
    assert not [w for w in caught if "distinct input shapes" in str(w.message)]
    with pytest.warns(UserWarning, match="distinct input shapes"):
        m(torch.randn(3, 4))


def test_misuse() -> None:
    with pytest.raises(ptt.PttError, match="mode"):
        ptt.compile_(nn.Linear(2, 2), mode="fastest")
    m = ptt.compile_(nn.Linear(2, 2), backend="eager")
    with pytest.raises(ptt.PttError, match="already compiled"):
        ptt.compile_(m, backend="eager")


@pytest.mark.slow
def test_inductor_freezing_inference_matches_eager() -> None:
    torch.manual_seed(0)
    ref = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU()).eval()
    m = ptt.compile_(copy.deepcopy(ref), for_inference=True)
    assert not m.training
    x = torch.randn(2, 3, 8, 8)
    with torch.no_grad():
        torch.testing.assert_close(m(x), ref(x), rtol=1e-4, atol=1e-4)
