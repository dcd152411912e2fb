"""The rules of ``ptt lint``: each a check ``(LintContext) -> list[Finding]`` registered in ``RULES`` by
``@rule(id, name, fix=...)`` - its id and name stated once there (its findings are ``found(...)``, stamped with
them), its safe fix beside it.

Costs are estimates from shapes (bytes of memory traffic per forward, parameter bytes) unless a finding says
``measured``; ShuffleNetV2's guidelines G1-G4 (Ma et al. 2018) and TRT-ViT's stage rule (Xia et al. 2022) are
stated as memory-access-cost arithmetic, never as a speed promise (``ptt lint --measure`` times them here).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from pytorchtricks.analysis._probe import ModuleTracker, display
from pytorchtricks.analysis.flops import FlopReport

_CONV = (nn.Conv1d, nn.Conv2d, nn.Conv3d)
MiB = 2**20
G4_ELEMENTWISE_SHARE = 0.33  # fire when element-wise ops move over a third of all bytes (ShuffleNetV2: ~0.18)
G1_EXCESS_SHARE = 0.10  # fire when a 1x1 conv moves >10% more feature-map bytes than the balanced one
G3_MIN_BRANCHES = 3  # fire when one tensor feeds this many parallel compute branches
ATTENTION_MAX_TOKENS = (
    1024  # TRT-ViT: attention at >= 32x32 tokens belongs in a later, lower-resolution stage
)


@dataclass
class Finding:
    """One finding - of a lint rule or of tune's diagnosis (one type for both): id and name (one id per concept:
    ``PTL...`` lint rules, ``PTD...`` the diagnosis' own), where, what it costs, and how to fix it."""

    id: str
    name: str
    location: str
    message: str
    cost: str
    fix: str
    fixable: bool = False
    severity: str = "warn"  # warn | info
    cost_bytes: int = 0  # estimated bytes (memory traffic per forward, or parameter bytes): for sorting
    measured: str = ""
    source: str = "ptt.lint"  # who found it: ptt.lint, or tune's own diagnosis ("tune", "ptt.doctor_data")

    def line(self) -> str:
        m = f" measured: {self.measured}." if self.measured else ""
        auto = " [--fix]" if self.fixable else ""
        return f"{self.id} {self.name} at {display(self.location)}: {self.message} Cost: {self.cost}.{m} Fix: {self.fix}{auto}"


@dataclass
class LintContext:
    """Everything the rules read, gathered once by ``lint``."""

    model: nn.Module
    args: tuple[Any, ...]
    phase: str
    flops: FlopReport
    tracker: ModuleTracker
    graph: Any  # torch.fx.Graph or None when the model does not trace
    trace_error: str = ""
    modules: dict[str, nn.Module] = field(default_factory=dict)
    grouped_conv_inputs_channels_last: set[str] = field(default_factory=set)
    no_grad_params: list[str] | None = None  # None: not probed
    # the batch the model runs at when ``args`` is a smaller probe (None: the probe's own batch); costs per
    # forward scale with it, so findings describe the user's workload, never the probe
    batch_size: int | None = None

    @property
    def probe_batch(self) -> int | None:
        x = next((a for a in self.args if isinstance(a, torch.Tensor) and a.dim() > 0), None)
        return int(x.shape[0]) if x is not None else None

    @property
    def batch(self) -> int | None:
        """The batch findings are stated for: the workload's when given, else the example's."""
        return self.batch_size or self.probe_batch

    def per_forward(self, probe_bytes: float) -> int:
        """Bytes per forward at ``batch`` from bytes measured on the probe (activation traffic is linear in it)."""
        probe = self.probe_batch
        scale = self.batch_size / probe if self.batch_size and probe else 1.0
        return int(probe_bytes * scale)

    def out_shape(self, path: str) -> tuple[int, ...] | None:
        outs = self.tracker.call_outputs.get(path)
        return outs[0][0] if outs and outs[0] else None

    def in_shape(self, path: str) -> tuple[int, ...] | None:
        ins = self.tracker.call_inputs.get(path)
        return ins[0][0] if ins and ins[0] else None

    def itemsize(self) -> int:
        t = next((a for a in self.args if isinstance(a, torch.Tensor) and a.is_floating_point()), None)
        return t.element_size() if t is not None else 4


Check = Callable[[LintContext], list[Finding]]
Fix = Callable[[nn.Module, Any], tuple[list[str], list[str]]]  # (model, LintReport) -> (applied, skipped)


@dataclass(frozen=True)
class Rule:
    """One lint rule: its id and name (stated once, here), its check, and its safe fix when it has one."""

    id: str
    name: str
    check: Check
    fix: Fix | None = None


RULES: dict[str, Rule] = {}


def rule(rule_id: str, name: str, fix: Fix | None = None) -> Callable[[Check], Check]:
    """Register a check under ``rule_id``/``name``. It returns ``found(...)`` findings, which get the rule's id and
    name when ``lint`` runs it (``stamp``); ``fix(model, report)`` applies its safe fix (``apply_lint_fixes_``)."""

    def register(fn: Check) -> Check:
        RULES[rule_id] = Rule(rule_id, name, fn, fix)
        return fn

    return register


def found(location: str, message: str, cost: str, fix: str, **kw: Any) -> Finding:
    """A finding of the rule that returns it (its id and name are filled in by ``stamp``)."""
    return Finding("", "", location, message, cost, fix, **kw)


def stamp(r: Rule, findings: list[Finding]) -> list[Finding]:
    for f in findings:
        f.id, f.name = r.id, r.name
    return findings


def _fix_conv_bias(model: nn.Module, report: Any) -> tuple[list[str], list[str]]:
    biased = report.where("PTL001")
    if not biased:
        return [], []
    from pytorchtricks.tricks.model.remove_conv_bias_before_bn import remove_conv_bias_before_bn_

    remove_conv_bias_before_bn_(model)
    return [f"PTL001 remove_conv_bias_before_bn_: bias removed from {', '.join(biased)}"], []


def _fix_reused(model: nn.Module, report: Any) -> tuple[list[str], list[str]]:
    reused = [f for f in report.findings if f.id == "PTL010"]
    if not reused:
        return [], []
    if not all(f.fixable for f in reused):
        return [], [
            "PTL010: a reused module holds weights; unsharing would untie them (do it by hand if meant)"
        ]
    from pytorchtricks.tricks.model.unshare_modules import unshare_modules_

    unshare_modules_(model)
    return [
        f"PTL010 unshare_modules_: {', '.join(f.location for f in reused)} get one copy per call site"
    ], []


def _fix_inplace(model: nn.Module, report: Any) -> tuple[list[str], list[str]]:
    """PTL012's fix; also after PTL010's (unsharing a reused ReLU can make its calls safe to run in place)."""
    if not (report.where("PTL012") or report.where("PTL010")):
        return [], []
    from pytorchtricks.tricks.model.inplace_activations import inplace_activations_, safe_inplace_candidates

    paths = safe_inplace_candidates(model)
    if not paths:
        return [], []
    inplace_activations_(model)
    return [f"PTL012 inplace_activations_: {', '.join(paths)} now inplace=True"], []


def fmt_bytes(n: float) -> str:
    if n >= 0.01 * MiB:
        return f"{n / MiB:.2f} MiB"
    return f"{n / 1024:.1f} KiB" if n >= 1024 else f"{int(n)} B"


@rule("PTL001", "conv-bias-before-bn", fix=_fix_conv_bias)
def conv_bias_before_bn(ctx: LintContext) -> list[Finding]:
    from pytorchtricks.tricks.graph import conv_bn_links

    out: list[Finding] = []
    for lk in conv_bn_links(ctx.model):
        conv, bias = lk.first, getattr(lk.first, "bias", None)
        if not isinstance(bias, torch.Tensor):
            continue
        shape = ctx.out_shape(lk.first_name)
        traffic = (
            ctx.per_forward(2 * math.prod(shape) * ctx.itemsize()) if shape else 0
        )  # bias add: read + write
        out.append(
            found(
                lk.first_name,
                f"{type(conv).__name__} has a bias but feeds only {lk.second_name} (BatchNorm), which subtracts "
                "the channel mean and cancels it.",
                f"{bias.numel()} useless parameters and a bias add over the output "
                f"(~{fmt_bytes(traffic)} traffic per forward)",
                "ptt.remove_conv_bias_before_bn_(model) (exact: bias folded into running_mean), or bias=False",
                fixable=True,
                cost_bytes=traffic,
            )
        )
    return out


def _input_fed(ctx: LintContext) -> set[str]:
    """Modules whose input is a model input (their in-channels are the data's, e.g. RGB)."""
    fed: set[str] = set()
    if ctx.graph is not None:
        for node in ctx.graph.nodes:
            if node.op == "call_module" and any(getattr(a, "op", "") == "placeholder" for a in node.args):
                fed.add(node.target)
    else:
        for path, m in ctx.modules.items():
            if isinstance(m, _CONV) and m.in_channels <= 4:
                fed.add(path)
    return fed


def _output_layers(ctx: LintContext) -> set[str]:
    """Convs/Linears whose output is the model's output (a classifier's logits, a head's channels), possibly
    through ops that keep the width (log_softmax, flatten, dropout, ...): their width is the task's, not a choice.

    From the traced graph, walking back from the output to the nearest conv/linear on every path; untraced, the
    last conv/linear that ran whose width equals the model output's.
    """
    layers = (*_CONV, nn.Linear)
    found: set[str] = set()
    if ctx.graph is not None:
        out_node = next((n for n in ctx.graph.nodes if n.op == "output"), None)
        todo = list(out_node.all_input_nodes) if out_node is not None else []
        seen: set[Any] = set()
        while todo:
            node = todo.pop()
            if node in seen:
                continue
            seen.add(node)
            if node.op == "call_module" and isinstance(ctx.modules.get(node.target), layers):
                found.add(str(node.target))
            elif node.op != "placeholder":
                todo.extend(node.all_input_nodes)
        return found
    model_out = ctx.out_shape("")
    width = model_out[1] if model_out and len(model_out) > 1 else None
    ran = [
        p for p in ctx.tracker.call_outputs if isinstance(ctx.modules.get(p), layers)
    ]  # in order of running
    for path in reversed(ran):
        shape = ctx.out_shape(path)
        if shape and len(shape) > 1 and shape[1] == width:
            found.add(path)
            break
    return found


def _pad8(c: int, keep: bool) -> int:
    return c if keep else math.ceil(c / 8) * 8


@rule("PTL002", "channels-not-multiple-of-8")
def channels_not_multiple_of_8(ctx: LintContext) -> list[Finding]:
    out: list[Finding] = []
    fed = _input_fed(ctx)
    heads = _output_layers(ctx)  # a 10-class output layer is not a finding: the task fixes its width
    for path, m in ctx.modules.items():
        if ctx.tracker.calls.get(path, 0) == 0:
            continue
        if isinstance(m, _CONV):
            c_in, c_out, kind = m.in_channels, m.out_channels, "channels"
        elif isinstance(m, nn.Linear):
            c_in, c_out, kind = m.in_features, m.out_features, "features"
        else:
            continue
        bad = [f"out {c_out}"] if c_out % 8 and path not in heads else []
        if c_in % 8 and path not in fed:
            bad.insert(0, f"in {c_in}")
        if not bad:
            continue
        padded = _pad8(c_in, path in fed) * _pad8(c_out, path in heads)
        waste = 1 - (c_in * c_out) / padded if padded else 0.0
        widths = [c for c, keep in ((c_in, path in fed), (c_out, path in heads)) if not keep and c % 8]
        out.append(
            found(
                path,
                f"{type(m).__name__} {kind} {', '.join(bad)} are not multiples of 8: tensor cores and vector units "
                "work on blocks of 8 (fp16/bf16) and pad or fall back to slower kernels.",
                f"up to {waste:.0%} of this layer's math is padding",
                f"round {kind} to a multiple of 8 (e.g. {math.ceil(max(widths) / 8) * 8})",
                severity="info" if c_out < 8 else "warn",
            )
        )
    return out


@rule("PTL003", "batch-not-multiple-of-8")
def batch_not_multiple_of_8(ctx: LintContext) -> list[Finding]:
    b = ctx.batch
    if b is None or b <= 1 or b % 8 == 0:
        return []
    return [
        found(
            "(input)",
            f"batch size {b} is not a multiple of 8, so matmul/conv tiles over the batch are partly empty.",
            f"up to {1 - b / (math.ceil(b / 8) * 8):.0%} of tile work wasted",
            f"use batch {' or '.join(str(c) for c in sorted({math.ceil(b / 8) * 8, max(8, b // 8 * 8)}))}; "
            "ptt.find_batch_size picks the fastest that fits",
        )
    ]


@rule("PTL004", "g1-unequal-channels")
def g1_unequal_channels(ctx: LintContext) -> list[Finding]:
    out: list[Finding] = []
    for path, m in ctx.modules.items():
        shape = ctx.out_shape(path)
        if not isinstance(m, nn.Conv2d) or m.kernel_size != (1, 1) or m.groups != 1 or shape is None:
            continue
        c1, c2 = m.in_channels, m.out_channels
        n, hw = shape[0], shape[-1] * shape[-2]
        feature = hw * (c1 + c2)  # ShuffleNetV2: MAC = hw(c1 + c2) + c1*c2 elements per sample
        balanced = 2 * hw * math.sqrt(c1 * c2)  # same FLOPs with c1 = c2 = sqrt(c1*c2)
        excess = feature - balanced
        if excess / (feature + c1 * c2) < G1_EXCESS_SHARE:
            continue
        nbytes = ctx.per_forward(excess * n * ctx.itemsize())
        out.append(
            found(
                path,
                f"1x1 conv {c1}->{c2} channels (ratio {max(c1, c2) / min(c1, c2):.1f}); equal widths minimise "
                "memory access at equal FLOPs (ShuffleNetV2 G1).",
                f"{fmt_bytes(nbytes)} more feature-map traffic per forward than a {round(math.sqrt(c1 * c2))}->"
                f"{round(math.sqrt(c1 * c2))} conv of the same FLOPs ({excess / feature:.0%})",
                "keep 1x1 conv input and output widths close (bottlenecks trade this for FLOPs: measure)",
                severity="info",
                cost_bytes=nbytes,
            )
        )
    return out


@rule("PTL005", "g2-group-conv")
def g2_group_conv(ctx: LintContext) -> list[Finding]:
    out: list[Finding] = []
    for path, m in ctx.modules.items():
        shape = ctx.out_shape(path)
        if not isinstance(m, _CONV) or m.groups == 1 or m.groups == m.in_channels or shape is None:
            continue
        g, c2 = m.groups, m.out_channels
        n, spatial = shape[0], math.prod(shape[2:])
        # at equal FLOPs a dense conv has c2/g outputs: MAC excess = spatial * c2 * (1 - 1/g) elements per sample
        nbytes = ctx.per_forward(n * spatial * c2 * (1 - 1 / g) * ctx.itemsize())
        out.append(
            found(
                path,
                f"grouped conv with {g} groups ({m.in_channels}->{c2}): more groups raise memory access at equal "
                "FLOPs (ShuffleNetV2 G2).",
                f"{fmt_bytes(nbytes)} more output traffic per forward than a dense conv of the same FLOPs",
                "use fewer groups (or a depthwise + 1x1 pair) and measure with `ptt lint --measure`",
                cost_bytes=nbytes,
            )
        )
    return out


_BRANCH_MODULES = (*_CONV, nn.Linear, nn.MaxPool2d, nn.AvgPool2d, nn.Sequential, nn.MultiheadAttention)


@rule("PTL006", "g3-fragmentation")
def g3_fragmentation(ctx: LintContext) -> list[Finding]:
    out: list[Finding] = []
    if ctx.graph is None:
        return out
    for node in ctx.graph.nodes:
        branches = [
            u
            for u in node.users
            if (u.op == "call_module" and not _is_elementwise_module(ctx.modules.get(u.target)))
            or (
                u.op == "call_function"
                and getattr(u.target, "__name__", "") in ("conv2d", "linear", "max_pool2d", "avg_pool2d")
            )
        ]
        if len(branches) < G3_MIN_BRANCHES:
            continue
        stacks = [list((u.meta.get("nn_module_stack") or {}).keys()) for u in branches]
        common = _common_prefix(stacks)
        where = common[-1] if common else ""
        out.append(
            found(
                where,
                f"one tensor feeds {len(branches)} parallel branches ({', '.join(str(b.target) for b in branches[:5])}): "
                "many small ops launch and synchronise separately (ShuffleNetV2 G3).",
                f"{len(branches)} kernels where 1-2 wide ones would do the same work",
                "merge parallel branches into fewer, wider ops (one conv with concatenated output channels)",
                severity="info",
            )
        )
    return out


def _is_elementwise_module(m: nn.Module | None) -> bool:
    return m is None or not isinstance(m, _BRANCH_MODULES)


def _common_prefix(lists: list[list[str]]) -> list[str]:
    if not lists:
        return []
    out: list[str] = []
    for items in zip(*lists):
        if all(i == items[0] for i in items):
            out.append(items[0])
        else:
            break
    return out


@rule("PTL007", "g4-elementwise-traffic")
def g4_elementwise_traffic(ctx: LintContext) -> list[Finding]:
    # the share is the probe's: weight reads do not grow with the batch, so at a larger batch it is if anything
    # higher; the bytes are scaled to the workload's batch
    total = ctx.flops.bytes
    ew = ctx.flops.bytes_by_category.get("elementwise", 0)
    if not total or ew / total < G4_ELEMENTWISE_SHARE:
        return []
    top = sorted(
        (r for r in ctx.flops.layers if r.bytes_by_category.get("elementwise", 0)),
        key=lambda r: -r.bytes_by_category.get("elementwise", 0),
    )[:3]
    return [
        found(
            "",
            f"element-wise ops (activations, adds, bias) move {ew / total:.0%} of all bytes for "
            f"{ctx.flops.flops_by_category.get('elementwise', 0) / max(ctx.flops.flops, 1):.1%} of the FLOPs "
            f"(ShuffleNetV2 G4); largest at {', '.join(display(r.path) for r in top)}.",
            f"{fmt_bytes(ctx.per_forward(ew))} of element-wise memory traffic per forward",
            "fuse element-wise ops into the producing kernel (torch.compile, ptt.fuse_conv_bn_ for inference) "
            "and drop activations/adds that do not help accuracy",
            severity="info",
            cost_bytes=ctx.per_forward(ew),
        )
    ]


@rule("PTL008", "attention-high-resolution")
def attention_high_resolution(ctx: LintContext) -> list[Finding]:
    out: list[Finding] = []
    seen: set[str] = set()
    for op in ctx.flops.ops:
        tokens = op.get("tokens", 0)
        if tokens < ATTENTION_MAX_TOKENS or op["module"] in seen:
            continue
        seen.add(op["module"])
        score_bytes = ctx.per_forward(op.get("score_elements", 0) * ctx.itemsize())
        out.append(
            found(
                op["module"],
                f"attention over {tokens} tokens: its cost grows with tokens^2; TRT-ViT puts convolution in the "
                "early high-resolution stages and attention in the late ones.",
                f"attention scores of {fmt_bytes(score_bytes)} per forward",
                "move attention blocks after downsampling (or use windowed/local attention at high resolution)",
                cost_bytes=score_bytes,
            )
        )
    return out


@rule("PTL009", "unused-parameters")
def unused_parameters(ctx: LintContext) -> list[Finding]:
    if ctx.no_grad_params is None:
        return []
    owners: dict[str, list[str]] = {}
    for name in ctx.no_grad_params:
        owner, _, leaf = name.rpartition(".")
        owners.setdefault(owner, []).append(leaf)
    out: list[Finding] = []
    params = dict(ctx.model.named_parameters())
    for owner, leaves in owners.items():
        nbytes = sum(params[f"{owner}.{leaf}" if owner else leaf].nbytes for leaf in leaves)
        out.append(
            found(
                owner,
                f"parameter(s) {', '.join(leaves)} require grad but get no gradient from the loss.",
                f"{fmt_bytes(nbytes)} of weights plus their optimizer state; DDP needs find_unused_parameters=True "
                "(an extra graph walk every step)",
                "delete the unused module or call requires_grad_(False) on it",
                cost_bytes=nbytes,
            )
        )
    return out


@rule("PTL010", "module-reused", fix=_fix_reused)
def module_reused(ctx: LintContext) -> list[Finding]:
    out: list[Finding] = []
    for path, calls in ctx.tracker.calls.items():
        m = ctx.modules.get(path)
        if not path or calls < 2 or m is None:
            continue
        stateful = any(True for _ in m.parameters()) or any(True for _ in m.buffers())
        out.append(
            found(
                path,
                f"{type(m).__name__} instance is called at {calls} sites per forward"
                + (" and holds weights (weight sharing: intended?)" if stateful else "")
                + "; fusion, quantization observers and export treat one instance as one site.",
                "blocks conv-bn-relu fusion and PT2E quantization of the other sites",
                "ptt.unshare_modules_(model)" + (" (unties the shared weights)" if stateful else " (exact)"),
                fixable=not stateful,
                severity="info" if stateful else "warn",
            )
        )
    return out


@rule("PTL011", "data-parallel")
def data_parallel(ctx: LintContext) -> list[Finding]:
    return [
        found(
            path,
            "nn.DataParallel runs one Python thread per GPU, scatters inputs and gathers outputs on GPU 0 every step.",
            "GPU 0 bottleneck and GIL contention; slower than DDP even on one node",
            "use torch.nn.parallel.DistributedDataParallel (one process per GPU, torchrun)",
        )
        for path, m in ctx.modules.items()
        if isinstance(m, nn.DataParallel)
    ]


@rule("PTL012", "inplace-activation", fix=_fix_inplace)
def inplace_activation(ctx: LintContext) -> list[Finding]:
    if ctx.graph is None:
        return []
    from pytorchtricks.tricks.model.inplace_activations import safe_inplace_candidates

    out: list[Finding] = []
    for path in safe_inplace_candidates(ctx.model):
        shape = ctx.out_shape(path)
        nbytes = ctx.per_forward(math.prod(shape) * ctx.itemsize()) if shape else 0
        out.append(
            found(
                path,
                f"{type(ctx.modules[path]).__name__}(inplace=False) whose input is used by nothing else.",
                f"one extra tensor of {fmt_bytes(nbytes)} allocated per call",
                "ptt.inplace_activations_(model) (exact), or inplace=True",
                fixable=True,
                severity="info",
                cost_bytes=nbytes,
            )
        )
    return out


@rule("PTL013", "grouped-conv-channels-last")
def grouped_conv_channels_last(ctx: LintContext) -> list[Finding]:
    out: list[Finding] = []
    for path, m in ctx.modules.items():
        if not isinstance(m, nn.Conv2d) or m.groups == 1:
            continue
        w = m.weight
        weight_cl = w.is_contiguous(memory_format=torch.channels_last) and not w.is_contiguous()
        if weight_cl or path in ctx.grouped_conv_inputs_channels_last:
            kind = "depthwise" if m.groups == m.in_channels else "grouped"
            out.append(
                found(
                    path,
                    f"{kind} conv ({m.groups} groups) runs in channels_last; several backends have slow NHWC "
                    "grouped/depthwise kernels.",
                    "can be several times slower than NCHW on some backends (measure)",
                    "benchmark this layer in both formats (`ptt bench to_channels_last`); keep grouped convs NCHW if slower",
                    severity="info",
                )
            )
    return out


@rule("PTL014", "train-mode-inference")
def train_mode_inference(ctx: LintContext) -> list[Finding]:
    if ctx.phase != "infer":
        return []
    hits = [
        p
        for p, m in ctx.modules.items()
        if m.training and isinstance(m, nn.modules.batchnorm._BatchNorm | nn.Dropout)
    ]
    if not hits:
        return []
    return [
        found(
            "",
            f"the model is in training mode for inference: {len(hits)} BatchNorm/Dropout module(s) (e.g. "
            f"{', '.join(hits[:3])}) use batch statistics and random masks.",
            "wrong, non-deterministic outputs and BN running statistics overwritten by inference data",
            "call model.eval() and run inference under torch.inference_mode()",
        )
    ]
