"""The lint test zoo: one small model per rule, each breaking exactly that rule, plus a clean model."""

from __future__ import annotations

import copy
import warnings
from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import pytorchtricks as ptt
from pytorchtricks.analysis.lint_rules import RULES
from pytorchtricks.core import PttError
from pytorchtricks.fixtures import randomize_bn_

pytestmark = pytest.mark.usefixtures("one_thread")  # the root conftest's fixture


X = torch.randn(8, 8, 8, 8)  # batch 8, 8 channels, 8x8: the clean shape


def cbr(c_in: int, c_out: int, **kw: int) -> list[nn.Module]:
    return [
        nn.Conv2d(c_in, c_out, 3, padding=1, bias=False, **kw),
        nn.BatchNorm2d(c_out),
        nn.ReLU(inplace=True),
    ]


def head(c: int) -> list[nn.Module]:
    return [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(c, 64), nn.ReLU(inplace=True), nn.Linear(64, 16)]


def clean() -> nn.Module:
    return nn.Sequential(*cbr(8, 64), *cbr(64, 64), *head(64))


class Stem(nn.Module):
    """clean() with a replaceable middle block: ``Stem(block)``; the block sees 64 channels at 8x8."""

    def __init__(self, block: nn.Module, c_out: int = 64) -> None:
        super().__init__()
        self.stem = nn.Sequential(*cbr(8, 64))
        self.block = block
        self.head = nn.Sequential(*head(c_out))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.block(self.stem(x)))


class Inception(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.b1 = nn.Conv2d(64, 16, 3, padding=1, bias=False)
        self.b2 = nn.Conv2d(64, 16, 3, padding=1, bias=False)
        self.b3 = nn.Conv2d(64, 32, 3, padding=1, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([self.b1(x), self.b2(x), self.b3(x)], 1)


class ManyElementwise(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for _ in range(6):
            x = torch.sigmoid(x) * x + x
        return x


class EarlyAttention(nn.Module):
    """Self-attention over the 32x32 = 1024 tokens of a high-resolution feature map."""

    def __init__(self) -> None:
        super().__init__()
        self.qkv = nn.Linear(64, 192, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n, c, h, w = x.shape
        q, k, v = self.qkv(x.flatten(2).transpose(1, 2)).unsqueeze(1).chunk(3, dim=-1)
        return F.scaled_dot_product_attention(q, k, v).squeeze(1).transpose(1, 2).reshape(n, c, h, w)


class WithUnused(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = clean()
        self.aux = nn.Linear(16, 16)  # never called

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


class SharedRelu(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.c1, self.b1 = nn.Conv2d(64, 64, 3, padding=1, bias=False), nn.BatchNorm2d(64)
        self.c2, self.b2 = nn.Conv2d(64, 64, 3, padding=1, bias=False), nn.BatchNorm2d(64)
        self.relu = nn.ReLU(inplace=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.relu(self.b2(self.c2(self.relu(self.b1(self.c1(x))))))


def _depthwise_channels_last() -> nn.Module:
    block = nn.Sequential(nn.Conv2d(64, 64, 3, padding=1, groups=64, bias=False), nn.BatchNorm2d(64))
    return Stem(block).to(memory_format=torch.channels_last)


# rule id -> (model factory, input, phase, planted location(s))
ZOO: dict[str, tuple[Callable[[], nn.Module], torch.Tensor, str, list[str]]] = {
    "PTL001": (lambda: Stem(nn.Sequential(nn.Conv2d(64, 64, 3, padding=1), nn.BatchNorm2d(64))), X, "train", ["block.0"]),
    "PTL002": (lambda: Stem(nn.Sequential(*cbr(64, 60)), c_out=60), X, "train", ["block.0", "head.2"]),
    "PTL003": (clean, torch.randn(6, 8, 8, 8), "train", ["(input)"]),
    "PTL004": (lambda: Stem(nn.Sequential(nn.Conv2d(64, 512, 1, bias=False)), c_out=512), torch.randn(8, 8, 32, 32), "train", ["block.0"]),
    "PTL005": (lambda: Stem(nn.Sequential(*cbr(64, 64, groups=4))), X, "train", ["block.0"]),
    "PTL006": (lambda: Stem(Inception()), X, "train", ["block"]),
    "PTL007": (lambda: Stem(ManyElementwise()), X, "train", [""]),
    "PTL008": (lambda: Stem(EarlyAttention()), torch.randn(1, 8, 32, 32), "train", ["block"]),
    "PTL009": (WithUnused, X, "train", ["aux"]),
    "PTL010": (lambda: Stem(SharedRelu()), X, "train", ["block.relu"]),
    "PTL011": (lambda: nn.DataParallel(clean()), X, "train", [""]),
    "PTL012": (lambda: Stem(nn.Sequential(nn.Conv2d(64, 64, 3, padding=1, bias=False), nn.BatchNorm2d(64), nn.ReLU())), X, "train", ["block.2"]),
    "PTL013": (_depthwise_channels_last, X.contiguous(memory_format=torch.channels_last), "train", ["block.0"]),
    "PTL014": (clean, X, "infer", [""]),
}  # fmt: skip


def test_zoo_covers_every_rule() -> None:
    assert sorted(ZOO) == sorted(RULES)


def test_clean_model_has_no_findings() -> None:
    for phase in ("train", "infer"):
        model = clean().eval() if phase == "infer" else clean()
        report = ptt.lint(model, X, phase=phase)
        assert report.findings == [], report.details()


@pytest.mark.parametrize("rule_id", sorted(ZOO))
def test_each_rule_fires_exactly_where_planted(rule_id: str) -> None:
    factory, x, phase, where = ZOO[rule_id]
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # DataParallel without GPUs warns
        model = factory()
    report = ptt.lint(model, x, phase=phase)
    assert sorted(report.where(rule_id)) == sorted(where), report.details()
    assert report.ids() == [rule_id], report.details()  # and no other rule fires on the zoo model
    assert all(f.fix and f.cost and f.message for f in report.findings)


def test_costs_are_computed_from_shapes() -> None:
    factory, x, phase, _ = ZOO["PTL004"]
    f = ptt.lint(factory(), x, phase=phase).findings[0]
    hw, c1, c2 = 32 * 32, 64, 512
    excess = hw * (c1 + c2) - 2 * hw * (c1 * c2) ** 0.5  # ShuffleNetV2 G1 excess, elements per sample
    assert f.cost_bytes == int(excess * 8 * 4)


def test_lint_restores_model_state() -> None:
    model = randomize_bn_(clean())
    before = copy.deepcopy(model.state_dict())
    ptt.lint(model, X)
    for k, v in model.state_dict().items():
        torch.testing.assert_close(v, before[k], rtol=0, atol=0)
    assert all(p.grad is None for p in model.parameters())


class Fixable(nn.Module):
    """Breaks the three auto-fixable rules at once: conv bias before BN, out-of-place ReLU, a shared ReLU."""

    def __init__(self) -> None:
        super().__init__()
        self.c1, self.b1 = nn.Conv2d(8, 64, 3, padding=1), nn.BatchNorm2d(64)
        self.c2, self.b2 = nn.Conv2d(64, 64, 3, padding=1, bias=False), nn.BatchNorm2d(64)
        self.act = nn.ReLU()
        self.shared = nn.ReLU()
        self.fc = nn.Linear(64, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.act(self.b1(self.c1(x)))
        x = self.shared(self.b2(self.c2(x)))
        return self.fc(self.shared(x.mean((2, 3)) + 1.0))


def test_fix_is_numerically_equivalent_in_train_and_eval() -> None:
    torch.manual_seed(0)
    model = randomize_bn_(Fixable())
    with torch.no_grad():
        model.c1.bias.normal_()  # a bias that matters if folded wrongly
    ref = copy.deepcopy(model)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        rep = ptt.apply_lint_fixes_(model, X)
    assert {a.split()[0] for a in rep.applied} == {"PTL001", "PTL010", "PTL012"}, str(rep)
    assert rep.after.ids() == [], rep.after.details()
    assert model.c1.bias is None
    x = torch.randn(8, 8, 8, 8) * 3
    for train in (True, False):
        for m in (model, ref):
            m.train(train)
            m.zero_grad(set_to_none=True)
        out, out_ref = model(x), ref(x)
        torch.testing.assert_close(out, out_ref, rtol=1e-5, atol=1e-5)
        out.square().sum().backward()
        out_ref.square().sum().backward()
        torch.testing.assert_close(model.c2.weight.grad, ref.c2.weight.grad, rtol=1e-4, atol=1e-5)
    for name in ("b1.running_mean", "b2.running_var"):  # train-mode runs updated BN stats identically
        torch.testing.assert_close(
            model.state_dict()[name],
            ref.state_dict()[name] - (ref.c1.bias.detach() if name == "b1.running_mean" else 0),
            rtol=1e-5,
            atol=1e-5,
        )


def test_fix_skips_unsharing_weights() -> None:
    class Tied(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(16, 16)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.fc(self.fc(x))

    m = Tied()
    rep = ptt.apply_lint_fixes_(m, torch.randn(8, 16))
    assert rep.applied == [] and "untie" in rep.skipped[0]
    assert ptt.lint(m, torch.randn(8, 16)).findings[0].severity == "info"


def test_bad_input_errors() -> None:
    with pytest.raises(PttError, match="phase"):
        ptt.lint(clean(), X, phase="serve")
    with pytest.raises(PttError, match="unknown lint rule"):
        ptt.lint(clean(), X, rules=["PTL999"])
    with pytest.raises(PttError, match="tensor or a tuple"):
        ptt.lint(clean(), {"x": X})


def test_untraceable_model_still_lints_with_a_note() -> None:
    class Dynamic(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.body = clean()

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.body(x) if x.sum() > -1e9 else x

    report = ptt.lint(Dynamic(), X)
    assert report.findings == [] and "could not trace" in report.notes[0]


class MnistNet(nn.Module):
    """The official MNIST example's model (pytorch/examples): 1 input channel, a 10-class output layer."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1, self.conv2 = nn.Conv2d(1, 32, 3, 1), nn.Conv2d(32, 64, 3, 1)
        self.fc1, self.fc2 = nn.Linear(9216, 128), nn.Linear(128, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.conv2(F.relu(self.conv1(x)))), 2)
        return F.log_softmax(self.fc2(F.relu(self.fc1(torch.flatten(x, 1)))), dim=1)


class Untraceable(nn.Module):
    """Data-dependent control flow: torch.fx cannot trace it, lint falls back on the module probe."""

    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(16, hidden), nn.Linear(hidden, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc1(x)
        return self.fc2(h.relu() if h.sum() > 0 else h)


def test_the_output_layer_width_is_not_a_finding() -> None:
    rep = ptt.lint(MnistNet(), torch.randn(8, 1, 28, 28), rules=["PTL002"])
    assert rep.where("PTL002") == []  # fc2's 10 classes are the task's, not a design choice
    hidden = nn.Sequential(nn.Linear(16, 60), nn.ReLU(), nn.Linear(60, 64), nn.ReLU(), nn.Linear(64, 10))
    rep = ptt.lint(hidden, torch.randn(8, 16), rules=["PTL002"])
    assert rep.where("PTL002") == ["0", "2"]  # hidden width 60 (out of 0, into 2) still is; the head is not
    assert "in 60" in next(f.message for f in rep.findings if f.location == "2")
    untraced = ptt.lint(Untraceable(60), torch.randn(8, 16), rules=["PTL002"])
    assert untraced.where("PTL002") == ["fc1", "fc2"] and "out 10" not in str(untraced)


def test_a_probe_batch_is_reported_at_the_workload_batch() -> None:
    m = nn.Sequential(
        nn.Conv2d(8, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16), nn.ReLU(), nn.Conv2d(16, 16, 1)
    )
    probe, whole = torch.randn(2, 8, 8, 8), torch.randn(32, 8, 8, 8)
    small, stated, real = ptt.lint(m, probe), ptt.lint(m, probe, batch_size=32), ptt.lint(m, whole)
    assert "PTL003" in small.ids() and "PTL003" not in stated.ids()  # the probe's batch 2 never leaks
    cost = {r: next(f.cost_bytes for f in rep.findings if f.id == "PTL012") for r, rep in
            (("small", small), ("stated", stated), ("real", real))}  # fmt: skip
    assert cost["stated"] == cost["real"] == 16 * cost["small"]
    odd = ptt.lint(m, probe, batch_size=12)
    assert "batch size 12 " in next(f.message for f in odd.findings if f.id == "PTL003")
    assert "costs for batch 12" in str(odd)
    with pytest.raises(PttError, match="batch_size"):
        ptt.lint(m, probe, batch_size=0)
