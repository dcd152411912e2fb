"""The tricks ``tune`` can try, when each applies, and how each is checked for correctness.

A candidate names a catalogue trick (or a plain DataLoader setting) and the ``ptt`` function it needs. Its
metadata (exact or not, what it gains) comes from the trick's ``TRICK`` when this build has the module. ``why_not``
says why a candidate cannot help on this workload; ``check`` proves a candidate keeps the results right: exact
tricks by output, gradient and updated-parameter equality on the same batch, approximate ones by loss parity over
a few training steps and the SQNR of the outputs, loader settings by yielding the same batches.
"""

from __future__ import annotations

import importlib
import math
import os
from dataclasses import dataclass
from typing import Any

import torch

from pytorchtricks.tune.diagnose import Diagnosis
from pytorchtricks.tune.runner import Runner, make_loader, ptt_function
from pytorchtricks.tune.workload import Workload

EXACT_REL_TOL = 5e-3  # max |a-b| / max |a|: fp32 reassociation (other kernels or layouts, through a deep net
# with train-mode BN) stays near 1e-3 on a ResNet-18; a real bug gives O(1)
LOSS_REL_TOL = 0.05  # approximate tricks: every loss of the first steps within 5% of fp32
MIN_SQNR_DB = 20.0  # approximate tricks: outputs at least 20 dB above the error (bf16 typically gives 30-45)
PARITY_STEPS = 3
COMPILE_MIN_BUDGET_S = 420.0  # CPU inductor compiles a ResNet-18 training step in minutes on 2 cores


@dataclass(frozen=True)
class Candidate:
    name: str  # receipt row name: the catalogue trick's name, or the loader setting
    export: str | None  # the ptt function it needs; None for plain torch settings
    phases: tuple[str, ...]
    exact: bool
    gains: tuple[str, ...]
    apply: str  # the line apply.py writes


CANDIDATES: tuple[Candidate, ...] = (
    Candidate(
        "remove_conv_bias_before_bn",
        "remove_conv_bias_before_bn_",
        ("train", "infer"),
        True,
        ("speed", "memory"),
        "ptt.remove_conv_bias_before_bn_(model)",
    ),
    Candidate(
        "fuse_conv_bn", "fuse_conv_bn_", ("infer",), True, ("speed",), "ptt.fuse_conv_bn_(model.eval())"
    ),
    Candidate(
        "to_channels_last",
        "to_channels_last_",
        ("train", "infer"),
        True,
        ("speed",),
        "ptt.to_channels_last_(model)  # and x = x.contiguous(memory_format=torch.channels_last)",
    ),
    Candidate(
        "mixed_precision",
        "mixed_precision",
        ("train", "infer"),
        False,
        ("speed", "memory"),
        'mp = ptt.mixed_precision(device, dtype="bf16")',
    ),
    Candidate(
        "fast_optimizer",
        "fast_optimizer",
        ("train",),
        True,
        ("speed",),
        'optimizer = ptt.fast_optimizer(model.parameters(), "sgd", lr=lr, momentum=0.9)',
    ),
    Candidate("compile", "compile_", ("train", "infer"), False, ("speed",), "ptt.compile_(model)"),
    Candidate(
        "quantize",
        "quantize_",
        ("infer",),
        False,
        ("speed", "memory"),
        "model = ptt.quantize_(model.eval(), (example_batch,))",
    ),
    Candidate(
        "loader_workers",
        None,
        ("train", "infer"),
        True,
        ("speed",),
        "loader = DataLoader(dataset, batch_size, shuffle=True, drop_last=True, num_workers={workers}, "
        "persistent_workers=True, prefetch_factor=2)",
    ),
    Candidate("pin_memory", None, ("train", "infer"), True, ("speed",), "DataLoader(..., pin_memory=True)"),
    Candidate(
        "enable_cudnn_benchmark",
        "enable_cudnn_benchmark",
        ("train", "infer"),
        True,
        ("speed",),
        "ptt.enable_cudnn_benchmark()",
    ),
    Candidate("enable_tf32", "enable_tf32", ("train", "infer"), False, ("speed",), "ptt.enable_tf32()"),
)


def by_name(name: str) -> Candidate:
    for c in CANDIDATES:
        if c.name == name:
            return c
    raise KeyError(name)


def with_catalogue_metadata(c: Candidate) -> Candidate:
    """The candidate with ``exact``/``gains`` read from the trick module's ``TRICK`` when this build has it."""
    import pytorchtricks as ptt

    module = ptt._EXPORTS.get(c.export or "")
    if module is None:
        return c
    try:
        info = importlib.import_module(module).TRICK
    except Exception:
        return c
    return Candidate(c.name, c.export, c.phases, bool(info.exact), tuple(info.gains), c.apply)


def why_not(c: Candidate, w: Workload, diag: Diagnosis, budget_left_s: float) -> str | None:
    """Why ``c`` cannot help on this workload, or None when it is worth measuring."""
    if w.for_ not in c.phases:
        return (
            "applies to "
            + (" and ".join("training" if p == "train" else "inference" for p in c.phases))
            + " only"
        )
    dev = w.device.type
    if c.name in ("enable_cudnn_benchmark", "enable_tf32") and dev != "cuda":
        return "needs a CUDA GPU (cuDNN autotuning / TF32 tensor cores); this run is on the CPU"
    if c.name == "pin_memory":
        return (
            "pinned memory only speeds host-to-CUDA copies; this run is on the CPU" if dev != "cuda" else None
        )
    if c.export is not None and ptt_function(c.export) is None:
        return "not available in this build"
    if c.name == "remove_conv_bias_before_bn" and not diag.conv_bias_pairs:
        return "no convolution with a bias feeds a BatchNorm: nothing to remove"
    if c.name == "fuse_conv_bn" and diag.conv_bn_pairs == 0:
        return "no Conv->BatchNorm pair to fold"
    if c.name == "to_channels_last" and not diag.has_conv2d:
        return "no 2-D convolutions: the memory format does not matter"
    if c.name == "mixed_precision" and not diag.bf16_native:
        return "this device has no native bf16 (CPU: avx512_bf16 or AMX): bf16 would be emulated and slower"
    if c.name == "compile" and budget_left_s < COMPILE_MIN_BUDGET_S:
        return (
            f"torch.compile needs minutes of compilation on this CPU, more than the {budget_left_s:.0f} s left of the "
            f"time budget; rerun with --time-budget {int(COMPILE_MIN_BUDGET_S * 2)} to try it"
        )
    if c.name == "loader_workers" and (os.cpu_count() or 1) < 2:
        return "one CPU core: loader workers could not run beside the training process"
    return None


# ----------------------------------------------------------------------------------------------- checks


@dataclass
class Check:
    kind: str
    passed: bool
    detail: str
    metrics: dict[str, float]


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.detach().float().cpu(), b.detach().float().cpu()
    scale = float(a.abs().max()) if a.numel() else 0.0
    return float((a - b).abs().max()) / max(scale, 1e-12) if a.numel() else 0.0


def _rel_all(a: list[Any], b: list[Any]) -> float:
    if not a:
        return 0.0
    scale = max(float(t.detach().abs().max()) for t in a)
    diff = max(float((x.detach().float() - y.detach().float()).abs().max()) for x, y in zip(a, b))
    return diff / max(scale, 1e-12)


def sqnr_db(ref: torch.Tensor, test: torch.Tensor) -> float:
    """Signal-to-quantization-noise ratio of ``test`` against ``ref`` in dB (inf when equal)."""
    ref, test = ref.detach().float().cpu(), test.detach().float().cpu()
    noise = float((ref - test).pow(2).sum())
    return math.inf if noise == 0 else 10 * math.log10(float(ref.pow(2).sum()) / noise)


def _model_tricks(tricks: tuple[str, ...]) -> tuple[str, ...]:  # loader settings are checked by check_loader
    return tuple(t for t in tricks if t not in ("loader_workers", "pin_memory"))


def check_loader(w: Workload, workers: int) -> Check:
    """The worker loader yields exactly the batches (images and labels) of the in-process loader."""
    import itertools

    a = list(itertools.islice(iter(make_loader(w, 0)), 2))
    b = list(itertools.islice(iter(make_loader(w, workers)), 2))
    same = len(a) == len(b) and all(
        torch.equal(x1, x2) and torch.equal(y1, y2) for (x1, y1), (x2, y2) in zip(a, b)
    )
    return Check("same batches", same, "first 2 batches identical" if same else "batches differ", {})


def _exact(w: Workload, tricks: tuple[str, ...], x: torch.Tensor, y: torch.Tensor) -> Check:
    base, trt = Runner(w, (), loader=False), Runner(w, tricks, loader=False)
    try:
        if not base.train:
            with torch.no_grad():
                rel = _rel(base.forward(base.prepare(x)), trt.forward(trt.prepare(x)))
            return Check(
                "exact: outputs", rel <= EXACT_REL_TOL, f"max rel. output diff {rel:.1e}", {"out_rel": rel}
            )
        metrics: dict[str, float] = {}
        out_b, loss_b = base.loss_of(base.prepare(x), y.to(w.device))
        out_t, loss_t = trt.loss_of(trt.prepare(x), y.to(w.device))
        metrics["out_rel"] = _rel(out_b, out_t)
        loss_b.backward()
        loss_t.backward()
        pb, pt = dict(base.model.named_parameters()), dict(trt.model.named_parameters())
        common = [k for k in pb if k in pt and pb[k].grad is not None and pt[k].grad is not None]
        # relative to the largest gradient of the model: a conv bias before BN has a ~0 gradient of its own
        metrics["grad_rel"] = _rel_all([pb[k].grad for k in common], [pt[k].grad for k in common])
        base.optimizer.step()
        if trt.mp is not None:
            trt.mp.step(trt.optimizer)
        else:
            trt.optimizer.step()
        metrics["param_rel"] = _rel_all([pb[k] for k in common], [pt[k] for k in common])
        worst = max(metrics.values())
        return Check(
            "exact: outputs, grads, updated params",
            worst <= EXACT_REL_TOL,
            f"max rel. diff out {metrics['out_rel']:.1e}, grad {metrics['grad_rel']:.1e}, "
            f"params after a step {metrics['param_rel']:.1e} ({len(common)} tensors)",
            metrics,
        )
    finally:
        base.close()
        trt.close()


def _approx(w: Workload, tricks: tuple[str, ...], x: torch.Tensor, y: torch.Tensor) -> Check:
    base, trt = Runner(w, (), loader=False), Runner(w, tricks, loader=False)
    try:
        if not base.train:
            with torch.inference_mode():
                ref = base.forward(base.prepare(x))
                with trt.autocast():
                    got = trt.forward(trt.prepare(x))
            s = sqnr_db(ref, got)
            return Check("approximate: SQNR of outputs", s >= MIN_SQNR_DB, f"SQNR {s:.1f} dB", {"sqnr_db": s})
        losses: dict[str, list[float]] = {"base": [], "trt": []}
        s = math.inf
        yd = y.to(w.device)
        for i in range(PARITY_STEPS):
            for key, r in (("base", base), ("trt", trt)):
                out, loss = r.loss_of(r.prepare(x), yd)
                if key == "base":
                    ref = out.detach()
                elif i == 0:
                    s = sqnr_db(ref, out)
                losses[key].append(loss.detach().item())
                r.optimizer.zero_grad(set_to_none=True)
                if r.mp is not None:
                    r.mp.backward(loss)
                    r.mp.step(r.optimizer)
                else:
                    loss.backward()
                    r.optimizer.step()
        # relative to the first fp32 loss: after a few steps on one batch the loss can be near 0
        rel = max(abs(a - b) for a, b in zip(losses["base"], losses["trt"])) / max(
            abs(losses["base"][0]), 1e-12
        )
        finite = all(math.isfinite(v) for v in losses["trt"])
        ok = finite and rel <= LOSS_REL_TOL and s >= MIN_SQNR_DB
        return Check(
            f"approximate: loss parity over {PARITY_STEPS} steps + SQNR",
            ok,
            f"max rel. loss diff {rel:.1e} (fp32 {losses['base'][-1]:.3f} vs {losses['trt'][-1]:.3f}), "
            f"output SQNR {s:.1f} dB",
            {"loss_rel": rel, "sqnr_db": s},
        )
    finally:
        base.close()
        trt.close()


def check(w: Workload, tricks: tuple[str, ...], exact: bool) -> Check:
    """Correctness of the configuration ``tricks`` against the baseline (see the module docstring)."""
    checks: list[Check] = []
    if "loader_workers" in tricks:
        from pytorchtricks.tune.runner import loader_workers

        checks.append(check_loader(w, loader_workers()))
    model_tricks = _model_tricks(tricks)
    if model_tricks:
        x, y = w.example_batch(min(w.batch_size, 16))
        try:
            checks.append((_exact if exact else _approx)(w, model_tricks, x, y))
        except Exception as exc:  # a trick that crashes on this model fails its check, with the reason
            checks.append(Check("error", False, f"{type(exc).__name__}: {str(exc)[:200]}", {}))
    if not checks:
        return Check("none needed", True, "no model or data change", {})
    metrics: dict[str, float] = {}
    for c in checks:
        metrics.update(c.metrics)
    return Check(
        "; ".join(c.kind for c in checks),
        all(c.passed for c in checks),
        "; ".join(c.detail for c in checks),
        metrics,
    )


def exact_set(tricks: tuple[str, ...]) -> bool:
    return all(with_catalogue_metadata(by_name(t)).exact for t in tricks)
