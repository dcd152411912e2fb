"""checkpoint_activations_(model, budget=...): the module-tree planner. Exact (outputs, gradients, BatchNorm running
statistics and num_batches_tracked, dropout masks) on models with branches, a reused module, BatchNorm and dropout;
selective regions keep convolution outputs instead of recomputing them; the measured peak of the planned model
fits the budget (an independent meter, not the planner's own); models that cannot be planned get a reason."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import pytorchtricks as ptt
from pytorchtricks.bench.alloc_events import quiet_peak_memory
from pytorchtricks.tricks.loop import _regions
from pytorchtricks.tricks.loop._regions import apply, build_tree, channel_chain, probe, unapply
from pytorchtricks.tricks.loop._tree_checkpoint import fwd_bwd_peak

pytestmark = [pytest.mark.isa, pytest.mark.usefixtures("one_thread")]


class _Branchy(nn.Module):
    """A stem run, two parallel branches, a module called twice, BN (one cumulative), dropout."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8, momentum=None)  # cumulative average: counts num_batches_tracked
        self.act = nn.ReLU(inplace=True)
        self.pool = nn.MaxPool2d(2)
        self.a = nn.Sequential(nn.Conv2d(8, 8, 3, padding=1), nn.BatchNorm2d(8), nn.GELU(), nn.Dropout(0.3))
        self.b = nn.Sequential(nn.Conv2d(8, 8, 1), nn.BatchNorm2d(8), nn.ReLU())
        self.shared = nn.Sequential(nn.Conv2d(8, 8, 3, padding=1), nn.BatchNorm2d(8), nn.SiLU())
        self.head = nn.Linear(8, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.pool(self.act(self.bn(self.stem(x))))
        y = self.a(x) + self.b(x)
        y = self.shared(self.shared(y))  # the same module twice: both calls recomputed
        return self.head(y.mean((2, 3)))


def _net() -> _Branchy:
    torch.manual_seed(0)
    net = _Branchy()
    with torch.no_grad():  # random running statistics: a stat update counted twice would show
        for m in net.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.uniform_(-1, 1)
                m.running_var.uniform_(0.5, 2)
    return net


def _steps(m: nn.Module, xs: list[torch.Tensor]) -> list[torch.Tensor]:
    opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
    outs = []
    for i, x in enumerate(xs):
        torch.manual_seed(100 + i)  # the same dropout masks in both models
        out = m(x)
        out.square().mean().backward()
        outs.append(out.detach())
        if i < len(xs) - 1:
            opt.step()
            opt.zero_grad(set_to_none=True)
    return outs


@pytest.mark.parametrize("budget", [0.7, "min"])
def test_exact_on_branches_reuse_batchnorm_dropout(budget: float | str) -> None:
    ref = _net()
    m = ptt.checkpoint_activations_(
        copy.deepcopy(ref), budget=budget
    )  # planned at the first training forward
    g = torch.Generator().manual_seed(1)
    xs = [torch.randn(12, 3, 16, 16, generator=g) * 2 + 0.5 for _ in range(3)]
    for a, b in zip(_steps(ref, xs), _steps(m, xs)):
        torch.testing.assert_close(b, a)
    for (name, p), q in zip(ref.named_parameters(), m.parameters()):
        torch.testing.assert_close(q.grad, p.grad, msg=name)
    assert list(m.state_dict()) == list(ref.state_dict())
    for (k, a), b in zip(ref.state_dict().items(), m.state_dict().values()):
        torch.testing.assert_close(b, a, msg=k)
    assert int(m.bn.num_batches_tracked) == 3
    plan = ptt.checkpoint_plan(m)
    assert not plan.pending and plan.regions, str(plan)
    assert plan.measured_peak_bytes < plan.untreated_peak_bytes
    if budget == 0.7:
        assert plan.measured_peak_bytes <= 0.7 * plan.untreated_peak_bytes


def test_stem_is_a_run_region_and_a_reused_module_a_region() -> None:
    m = ptt.checkpoint_activations_(_net(), budget="min", example_inputs=torch.randn(16, 3, 32, 32))
    names = [r[0] for r in ptt.checkpoint_plan(m).regions]
    assert any(n.startswith("stem..") for n in names), names  # conv -> BN -> ReLU(inplace) -> pool as one
    assert "act" not in names  # an in-place ReLU alone would recompute from its changed input


class _ConvCounter(torch.utils._python_dispatch.TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.convs = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        if func.overloadpacket is torch.ops.aten.convolution:
            self.convs += 1
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize(("mode", "recomputed_convs"), [("full", 2), ("selective", 0)])
def test_selective_keeps_convolutions_full_recomputes_them(mode: str, recomputed_convs: int) -> None:
    torch.manual_seed(0)
    block = nn.Sequential(
        nn.Conv2d(4, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.Conv2d(8, 8, 3, padding=1), nn.GELU()
    )
    ref = copy.deepcopy(block)
    m = nn.Sequential(block)
    apply(m, [(("0",), mode)])
    x = torch.randn(6, 4, 10, 10)
    out = m(x)
    counter = _ConvCounter()
    with counter:
        out.sum().backward()
    assert (
        counter.convs == recomputed_convs
    )  # convolution forwards run again in backward (backward convs differ)
    ref(x).sum().backward()
    for p, q in zip(ref.parameters(), block.parameters()):
        torch.testing.assert_close(q.grad, p.grad)
    torch.testing.assert_close(block[1].running_mean, ref[1].running_mean)


def test_measured_peak_fits_the_budget_by_an_independent_meter() -> None:
    ref = _net()
    x = torch.randn(32, 3, 32, 32)
    m = ptt.checkpoint_activations_(copy.deepcopy(ref), budget=0.75, example_inputs=x)
    plan = ptt.checkpoint_plan(m)

    def fwd_bwd(model: nn.Module) -> int:
        for p in model.parameters():
            p.grad = torch.zeros_like(p)
        return quiet_peak_memory(lambda: model(x).mean().backward()).peak_bytes

    base, got = fwd_bwd(ref), fwd_bwd(m)
    assert got <= 0.75 * base * 1.05, (got, base, str(plan))  # 5%: the allocator's run-to-run spread


def test_models_that_cannot_be_planned_say_why() -> None:
    with pytest.raises(ptt.PttError, match="requires grad"):
        frozen = nn.Sequential(nn.Linear(4, 4)).requires_grad_(False)
        ptt.checkpoint_activations_(frozen, budget=0.5, example_inputs=torch.randn(2, 4))
    with pytest.raises(ptt.PttError, match="no plan fits"):
        ptt.checkpoint_activations_(_net(), budget=1000, example_inputs=torch.randn(8, 3, 16, 16))
    with pytest.raises(ptt.PttError, match="share"):
        ptt.checkpoint_activations_(_net(), budget=1.5)
    with pytest.raises(ptt.PttError, match="drop budget_bytes"):
        ptt.checkpoint_activations_(_net(), budget=0.5, segments=2)
    m = ptt.checkpoint_activations_(_net(), budget=0.5)
    with pytest.raises(ptt.PttError, match="already"):
        ptt.checkpoint_activations_(m, budget=0.5)


def test_inplace_on_input_is_not_a_region() -> None:
    class InplaceIn(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(8, 8)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.lin(x.mul_(2))

    net = nn.Module()
    net.pre = nn.Linear(8, 8)
    net.body = InplaceIn()
    net.forward = lambda x: net.body(net.pre(x))  # type: ignore[method-assign]
    m = ptt.checkpoint_activations_(net, budget="min", example_inputs=torch.randn(4, 8))
    plan = ptt.checkpoint_plan(m)
    assert (
        "body",
        "modifies its input in place (a recomputation would start from the changed input)",
    ) in plan.skipped


def test_memory_breakdown_lists_what_the_plan_frees_region_by_region() -> None:
    x = torch.randn(16, 3, 32, 32)
    ref = _net()
    m = ptt.checkpoint_activations_(copy.deepcopy(ref), budget="min", example_inputs=x)
    got = ptt.memory_breakdown(m, x)
    base = ptt.memory_breakdown(ref, x)
    plan = ptt.checkpoint_plan(m)
    assert got.checkpoint_regions == plan.regions and got.checkpoint_regions
    assert "checkpointed:" in str(got) and plan.regions[0][0] in str(got)
    assert got.measured_peak_bytes < base.measured_peak_bytes  # the plan's saving, seen by the step's meter
    assert not base.checkpoint_regions


@pytest.mark.slow  # ~5 s alone, ~11 s beside a benchmark on 2 cores
def test_resnet18_train_mode_exact_and_within_budget() -> None:
    """torchvision's ResNet-18, BatchNorm in train mode: the stem is planned as a run, the update of one SGD step,
    the gradients and the running statistics equal the untreated model's, the measured activation peak fits."""
    tv = pytest.importorskip("torchvision")
    torch.manual_seed(0)
    ref = tv.models.resnet18(num_classes=10)
    x = torch.randn(8, 3, 64, 64)
    # 0.9: above the floor on every ISA (the stem's BatchNorm backward; measured 0.856 with AVX2 kernels)
    m = ptt.checkpoint_activations_(copy.deepcopy(ref), budget=0.9, example_inputs=x)
    plan = ptt.checkpoint_plan(m)
    assert plan.measured_peak_bytes <= 0.9 * plan.untreated_peak_bytes, str(plan)
    assert any(name.startswith("conv1..") for name, *_ in plan.regions), plan.table()  # the stem, as one run
    for model in (ref, m):
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        torch.nn.functional.cross_entropy(model(x), torch.arange(8)).backward()
        opt.step()
    for (k, a), b in zip(ref.state_dict().items(), m.state_dict().values()):
        torch.testing.assert_close(
            b, a, msg=k
        )  # weights after the update, BN running stats, num_batches_tracked


def test_a_deep_copy_of_a_planned_model_is_planned_on_its_own_modules() -> None:
    x = torch.randn(16, 3, 32, 32)
    ref = _net()
    m = ptt.checkpoint_activations_(copy.deepcopy(ref), budget="min", example_inputs=x)
    twin = copy.deepcopy(m)  # traced parents and wrapped forwards travel with the copy
    for model in (ref, twin):
        torch.manual_seed(3)
        model(x).sum().backward()
    for (name, p), q in zip(ref.named_parameters(), twin.parameters()):
        torch.testing.assert_close(q.grad, p.grad, msg=name)
    assert all(p.grad is None for p in m.parameters())  # the copy's backward did not reach the original


def test_a_module_planned_inside_a_larger_step_spends_the_steps_headroom_on_recomputation() -> None:
    """The region planner's cost model with a headroom (a detector's heads above its backbone): recomputing up to
    the headroom costs no memory, so the plan that keeps the least wins, though alone its peak is higher."""
    from pytorchtricks.tricks.loop._region_planner import Option, Region, Tree, plan_choices

    mib = 2**20
    regions = {
        "a": Region("a", "", ("a",), 100 * mib, [Option("full", 90 * mib, 100 * mib, 1.0)]),
        "b": Region("b", "", ("b",), 50 * mib, [Option("full", 50 * mib, 50 * mib, 0.5)]),
    }
    run = Region("a..b", "", ("a", "b"), 150 * mib, [Option("full", 145 * mib, 150 * mib, 1.5)])
    tree = Tree({"": ["a", "b"], "a": [], "b": []}, {"": [["a", "b"]]}, regions, {("a", "b"): run})
    alone = plan_choices(tree, 150 * mib, 0, None)[0]  # the module's own peak: keep 10, recompute 100
    assert sorted(alone.regions) == [("a", "full"), ("b", "full")]
    assert alone.modeled_peak_bytes == 110 * mib
    inside = plan_choices(tree, 150 * mib, 0, None, headroom_bytes=150 * mib)[0]
    assert inside.regions == [("a..b", "full")]  # keeps 5: under the step's 150 its 150 recomputed is free
    assert inside.modeled_peak_bytes == 155 * mib


def _frozen_bn(c: int) -> nn.Module:
    tv = pytest.importorskip("torchvision")
    bn = tv.ops.misc.FrozenBatchNorm2d(c)
    with torch.no_grad():
        bn.weight.uniform_(0.5, 1.5)
        bn.bias.uniform_(-0.5, 0.5)
        bn.running_mean.uniform_(-1, 1)
        bn.running_var.uniform_(0.5, 2)
    return bn


def _stem(kind: str) -> nn.Module:
    torch.manual_seed(0)
    conv = nn.Conv2d(3, 24, 5, stride=2, padding=2, bias=kind == "bias")
    norm = _frozen_bn(24) if kind == "frozen" else nn.BatchNorm2d(24, momentum=None)
    acts = (
        [nn.ReLU(inplace=True), nn.MaxPool2d(3, 2, 1)]
        if kind != "leaky"
        else [nn.LeakyReLU(0.1), nn.AvgPool2d(2)]
    )
    stem = nn.Sequential(conv, norm, *acts)
    if kind == "eval":
        with torch.no_grad():
            norm.running_mean.uniform_(-1, 1)
            norm.running_var.uniform_(0.5, 2)
        norm.eval()
    return stem


@pytest.mark.parametrize("kind", ["train", "eval", "frozen", "bias", "leaky", "channels_last"])
def test_channels_mode_is_the_untreated_step_bit_for_bit(kind: str) -> None:
    """A convolution on the image and per-channel modules after it, checkpointed channel slice by channel slice:
    outputs, every gradient and the BatchNorm statistics equal the untreated ones exactly (torch.equal), with
    the convolution run once more in backward, as a full checkpoint does (channels_last: a full checkpoint)."""
    ref = _stem(kind)
    if kind == "channels_last":
        ref = ref.to(memory_format=torch.channels_last)
    m = nn.Sequential(copy.deepcopy(ref))
    apply(m, [(("0",), "channels")])
    x = torch.randn(6, 3, 40, 36) * 2 + 0.5
    if kind == "channels_last":
        x = x.contiguous(memory_format=torch.channels_last)
    gy = None
    for step in range(2):  # twice: the statistics' second update starts from the first one's result
        a, b = ref(x), m(x)
        assert torch.equal(a, b)
        gy = torch.randn_like(a) if gy is None else gy * -0.5
        a.backward(gy)
        counter = _ConvCounter()
        with counter:
            b.backward(gy)
        # the convolution's output recomputed once: whole, or 2 samples at a time where that measured exact
        parts = kind != "channels_last" and any(
            v for k, v in _regions._PARTS_EXACT.items() if k[0] == x.shape
        )
        assert counter.convs == (3 if parts else 1), step
    for (name, p), q in zip(ref.named_parameters(), m[0].parameters()):
        assert torch.equal(q.grad, p.grad), name
    for (k, v), w in zip(ref.state_dict().items(), m[0].state_dict().values()):
        assert torch.equal(w, v), k


def test_channels_mode_holds_one_channel_slice_at_a_time_in_backward() -> None:
    """The backward of a ResNet-sized stem under ``channels`` brings back the convolution's output and one slice,
    where a full checkpoint brings back every activation of the stem at once."""
    torch.manual_seed(0)
    ref = nn.Sequential(
        nn.Conv2d(3, 32, 7, 2, 3, bias=False), nn.BatchNorm2d(32), nn.ReLU(True), nn.MaxPool2d(3, 2, 1)
    )
    x = torch.randn(8, 3, 96, 96)
    z = 8 * 32 * 48 * 48 * 4  # the convolution's output, bytes
    peaks = {}
    for mode in ("full", "channels"):
        m = nn.Sequential(copy.deepcopy(ref))
        apply(m, [(("0",), mode)])
        out = m(x)
        g = torch.ones_like(out)
        peaks[mode] = quiet_peak_memory(lambda m=m, out=out, g=g: out.backward(g)).peak_bytes
    # full: the conv output, the BN output (ReLU in place), the pool's indices, their gradients, all at once
    assert peaks["full"] >= 3 * z, peaks
    # channels: the conv output (reused for its own gradient), one slice, the weight gradient's workspace; at
    # least the BN output and one gradient buffer fewer
    assert peaks["channels"] <= peaks["full"] - 1.5 * z, peaks


@pytest.mark.parametrize(
    ("modules", "why"),
    [
        ([nn.Conv2d(3, 8, 3, groups=1), nn.Dropout(0.1)], "dropout draws random numbers per element"),
        (
            [nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.SiLU()],
            "exp: a slice may round otherwise than the whole",
        ),
        ([nn.Conv2d(4, 8, 3, groups=2), nn.ReLU()], "a grouped convolution"),
        ([nn.Conv2d(3, 8, 3), nn.Conv2d(8, 8, 1)], "a second convolution mixes channels"),
        ([nn.BatchNorm2d(3), nn.ReLU()], "no convolution first"),
        ([nn.Conv2d(3, 8, 3, padding="same"), nn.ReLU()], "padding given as a string"),
    ],
)
def test_channel_chain_refuses_what_a_channel_slice_would_change(modules: list[nn.Module], why: str) -> None:
    assert channel_chain(modules) is None, why
    assert channel_chain([nn.Sequential(nn.Conv2d(3, 8, 3), nn.Sequential(nn.BatchNorm2d(8), nn.ReLU()))])


def test_channels_mode_falls_back_to_a_full_checkpoint_when_its_input_needs_a_gradient() -> None:
    ref = _stem("train")
    m = nn.Sequential(copy.deepcopy(ref))
    apply(m, [(("0",), "channels")])
    xa = (torch.randn(4, 3, 24, 24)).requires_grad_()
    xb = xa.detach().clone().requires_grad_()
    ref(xa).square().sum().backward()
    m(xb).square().sum().backward()
    assert torch.equal(xa.grad, xb.grad)
    for p, q in zip(ref.parameters(), m[0].parameters()):
        assert torch.equal(q.grad, p.grad)


def test_resnet18_at_half_its_activation_peak_exactly() -> None:
    """torchvision ResNet-18, BatchNorm in train mode, budget 50%: the stem is planned channel slice by channel
    slice (its backward held the step's peak), the measured peak fits and the update equals the untreated one."""
    tv = pytest.importorskip("torchvision")
    torch.manual_seed(0)
    ref = tv.models.resnet18(num_classes=10)
    x = torch.randn(16, 3, 96, 96)  # (the lowest measured peak: 36% here, 39% at batch 64 and 128 px)
    m = ptt.checkpoint_activations_(copy.deepcopy(ref), budget=0.5, example_inputs=x)
    plan = ptt.checkpoint_plan(m)
    assert plan.measured_peak_bytes <= 0.5 * plan.untreated_peak_bytes, plan.table()
    assert ("conv1..maxpool", "channels") in [(n, mode) for n, mode, *_ in plan.regions], plan.table()
    for model in (ref, m):
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        torch.nn.functional.cross_entropy(model(x), torch.arange(16) % 10).backward()
        opt.step()
    for (k, a), b in zip(ref.state_dict().items(), m.state_dict().values()):
        assert torch.equal(b, a), k


def test_channels_mode_under_autocast_is_the_untreated_autocast_step_bit_for_bit() -> None:
    """Under CPU autocast (bf16) the recomputation runs under the forward's autocast too: the convolution in bf16,
    its weight's gradient through the same cast - equal to the untreated autocast step."""
    ref = _stem("train")
    m = nn.Sequential(copy.deepcopy(ref))
    apply(m, [(("0",), "channels")])
    x = torch.randn(4, 3, 32, 32)
    outs = []
    for model in (ref, m):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = model(x)
        out.float().square().mean().backward()
        outs.append(out)
    assert outs[0].dtype == torch.bfloat16 and torch.equal(outs[0], outs[1])
    for (name, p), q in zip(ref.named_parameters(), m[0].parameters()):
        assert torch.equal(q.grad, p.grad), name


def test_channels_mode_recomputes_in_parts_only_where_the_parts_measured_exact(monkeypatch) -> None:
    """The stem's convolution is recomputed a few samples at a time only where ``parts_exact`` found the parts
    equal to the whole (checked on the forward's values): a library whose kernel for a part rounds differently
    (a part off by 1e-6 here) gets the whole convolution again, and the gradients stay the untreated ones."""
    import torch.nn.functional as F

    conv2d = F.conv2d

    def off_in_parts(x, w, *args, **kwargs):  # type: ignore[no-untyped-def]
        out = conv2d(x, w, *args, **kwargs)
        return out + 1e-6 if x.shape[0] < 7 else out

    ref = _stem("train")
    x = torch.randn(7, 3, 30, 30)
    for off in (False, True):
        monkeypatch.setattr(_regions, "_PARTS_EXACT", {})
        if off:
            monkeypatch.setattr(F, "conv2d", off_in_parts)
        m = nn.Sequential(copy.deepcopy(ref))
        apply(m, [(("0",), "channels")])
        b = m(x)
        counter = _ConvCounter()
        with counter:
            b.backward(torch.ones_like(b))
        assert list(_regions._PARTS_EXACT.values()) == [not off]
        assert counter.convs == (1 if off else 4)  # 7 samples: parts of 2, 2, 2, 1
        monkeypatch.setattr(F, "conv2d", conv2d)
    r = copy.deepcopy(ref)
    r(x).backward(torch.ones_like(b))
    for (name, p), q in zip(r.named_parameters(), m[0].parameters()):
        assert torch.equal(q.grad, p.grad), name


def test_nested_blocks_are_the_untreated_step_bit_for_bit_and_hold_less() -> None:
    """``nested``: a residual block checkpointed whole, its convolution -> BatchNorm pairs checkpointed again
    inside the recomputation. Two SGD steps (BatchNorm in train mode, statistics updated once) equal the
    untreated ones bit for bit, and the block's backward holds less than under a plain full checkpoint."""
    tv = pytest.importorskip("torchvision")
    torch.manual_seed(0)
    ref = tv.models.resnet18(num_classes=10)
    x = torch.randn(8, 3, 64, 64)
    tree = build_tree(ref, probe(ref, (x,), {}))
    opt = next(o for o in tree.regions["layer1.0"].options if o.mode == "nested")
    assert opt.inner == (("layer1.0.conv1", "layer1.0.bn1"), ("layer1.0.conv2", "layer1.0.bn2"))
    ref, x = ref.layer1, torch.randn(8, 64, 16, 16)  # two blocks alone: their backward is the peak
    blocks = ("0", "1")
    plans = {
        "full": [((b,), "full") for b in blocks],
        "nested": [
            *[((f"{b}.conv{i}", f"{b}.bn{i}"), "full") for b in blocks for i in (1, 2)],
            *[((b,), "full") for b in blocks],
        ],
    }
    peaks = {}
    for name, plan in plans.items():
        probe_copy = copy.deepcopy(ref)
        apply(probe_copy, plan)
        peaks[name] = fwd_bwd_peak(probe_copy, (x,), {})[0]
        m = copy.deepcopy(ref)
        apply(m, plan)
        models = (copy.deepcopy(ref), m)
        for model in models:
            opt_ = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
            for step in range(2):
                opt_.zero_grad()
                model(x * (step + 1)).square().mean().backward()
                opt_.step()
        for (k, a), b in zip(models[0].state_dict().items(), models[1].state_dict().values()):
            assert torch.equal(b, a), (name, k)
        unapply(m)
        assert all("forward" not in mod.__dict__ for mod in m.modules())  # every wrapper taken off
    assert peaks["nested"] < peaks["full"], peaks


def test_the_lowest_peak_search_nests_big_blocks_and_lightens_within_the_target(monkeypatch) -> None:
    """The measured search after the modeled lowest plan: ``_finer`` nests the blocks whose full recomputation is
    at least half the largest one's (inside a full region of several), ``_lighter`` then takes back, one measured
    step at a time, what does not lower the peak below the target - a nested block made full, a full one left
    alone - and keeps every step whose measured peak stays within it. Measured peaks come from a table here."""
    from pytorchtricks.tricks.loop import _tree_checkpoint as tc
    from pytorchtricks.tricks.loop._region_planner import Option, Region, Tree

    mib = 2**20

    def block(name: str, transient: int) -> Region:
        return Region(name, "s", (name,), 0, [
            Option("full", 40 * mib, transient * mib, 0.04),
            Option("nested", 40 * mib, transient * mib // 2, 0.08, ((f"{name}.c", f"{name}.b"),)),
        ])  # fmt: skip

    regions = {"s": Region("s", "", ("s",), 0, [Option("full", 200 * mib, 300 * mib, 0.2)])}
    regions |= {n: block(n, t) for n, t in (("s.0", 64), ("s.1", 60), ("s.2", 20))}
    tree = Tree({"": ["s"], "s": ["s.0", "s.1", "s.2"], "s.0": [], "s.1": [], "s.2": []}, {}, regions, {})
    finer = tc._finer(tree, [("s", "full")])
    assert finer == [("s.0", "nested"), ("s.1", "nested"), ("s.2", "full")]  # 20 < 64 / 2: left full

    def peak_of(plan: list[tuple[str, str]]) -> int:  # s.0 must stay nested, s.1 be checkpointed, s.2 +2 MiB
        got = dict(plan)
        return (
            100 + 30 * (got.get("s.0") != "nested") + 8 * ("s.1" not in got) + 2 * ("s.2" not in got)
        ) * mib

    applied: list[list[tuple[str, str]]] = []
    monkeypatch.setattr(tc, "_apply", lambda model, tree, choice: applied.append(choice.regions))
    monkeypatch.setattr(tc, "unapply", lambda model: None)
    start = tc.choice_of(tree, finer, 300 * mib, 0)
    for budget, want in (
        (
            None,
            [("s.0", "nested"), ("s.1", "full"), ("s.2", "full")],
        ),  # the same 100 MiB, s.1 no longer nested
        (105 * mib, [("s.0", "nested"), ("s.1", "full")]),  # and s.2 left alone: 102 fits the budget
    ):
        applied.clear()
        plan, peak = tc._lighter(
            None,  # type: ignore[arg-type]
            tree,
            start,
            peak_of(finer),
            (300 * mib, 0, 0),
            budget,
            lambda: peak_of(applied[-1]),
        )
        assert (plan.regions, peak) == (want, peak_of(want))
        assert len(applied) == 4  # every step measured once: s.1 full, s.2 alone, s.0 full, s.1 alone
