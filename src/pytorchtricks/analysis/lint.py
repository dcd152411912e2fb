"""Lint a model's design against the catalogue's rules: ``lint(model, example_inputs)`` and ``apply_lint_fixes_``.

Each finding has an id and name (``PTL001 conv-bias-before-bn``), a location (module path), an estimated cost
(bytes of memory traffic or parameters; ``--measure`` adds timings on this machine for G1/G2) and the fix. The
rules live in ``lint_rules.py``; the safe fixes call the catalogue's transforms (``remove_conv_bias_before_bn_``,
``inplace_activations_``, ``unshare_modules_``), never a copy of them.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.utils._pytree import tree_flatten

from pytorchtricks.analysis._probe import ModuleTracker, as_args, check_module, display, preserved_state
from pytorchtricks.analysis.flops import count_flops
from pytorchtricks.analysis.lint_rules import RULES, Finding, LintContext, fmt_bytes, stamp
from pytorchtricks.core import PttError

__all__ = ["FixReport", "LintReport", "apply_lint_fixes_", "lint"]

PHASES = ("train", "infer")


@dataclass
class LintReport:
    """Findings of ``lint`` (sorted by rule id, then location) and notes about rules that could not run."""

    findings: list[Finding]
    model: str
    input_shapes: list[tuple[int, ...]]
    phase: str
    summary: str = ""
    notes: list[str] = field(default_factory=list)
    batch_size: int | None = None  # the batch findings are stated for, when the example was a smaller probe

    def ids(self) -> list[str]:
        return sorted({f.id for f in self.findings})

    def where(self, rule_id: str) -> list[str]:
        """Locations at which ``rule_id`` fired."""
        return [f.location for f in self.findings if f.id == rule_id]

    def __str__(self) -> str:
        shapes = ", ".join("x".join(map(str, s)) for s in self.input_shapes)
        at = f", costs for batch {self.batch_size}" if self.batch_size else ""
        lines = [f"ptt lint {self.model} (input {shapes}{at}, phase {self.phase})", self.summary]
        counts: dict[str, int] = {}
        for f in self.findings:
            counts[f.id] = counts.get(f.id, 0) + 1
        lines.append(
            f"{len(self.findings)} finding(s) from {len(counts)} rule(s); {sum(f.fixable for f in self.findings)} "
            "fixable with --fix"
        )
        groups: dict[str, list[Finding]] = {}
        for f in self.findings:
            groups.setdefault(f.id, []).append(f)
        for fs in groups.values():
            f = fs[0]
            total = sum(x.cost_bytes for x in fs)
            size = f", ~{fmt_bytes(total)} in all" if total and len(fs) > 1 else ""
            where = ", ".join(display(x.location) for x in fs[:8]) + (
                f" (+{len(fs) - 8} more)" if len(fs) > 8 else ""
            )
            lines.append(f"\n[{f.severity}] {f.id} {f.name}: {len(fs)} site(s){size}")
            lines.append(f"  e.g. at {display(f.location)}: {f.message}")
            lines.append(f"  cost: {f.cost}" + (f"; measured: {f.measured}" if f.measured else ""))
            lines.append(f"  fix: {f.fix}" + (" [applied by --fix]" if f.fixable else ""))
            if len(fs) > 1:
                lines.append(f"  at: {where}")
        lines += [f"note: {n}" for n in self.notes]
        return "\n".join(line for line in lines if line)

    def details(self) -> str:
        """One line per finding (``str(report)`` groups them by rule)."""
        return "\n".join(f"[{f.severity}] {f.line()}" for f in self.findings)


def _trace_graph(model: nn.Module) -> tuple[Any, str]:
    import torch.fx

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return torch.fx.symbolic_trace(model).graph, ""
    except Exception as exc:
        return None, f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}" if str(exc) else type(
            exc
        ).__name__


def _probe_forward(model: nn.Module, args: tuple[Any, ...]) -> tuple[ModuleTracker, set[str]]:
    """One no-grad forward with call counting, shapes, and the memory format grouped convs see."""
    tracker = ModuleTracker(model)
    channels_last: set[str] = set()
    handles = []
    for path, m in model.named_modules():
        if isinstance(m, nn.Conv2d) and m.groups > 1:

            def hook(mod: nn.Module, inp: Any, path: str = path) -> None:
                x = inp[0] if inp else None
                if (
                    isinstance(x, torch.Tensor)
                    and x.dim() == 4
                    and not x.is_contiguous()
                    and x.is_contiguous(memory_format=torch.channels_last)
                ):
                    channels_last.add(path)

            handles.append(m.register_forward_pre_hook(hook))
    try:
        with preserved_state(model), torch.no_grad(), tracker:
            model(*args)
    finally:
        for h in handles:
            h.remove()
    return tracker, channels_last


def _params_without_grad(model: nn.Module, args: tuple[Any, ...]) -> tuple[list[str] | None, str]:
    """Names of trainable parameters that get no gradient from (sum of the outputs).backward()."""
    trainable = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    if not trainable:
        return [], ""
    with preserved_state(model):
        for _, p in trainable:
            p.grad = None
        outs = [t for t in tree_flatten(model(*args))[0] if isinstance(t, torch.Tensor) and t.requires_grad]
        if not outs:
            return None, "unused-parameters skipped: no output requires grad"
        torch.autograd.backward([o.float().sum() for o in outs])
        missing = [n for n, p in trainable if p.grad is None]
    return missing, ""


def lint(
    model: nn.Module,
    example_inputs: Any,
    *,
    phase: str = "train",
    rules: list[str] | None = None,
    batch_size: int | None = None,
) -> LintReport:
    """Check ``model`` against the design rules; returns a ``LintReport`` (``print`` it).

    ``phase`` is ``"train"`` (also probes which parameters get gradients, with one backward) or ``"infer"``
    (also flags a model left in training mode). ``rules`` restricts to some ids (``["PTL001"]``). The model is
    run, but its buffers, gradients and modes are restored. ``batch_size`` is the batch the model really runs
    at when ``example_inputs`` is a smaller probe: the batch rule (PTL003) and the bytes per forward are then
    stated for it, not for the probe.

    Example:
        >>> m = nn.Sequential(nn.Conv2d(3, 16, 3), nn.BatchNorm2d(16), nn.ReLU(), nn.Conv2d(16, 64, 3))
        >>> ptt.lint(m, torch.randn(8, 3, 16, 16)).ids()
        ['PTL001', 'PTL012']
        >>> ptt.lint(m, torch.randn(2, 3, 16, 16), batch_size=30).ids()  # probed at 2, stated for batch 30
        ['PTL001', 'PTL003', 'PTL012']
    """
    check_module(model)
    if phase not in PHASES:
        raise PttError(f"phase must be 'train' or 'infer', got {phase!r}.")
    if batch_size is not None and batch_size < 1:
        raise PttError(f"batch_size must be a positive number of samples, got {batch_size}.")
    unknown = [r for r in rules or [] if r not in RULES]
    if unknown:
        raise PttError(f"unknown lint rule(s) {unknown}; known: {', '.join(RULES)}.")
    args = as_args(example_inputs)
    notes: list[str] = []
    flops = count_flops(model, args)
    tracker, channels_last = _probe_forward(model, args)
    graph, trace_error = _trace_graph(model)
    if graph is None:
        notes.append(
            f"torch.fx could not trace the model ({trace_error}); PTL001/PTL006/PTL012 were skipped."
        )
    no_grad: list[str] | None = None
    if phase == "train":
        no_grad, why = _params_without_grad(model, args)
        if why:
            notes.append(why)
    ctx = LintContext(
        model=model,
        args=args,
        phase=phase,
        flops=flops,
        tracker=tracker,
        graph=graph,
        trace_error=trace_error,
        modules=dict(model.named_modules()),
        grouped_conv_inputs_channels_last=channels_last,
        no_grad_params=no_grad,
        batch_size=batch_size,
    )
    findings: list[Finding] = []
    for r in RULES.values():
        if rules is None or r.id in rules:
            findings.extend(stamp(r, r.check(ctx)))
    return LintReport(
        findings=findings,
        model=type(model).__name__,
        input_shapes=[tuple(a.shape) for a in args if isinstance(a, torch.Tensor)],
        phase=phase,
        summary=str(flops),
        notes=notes,
        batch_size=batch_size,
    )


@dataclass
class FixReport:
    """What ``apply_lint_fixes_`` changed: one line per applied fix, skipped fixes with the reason, and re-lint."""

    applied: list[str]
    skipped: list[str]
    before: LintReport
    after: LintReport

    def __str__(self) -> str:
        lines = [f"applied: {a}" for a in self.applied] or ["applied: nothing"]
        lines += [f"skipped: {s}" for s in self.skipped]
        lines.append(f"findings: {len(self.before.findings)} before, {len(self.after.findings)} after")
        return "\n".join(lines)


def apply_lint_fixes_(model: nn.Module, example_inputs: Any, *, phase: str = "train") -> FixReport:
    """Apply the safe fixes of ``lint`` in place: unshare stateless reused modules (PTL010), remove conv biases
    before BatchNorm (PTL001, exact), make activations in-place where proven safe (PTL012, exact).

    Example:
        >>> m = nn.Sequential(nn.Conv2d(3, 16, 3), nn.BatchNorm2d(16), nn.ReLU(), nn.Conv2d(16, 64, 3))
        >>> rep = ptt.apply_lint_fixes_(m, torch.randn(8, 3, 16, 16))
        >>> m[0].bias is None, m[2].inplace, rep.after.ids()
        (True, True, [])
    """
    before = lint(model, example_inputs, phase=phase)
    applied: list[str] = []
    skipped: list[str] = []
    # each rule's fix is declared beside it (lint_rules), in rule order: PTL010's unsharing before PTL012
    for r in RULES.values():
        if r.fix is not None:
            done, why_not = r.fix(model, before)
            applied += done
            skipped += why_not
    after = lint(model, example_inputs, phase=phase)
    return FixReport(applied=applied, skipped=skipped, before=before, after=after)
