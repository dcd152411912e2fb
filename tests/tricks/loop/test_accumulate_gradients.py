"""accumulate_gradients: K micro-steps == one full batch (<= 1e-6 fp32) on an MLP and a CNN, weighted micro-batches,
one optimizer/scheduler step per K, BatchNorm warning, check_accumulation. DDP: tests/test_distributed.py."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import pytorchtricks as ptt
from pytorchtricks.fixtures import tiny_mlp

# CPU-sensitive (kernels differ by ISA): make test runs these again with the kernels limited to AVX2
pytestmark = pytest.mark.isa


def _cnn() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1),
        nn.ReLU(),
        nn.Conv2d(8, 8, 3, stride=2),
        nn.GroupNorm(2, 8),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(8, 5),
    )


def _max_param_diff(a: nn.Module, b: nn.Module) -> float:
    return max((p - q).abs().max().item() for p, q in zip(a.parameters(), b.parameters()))


@pytest.mark.parametrize("make,shape", [(tiny_mlp, (12,)), (_cnn, (3, 9, 9))], ids=["mlp", "cnn"])
def test_k4_equals_full_batch(make, shape) -> None:
    ref, m = make(), make()
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(32, *shape, generator=g), torch.randint(0, 5, (32,), generator=g)
    lossf = nn.functional.cross_entropy
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.5, momentum=0.9)
    opt = torch.optim.SGD(m.parameters(), lr=0.5, momentum=0.9)
    for _ in range(2):  # two optimizer steps: momentum state must match too
        lossf(ref(x), y).backward()
        ref_opt.step()
        ref_opt.zero_grad()
        with ptt.accumulate_gradients(m, opt, steps=4) as acc:
            stepped = [acc.backward(lossf(m(xb), yb)) for xb, yb in zip(x.chunk(4), y.chunk(4))]
        assert stepped == [False, False, False, True]
    assert _max_param_diff(ref, m) <= 1e-6
    assert acc.optimizer_steps == 1


def test_unequal_micro_batches_need_weights() -> None:
    ref, m, naive = tiny_mlp(), tiny_mlp(), tiny_mlp()
    x, y = torch.randn(30, 12), torch.randint(0, 5, (30,))
    sizes = [2, 4, 8, 16]
    lossf = nn.functional.cross_entropy
    lossf(ref(x), y).backward()
    torch.optim.SGD(ref.parameters(), lr=1.0).step()
    for model, weighted in ((m, True), (naive, False)):
        with ptt.accumulate_gradients(model, torch.optim.SGD(model.parameters(), lr=1.0), steps=4) as acc:
            for xb, yb in zip(x.split(sizes), y.split(sizes)):
                acc.backward(lossf(model(xb), yb), weight=len(xb) if weighted else None)
    assert _max_param_diff(ref, m) <= 1e-6
    assert _max_param_diff(ref, naive) > 1e-3  # per-micro-batch mean is a different objective


def test_scheduler_and_precision_step_once_per_k() -> None:
    m = tiny_mlp()
    opt = torch.optim.SGD(m.parameters(), lr=1.0)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    mp = ptt.mixed_precision("cpu", "fp16")
    with ptt.accumulate_gradients(m, opt, steps=3, precision=mp, scheduler=sched, clip_grad_norm=1.0) as acc:
        for _ in range(6):
            with mp.autocast():
                loss = m(torch.randn(4, 12)).float().square().mean()
            acc.backward(loss)
    assert acc.optimizer_steps == 2 and mp.steps == 2
    assert opt.param_groups[0]["lr"] == pytest.approx(0.25)


def test_partial_cycle_flushed_or_dropped() -> None:
    for flush, expected in ((True, 1), (False, 0)):
        m = tiny_mlp()
        w = m[0].weight.clone()
        with ptt.accumulate_gradients(
            m, torch.optim.SGD(m.parameters(), lr=1.0), steps=4, flush_partial=flush
        ) as a:
            a.backward(m(torch.randn(4, 12)).square().mean())
        assert a.optimizer_steps == expected
        assert torch.equal(m[0].weight, w) != bool(expected)
        assert m[0].weight.grad is None


def test_batchnorm_warning_and_check_accumulation() -> None:
    torch.manual_seed(0)
    bn_model = nn.Sequential(nn.Linear(6, 8), nn.BatchNorm1d(8), nn.Linear(8, 2))
    with pytest.warns(UserWarning, match="BatchNorm"):
        ptt.accumulate_gradients(bn_model, torch.optim.SGD(bn_model.parameters(), lr=0.1), steps=2)
    x, y = torch.randn(16, 6), torch.randn(16, 2)
    bad = ptt.check_accumulation(bn_model, nn.functional.mse_loss, x, y, steps=4)
    assert not bad.ok and bad.batchnorm_layers == 1 and "NOT" in str(bad)
    good = ptt.check_accumulation(
        tiny_mlp(), nn.functional.cross_entropy, torch.randn(16, 12), torch.randint(0, 5, (16,))
    )
    assert good.ok and good.max_abs_diff < 1e-6
    assert bn_model[1].num_batches_tracked == 0  # the user's model is untouched


def test_misuse() -> None:
    m = tiny_mlp()
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    with pytest.raises(ptt.PttError, match="steps"):
        ptt.accumulate_gradients(m, opt, steps=0)
    with ptt.accumulate_gradients(m, opt, steps=2) as acc:
        with pytest.raises(ptt.PttError, match="scalar"):
            acc.backward(m(torch.randn(3, 12)).sum(1))
        with pytest.raises(ptt.PttError, match="weight"):
            acc.backward(m(torch.randn(3, 12)).sum(), weight=0)
