"""prune_channels_: physical removal, exact when removed channels are dead, residual/concat/depthwise-aware."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import pytorchtricks as ptt
from pytorchtricks.core import NoEffectWarning, PttError
from pytorchtricks.fixtures import randomize_bn_


def _kill_half_(model: nn.Module) -> None:
    """Zero gamma and beta of the first half of every BN's channels: those channels output exactly 0."""
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                h = m.num_features // 2
                m.weight[:h] = 0
                m.bias[:h] = 0


def _params(m: nn.Module) -> int:
    return sum(p.numel() for p in m.parameters())


def _exact_after_pruning(model: nn.Module, x: torch.Tensor) -> nn.Module:
    model = randomize_bn_(model).eval()
    _kill_half_(model)
    with torch.no_grad():
        ref = model(x)
    pruned = ptt.prune_channels_(copy.deepcopy(model), 0.5, criterion="bn_gamma")
    with torch.no_grad():
        torch.testing.assert_close(pruned(x), ref, atol=1e-5, rtol=1e-5)
    assert _params(pruned) < 0.6 * _params(model)
    return pruned


def test_resnet18_residual_groups_exact() -> None:
    tvm = pytest.importorskip("torchvision.models")
    torch.manual_seed(0)
    pruned = _exact_after_pruning(tvm.resnet18(weights=None), torch.randn(2, 3, 64, 64))
    assert pruned.conv1.out_channels == 32 and pruned.layer4[1].conv2.out_channels == 256
    assert pruned.fc.in_features == 256 and pruned.fc.out_features == 1000


class Concat(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU())
        self.b = nn.Sequential(nn.Conv2d(3, 8, 1), nn.BatchNorm2d(8), nn.ReLU())
        self.head = nn.Conv2d(24, 5, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.cat([self.a(x), self.b(x)], dim=1))


def test_concat_maps_indices() -> None:
    torch.manual_seed(0)
    pruned = _exact_after_pruning_round(Concat(), torch.randn(2, 3, 8, 8))
    assert pruned.head.in_channels == 12 and pruned.head.out_channels == 5


def _exact_after_pruning_round(model: nn.Module, x: torch.Tensor) -> nn.Module:
    model = randomize_bn_(model).eval()
    _kill_half_(model)
    with torch.no_grad():
        ref = model(x)
    pruned = ptt.prune_channels_(copy.deepcopy(model), 0.5, criterion="bn_gamma", round_to=4)
    with torch.no_grad():
        torch.testing.assert_close(pruned(x), ref, atol=1e-5, rtol=1e-5)
    return pruned


def test_depthwise_follows_input() -> None:
    torch.manual_seed(0)
    net = nn.Sequential(
        nn.Conv2d(3, 16, 1), nn.BatchNorm2d(16), nn.ReLU(),
        nn.Conv2d(16, 16, 3, padding=1, groups=16), nn.BatchNorm2d(16), nn.ReLU(),
        nn.Conv2d(16, 6, 1), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(6, 3),
    )  # fmt: skip
    pruned = _exact_after_pruning_round(net, torch.randn(2, 3, 9, 9))
    assert pruned[3].groups == pruned[3].in_channels == 8 and pruned[6].in_channels == 8


def test_grouped_conv_and_output_are_left_whole() -> None:
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(3, 16, 1), nn.BatchNorm2d(16), nn.ReLU(), nn.Conv2d(16, 16, 3, groups=4))
    with pytest.warns(NoEffectWarning):
        ptt.prune_channels_(net.eval(), 0.5)
    assert net[0].out_channels == 16


def test_l1_criterion_prunes_mlp_hidden_units() -> None:
    net = nn.Sequential(nn.Linear(10, 64), nn.ReLU(), nn.Linear(64, 3))
    ptt.prune_channels_(net, 0.75)
    assert net[0].out_features == 16 and net[2].in_features == 16
    assert net(torch.randn(2, 10)).shape == (2, 3)


@pytest.mark.slow
def test_fashion_mnist_half_channels_fine_tuned_within_1_5_points(fmnist) -> None:
    from pytorchtricks.fashion_mnist import evaluate, train

    model = copy.deepcopy(fmnist.model)
    ptt.prune_channels_(model, 0.5)
    assert [m.out_channels for m in model.modules() if isinstance(m, nn.Conv2d)] == [8, 16, 32]
    # fine-tune as long as the fp32 model trained (3 epochs of the same subset): 2 epochs left a 1.8-point drop
    train(model, fmnist.train_x, fmnist.train_y, epochs=3.0, lr=0.2, batch_size=256)
    acc = evaluate(model, fmnist.test_x, fmnist.test_y)
    assert fmnist.fp32_acc - acc <= 1.5, (fmnist.fp32_acc, acc)


def test_slimming_and_unstructured_and_misuse() -> None:
    bn_net = nn.Sequential(nn.Conv2d(3, 4, 1), nn.BatchNorm2d(4))
    bn_net(torch.randn(2, 3, 4, 4)).sum().backward()
    before = bn_net[1].weight.grad.clone()
    ptt.network_slimming_step_(bn_net, 0.5)
    torch.testing.assert_close(bn_net[1].weight.grad - before, 0.5 * torch.sign(bn_net[1].weight.detach()))
    lin = ptt.prune_unstructured_(nn.Linear(8, 8), 0.25)
    assert int((lin.weight == 0).sum()) == 16 and lin.weight.shape == (8, 8)
    with pytest.raises(PttError, match="amount"):
        ptt.prune_channels_(nn.Linear(2, 2), 1.0)
    with pytest.raises(PttError, match="criterion"):
        ptt.prune_channels_(nn.Linear(2, 2), 0.5, criterion="random")


class SharedConvNet(nn.Module):
    """``mid`` is called twice (its input and output channels are one group) and one ReLU serves every layer."""

    def __init__(self) -> None:
        super().__init__()
        self.stem, self.bn = nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16)
        self.mid = nn.Conv2d(16, 16, 3, padding=1)
        self.wide, self.head = nn.Conv2d(16, 32, 1), nn.Conv2d(32, 4, 1)
        self.relu = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.relu(self.mid(self.relu(self.mid(self.relu(self.bn(self.stem(x)))))))
        return self.head(self.relu(self.wide(x)))


def test_reused_modules_are_left_whole_and_the_rest_is_pruned() -> None:
    torch.manual_seed(0)
    model = randomize_bn_(SharedConvNet()).eval()
    x = torch.randn(2, 3, 8, 8)
    pruned = ptt.prune_channels_(copy.deepcopy(model), 0.5)
    assert pruned.mid.weight.shape == (16, 16, 3, 3) and pruned.stem.out_channels == 16  # the reused conv
    assert pruned.wide.out_channels == 16 and pruned.head.in_channels == 16  # a shared ReLU ties nothing
    assert pruned(x).shape == model(x).shape
