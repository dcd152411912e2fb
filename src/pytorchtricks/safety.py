"""Safety check for model transforms: same answers, caller's inputs untouched, no aliasing.

Every rewriting transform (``fuse_conv_bn_``, ``reparameterize_``, ``quantize``, ``compile_``) can silently give
wrong results: a ReLU dropped from a reused module, BN folded into a conv used elsewhere, or an int8 graph whose
oneDNN in-place sum post-op writes into the caller's input tensor (PT2E x86 + freezing). ``check_transform`` runs
the transformed callable on example inputs and compares it with reference outputs taken *before* the transform:
maximum absolute difference, SQNR in dB, whether the caller's input tensors changed, and whether an output shares
storage with an input. It returns a ``SafetyReport`` and raises ``SafetyError`` (saying what went wrong) on failure.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from pytorchtricks.core import PttError

__all__ = ["SafetyError", "SafetyReport", "check_transform", "reference_outputs", "sqnr_db"]


class SafetyError(PttError):
    """A transformed model failed its safety check; ``report`` holds the measurements."""

    def __init__(self, message: str, report: SafetyReport) -> None:
        super().__init__(message)
        self.report = report


@dataclass
class SafetyReport:
    """Outcome of one safety check (all numbers over every output tensor together)."""

    step: str
    max_abs_diff: float
    sqnr_db: float
    inputs_unchanged: bool
    outputs_alias_inputs: bool
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def as_dict(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "max_abs_diff": self.max_abs_diff,
            "sqnr_db": self.sqnr_db,
            "inputs_unchanged": self.inputs_unchanged,
            "outputs_alias_inputs": self.outputs_alias_inputs,
            "ok": self.ok,
            "problems": list(self.problems),
        }


def _tensors(obj: Any) -> list[torch.Tensor]:
    """Tensors inside nested tuples/lists/dicts, in a stable order."""
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, dict):
        return [t for k in sorted(obj, key=str) for t in _tensors(obj[k])]
    if isinstance(obj, list | tuple):
        return [t for x in obj for t in _tensors(x)]
    if hasattr(obj, "__dataclass_fields__") or hasattr(obj, "_fields"):  # namedtuple / ModelOutput-like
        return _tensors(tuple(getattr(obj, f) for f in getattr(obj, "_fields", obj.__dataclass_fields__)))
    return []


def _as_tuple(example_inputs: Any) -> tuple[Any, ...]:
    return tuple(example_inputs) if isinstance(example_inputs, list | tuple) else (example_inputs,)


def reference_outputs(model: Callable[..., Any], example_inputs: Any) -> list[torch.Tensor]:
    """Run the untreated ``model`` on copies of ``example_inputs``; returns detached fp32 copies of its outputs.

    Example:
        >>> ref = reference_outputs(nn.Linear(3, 2), torch.ones(1, 3))
        >>> ref[0].shape
        torch.Size([1, 2])
    """
    args = tuple(a.clone() if isinstance(a, torch.Tensor) else a for a in _as_tuple(example_inputs))
    with torch.no_grad():
        out = model(*args)
    return [t.detach().float().clone() for t in _tensors(out)]


def sqnr_db(reference: torch.Tensor, actual: torch.Tensor) -> float:
    """Signal-to-quantization-noise ratio ``10 log10(sum ref^2 / sum (ref - actual)^2)``; inf when equal.

    Example:
        >>> round(sqnr_db(torch.ones(4), torch.full((4,), 1.1)), 1)
        20.0
    """
    ref = reference.detach().double()
    noise = (ref - actual.detach().double()).pow(2).sum().item()
    signal = ref.pow(2).sum().item()
    if noise == 0.0:
        return math.inf
    if signal == 0.0:
        return -math.inf
    return 10.0 * math.log10(signal / noise)


def _storages(ts: Sequence[torch.Tensor]) -> set[int]:
    out = set()
    for t in ts:
        if t.device.type == "meta":
            continue
        try:
            out.add(t.untyped_storage().data_ptr())
        except (RuntimeError, NotImplementedError):  # tensor subclasses without storage
            pass
    return out - {0}


def check_transform(
    transformed: Callable[..., Any],
    example_inputs: Any,
    reference: Sequence[torch.Tensor],
    *,
    step: str = "transform",
    max_abs_diff: float | None = None,
    min_sqnr_db: float | None = None,
    raise_on_failure: bool = True,
) -> SafetyReport:
    """Run ``transformed`` on the caller's ``example_inputs`` and check it against ``reference`` outputs.

    Checks: max abs diff <= ``max_abs_diff`` (when given), SQNR >= ``min_sqnr_db`` (when given), the input
    tensors are bit-for-bit unchanged after the call, and no output shares storage with an input.

    Example:
        >>> m = nn.Linear(3, 2)
        >>> x = torch.randn(4, 3)
        >>> ref = reference_outputs(m, x)
        >>> check_transform(m, x, ref, max_abs_diff=0.0).ok
        True
    """
    args = _as_tuple(example_inputs)
    inputs = _tensors(args)
    before = [t.detach().clone() for t in inputs]
    with torch.no_grad():
        out = transformed(*args)
    outs = _tensors(out)
    problems: list[str] = []
    changed = [i for i, (b, t) in enumerate(zip(before, inputs)) if not torch.equal(b, t.detach())]
    if changed:
        problems.append(
            f"the call modified the caller's input tensor(s) {changed} in place; clone inputs before calling "
            "(quantize(..., QuantConfig(clone_inputs=True))) or avoid freezing/in-place fusions for this model."
        )
        for b, t in zip(before, inputs):  # give the caller their data back
            with torch.no_grad():
                t.copy_(b)
    aliases = bool(_storages(outs) & _storages(inputs))
    if aliases:
        problems.append("an output shares memory with an input; clone the output or drop the in-place op.")
    if len(outs) != len(reference):
        problems.append(f"the transformed model returned {len(outs)} tensors, the original {len(reference)}.")
        diff, sq = math.inf, -math.inf
    else:
        diff, sq = 0.0, math.inf
        shape_bad = [i for i, (r, o) in enumerate(zip(reference, outs)) if r.shape != o.shape]
        if shape_bad:
            problems.append(f"output(s) {shape_bad} changed shape.")
            diff, sq = math.inf, -math.inf
        elif outs:
            ref_cat = torch.cat([r.reshape(-1) for r in reference])
            out_cat = torch.cat([o.detach().float().reshape(-1).cpu() for o in outs])
            diff = (ref_cat.cpu() - out_cat).abs().max().item() if ref_cat.numel() else 0.0
            sq = sqnr_db(ref_cat.cpu(), out_cat)
    if max_abs_diff is not None and not diff <= max_abs_diff:
        problems.append(f"max abs diff {diff:.3g} exceeds {max_abs_diff:.3g}.")
    if min_sqnr_db is not None and not sq >= min_sqnr_db:
        problems.append(f"SQNR {sq:.1f} dB is below {min_sqnr_db:.1f} dB.")
    report = SafetyReport(step, diff, sq, not changed, aliases, problems)
    if problems and raise_on_failure:
        raise SafetyError(f"{step} failed its safety check: " + " ".join(problems), report)
    return report
