"""unshare_modules_: each call site gets its own instance; outputs unchanged; fusion then works."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import pytorchtricks as ptt
from pytorchtricks.core import NoEffectWarning
from pytorchtricks.fixtures import ConvUsedTwice, randomize_bn_


class SharedRelu(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.c1, self.c2, self.relu = nn.Conv2d(3, 4, 1), nn.Conv2d(4, 4, 1), nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.relu(self.c2(self.relu(self.c1(x))))


def _sites(model: nn.Module) -> dict[int, int]:
    counts: dict[int, int] = {}
    hooks = [
        m.register_forward_hook(lambda m, i, o: counts.__setitem__(id(m), counts.get(id(m), 0) + 1))
        for m in model.modules()
    ]
    model(torch.randn(1, model_in(model), 5, 5))
    for h in hooks:
        h.remove()
    return counts


def model_in(model: nn.Module) -> int:
    return next(m for m in model.modules() if isinstance(m, nn.Conv2d)).in_channels


def test_stateless_reuse_is_split_silently() -> None:
    torch.manual_seed(0)
    model = SharedRelu()
    x = torch.randn(2, 3, 5, 5)
    ref = model(x)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no warning for stateless copies
        ptt.unshare_modules_(model)
    torch.testing.assert_close(model(x), ref)
    assert max(_sites(model).values()) == 1


def test_stateful_reuse_warns_and_then_fuses() -> None:
    torch.manual_seed(0)
    model = randomize_bn_(ConvUsedTwice()).eval()
    x = torch.randn(2, 4, 6, 6)
    ref = model(x)
    with pytest.warns(UserWarning, match="no\\s+longer share weights"):
        ptt.unshare_modules_(model)
    torch.testing.assert_close(model(x), ref)
    ptt.fuse_conv_bn_(model, x)
    assert isinstance(model.bn, nn.Identity)
    torch.testing.assert_close(model(x), ref, atol=1e-5, rtol=1e-5)


def test_shared_by_two_names() -> None:
    seq = nn.Sequential(nn.Conv2d(3, 3, 1), nn.ReLU())
    seq.add_module("again", seq[1])
    seq.add_module("conv2", nn.Conv2d(3, 3, 1))
    ptt.unshare_modules_(seq)
    assert seq[1] is not seq.again


def test_copy_and_deepcopy_still_work() -> None:
    model = ptt.unshare_modules_(SharedRelu())
    x = torch.randn(1, 3, 4, 4)
    torch.testing.assert_close(copy.deepcopy(model)(x), model(x))


def test_nothing_shared_warns() -> None:
    with pytest.warns(NoEffectWarning):
        ptt.unshare_modules_(nn.Sequential(nn.Conv2d(3, 3, 1), nn.ReLU()))
