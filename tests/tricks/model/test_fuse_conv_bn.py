"""fuse_conv_bn_: exact on real call graphs, never folds a conv used elsewhere, eval-only."""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
from torch import nn

import pytorchtricks as ptt
from pytorchtricks.core import NoEffectWarning, PttError
from pytorchtricks.fixtures import ConvUsedTwice, randomize_bn_


def _bns(m: nn.Module) -> int:
    return sum(isinstance(x, nn.modules.batchnorm._BatchNorm) for x in m.modules())


def _check_exact(model: nn.Module, x: torch.Tensor, **kw: object) -> nn.Module:
    model = randomize_bn_(model).eval()
    with torch.no_grad():
        ref = model(x)
    fused = ptt.fuse_conv_bn_(copy.deepcopy(model), x, **kw)
    with torch.no_grad():
        torch.testing.assert_close(fused(x), ref, atol=1e-5, rtol=1e-5)
    return fused


def test_resnet18_exact_and_all_bn_gone() -> None:
    tvm = pytest.importorskip("torchvision.models")
    torch.manual_seed(0)
    fused = _check_exact(tvm.resnet18(weights=None), torch.randn(2, 3, 64, 64))
    assert _bns(fused) == 0
    assert "safety_report" not in fused.__dict__  # checked (a failure raises), not stored on the model


class ReusedRelu(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.c1, self.b1 = nn.Conv2d(3, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8)
        self.c2, self.b2 = nn.Conv2d(8, 8, 3, padding=1), nn.BatchNorm2d(8)
        self.relu = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.relu(self.b2(self.c2(self.relu(self.b1(self.c1(x))))))


class OutputUsedTwice(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(4, 4, 3, padding=1)
        self.bn = nn.BatchNorm2d(4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(x)
        return self.bn(y) * y


def test_reused_relu_exact() -> None:
    torch.manual_seed(0)
    fused = _check_exact(ReusedRelu(), torch.randn(2, 3, 9, 11))
    assert _bns(fused) == 0


@pytest.mark.parametrize("cls", [ConvUsedTwice, OutputUsedTwice])
def test_conv_used_elsewhere_is_not_fused(cls: type[nn.Module]) -> None:
    torch.manual_seed(0)
    with pytest.warns(NoEffectWarning):
        fused = _check_exact(cls(), torch.randn(2, 4, 8, 8))
    assert isinstance(fused.bn, nn.BatchNorm2d)


@pytest.mark.parametrize(
    "layer,bn,shape",
    [
        (nn.Conv1d(4, 6, 3), nn.BatchNorm1d(6), (2, 4, 10)),
        (nn.Conv3d(4, 6, 3, bias=False), nn.BatchNorm3d(6), (2, 4, 5, 5, 5)),
        (nn.Conv2d(4, 8, 3, groups=2), nn.BatchNorm2d(8), (2, 4, 7, 7)),
        (nn.Conv2d(8, 8, 3, groups=8), nn.BatchNorm2d(8), (2, 8, 7, 7)),
        (nn.ConvTranspose2d(4, 6, 3, stride=2), nn.BatchNorm2d(6), (2, 4, 5, 5)),
        (nn.ConvTranspose2d(4, 6, 3, groups=2, bias=False), nn.BatchNorm2d(6), (2, 4, 5, 5)),
        (nn.ConvTranspose3d(2, 4, 2), nn.BatchNorm3d(4), (1, 2, 3, 3, 3)),
        (nn.Linear(5, 7), nn.BatchNorm1d(7), (4, 5)),
    ],
)
def test_layer_kinds_exact(layer: nn.Module, bn: nn.Module, shape: tuple[int, ...]) -> None:
    torch.manual_seed(0)
    fused = _check_exact(nn.Sequential(layer, bn), torch.randn(*shape))
    assert isinstance(fused[1], nn.Identity)


def test_linear_bn_on_3d_input_is_not_folded() -> None:
    torch.manual_seed(0)
    with pytest.warns(NoEffectWarning):
        fused = _check_exact(nn.Sequential(nn.Linear(6, 6), nn.BatchNorm1d(3)), torch.randn(2, 3, 6))
    assert isinstance(fused[1], nn.BatchNorm1d)


def test_channels_last_input() -> None:
    torch.manual_seed(0)
    x = torch.randn(2, 3, 9, 9).to(memory_format=torch.channels_last)
    _check_exact(ReusedRelu().to(memory_format=torch.channels_last), x)


def test_untraceable_forward_falls_back_to_children() -> None:
    class Dyn(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.body = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            if x.sum() > 0:  # data-dependent: fx cannot trace this forward
                return self.body(x)
            return self.body(-x)

    torch.manual_seed(0)
    fused = _check_exact(Dyn(), torch.randn(1, 3, 8, 8))
    assert isinstance(fused.body[1], nn.Identity)


def test_training_mode_raises() -> None:
    with pytest.raises(PttError, match="eval"):
        ptt.fuse_conv_bn_(nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4)))


def test_no_pair_warns() -> None:
    with pytest.warns(NoEffectWarning):
        ptt.fuse_conv_bn_(nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU()).eval())


def test_bench_case_smoke() -> None:
    from pytorchtricks.tricks.model.fuse_conv_bn import bench_case

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        case = bench_case("smoke")
    assert case.check is not None
    case.check(case.baseline(), case.treated())


class OneSharedPair(nn.Module):
    """A folded pair next to a conv -> BN pair whose conv is called twice: that one stays, with a warning."""

    def __init__(self) -> None:
        super().__init__()
        self.c1, self.b1 = nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4)
        self.conv, self.bn = nn.Conv2d(4, 4, 3, padding=1), nn.BatchNorm2d(4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.b1(self.c1(x))
        return self.bn(self.conv(x)) + self.conv(x)


def test_partly_shared_warns_naming_unshare_then_folds_everything_after_it() -> None:
    torch.manual_seed(0)
    x = torch.randn(2, 3, 8, 8)
    with pytest.warns(UserWarning, match=r"1 pair\(s\) unfolded .*bn.*ptt\.unshare_modules_"):
        fused = _check_exact(OneSharedPair(), x)
    assert _bns(fused) == 1
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the copied conv's weights are untied: fine for inference
        model = ptt.unshare_modules_(randomize_bn_(OneSharedPair()).eval())
    assert _bns(_check_exact(model, x)) == 0  # the second call site has its own conv now: every BN folds


def test_a_wrong_fold_raises_safety_error_with_its_report(monkeypatch) -> None:
    """The check is what stands behind the result: a fold that changes the outputs raises, with the numbers."""
    from pytorchtricks.safety import SafetyError
    from pytorchtricks.tricks.model import fuse_conv_bn as mod

    real = mod.fold_bn_into_

    def off_by_one(layer, bn):
        real(layer, bn)
        with torch.no_grad():
            layer.bias.add_(1.0)

    monkeypatch.setattr(mod, "fold_bn_into_", off_by_one)
    m = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8)).eval()
    with pytest.raises(SafetyError, match=r"max abs diff|differ|SQNR"):
        ptt.fuse_conv_bn_(m, torch.randn(2, 3, 8, 8))
