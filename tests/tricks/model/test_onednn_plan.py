"""The oneDNN plan for PT2E int8 graphs: same results as the graph it replaces, safe in-place adds, clear refusals.

"Same results" is measured against the graph's own rounding noise (``rounding_sqnr_db``): where the kernels cannot
saturate (VNNI, or 7-bit activations without it) the plan differs from the graph only by rounding flips, at most
twice the graph's rounding error in amplitude (6 dB). On a CPU without VNNI the graphs here are built as
``quantize`` builds them, with 7-bit activations (``int8_range``).
"""

from __future__ import annotations

import copy
import pickle

import pytest
import torch
from torch import nn

import pytorchtricks as ptt
from pytorchtricks.fixtures import randomize_bn_
from pytorchtricks.safety import sqnr_db
from pytorchtricks.tricks.model import onednn_plan
from pytorchtricks.tricks.model.onednn_plan import (
    PlanUnsupported,
    binding,
    build_plan,
    onednn_available,
    rounding_sqnr_db,
    saturation_risk,
)

pytest.importorskip("torchao")
needs_onednn = pytest.mark.skipif(
    not onednn_available(), reason="system oneDNN missing: `make system-deps` installs libdnnl2"
)


class Block(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.relu1 = nn.ReLU()
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.relu2 = nn.ReLU()
        self.down = None
        if stride != 1 or cin != cout:
            self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.down is None else self.down(x)
        return self.relu2(self.bn2(self.conv2(self.relu1(self.bn1(self.conv1(x))))) + identity)


class ResNetLike(nn.Module):
    """Stem conv + max-pool, residual blocks (with and without a downsample), global pool, classifier."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 5, 2, 2, bias=False), nn.BatchNorm2d(16), nn.ReLU())
        self.pool = nn.MaxPool2d(3, 2, 1)
        self.blocks = nn.Sequential(Block(16, 16, 1), Block(16, 32, 2), Block(32, 32, 1))
        self.head = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 10))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks(self.pool(self.stem(x))))


class ReusedResidual(nn.Module):
    """The residual ``x`` is read again after the add: the plan must not add into x's buffer in place."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU())
        self.conv = nn.Conv2d(8, 8, 3, padding=1)
        self.relu = nn.ReLU()
        self.late = nn.Conv2d(8, 8, 1)
        self.late_relu = nn.ReLU()
        self.out_y, self.out_z = nn.Conv2d(8, 4, 1), nn.Conv2d(8, 4, 1)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = self.stem(x)
        y = self.relu(self.conv(x) + x)
        z = self.late_relu(self.late(x))  # reads x after the add
        return self.out_y(y), self.out_z(z)


class Activations(nn.Module):
    """MobileNetV2-style: ReLU6 and depthwise convs, an inverted residual (add, no activation after), hardswish,
    SiLU and GELU after convs, functional global pooling, dropout, classifier."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, 2, 1, bias=False), nn.BatchNorm2d(16), nn.ReLU6())
        self.expand = nn.Sequential(nn.Conv2d(16, 48, 1, bias=False), nn.BatchNorm2d(48), nn.ReLU6())
        self.dw = nn.Sequential(
            nn.Conv2d(48, 48, 3, 1, 1, groups=48, bias=False), nn.BatchNorm2d(48), nn.ReLU6()
        )
        self.project = nn.Sequential(nn.Conv2d(48, 16, 1, bias=False), nn.BatchNorm2d(16))
        self.gelu = nn.Sequential(nn.Conv2d(16, 32, 1), nn.GELU())
        self.hs = nn.Sequential(nn.Conv2d(32, 32, 3, padding=1), nn.Hardswish())
        self.silu = nn.Sequential(nn.Conv2d(32, 32, 3, padding=1), nn.SiLU())
        self.drop, self.fc = nn.Dropout(0.2), nn.Linear(32, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        x = x + self.project(self.dw(self.expand(x)))
        x = self.silu(self.hs(self.gelu(x)))
        x = torch.flatten(nn.functional.adaptive_avg_pool2d(x, (1, 1)), 1)
        return self.fc(self.drop(x))


def _int8_graph(model: nn.Module, x: torch.Tensor, reduce_range: bool | None = None) -> nn.Module:
    """The PT2E int8 graph of ``model``; ``reduce_range=None``: as quantize decides on this CPU (no VNNI:
    balanced ranges)."""
    from pytorchtricks.tricks.model.quantize import _static_int8, int8_range

    model = randomize_bn_(model).eval()
    ptt.fuse_conv_bn_(model, x)
    g = torch.Generator().manual_seed(1)
    calib = [(torch.randn(x.shape, generator=g),) for _ in range(4)] + [(x,)]
    ranges, _ = int8_range("pt2e", reduce_range)
    return _static_int8(model, (x,), calib, "pt2e", ranges=ranges)[0]


def _flat(out: torch.Tensor | tuple[torch.Tensor, ...]) -> torch.Tensor:
    return torch.cat([t.reshape(-1) for t in ([out] if isinstance(out, torch.Tensor) else out)])


def _assert_agrees(graph: nn.Module, plan: onednn_plan.OnednnPlan, y: torch.Tensor) -> None:
    """The plan on ``y`` (not the build example) is within the mechanism's bound of the graph."""
    with torch.no_grad():
        ref, got = _flat(graph(y)), _flat(plan(y))
    floor = min(rounding_sqnr_db(graph, (y,)) - 6.0, 100.0)
    assert sqnr_db(ref, got) >= floor, (sqnr_db(ref, got), floor)


@needs_onednn
@pytest.mark.isa
def test_plan_matches_the_int8_graph_on_a_resnet_like_net() -> None:
    torch.manual_seed(0)
    x = torch.randn(2, 3, 32, 32)
    graph = _int8_graph(ResNetLike(), x)
    plan = build_plan(graph, (x,))
    assert plan.primitives[0] == "quantize input" and plan.primitives[-1] == "linear -> float32"
    assert plan.primitives.count("conv + add + relu -> uint8") == 3 and "maxpool" in plan.primitives
    assert "avgpool" in plan.primitives and "copy residual" not in plan.primitives
    y = torch.randn(2, 3, 32, 32)  # not the example: the plan holds no result of the build-time check
    with torch.no_grad():
        ref, got = graph(y), plan(y)
    assert got.shape == ref.shape and got.dtype == torch.float32
    _assert_agrees(graph, plan, y)  # same int8 graph; only rounding of a few intermediate values differs
    x_before = y.clone()
    again = plan(y)
    torch.testing.assert_close(y, x_before, rtol=0, atol=0)  # the caller's input is only read
    assert again.data_ptr() != got.data_ptr()  # a fresh output per call: earlier results stay valid
    torch.testing.assert_close(again, got, rtol=0, atol=0)
    assert (
        not any(k.startswith("ref") for k in plan.kernels) and len(plan.kernels) == len(plan.primitives) - 1
    )
    assert copy.deepcopy(plan) is plan  # read-only after the build: copies of a model share it
    with pytest.raises(TypeError, match="cannot be pickled"):
        pickle.dumps(plan)


@needs_onednn
@pytest.mark.isa
def test_plan_lowers_mobilenet_style_activations_depthwise_and_pooling() -> None:
    torch.manual_seed(0)
    x = torch.randn(2, 3, 32, 32)
    graph = _int8_graph(Activations(), x)
    plan = build_plan(graph, (x,))
    lines = "\n".join(plan.primitives)
    for part in (
        "conv + relu6 -> uint8",
        "conv + add -> uint8",
        "+ hardswish",
        "+ silu",
        "+ gelu",
        "avgpool",
    ):
        assert part in lines, (part, lines)
    y = torch.randn(2, 3, 32, 32)
    # hardswish/SiLU/GELU run on true float values (output scale applied after them): same result as the graph
    _assert_agrees(graph, plan, y)


@needs_onednn
@pytest.mark.isa
def test_plan_copies_a_residual_that_is_read_after_the_add() -> None:
    torch.manual_seed(0)
    x = torch.randn(1, 3, 16, 16)
    graph = _int8_graph(ReusedResidual(), x)
    plan = build_plan(graph, (x,))
    assert "copy residual" in plan.primitives
    y = torch.randn(1, 3, 16, 16)
    with torch.no_grad():
        got = plan(y)
    assert isinstance(got, tuple) and len(got) == 2
    _assert_agrees(graph, plan, y)


class ConvRelu6(nn.Module):
    """conv -> ReLU6 -> conv: with 7-bit activations the ReLU6's clip and the range clip are two clips in one
    primitive (oneDNN 2.x keeps one injector per algorithm: the range clip must be another algorithm)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv, self.act, self.head = nn.Conv2d(8, 16, 3, padding=1), nn.ReLU6(), nn.Conv2d(16, 4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.act(self.conv(x)))


@needs_onednn
@pytest.mark.parametrize("model", [ConvRelu6, Activations], ids=["relu6", "activations"])
def test_plan_keeps_7bit_activations_in_range_beyond_the_calibration(model: type[nn.Module]) -> None:
    torch.manual_seed(0)
    shape = (2, 8, 16, 16) if model is ConvRelu6 else (2, 3, 32, 32)
    x = torch.randn(shape)
    graph = _int8_graph(model(), x, reduce_range=True)  # 0..127 on every CPU class
    y = x * 3  # far beyond the calibrated range: the graph clamps at 127, the plan must too
    plan = build_plan(graph, (y,))
    _assert_agrees(graph, plan, y)
    if model is Activations:  # the average pool's output is requantized into 0..127: a clamp follows it
        assert "clamp to 0..127" in plan.primitives


@needs_onednn
def test_plan_refuses_8bit_activations_on_a_cpu_without_vnni(monkeypatch: pytest.MonkeyPatch) -> None:
    from pytorchtricks import hardware

    torch.manual_seed(0)
    x = torch.randn(2, 3, 32, 32)
    graph = _int8_graph(ResNetLike(), x, reduce_range=False)
    zen3 = hardware.caps_from("AMD EPYC (Zen 3)", {"avx2", "fma"}, {})
    monkeypatch.setattr(hardware, "cpu_caps", lambda: zen3)
    with pytest.raises(PlanUnsupported, match=r"without VNNI.*saturate.*reduce_range=None"):
        build_plan(graph, (x,))
    assert (
        saturation_risk(255, 128) and saturation_risk(255, 64) is None and saturation_risk(127, 128) is None
    )


@needs_onednn
def test_balanced_ranges_are_exact_on_the_avx2_kernels(monkeypatch: pytest.MonkeyPatch) -> None:
    """A graph quantized as on a CPU without VNNI (balanced: up to 8-bit activations, the weights what is left)
    passes the plan's saturation rule and its exactness check against the graph, on a fake AVX2 CPU."""
    from pytorchtricks import hardware

    zen3 = hardware.caps_from("AMD EPYC (Zen 3)", {"avx2", "fma"}, {})
    monkeypatch.setattr(hardware, "cpu_caps", lambda: zen3)
    torch.manual_seed(0)
    x = torch.randn(2, 3, 32, 32)
    graph = _int8_graph(ResNetLike(), x)
    qmax = {
        int(n.args[4])
        for n in graph.graph.nodes
        if n.target == torch.ops.quantized_decomposed.quantize_per_tensor.default
    }
    assert max(qmax) > 127  # some activation got more than 7 bits: its weights fewer
    _assert_agrees(graph, build_plan(graph, (x,)), x)


@needs_onednn
def test_plan_refuses_what_it_does_not_lower_and_wrong_shapes() -> None:
    torch.manual_seed(0)
    x = torch.randn(2, 3, 16, 16)
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.Hardswish(), nn.Flatten(), nn.Linear(8 * 14 * 14, 4))
    with pytest.raises(PlanUnsupported, match=r"flatten other than NxCx1x1"):
        build_plan(_int8_graph(model, x), (x,))
    graph = _int8_graph(ResNetLike(), x)
    plan = build_plan(graph, (x,))
    with pytest.raises(ValueError, match="built for inputs of shape"):
        plan(torch.randn(1, 3, 16, 16))


def test_missing_library_says_how_to_install(monkeypatch) -> None:
    monkeypatch.setattr(binding, "_LIB", None)
    monkeypatch.setattr(binding.ctypes.util, "find_library", lambda name: None)
    with pytest.raises(PlanUnsupported, match="apt-get install libdnnl2"):
        binding._load()
    assert not onednn_available()


@needs_onednn
@pytest.mark.slow
@pytest.mark.isa
def test_quantize_onednn_runs_the_plan_per_thread_count_and_falls_back_for_other_shapes() -> None:
    torch.manual_seed(0)
    model = randomize_bn_(ResNetLike()).eval()
    x = torch.randn(2, 3, 32, 32)
    ref = ptt.quantize(copy.deepcopy(model), x, ptt.QuantConfig(engine="eager"))
    q = ptt.quantize(copy.deepcopy(model), x, ptt.QuantConfig(engine="onednn"))
    assert q.plan_error is None and q.plan_shapes == ((2, 3, 32, 32),) and q.safety_report.ok
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        with torch.no_grad():
            got = q(x)
        assert set(q.plans) == {threads, 1}  # oneDNN fixes threads per primitive: one plan per thread count
    finally:
        torch.set_num_threads(threads)
    with torch.no_grad():
        assert sqnr_db(ref(x), got) >= rounding_sqnr_db(ref.inner, (x,)) - 6.0  # the plan vs its graph
        y = torch.randn(3, 3, 32, 32)  # no plan for this shape: the compiled int8 graph runs it
        assert sqnr_db(ref(y), q(y)) > 30  # other kernels (Inductor's do not clamp a 7-bit qmax)
    assert set(q.plans) == {threads, 1}


@pytest.mark.slow
def test_quantize_onednn_without_the_library_warns_and_keeps_the_compiled_path(monkeypatch) -> None:
    from pytorchtricks.core import NoEffectWarning

    monkeypatch.setattr(binding, "_LIB", None)
    monkeypatch.setattr(binding.ctypes.util, "find_library", lambda name: None)
    torch.manual_seed(0)
    model = randomize_bn_(ResNetLike()).eval()
    x = torch.randn(2, 3, 32, 32)
    with pytest.warns(NoEffectWarning, match="libdnnl2"):
        q = ptt.quantize(copy.deepcopy(model), x, ptt.QuantConfig(engine="onednn"))
    assert q.plan() is None and "libdnnl2" in q.plan_error and q.safety_report.ok


@needs_onednn
@pytest.mark.slow
@pytest.mark.isa
@pytest.mark.parametrize("name", ["resnet50", "mobilenet_v2"])
def test_plan_builds_for_torchvision_models(name: str) -> None:
    torchvision = pytest.importorskip("torchvision")
    torch.manual_seed(0)
    model = getattr(torchvision.models, name)(weights=None)
    x = torch.randn(1, 3, 64, 64)
    ptt.unshare_modules_(model)
    graph = _int8_graph(model, x)
    plan = build_plan(graph, (x,))
    assert plan.primitives[-1] == "linear -> float32"
    _assert_agrees(graph, plan, torch.randn(1, 3, 64, 64))


def test_quantize_onednn_with_the_fx_backend_says_it_has_no_plan() -> None:
    from pytorchtricks.core import NoEffectWarning

    torch.manual_seed(0)
    model = randomize_bn_(ResNetLike()).eval()
    x = torch.randn(2, 3, 32, 32)
    with pytest.warns(NoEffectWarning, match="no oneDNN plan: .*FX"):
        q = ptt.quantize(copy.deepcopy(model), x, ptt.QuantConfig(backend="fx", engine="onednn"))
    assert q.plan() is None and q.safety_report.ok
