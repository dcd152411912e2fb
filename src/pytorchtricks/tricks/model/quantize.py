"""Quantize a model for CPU inference through one facade: static int8, dynamic int8, QAT, bf16/fp16 weights.

Why: int8 conv/matmul on x86 with VNNI runs several times faster than fp32 (ResNet-18 at 160 px, 1 thread, Zen 4:
PT2E int8 as a oneDNN plan (``engine="onednn"``) 6.58x / 5.08x at batch 1 / 8, 1.17-1.36x ONNX Runtime static
int8, 35.3 dB SQNR; bf16 2.90x / 2.41x; results/avx512_bf16/inference_cpu.md, int8_breakdown.md; Linear-heavy MLPs:
dynamic int8 5.1-5.5x per ANCHORS). The backends churn (PT2E moved to torchao; eager/FX deprecated): this picks the
one that works.
When: CPU inference of CNNs (``"int8"``: PT2E with torchao's X86InductorQuantizer when installed, FX otherwise,
calibrated on ``example_inputs`` or ``calibration=``), Linear/LSTM-heavy models (``"int8_dynamic"``), models that lose
accuracy under PTQ (``"qat"`` then ``"qat_convert"``), or a cheap first step (``"bf16"``/``"fp16"``).
Caveats: always use the return value (a ``Quantized`` module; int8 and QAT work on a copy with reused modules
unshared, your model is not changed). Without VNNI (AVX2-only CPUs, or ``ONEDNN_MAX_CPU_ISA=AVX2``) the u8 x s8
kernels add pairs of products into int16 and saturate (8-bit activations and weights: 30.3 dB on ResNet-18), so
PT2E static int8 balances the bits instead (``q.int8_ranges == "balanced"``, ``q.reduce_range_reason`` says so):
each conv/linear input gets 0..127 to 0..255 and its weights what is left (2 x act x weight <= 32767: exact sums),
chosen by that layer's own output error on the calibration batches, with MSE weight ranges and bias correction -
36.4 dB on Zen 3 vs 31.7 dB with 7-bit activations everywhere (results/avx2/int8_no_vnni.md). With VNNI nothing
changes: 8 bits everywhere. A safety check runs by default: SQNR vs the float
model (default floors 20 dB int8, 25 dB bf16, 40 dB fp16), and the caller's inputs must be unchanged - with
freezing, the x86 int8 lowering of ``x + Linear(x)`` writes into the caller's input (oneDNN in-place sum): the check
raises, pass ``clone_inputs=True``. RepVGG-style nets and depthwise convs lose most under int8 (check the SQNR).
Dynamic int8 on CNNs is slower (0.34-0.50x): not offered.
See also: fuse_conv_bn, reparameterize, export_onnx, quantize_lowbit, unshare_modules, 推理加速 / 量化.
"""

from __future__ import annotations

import copy
import dataclasses
import os
import warnings
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from pytorchtricks.core import BenchCase, NoEffectWarning, PttError, TrickInfo, require
from pytorchtricks.tricks._cases import inference_case
from pytorchtricks.tunable import TuneHook, TuneSetup

__all__ = ["quantize", "QuantConfig", "Quantized"]

TRICK = TrickInfo(gains=("speed", "memory"), phase=("infer",), exact=False, needs=("infer",))


def _tune_apply(setup: TuneSetup, state: object) -> None:
    # FX int8 without torch.compile: PT2E's int8 kernels need minutes of compilation on a CPU
    setup.forward = quantize(setup.model.eval(), (setup.example,), QuantConfig(backend="fx", engine="eager"))


TUNE = TuneHook(
    changes="step",
    check="approximate",
    receipt="model = ptt.quantize(model.eval(), (example_batch,))  # int8; check its SQNR on your data",
    apply=_tune_apply,
    order=75,
    bound="outputs >= 20 dB SQNR vs fp32",
)

MODES = ("int8", "int8_dynamic", "qat", "qat_convert", "bf16", "fp16")
DEFAULT_MIN_SQNR_DB = {"int8": 20.0, "int8_dynamic": 20.0, "qat_convert": 20.0, "bf16": 25.0, "fp16": 40.0}


class Quantized(nn.Module):
    """What ``quantize`` returns: the quantized callable, how it was built, and its safety report.

    Calls run under ``torch.no_grad()``; with ``freezing`` inside inductor's freezing config (so a recompile for a
    new shape freezes too); with ``clone_inputs`` on copies of the inputs; with ``dtype`` on inputs cast to it and
    outputs cast back to float32.
    """

    def __init__(
        self,
        inner: Any,
        mode: str,
        backend: str,
        *,
        freezing: bool = False,
        clone_inputs: bool = False,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        self.inner = inner
        self.mode, self.backend = mode, backend
        self.freezing, self.clone_inputs, self.dtype = freezing, clone_inputs, dtype
        self.safety_report: Any = None  # what the check measured (SQNR, inputs unchanged, no aliasing)
        # static int8: how activation and weight levels are split (``int8_range``: "8bit" with VNNI, "balanced"
        # without; "7bit_activations" with reduce_range=True or FX), why, and for "balanced" what each conv/linear
        # got ({node name: (activation qmax, weight magnitude max)}); reduce_range: 7-bit activations everywhere
        self.int8_ranges: str | None = None
        self.int8_levels: dict[str, tuple[int, int]] = {}
        self.reduce_range: bool | None = None
        self.reduce_range_reason: str | None = None
        # AOTInductor (engine="aot"): the loaded package, the input shapes it was built for, and its file
        self.aot: Any = None
        self.aot_shapes: tuple[tuple[int, ...], ...] | None = None
        self.package_path: str | None = None
        self.aot_error: str | None = None
        # oneDNN plan (engine="onednn"): the int8 graph and the input shapes it is lowered for; one plan per
        # thread count (oneDNN fixes a primitive's threads when it is built)
        self.plan_source: tuple[Any, tuple[Any, ...]] | None = None
        self.plan_shapes: tuple[tuple[int, ...], ...] | None = None
        self.plans: dict[int, Any] = {}
        self.plan_error: str | None = None

    def plan(self) -> Any:
        """The oneDNN plan for the current thread count (built on first use), or None when there is none."""
        if self.plan_source is None:
            return None
        threads = torch.get_num_threads()
        if threads not in self.plans:
            from pytorchtricks.tricks.model._onednn_plan import PlanUnsupported, build_plan

            graph, example = self.plan_source
            try:
                self.plans[threads] = build_plan(graph, example)
            except PlanUnsupported as exc:
                self.plan_error, self.plan_source = str(exc), None
                return None
        return self.plans[threads]

    def train(self, mode: bool = True) -> Quantized:
        # exported/quantized graphs refuse .train()/.eval(); this wrapper is inference-only, so just record it
        self.training = mode
        return self

    def forward(self, *args: Any) -> Any:
        if self.clone_inputs:
            args = tuple(a.clone() if isinstance(a, torch.Tensor) else a for a in args)
        if self.dtype is not None:
            args = tuple(
                a.to(self.dtype) if isinstance(a, torch.Tensor) and a.is_floating_point() else a for a in args
            )
        with torch.no_grad():
            plan = self.plan() if self.plan_shapes == _shapes(args) else None
            if plan is not None:
                out = plan(*args)
            elif self.aot is not None and self.aot_shapes == _shapes(args):
                out = self.aot(*args)
            elif self.freezing:
                import torch._inductor.config as inductor_config

                with inductor_config.patch(freezing=True):
                    out = self.inner(*args)
            else:
                out = self.inner(*args)
        if self.dtype is not None:
            out = torch.utils._pytree.tree_map(
                lambda t: t.float() if isinstance(t, torch.Tensor) and t.is_floating_point() else t, out
            )
        return out


def _shapes(args: tuple[Any, ...]) -> tuple[tuple[int, ...], ...]:
    return tuple(tuple(a.shape) if isinstance(a, torch.Tensor) else () for a in args)


def _aot_package(q: Quantized, example: tuple[Any, ...]) -> Quantized:
    """Build an AOTInductor package of ``q``'s int8 graph for the example's shapes (freezing on) and load it.

    The loaded package runs without Dynamo guards or Inductor's Python wrapper (measured on ResNet-18 int8,
    batch 1: 5.7 ms vs 6.6 ms with torch.compile); calls with other shapes use the torch.compile path. If the
    package cannot be built, ``q`` is returned unchanged with the reason in ``q.aot_error``.
    """
    import tempfile

    import torch._inductor.config as inductor_config

    graph = getattr(q.inner, "_orig_mod", q.inner)  # the graph under torch.compile's wrapper
    try:
        with torch.no_grad():
            ep = torch.export.export(graph, example)
            folder = tempfile.mkdtemp(prefix="ptt-aoti-")
            with inductor_config.patch(freezing=True):
                path = torch._inductor.aoti_compile_and_package(
                    ep, package_path=os.path.join(folder, "model.pt2")
                )
        q.aot = torch._inductor.aoti_load_package(path)
    except Exception as exc:  # keep the torch.compile path, say why
        q.aot_error = f"{type(exc).__name__}: {str(exc)[:300]}"
        return q
    q.aot_shapes, q.package_path = _shapes(example), path
    return q


def _onednn_plan(q: Quantized, graph: Any, example: tuple[Any, ...]) -> Quantized:
    """Lower ``graph`` (the PT2E int8 graph) to a oneDNN plan for the example's shapes; see ``_onednn_plan``.

    The plan runs every int8 op as one prebuilt oneDNN primitive (ResNet-18 at 160 px, Zen 4: 1.17-1.36x ONNX
    Runtime static int8, results/int8_breakdown.md). If it cannot be built, ``q.plan_error`` says why and calls keep
    the AOTInductor / torch.compile path.
    """
    from pytorchtricks.tricks.model._onednn_plan import PlanUnsupported, build_plan

    try:
        q.plans[torch.get_num_threads()] = build_plan(graph, example)
    except PlanUnsupported as exc:
        q.plan_error = str(exc)
        return q
    q.plan_source, q.plan_shapes = (graph, example), _shapes(example)
    return q


def _batches(
    calibration: Iterable[Any] | None, example: tuple[Any, ...], limit: int
) -> list[tuple[Any, ...]]:
    if calibration is None:
        return [example]
    out = []
    for item in calibration:
        if isinstance(item, torch.Tensor):
            out.append((item,))
        elif isinstance(
            item, list | tuple
        ):  # (x, y) loader batches: the inputs are the first len(example) items
            out.append(tuple(item[: len(example)]))
        else:
            raise PttError(
                f"calibration yields {type(item).__name__}; yield tensors or (inputs, labels) tuples."
            )
        if len(out) >= limit:
            break
    if not out:
        raise PttError("calibration is empty; pass a few batches of real inputs (32 is plenty).")
    return out


INT8_RANGES = ("8bit", "7bit_activations", "balanced")
# the activation levels ("balanced") tries for each activation that a conv / linear reads; its weights get the rest
ACT_QMAX_CHOICES = (127, 159, 191, 223, 255)


def weight_absmax_for(act_qmax: int) -> int:
    """The largest weight magnitude that AVX2's int16 pair sums take exactly with activations in 0..act_qmax.

    ``vpmaddubsw`` adds two u8 x s8 products into int16: exact while 2 * act_qmax * weight_absmax <= 32767, so
    7-bit activations keep 8-bit weights (-128..127) and 8-bit activations get 7-bit ones (-64..64).

    Example:
        >>> [weight_absmax_for(q) for q in (127, 191, 255)]
        [128, 85, 64]
    """
    return min(128, 32767 // (2 * act_qmax))


def int8_range(backend: str, reduce_range: bool | None = None) -> tuple[str, str]:
    """How static int8 splits its bits on this CPU (one of ``INT8_RANGES``) and why (``Quantized`` keeps both).

    Without VNNI the x86 u8 x s8 kernels (oneDNN's and FBGEMM's AVX2 ``vpmaddubsw``) add each pair of products
    into int16 and saturate: 2 * 255 * 127 overflows 32767. PT2E then gets ``"balanced"``: each activation a conv or
    linear reads gets the activation levels (0..127 up to 0..255) that, with the weight levels left for it
    (``weight_absmax_for``), add the least rounding noise to that layer's output on the calibration batches -
    exact sums, and both kinds of noise land on the same output, so the layer's own error is what decides
    (ResNet-18 on Zen 3: results/avx2/int8_no_vnni.md). ``reduce_range=True``: 7-bit activations everywhere,
    ``False``: 8 bits everywhere (saturates without VNNI). ``None`` decides by ``cpu_caps().vnni`` (which honours
    ``ONEDNN_MAX_CPU_ISA``); FX keeps PyTorch's x86 qconfig, 7-bit activations everywhere.
    """
    from pytorchtricks.hardware import cpu_caps

    caps = cpu_caps()
    if reduce_range is not None:
        return (
            "7bit_activations" if reduce_range else "8bit",
            f"reduce_range: {'on' if reduce_range else 'off'}, as asked ({caps.cpu_class} CPU)",
        )
    if backend == "fx":
        return (
            "7bit_activations",
            "reduce_range: on, FX's x86 qconfig (FBGEMM kernels may add products into int16)",
        )
    if caps.vnni:
        return (
            "8bit",
            f"reduce_range: off, VNNI on this CPU ({caps.cpu_class}): int8 products add up in int32",
        )
    return "balanced", (
        f"balanced ranges: no VNNI on this CPU ({caps.cpu_class}), so the AVX2 u8 x s8 kernels add pairs of "
        "products into int16; each conv/linear input gets the activation levels (0..127 to 0..255) that, with "
        "the weight levels left for it (2 x act x weight <= 32767), add the least error to that layer's output "
        "on the calibration batches"
    )


def _matmul_sites(prepared: Any) -> dict[str, list[tuple[Any, str]]]:
    """The conv/linear nodes of a prepared PT2E graph, grouped by the activation observer they read.

    Returns ``{activation observer name: [(conv/linear node, weight observer name), ...]}``; ops whose input or
    weight is not observed (left in float) are not listed.
    """
    aten = torch.ops.aten
    sites: dict[str, list[tuple[Any, str]]] = {}
    for node in prepared.graph.nodes:
        if node.op != "call_function" or node.target not in (aten.conv2d.default, aten.linear.default):
            continue
        x, w = node.args[0], node.args[1]
        if getattr(x, "op", None) == "call_module" and getattr(w, "op", None) == "call_module":
            sites.setdefault(str(x.target), []).append((node, str(w.target)))
    return sites


def _set_levels(prepared: Any, act: str, act_qmax: int, weights: list[str], int16: bool = True) -> None:
    """Set an activation observer to 0..act_qmax and its consumers' weight observers to what fits with it
    (``int16``: inside AVX2's int16 pair sums; else 8-bit weights, as VNNI's int32 sums take)."""
    obs = prepared.get_submodule(act)
    obs.quant_max = act_qmax
    if hasattr(obs, "dst_nbins"):  # the histogram's range search for as many levels as there are
        obs.dst_nbins = act_qmax + 1
    wmax = weight_absmax_for(act_qmax) if int16 else 128
    for name in weights:
        wobs = prepared.get_submodule(name)
        wobs.quant_min, wobs.quant_max = (-128, 127) if wmax >= 128 else (-wmax, wmax)


def _clip_weights(wobs: Any, w: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor) -> None:
    """Per output channel, the weight range (a fraction of min/max) with the least squared rounding error."""
    qmin, qmax = int(wobs.quant_min), int(wobs.quant_max)
    flat = w.detach().reshape(w.shape[0], -1)
    amax = torch.maximum(-lo, hi).clamp_min(1e-12)
    best, best_err = torch.ones_like(amax), torch.full_like(amax, float("inf"))
    for frac in torch.linspace(0.5, 1.0, 21).tolist():
        scale = (frac * amax / ((qmax - qmin) / 2)).clamp_min(float(wobs.eps))[:, None]
        q = (flat / scale).round_().clamp_(qmin, qmax).mul_(scale).sub_(flat)
        err = q.mul_(q).sum(1)
        better = err < best_err
        best = torch.where(better, torch.full_like(amax, frac), best)
        best_err = torch.where(better, err, best_err)
    wobs.min_val, wobs.max_val = lo * best, hi * best


def _fake_quant_weight(wobs: Any, w: torch.Tensor) -> torch.Tensor:
    scale, zp = wobs.calculate_qparams()
    return torch.fake_quantize_per_channel_affine(
        w, scale.float(), zp.int(), int(wobs.ch_axis), int(wobs.quant_min), int(wobs.quant_max)
    )


def _value(prepared: Any, a: Any) -> Any:
    """A node argument's value for a re-run of one op: parameters read, observers seen through, literals kept."""
    from pytorchtricks.tricks.model._onednn_plan.lowering import _attr_of

    if getattr(a, "op", None) == "get_attr":
        return _attr_of(prepared, str(a.target))
    if getattr(a, "op", None) == "call_module":
        return _value(prepared, a.args[0])
    return a


def balance_ranges_(
    prepared: Any,
    captured: dict[str, torch.Tensor],
    *,
    clip_weights: bool = False,
    correct_bias: bool = False,
    choices: tuple[int, ...] = ACT_QMAX_CHOICES,
    int16: bool = True,
) -> dict[str, tuple[int, int]]:
    """Give each activation that a conv/linear of a calibrated PT2E graph reads its levels (``"balanced"``), in place.

    ``captured``: some calibration inputs of each activation observer (by name). For each observer and each of
    ``ACT_QMAX_CHOICES`` the observer's own range search picks scale and zero point for that many levels, its
    consumers' weights get ``weight_absmax_for`` it, and the summed relative output error of those consumers on
    the captured inputs decides. Activation rounding noise and weight rounding noise both enter at the layer's
    output, so whatever the net does downstream amplifies both alike: the layer's own error is the measure.
    ``clip_weights``: each output channel's weight range shrunk to the least squared rounding error (else min/max);
    ``correct_bias``: each consumer's bias less the mean output error the rounding adds on the captured inputs.
    ``choices``: the activation levels tried; ``int16=False``: weights keep 8 bits whatever the activations get
    (what VNNI's int32 sums compute exactly; saturates on AVX2 - for measuring only). Returns ``{conv/linear node name: (activation qmax, weight magnitude
    max)}``; observers not captured (or read by a conv/linear whose weight or bias the graph computes) get the fewest
    activation levels of ``choices``.
    """
    sites = _matmul_sites(prepared)
    instances: dict[int, list[str]] = {}  # one observer instance may sit at several places (shared qparams)
    for act in sites:
        instances.setdefault(id(prepared.get_submodule(act)), []).append(act)
    chosen: dict[str, tuple[int, int]] = {}
    for names in instances.values():
        consumers = [(node, w, captured.get(act)) for act in names for node, w in sites[act]]
        best = _Balance(prepared, names[0], consumers, clip_weights, int16).run(correct_bias, choices)
        for node, _, _ in consumers:
            chosen[node.name] = (best, weight_absmax_for(best) if int16 else 128)
    return chosen


class _Balance:
    """One activation observer of ``balance_ranges_``, the conv/linear nodes that read it and their inputs."""

    def __init__(
        self,
        prepared: Any,
        act: str,
        consumers: list[tuple[Any, str, torch.Tensor | None]],
        clip_weights: bool,
        int16: bool = True,
    ) -> None:
        self.prepared, self.act, self.consumers, self.clip_weights = prepared, act, consumers, clip_weights
        self.int16 = int16
        self.weights = [w for _, w, _ in consumers]
        self.wobs = [prepared.get_submodule(w) for w in self.weights]
        self.ranges = [(o.min_val.clone(), o.max_val.clone()) for o in self.wobs]
        # a weight or bias computed in the graph (not a parameter): not re-run, its activation gets 7 bits (exact)
        constant = [
            all(
                getattr(a, "op", None) == "get_attr"
                for a in [n.args[1].args[0], *n.args[2:]]
                if isinstance(a, torch.fx.Node)
            )
            for n, _, _ in consumers
        ]
        self.floats = [
            _value(prepared, n.args[1]) if c else None
            for (n, _, _), c in zip(consumers, constant, strict=True)
        ]
        self.measured = all(constant) and all(x is not None for _, _, x in consumers)
        self.refs: dict[str, torch.Tensor] = {}

    def set_levels(self, qmax: int) -> None:
        _set_levels(self.prepared, self.act, qmax, self.weights, self.int16)
        for o, (lo, hi), w in zip(self.wobs, self.ranges, self.floats, strict=True):
            if self.clip_weights and w is not None:
                _clip_weights(o, w, lo, hi)
            else:
                o.min_val, o.max_val = lo, hi

    def outputs(self, qmax: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """(float output, output with rounded input and weights) of each consumer on its captured inputs."""
        scale, zp = self.prepared.get_submodule(self.act).calculate_qparams()
        pairs = []
        for (node, _, x), o, w in zip(self.consumers, self.wobs, self.floats, strict=True):
            if x is None or w is None:
                raise PttError(f"{node.name}: no captured calibration input or constant weight to measure on")
            xq = torch.fake_quantize_per_tensor_affine(x, float(scale), int(zp), 0, qmax)
            rest = [_value(self.prepared, a) for a in node.args[2:]]
            if node.name not in self.refs:  # the float output does not depend on the levels (nor on the bias
                self.refs[node.name] = node.target(x, w, *rest)  # correction, which comes after)
            pairs.append((self.refs[node.name], node.target(xq, _fake_quant_weight(o, w), *rest)))
        return pairs

    def run(self, correct_bias: bool, choices: tuple[int, ...]) -> int:
        best = min(choices)
        if self.measured:
            errors = {}
            for qmax in choices:
                self.set_levels(qmax)
                errors[qmax] = sum(
                    float(((got - ref) ** 2).sum() / (ref**2).sum().clamp_min(1e-30))
                    for ref, got in self.outputs(qmax)
                )
            best = min(errors, key=lambda q: errors[q])
        self.set_levels(best)
        if correct_bias and self.measured:
            for (node, _, _), (ref, got) in zip(self.consumers, self.outputs(best), strict=True):
                bias = node.args[2] if len(node.args) > 2 else None
                if getattr(bias, "op", None) != "get_attr":
                    continue  # no bias to carry the correction
                linear = node.target == torch.ops.aten.linear.default  # channels last; conv: dim 1
                dims = list(range(ref.dim() - 1)) if linear else [d for d in range(ref.dim()) if d != 1]
                _value(self.prepared, bias).data.sub_((got - ref).mean(dims))
        return best


def _x86_quantizer(is_qat: bool = False, reduce_range: bool = False) -> Any:
    xiq = require("torchao.quantization.pt2e.quantizer.x86_inductor_quantizer", "infer", package="torchao")
    quantizer = xiq.X86InductorQuantizer()
    config = xiq.get_default_x86_inductor_quantization_config(is_qat=is_qat, reduce_range=reduce_range)
    quantizer.set_global(config)
    return quantizer


def _fx_qconfig_mapping(reduce_range: bool) -> Any:
    """PyTorch's x86 FX mapping with the activation observers' ``reduce_range`` set as decided."""
    from torch.ao.quantization import QConfig, get_default_qconfig_mapping
    from torch.ao.quantization.observer import HistogramObserver

    mapping = get_default_qconfig_mapping("x86")
    default = mapping.global_qconfig
    if default is None:  # pragma: no cover - PyTorch's x86 mapping always has a global qconfig
        raise PttError("PyTorch's default x86 QConfigMapping has no global qconfig; use backend='pt2e'.")
    act = HistogramObserver.with_args(reduce_range=reduce_range)
    mapping.set_global(QConfig(activation=act, weight=default.weight))
    for pattern, qc in list(mapping.object_type_qconfigs.items()):
        if qc is not None and qc.activation is default.activation:  # fixed-qparams ops keep their own
            mapping.set_object_type(pattern, QConfig(activation=act, weight=qc.weight))
    return mapping


def _copy(model: nn.Module) -> nn.Module:
    try:
        return copy.deepcopy(model)
    except Exception as exc:
        raise PttError(
            f"quantize works on a copy of the model and copy.deepcopy failed ({type(exc).__name__}: "
            f"{str(exc)[:200]}); make the model deep-copyable (no open files, locks or generators as attributes)."
        ) from exc


def _working_copy(model: nn.Module) -> nn.Module:
    """A copy of ``model`` with every reused module instance unshared (PT2E's quantizer refuses shared ones)."""
    from pytorchtricks.tricks.model.unshare_modules import unshare_modules_

    work = _copy(model)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # nothing shared / weights untied: both fine on a throw-away copy
        try:
            unshare_modules_(work)
        except PttError:
            pass  # not fx-traceable: torch.export may still take it as it is
    return work


def _export(model: nn.Module, example: tuple[Any, ...]) -> Any:
    """torch.export with a dynamic batch dimension when the model allows it, else static shapes."""
    batch = torch.export.Dim("batch", min=1)
    tensors = [a for a in example if isinstance(a, torch.Tensor)]
    if tensors and all(t.dim() > 0 and t.shape[0] == tensors[0].shape[0] for t in tensors):
        # a batch of 1 would be specialised to the constant 1: trace with two copies instead
        ex = tuple(
            torch.cat([a, a]) if isinstance(a, torch.Tensor) and a.shape[0] == 1 else a for a in example
        )
        dyn = tuple({0: batch} if isinstance(a, torch.Tensor) else None for a in ex)
        try:
            return torch.export.export(model, ex, dynamic_shapes=dyn).module()
        except Exception:
            pass  # the model fixes its batch size somewhere: fall back to static shapes
    try:
        return torch.export.export(model, example).module()
    except Exception as exc:
        raise PttError(
            f"torch.export failed ({type(exc).__name__}: {str(exc)[:300]}). Call ptt.unshare_modules_(model) "
            "first if a module is reused, or quantize with backend='fx'."
        ) from exc


def _capture_inputs(prepared: Any, samples: int) -> tuple[dict[str, list[torch.Tensor]], list[Any]]:
    """Forward hooks that keep the first ``samples`` calibration inputs of each observer a conv/linear reads.

    One observer instance may sit at several places (a pool's output shares its input's observer): the hook counts
    the instance's calls in graph order and keeps only the call that feeds the conv/linear.
    """
    calls: dict[
        int, list[str]
    ] = {}  # observer instance -> the observer node names calling it, in graph order
    for node in prepared.graph.nodes:
        if node.op == "call_module":
            calls.setdefault(id(prepared.get_submodule(str(node.target))), []).append(str(node.target))
    wanted = set(_matmul_sites(prepared))
    captured: dict[str, list[torch.Tensor]] = {}
    handles = []
    for names in calls.values():
        if not wanted.intersection(names):
            continue
        count = [0]

        def keep(_m: Any, inputs: Any, _out: Any, names: list[str] = names, count: list[int] = count) -> None:
            act = names[count[0] % len(names)]
            count[0] += 1
            x = inputs[0] if inputs else None
            if act not in wanted or not isinstance(x, torch.Tensor) or x.dim() == 0:
                return
            kept = captured.setdefault(act, [])
            have = sum(t.shape[0] for t in kept)
            if have < samples and (
                not kept or kept[0].shape[1:] == x.shape[1:]
            ):  # one shape: they are concatenated
                kept.append(x.detach()[: samples - have].clone())

        handles.append(prepared.get_submodule(names[0]).register_forward_hook(keep))
    return captured, handles


BALANCE_SAMPLES = 8  # calibration samples per activation that balance_ranges_ measures layer errors on


def _static_int8(
    model: nn.Module,
    example: tuple[Any, ...],
    batches: list[tuple[Any, ...]],
    backend: str,
    *,
    ranges: str,
) -> tuple[Any, dict[str, tuple[int, int]]]:
    """Calibrated static int8 of ``model`` (not changed: PT2E exports it, FX works on a copy), and for
    ``ranges="balanced"`` the levels each conv/linear got (``balance_ranges_``)."""
    if ranges not in INT8_RANGES:
        raise PttError(f"unknown int8 ranges {ranges!r}; use one of {', '.join(INT8_RANGES)}.")
    if backend == "pt2e":
        pt2e = require("torchao.quantization.pt2e.quantize_pt2e", "infer", package="torchao")
        graph = _export(model, example)
        step = "PT2E prepare"
        try:
            prepared = pt2e.prepare_pt2e(graph, _x86_quantizer(reduce_range=ranges == "7bit_activations"))
            captured, handles = (
                _capture_inputs(prepared, BALANCE_SAMPLES) if ranges == "balanced" else ({}, [])
            )
            step = "calibration"
            with torch.no_grad():
                for b in batches:
                    prepared(*b)
            for h in handles:
                h.remove()
            levels: dict[str, tuple[int, int]] = {}
            if ranges == "balanced":
                step = "balancing the int8 ranges"
                with torch.no_grad():
                    kept = {k: torch.cat(v) for k, v in captured.items() if v}
                    levels = balance_ranges_(prepared, kept, clip_weights=True, correct_bias=True)
            step = "PT2E convert"
            return pt2e.convert_pt2e(prepared), levels
        except PttError:
            raise
        except Exception as exc:
            raise PttError(
                f"int8 {step} failed ({type(exc).__name__}: {str(exc)[:300]}). Call ptt.unshare_modules_(model) "
                "if a module is reused, check that calibration batches match example_inputs, or quantize with "
                "backend='fx'."
            ) from exc
    from torch.ao.quantization.quantize_fx import convert_fx, prepare_fx

    try:
        prepared = prepare_fx(copy.deepcopy(model), _fx_qconfig_mapping(ranges != "8bit"), example)
        with torch.no_grad():
            for b in batches:
                prepared(*b)
        return convert_fx(prepared), {}
    except Exception as exc:
        raise PttError(
            f"FX int8 failed ({type(exc).__name__}: {str(exc)[:300]}); the forward must be torch.fx-traceable "
            "(static control flow): quantize with backend='pt2e' (needs torchao)."
        ) from exc


def _compile(inner: Any) -> Any:
    # ptt.compile_ passes freezing as a per-call option; the int8 lowering reads the global inductor config at
    # compile time, so Quantized runs every call inside config.patch(freezing=True) instead.
    return torch.compile(inner, dynamic=False)  # dynamic-batch int8 lowering hits a stride bug in torch 2.14


ENGINES = ("eager", "compile", "aot", "onednn")


@dataclass(frozen=True, eq=False)
class QuantConfig:
    """How ``quantize`` builds the model: what precision, calibrated on what, run by which engine.

    Args:
        precision: ``"int8"`` (static int8, calibrated), ``"int8_dynamic"`` (Linear/LSTM/GRU), ``"qat"`` (returns a
            fake-quantized trainable graph), ``"qat_convert"`` (its int8 form), ``"bf16"`` or ``"fp16"`` (weights
            converted, inputs cast on the way in).
        calibration: batches of real inputs (tensors or ``(inputs, labels)``); default: the example inputs.
        calibration_batches: at most this many of them are used.
        reduce_range: ``True``: static int8 activations in 0..127 everywhere; ``False``: 0..255 everywhere (saturates
            without VNNI); ``None`` (default): 8 bits with VNNI, ``"balanced"`` ranges per layer without (PT2E;
            FX: 7 bits). ``q.int8_ranges`` and ``q.reduce_range_reason`` say what was chosen and why.
        backend: the int8 quantization flow: ``"auto"`` (PT2E when torchao is installed, else FX), ``"pt2e"``, ``"fx"``.
        engine: what runs the result: ``"eager"``; ``"compile"`` (``torch.compile``, with freezing for PT2E int8: real
            int8 kernels; the first call compiles); ``"aot"`` (PT2E int8: also an AOTInductor package for the
            example's shapes, no guards or Python wrapper per call; ``q.package_path``); ``"onednn"`` (as ``"aot"``,
            and the graph lowered to a oneDNN plan for the example's shapes - each int8 op one prebuilt primitive of
            the system oneDNN, ``libdnnl2``; ``q.plan()``, ``q.plan_error`` says why when it could not be built).
            Other shapes use the compiled path.
        check: run the safety check on the example inputs (SQNR >= ``min_sqnr_db``, inputs unchanged, no aliasing).
        min_sqnr_db: the check's floor (default per precision: ``DEFAULT_MIN_SQNR_DB``).
        clone_inputs: call the quantized graph on copies of the inputs (the fix when the check finds mutation).
    """

    precision: str = "int8"
    calibration: Iterable[Any] | None = None
    calibration_batches: int = 32
    reduce_range: bool | None = None
    backend: str = "auto"
    engine: str = "compile"
    check: bool = True
    min_sqnr_db: float | None = None
    clone_inputs: bool = False

    def __post_init__(self) -> None:
        if self.precision not in MODES:
            raise PttError(f"unknown precision {self.precision!r}; use one of {', '.join(MODES)}.")
        if self.backend not in ("auto", "pt2e", "fx"):
            raise PttError(f"unknown backend {self.backend!r}; use auto, pt2e or fx.")
        if self.engine not in ENGINES:
            raise PttError(f"unknown engine {self.engine!r}; use one of {', '.join(ENGINES)}.")

    def replace(self, **changes: Any) -> QuantConfig:
        """A copy with ``changes`` (``QuantConfig(engine="aot").replace(clone_inputs=True)``)."""
        return dataclasses.replace(self, **changes)


def quantize(model: nn.Module, example_inputs: Any, config: QuantConfig | str | None = None) -> Any:
    """Quantize ``model`` for CPU inference; returns the quantized callable (a ``Quantized`` module).

    ``config``: a ``QuantConfig``, or a precision name as shorthand (``quantize(m, x, "bf16")``), default static
    int8 compiled. The model is not changed: every precision works on a copy (int8 and QAT with reused module
    instances unshared), so keep using the return value. ``"qat"`` returns the trainable fake-quantized graph, which
    ``quantize(graph, x, "qat_convert")`` turns into int8 after training.

    Example:
        >>> m = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 4)).eval()
        >>> q = ptt.quantize(m, torch.randn(8, 16), "int8_dynamic")
        >>> q.mode, q.safety_report.sqnr_db > 20
        ('int8_dynamic', True)
        >>> q = ptt.quantize(m, torch.randn(8, 16), ptt.QuantConfig("bf16", engine="eager"))
        >>> q.dtype, next(m.parameters()).dtype  # the caller's model stays fp32
        (torch.bfloat16, torch.float32)
    """
    if config is None or isinstance(config, str):
        config = QuantConfig(config or "int8")
    if not isinstance(config, QuantConfig):
        raise PttError(
            f"config must be a QuantConfig or a precision name, not {type(config).__name__}; "
            "e.g. ptt.QuantConfig('int8', calibration=batches, engine='onednn')."
        )
    mode = config.precision
    reduce_range, backend = config.reduce_range, config.backend
    calibration, calibration_batches = config.calibration, config.calibration_batches
    check, min_sqnr_db, clone_inputs = config.check, config.min_sqnr_db, config.clone_inputs
    plan = config.engine == "onednn"
    aot = config.engine in ("aot", "onednn")
    compile = config.engine != "eager"
    example = tuple(example_inputs) if isinstance(example_inputs, list | tuple) else (example_inputs,)
    if mode == "qat":
        return _prepare_qat(model, example, reduce_range)
    if model.training and mode != "qat_convert":
        raise PttError(f"quantize({mode!r}) needs model.eval(); for quantization-aware training use 'qat'.")
    from pytorchtricks.safety import check_transform, reference_outputs

    if mode == "qat_convert":
        if not isinstance(model, torch.fx.GraphModule):
            raise PttError(
                "qat_convert takes the graph that quantize(model, x, 'qat') returned, after training."
            )
        pt2e = require("torchao.quantization.pt2e", "infer", package="torchao")
        pt2e.move_exported_model_to_eval(model)
    ref = reference_outputs(model, example) if check else None
    freezing = False
    if mode == "int8":
        use = backend if backend != "auto" else ("pt2e" if _has_torchao() else "fx")
        batches = _batches(calibration, example, calibration_batches)
        ranges, why = int8_range(use, reduce_range)
        inner, levels = _static_int8(_working_copy(model), example, batches, use, ranges=ranges)
        freezing = compile and use == "pt2e"  # FX output already runs eager x86 int8 kernels: not compiled
        result = Quantized(_compile(inner) if freezing else inner, mode, use, freezing=freezing)
        result.int8_ranges, result.int8_levels = ranges, levels
        result.reduce_range, result.reduce_range_reason = ranges == "7bit_activations", why
        if plan and use != "pt2e":
            result.plan_error = "the oneDNN plan lowers PT2E graphs; this model was quantized with FX"
            warnings.warn(f"no oneDNN plan: {result.plan_error}", NoEffectWarning, stacklevel=2)
        elif plan:
            result = _onednn_plan(result, inner, example)
            if result.plan_error:
                warnings.warn(
                    f"no oneDNN plan ({result.plan_error[:200]}); the int8 model runs compiled",
                    NoEffectWarning,
                    stacklevel=2,
                )
        if aot and freezing:
            result = _aot_package(result, example)
            if result.aot_error:
                warnings.warn(
                    f"the AOTInductor package failed ({result.aot_error[:160]}); the int8 model runs under "
                    "torch.compile",
                    NoEffectWarning,
                    stacklevel=2,
                )
    elif mode == "qat_convert":
        pt2e = require("torchao.quantization.pt2e.quantize_pt2e", "infer", package="torchao")
        try:
            inner = pt2e.convert_pt2e(model)
        except Exception as exc:
            raise PttError(
                f"qat_convert failed ({type(exc).__name__}: {str(exc)[:200]}); pass the graph that "
                "quantize(model, x, 'qat') returned, after training."
            ) from exc
        result = Quantized(_compile(inner) if compile else inner, mode, "pt2e", freezing=compile)
        result.int8_ranges, result.reduce_range_reason = getattr(model, "meta", {}).get(
            "ptt_int8_ranges", (None, None)
        )
        result.reduce_range = None if result.int8_ranges is None else result.int8_ranges == "7bit_activations"
    elif mode == "int8_dynamic":
        kinds = (nn.Linear, nn.LSTM, nn.GRU, nn.LSTMCell, nn.GRUCell)
        if not any(isinstance(m, kinds) for m in model.modules()):
            warnings.warn("int8_dynamic found no Linear/LSTM/GRU to quantize.", NoEffectWarning, stacklevel=2)
        from torch.ao.quantization import quantize_dynamic

        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            dynamic = quantize_dynamic(_copy(model), set(kinds), dtype=torch.qint8)
        result = Quantized(dynamic, mode, "torch.ao.dynamic")
    else:
        dtype = torch.bfloat16 if mode == "bf16" else torch.float16
        cast = _copy(model).to(dtype)
        result = Quantized(_compile(cast) if compile else cast, mode, "cast", freezing=compile, dtype=dtype)
    result.clone_inputs = clone_inputs
    if ref is not None:
        floor = DEFAULT_MIN_SQNR_DB[mode] if min_sqnr_db is None else min_sqnr_db
        try:
            report = check_transform(result, example, ref, step=f"quantize:{mode}", min_sqnr_db=floor)
        except PttError:
            raise
        except Exception as exc:  # the first call compiles (Inductor) or runs kernels for the first time
            raise PttError(
                f"the {mode} model failed on its first call ({type(exc).__name__}: {str(exc)[:300]}); "
                "retry with engine='eager'" + (" or backend='fx'" if mode == "int8" else "") + "."
            ) from exc
        result.safety_report = report
    return result


def _has_torchao() -> bool:
    try:
        require("torchao.quantization.pt2e.quantize_pt2e", "infer", package="torchao")
        return True
    except PttError:
        return False


def _prepare_qat(model: nn.Module, example: tuple[Any, ...], reduce_range: bool | None) -> nn.Module:
    pt2e = require("torchao.quantization.pt2e.quantize_pt2e", "infer", package="torchao")
    ranges, why = int8_range("pt2e", reduce_range)
    if ranges == "balanced":  # set from calibration statistics; QAT's fake quantizers train with fixed ranges
        ranges, why = "7bit_activations", why.split(":")[0] + ": QAT keeps 7-bit activations (" + why + ")"
    graph = _export(_working_copy(model).train(), example)
    try:
        prepared = pt2e.prepare_qat_pt2e(graph, _x86_quantizer(is_qat=True, reduce_range=ranges != "8bit"))
    except Exception as exc:
        raise PttError(
            f"PT2E QAT prepare failed ({type(exc).__name__}: {str(exc)[:300]}); call ptt.unshare_modules_(model) "
            "if a module is reused."
        ) from exc
    prepared.meta["ptt_int8_ranges"] = (ranges, why)  # qat_convert reports it
    return prepared  # type: ignore[no-any-return]


def bench_case(size: str = "smoke", device: str = "cpu") -> BenchCase:
    """Linear-heavy MLP: fp32 eager vs dynamic int8 (static int8 CNNs are in benchmarks/inference_cpu.py)."""
    if device != "cpu":
        raise PttError("quantize targets CPU inference; run its bench case with --device cpu.")
    width, batch = (256, 16) if size == "smoke" else (1024, 64)
    torch.manual_seed(0)
    base = nn.Sequential(
        nn.Linear(width, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(), nn.Linear(width, 10)
    )
    base.eval()
    x = torch.randn(batch, width)
    treated = quantize(base, x, "int8_dynamic")

    def check(a: torch.Tensor, b: torch.Tensor) -> None:
        from pytorchtricks.safety import sqnr_db

        if sqnr_db(a, b) < 20:
            raise AssertionError(f"dynamic int8 SQNR {sqnr_db(a, b):.1f} dB < 20 dB")

    return inference_case(
        base,
        treated,
        x,
        description=f"3-layer MLP width {width}, batch {batch}: fp32 vs dynamic int8",
        check=check,
        unit="samples",
    )
