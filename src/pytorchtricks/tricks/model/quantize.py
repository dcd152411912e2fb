"""Quantize a model for CPU inference through one facade: static int8, dynamic int8, QAT, bf16/fp16 weights.

Why: int8 conv/matmul on x86 with VNNI runs several times faster than fp32 (ResNet-18 at 160 px, 1 thread, Zen 4:
PT2E int8 as a oneDNN plan (``engine="onednn"``) 10.8x / 6.45x at batch 1 / 8, 1.26-1.55x ONNX Runtime static
int8, 37.7 dB SQNR; bf16 3.75x / 2.70x; results/avx512_bf16/inference_cpu-b1.md, -b8.md; Linear-heavy MLPs:
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
36.4 dB on Zen 3 vs 31.7 dB with 7-bit activations everywhere (results/avx2/int8_no_vnni.md). With VNNI the levels
stay 8 bits everywhere, with the same MSE weight ranges and bias correction (37.7 dB on Zen 4, 35.3 without).
A safety check runs by default: SQNR vs the float model (default floors 20 dB int8, 25 dB bf16, 40 dB fp16),
and the caller's inputs must be unchanged - with
freezing, the x86 int8 lowering of ``x + Linear(x)`` writes into the caller's input (oneDNN in-place sum): the check
raises, pass ``clone_inputs=True``. RepVGG-style nets and depthwise convs lose most under int8 (check the SQNR).
Dynamic int8 on CNNs is slower (0.34-0.50x): not offered.
See also: fuse_conv_bn, reparameterize, export_onnx, quantize_lowbit, unshare_modules, 推理加速 / 量化.
"""

from __future__ import annotations

import copy
import dataclasses
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from pytorchtricks.core import BenchCase, NoEffectWarning, PttError, TrickInfo, require
from pytorchtricks.tricks._cases import inference_case
from pytorchtricks.tricks.model._int8_ranges import (
    BALANCE_SAMPLES,
    balance_ranges_,
    capture_inputs,
)
from pytorchtricks.tricks.model._quantized import Quantized, _aot_package, onednn_plan
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
            f"reduce_range: off, VNNI on this CPU ({caps.cpu_class}): int8 products add up in int32 (8 bits "
            "everywhere, MSE weight ranges and bias correction on the calibration batches)",
        )
    return "balanced", (
        f"balanced ranges: no VNNI on this CPU ({caps.cpu_class}), so the AVX2 u8 x s8 kernels add pairs of "
        "products into int16; each conv/linear input gets the activation levels (0..127 to 0..255) that, with "
        "the weight levels left for it (2 x act x weight <= 32767), add the least error to that layer's output "
        "on the calibration batches"
    )


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


def _static_int8(
    model: nn.Module,
    example: tuple[Any, ...],
    batches: list[tuple[Any, ...]],
    backend: str,
    *,
    ranges: str,
) -> tuple[Any, dict[str, tuple[int, int]]]:
    """Calibrated static int8 of ``model`` (not changed: PT2E exports it, FX works on a copy), and for
    ``ranges="balanced"`` the levels each conv/linear got (``balance_ranges_``). PT2E's uniform ranges (8 bits with
    VNNI, or 7-bit activations when asked) keep their levels and get the same MSE weight ranges and bias
    correction (results/avx512_bf16/inference_cpu-b1.md)."""
    if ranges not in INT8_RANGES:
        raise PttError(f"unknown int8 ranges {ranges!r}; use one of {', '.join(INT8_RANGES)}.")
    if backend == "pt2e":
        pt2e = require("torchao.quantization.pt2e.quantize_pt2e", "infer", package="torchao")
        graph = _export(model, example)
        step = "PT2E prepare"
        try:
            prepared = pt2e.prepare_pt2e(graph, _x86_quantizer(reduce_range=ranges == "7bit_activations"))
            captured, handles = capture_inputs(prepared, BALANCE_SAMPLES)
            step = "calibration"
            with torch.no_grad():
                for b in batches:
                    prepared(*b)
            for h in handles:
                h.remove()
            levels: dict[str, tuple[int, int]] = {}
            step = (
                "balancing the int8 ranges" if ranges == "balanced" else "MSE weight ranges / bias correction"
            )
            with torch.no_grad():
                kept = {k: torch.cat(v) for k, v in captured.items() if v}
                if ranges == "balanced":
                    levels = balance_ranges_(prepared, kept, clip_weights=True, correct_bias=True)
                else:  # uniform levels stay; the weight ranges and biases are refined the same way
                    uniform = 255 if ranges == "8bit" else 127
                    balance_ranges_(
                        prepared, kept, clip_weights=True, correct_bias=True, choices=(uniform,), int16=False
                    )
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


_Handler = Callable[[nn.Module, tuple[Any, ...], QuantConfig], Any]
# mode -> the function that quantizes for it, filled by ``register_quantize_mode_handler`` below (as torchao fills
# ``_QUANTIZE_CONFIG_HANDLER`` per config type): ``quantize`` validates, looks the mode up and calls it.
_QUANTIZE_MODE_HANDLER: dict[str, _Handler] = {}


def register_quantize_mode_handler(*modes: str) -> Callable[[_Handler], _Handler]:
    """Register the decorated function as the handler of ``modes`` (each one of ``MODES``).

    A handler takes ``(model, example, config)`` - ``example`` already a tuple of inputs - and returns what
    ``quantize`` returns for that mode; it owns its mode's whole path (eval check, reference outputs, safety check)
    through the shared steps ``_needs_eval``, ``_reference`` and ``_checked``.
    """

    def register(handler: _Handler) -> _Handler:
        for mode in modes:
            if mode not in MODES:
                raise PttError(f"no quantize mode {mode!r} to register a handler for; add it to MODES first.")
            _QUANTIZE_MODE_HANDLER[mode] = handler
        return handler

    return register


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
    handler = _QUANTIZE_MODE_HANDLER.get(config.precision)
    if handler is None:  # QuantConfig checks the name against MODES: a mode listed there but never registered
        raise PttError(
            f"quantize mode {config.precision!r} has no handler; register one with "
            "@register_quantize_mode_handler in tricks/model/quantize.py."
        )
    example = tuple(example_inputs) if isinstance(example_inputs, list | tuple) else (example_inputs,)
    return handler(model, example, config)


def _needs_eval(model: nn.Module, mode: str) -> None:
    if model.training:
        raise PttError(f"quantize({mode!r}) needs model.eval(); for quantization-aware training use 'qat'.")


def _reference(model: nn.Module, example: tuple[Any, ...], config: QuantConfig) -> Any:
    """The float model's outputs the safety check compares with (``None`` with ``check=False``); taken before the
    mode's own work, which may change ``model`` (``qat_convert`` converts the graph in place)."""
    from pytorchtricks.safety import reference_outputs

    return reference_outputs(model, example) if config.check else None


def _checked(
    result: Quantized, example: tuple[Any, ...], ref: Any, config: QuantConfig, retry: str
) -> Quantized:
    """``result`` with the caller's ``clone_inputs`` and, when ``ref`` was taken, its safety report (SQNR vs the
    float outputs, inputs unchanged); ``retry`` is what the error suggests when the first call fails."""
    from pytorchtricks.safety import check_transform

    mode = config.precision
    result.clone_inputs = config.clone_inputs
    if ref is None:
        return result
    floor = DEFAULT_MIN_SQNR_DB[mode] if config.min_sqnr_db is None else config.min_sqnr_db
    try:
        report = check_transform(result, example, ref, step=f"quantize:{mode}", min_sqnr_db=floor)
    except PttError:
        raise
    except Exception as exc:  # the first call compiles (Inductor) or runs kernels for the first time
        raise PttError(
            f"the {mode} model failed on its first call ({type(exc).__name__}: {str(exc)[:300]}); retry with {retry}."
        ) from exc
    result.safety_report = report
    return result


@register_quantize_mode_handler("qat")
def _quantize_qat(model: nn.Module, example: tuple[Any, ...], config: QuantConfig) -> nn.Module:
    """The trainable fake-quantized graph (no safety check: it is not the int8 model yet)."""
    return _prepare_qat(model, example, config.reduce_range)


@register_quantize_mode_handler("int8")
def _quantize_int8(model: nn.Module, example: tuple[Any, ...], config: QuantConfig) -> Quantized:
    """Calibrated static int8 (PT2E or FX), compiled for PT2E unless ``engine="eager"``, then the engine's extras."""
    _needs_eval(model, "int8")
    ref = _reference(model, example, config)
    backend = config.backend
    use = backend if backend != "auto" else ("pt2e" if _has_torchao() else "fx")
    batches = _batches(config.calibration, example, config.calibration_batches)
    ranges, why = int8_range(use, config.reduce_range)
    inner, levels = _static_int8(_working_copy(model), example, batches, use, ranges=ranges)
    freezing = config.engine != "eager" and use == "pt2e"  # FX output already runs eager x86 int8 kernels
    result = Quantized(_compile(inner) if freezing else inner, "int8", use, freezing=freezing)
    result.int8_ranges, result.int8_levels = ranges, levels
    result.reduce_range, result.reduce_range_reason = ranges == "7bit_activations", why
    result = _int8_engine(result, inner, example, config.engine, use)
    return _checked(result, example, ref, config, retry="engine='eager' or backend='fx'")


def _int8_engine(result: Quantized, inner: Any, example: tuple[Any, ...], engine: str, use: str) -> Quantized:
    """What ``engine="onednn"`` / ``"aot"`` add to the compiled int8 model: the oneDNN plan, the AOTInductor
    package; each one that cannot be built warns and leaves the compiled path running."""
    if engine == "onednn" and use != "pt2e":
        result.plan_error = "the oneDNN plan lowers PT2E graphs; this model was quantized with FX"
        warnings.warn(f"no oneDNN plan: {result.plan_error}", NoEffectWarning, stacklevel=4)
    elif engine == "onednn":
        result = onednn_plan(result, inner, example)
        if result.plan_error:
            warnings.warn(
                f"no oneDNN plan ({result.plan_error[:200]}); the int8 model runs compiled",
                NoEffectWarning,
                stacklevel=4,
            )
    if engine in ("aot", "onednn") and result.freezing:
        result = _aot_package(result, example)
        if result.aot_error:
            warnings.warn(
                f"the AOTInductor package failed ({result.aot_error[:160]}); the int8 model runs under "
                "torch.compile",
                NoEffectWarning,
                stacklevel=4,
            )
    return result


@register_quantize_mode_handler("qat_convert")
def _quantize_qat_convert(model: nn.Module, example: tuple[Any, ...], config: QuantConfig) -> Quantized:
    """The int8 form of a trained QAT graph (converted in place: the reference is taken first)."""
    if not isinstance(model, torch.fx.GraphModule):
        raise PttError("qat_convert takes the graph that quantize(model, x, 'qat') returned, after training.")
    require("torchao.quantization.pt2e", "infer", package="torchao").move_exported_model_to_eval(model)
    ref = _reference(model, example, config)
    pt2e = require("torchao.quantization.pt2e.quantize_pt2e", "infer", package="torchao")
    try:
        inner = pt2e.convert_pt2e(model)
    except Exception as exc:
        raise PttError(
            f"qat_convert failed ({type(exc).__name__}: {str(exc)[:200]}); pass the graph that "
            "quantize(model, x, 'qat') returned, after training."
        ) from exc
    compile = config.engine != "eager"
    result = Quantized(_compile(inner) if compile else inner, "qat_convert", "pt2e", freezing=compile)
    result.int8_ranges, result.reduce_range_reason = getattr(model, "meta", {}).get(
        "ptt_int8_ranges", (None, None)
    )
    result.reduce_range = None if result.int8_ranges is None else result.int8_ranges == "7bit_activations"
    return _checked(result, example, ref, config, retry="engine='eager'")


@register_quantize_mode_handler("int8_dynamic")
def _quantize_int8_dynamic(model: nn.Module, example: tuple[Any, ...], config: QuantConfig) -> Quantized:
    """Dynamic int8 of every Linear/LSTM/GRU (weights int8, activations quantized per call), run eager."""
    _needs_eval(model, "int8_dynamic")
    ref = _reference(model, example, config)
    kinds = (nn.Linear, nn.LSTM, nn.GRU, nn.LSTMCell, nn.GRUCell)
    if not any(isinstance(m, kinds) for m in model.modules()):
        warnings.warn("int8_dynamic found no Linear/LSTM/GRU to quantize.", NoEffectWarning, stacklevel=3)
    from torch.ao.quantization import quantize_dynamic

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        dynamic = quantize_dynamic(_copy(model), set(kinds), dtype=torch.qint8)
    result = Quantized(dynamic, "int8_dynamic", "torch.ao.dynamic")
    return _checked(result, example, ref, config, retry="engine='eager'")


_CAST_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


@register_quantize_mode_handler(*_CAST_DTYPES)
def _quantize_cast(model: nn.Module, example: tuple[Any, ...], config: QuantConfig) -> Quantized:
    """Weights converted to bf16/fp16 (inputs cast on the way in), compiled unless ``engine="eager"``."""
    mode = config.precision
    _needs_eval(model, mode)
    ref = _reference(model, example, config)
    dtype = _CAST_DTYPES[mode]
    compile = config.engine != "eager"
    cast = _copy(model).to(dtype)
    result = Quantized(_compile(cast) if compile else cast, mode, "cast", freezing=compile, dtype=dtype)
    return _checked(result, example, ref, config, retry="engine='eager'")


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
