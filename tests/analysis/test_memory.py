"""memory_breakdown / estimate_memory against closed forms and the measured CPU peak; find_batch_size."""

from __future__ import annotations

import copy
from collections.abc import Callable

import pytest
import torch
from torch import nn

import pytorchtricks as ptt
from pytorchtricks.analysis.memory import _predict_bytes, measure_step_peak
from pytorchtricks.bench.workloads import load_model
from pytorchtricks.core import PttError
from pytorchtricks.fixtures import small_cnn

pytestmark = pytest.mark.usefixtures("one_thread")  # the root conftest's fixture


F32 = 4


def test_activation_bytes_of_small_cnn_equal_the_closed_form() -> None:
    n, w = 4, 8
    est = ptt.estimate_memory(small_cnn(width=w), torch.randn(n, 1, 28, 28))
    # Per Conv-BN-ReLU(inplace) block at c channels, s pixels: BN saves its input (the conv output) plus mean and
    # invstd (c each); ReLU saves its output (which the next conv saves too: one storage). Linear saves the pooled
    # features. The input batch (saved by the first conv) is reported apart.
    blocks = [(w, 28 * 28), (2 * w, 14 * 14), (4 * w, 7 * 7)]
    closed = sum(2 * n * c * s + 2 * c for c, s in blocks) + n * 4 * w
    assert est.activation_bytes == F32 * closed
    assert est.input_bytes == F32 * n * 28 * 28
    assert dict((p, b) for p, _, b in est.per_module)["1"] == F32 * (n * w * 28 * 28 + 2 * w)


def test_params_grads_and_adam_state() -> None:
    m = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    m[2].weight.requires_grad_(False)
    opt = torch.optim.Adam([p for p in m.parameters() if p.requires_grad])
    est = ptt.estimate_memory(m, torch.randn(8, 16), opt)
    n_params = 16 * 32 + 32 + 32 * 4 + 4
    trainable = n_params - 32 * 4
    assert est.param_bytes == F32 * n_params and est.grad_bytes == F32 * trainable
    assert (
        est.optimizer_state_bytes == 2 * F32 * trainable + 3 * F32
    )  # exp_avg, exp_avg_sq + one step scalar each
    assert opt.state == {} and all(p.grad is None for p in m.parameters())  # the user's objects are untouched


def _resnet18() -> nn.Module:
    return load_model("torchvision:resnet18", num_classes=16)


# Shapes that reach different backend paths: at 64 px ResNet-18's layer4 convs run at 2x2 pixels (on AVX2 oneDNN's
# backward-weights falls back to gemm:jit with a per-thread scratchpad of several weight copies), at 128 px at 4x4.
MODELS: dict[str, tuple[Callable[[], nn.Module], tuple[int, ...]]] = {
    "small_cnn": (lambda: small_cnn(width=16), (32, 1, 28, 28)),
    "mlp": (lambda: nn.Sequential(nn.Linear(256, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.GELU(), nn.Linear(1024, 10)), (64, 256)),
    "resnet18": (_resnet18, (4, 3, 64, 64)),
    "resnet18_128px": (_resnet18, (8, 3, 128, 128)),
}  # fmt: skip


def _optimizer(model: nn.Module, optim: str) -> torch.optim.Optimizer:
    if optim == "adamw":
        return torch.optim.AdamW(model.parameters())
    return torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)


@pytest.mark.isa
@pytest.mark.parametrize(
    ("name", "optim"),
    [("small_cnn", "adamw"), ("small_cnn", "sgd"), ("mlp", "adamw"), ("mlp", "sgd"), ("resnet18", "adamw"),
     ("resnet18", "sgd"), ("resnet18_128px", "adamw")],
)  # fmt: skip
def test_total_is_within_10_percent_of_measured_peak(name: str, optim: str) -> None:
    factory, shape = MODELS[name]
    torch.manual_seed(0)
    model = factory()
    b = ptt.memory_breakdown(model, torch.randn(shape), _optimizer(model, optim))
    assert b.measured_peak_bytes is not None and b.peak_method == "cpu_tracked"
    assert abs(b.total_bytes / b.measured_peak_bytes - 1) <= 0.10, str(b)
    assert "measured peak" in str(b) and b.table().count("\n") >= 1


SCRATCH = 16 * 2**20


class _ScratchInBackward(nn.Module):
    """Identity whose backward allocates a scratch buffer, as a backend kernel allocates its workspace."""

    class _Fn(torch.autograd.Function):
        @staticmethod
        def forward(ctx: torch.autograd.function.FunctionCtx, x: torch.Tensor) -> torch.Tensor:
            return x.clone()

        @staticmethod
        def backward(ctx: torch.autograd.function.FunctionCtx, g: torch.Tensor) -> torch.Tensor:
            scratch = torch.ones(SCRATCH // F32)
            return g * scratch[0]  # scratch is live while the gradient is computed

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._Fn.apply(x)  # type: ignore[no-any-return]


def test_backward_workspace_is_what_backward_allocates() -> None:
    m = nn.Sequential(nn.Linear(64, 64), _ScratchInBackward(), nn.Linear(64, 10))
    b = ptt.memory_breakdown(m, torch.randn(8, 64), torch.optim.SGD(m.parameters(), lr=0.1))
    # the scratch is no saved tensor and no parameter: only measuring the probe's backward sees it
    assert SCRATCH <= b.backward_workspace_bytes <= SCRATCH + 2**20, str(b)
    assert b.workspace_bytes == b.backward_workspace_bytes and b.measured_peak_bytes is not None
    assert abs(b.total_bytes / b.measured_peak_bytes - 1) <= 0.10, str(b)


@pytest.mark.isa
@pytest.mark.parametrize(("name", "shape"), [("small_cnn", (1, 28, 28)), ("resnet18", (3, 64, 64))])
def test_prediction_from_two_probes_is_within_10_percent_at_4x_the_batch(
    name: str, shape: tuple[int, ...]
) -> None:
    torch.manual_seed(0)
    model = MODELS[name][0]()
    opt = _optimizer(model, "sgd")
    e8, e16 = (ptt.estimate_memory(model, torch.randn(n, *shape), opt) for n in (8, 16))
    predicted = _predict_bytes(e8, e16, 8, 16, 32)
    measured, _ = measure_step_peak(model, torch.randn(32, *shape), opt)
    assert abs(predicted / measured - 1) <= 0.10, (predicted, measured)


def test_find_batch_size_picks_fastest_fitting_multiple_of_8_that_trains() -> None:
    torch.manual_seed(0)
    model = small_cnn(width=8)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    ref = copy.deepcopy(model.state_dict())

    def make_batch(n: int) -> torch.Tensor:
        return torch.randn(n, 1, 28, 28)

    est64, est128 = (ptt.estimate_memory(model, make_batch(n), opt).total_bytes for n in (64, 128))
    # 64 fits, 128 does not, as long as the prediction from the probes at 8 and 16 misses by under 32 samples' bytes
    budget = (est64 + est128) // 2
    r = ptt.find_batch_size(
        model, make_batch, opt, budget_bytes=budget, candidates=[8, 20, 64, 128], min_run_time_s=0.05
    )
    assert [row["batch_size"] for row in r.rows] == [8, 16, 64, 128]  # 20 snapped down to a multiple of 8
    assert [row["fits"] for row in r.rows] == [True, True, True, False]
    timed = [row for row in r.rows if row["samples_per_s"]]
    assert (
        r.batch_size == max(timed, key=lambda row: row["samples_per_s"])["batch_size"]
    )  # fastest, not largest
    chosen = next(row for row in r.rows if row["batch_size"] == r.batch_size)
    assert chosen["measured_bytes"] <= budget
    # the chosen size trains: one real step on a copy gives a finite loss and changes the weights
    m2 = copy.deepcopy(model)
    o2 = torch.optim.SGD(m2.parameters(), lr=0.05)
    loss = nn.functional.cross_entropy(m2(make_batch(r.batch_size)), torch.randint(0, 10, (r.batch_size,)))
    loss.backward()
    o2.step()
    assert torch.isfinite(loss) and not torch.equal(m2[0].weight, model[0].weight)
    for k, v in model.state_dict().items():  # the search trained copies only
        torch.testing.assert_close(v, ref[k], rtol=0, atol=0)
    assert "chosen" in str(r)


def test_find_batch_size_errors() -> None:
    model = small_cnn(width=8)
    with pytest.raises(PttError, match="no batch size"):
        ptt.find_batch_size(model, lambda n: torch.randn(n, 1, 28, 28), budget_bytes=1024, max_batch=32)
    with pytest.raises(PttError, match="positive"):
        ptt.find_batch_size(model, lambda n: torch.randn(n, 1, 28, 28), budget_bytes=0)
    with pytest.raises(
        PttError, match="missing budget_bytes: pass them as keywords, or pass a BatchSizeConfig"
    ):
        ptt.find_batch_size(model, lambda n: torch.randn(n, 1, 28, 28))
    with pytest.raises(PttError, match="unknown option 'budget': did you mean 'budget_bytes'"):
        ptt.find_batch_size(model, lambda n: torch.randn(n, 1, 28, 28), budget=1024)
    with pytest.raises(PttError, match="no batch size"):  # the same search, its options as one config
        ptt.find_batch_size(
            model, lambda n: torch.randn(n, 1, 28, 28), None, ptt.BatchSizeConfig(1024, max_batch=32)
        )


def test_measure_step_peak_counts_live_state() -> None:
    m = nn.Linear(256, 256, bias=False)
    peak, method = measure_step_peak(m, torch.randn(8, 256), torch.optim.SGD(m.parameters(), lr=0.1))
    assert method == "cpu_tracked" and peak >= 2 * F32 * 256 * 256  # weight + grad at least
