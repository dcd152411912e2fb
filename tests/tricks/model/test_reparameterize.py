"""reparameterize_: RepVGG / ACNet blocks fold exactly into one conv; eval-only; no-op warns."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import pytorchtricks as ptt
from pytorchtricks.core import NoEffectWarning, PttError
from pytorchtricks.fixtures import randomize_bn_
from pytorchtricks.tricks.model._rep_blocks import repvgg_net


def _exact(model: nn.Module, x: torch.Tensor) -> nn.Module:
    model = randomize_bn_(model).eval()
    with torch.no_grad():
        ref = model(x)
    out = ptt.reparameterize_(copy.deepcopy(model), x)
    with torch.no_grad():
        torch.testing.assert_close(out(x), ref, atol=1e-5, rtol=1e-5)
    return out


def test_repvgg_net_exact_and_single_branch() -> None:
    torch.manual_seed(0)
    net = _exact(
        repvgg_net(10, widths=(8, 16, 32, 64), depths=(1, 2, 2, 1), groups=2), torch.randn(2, 3, 32, 32)
    )
    assert not any(isinstance(m, nn.BatchNorm2d) for m in net.modules())
    assert all(m.reparam is not None for m in net.modules() if isinstance(m, ptt.RepVGGBlock))
    assert any(m.reparam.groups == 2 for m in net.modules() if isinstance(m, ptt.RepVGGBlock))
    assert "safety_report" not in net.__dict__  # checked (a failure raises), not stored on the model


@pytest.mark.parametrize("c_in,c_out,stride,groups", [(4, 4, 1, 1), (4, 8, 2, 1), (8, 8, 1, 4), (6, 6, 1, 6)])
def test_repvgg_block_variants(c_in: int, c_out: int, stride: int, groups: int) -> None:
    torch.manual_seed(0)
    block = ptt.RepVGGBlock(c_in, c_out, stride=stride, groups=groups)
    assert (block.identity is not None) == (c_in == c_out and stride == 1)
    _exact(nn.Sequential(block), torch.randn(2, c_in, 9, 7))


@pytest.mark.parametrize("k,stride,groups", [(3, 1, 1), (5, 2, 1), (3, 1, 2)])
def test_acblock_exact(k: int, stride: int, groups: int) -> None:
    torch.manual_seed(0)
    net = _exact(
        nn.Sequential(ptt.ACBlock(4, 6, k, stride=stride, groups=groups), nn.ReLU()), torch.randn(2, 4, 11, 9)
    )
    assert net[0].reparam.kernel_size == (k, k)


def test_foreign_switch_to_deploy_is_called() -> None:
    class Foreign(nn.Module):
        deployed = False

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x * 2

        def switch_to_deploy(self) -> None:
            self.deployed = True

    m = nn.Sequential(Foreign()).eval()
    ptt.reparameterize_(m)
    assert m[0].deployed


def test_training_mode_raises() -> None:
    with pytest.raises(PttError, match="eval"):
        ptt.reparameterize_(nn.Sequential(ptt.RepVGGBlock(3, 3)))
    block = ptt.RepVGGBlock(3, 3)  # called directly in train mode
    with pytest.raises(PttError, match="eval"):
        block.reparameterize_()


def test_nothing_to_do_warns() -> None:
    with pytest.warns(NoEffectWarning):
        ptt.reparameterize_(nn.Sequential(nn.Conv2d(3, 3, 3)).eval())


def test_acblock_even_kernel_rejected() -> None:
    with pytest.raises(PttError, match="odd"):
        ptt.ACBlock(3, 3, kernel_size=2)


def test_after_fuse_conv_bn_still_exact() -> None:
    torch.manual_seed(0)
    net = randomize_bn_(nn.Sequential(ptt.RepVGGBlock(4, 4), ptt.ACBlock(4, 4))).eval()
    x = torch.randn(2, 4, 9, 9)
    with torch.no_grad():
        ref = net(x)
    ptt.fuse_conv_bn_(net, x)  # folds the branch BNs first (the pipeline order)
    ptt.reparameterize_(net, x)
    with torch.no_grad():
        torch.testing.assert_close(net(x), ref, atol=1e-5, rtol=1e-5)


def test_reused_block_converts_once_and_stays_exact() -> None:
    class Twice(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.block = ptt.RepVGGBlock(8, 8)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.block(self.block(x))  # one instance at two call sites: both see the deploy form

    torch.manual_seed(0)
    net = _exact(Twice(), torch.randn(2, 8, 8, 8))
    assert type(net.block.reparam).__name__ == "Conv2d"


def test_a_failing_foreign_block_raises_ptt_error() -> None:
    class Broken(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x

        def switch_to_deploy(self) -> None:
            raise KeyError("rbr_dense")

    with pytest.raises(PttError, match=r"Broken\.switch_to_deploy\(\) failed \(KeyError"):
        ptt.reparameterize_(nn.Sequential(Broken()).eval())
