"""``Quantized``: what ``quantize`` returns (the quantized callable, how it was built, its safety report), and the
engines that run it - the AOTInductor package and the oneDNN plan built for the example's shapes.

Not a trick (leading underscore): ``tricks/model/quantize.py`` builds the graph, this module holds and runs it.
"""

from __future__ import annotations

import os
from typing import Any

import torch
from torch import nn


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
            from pytorchtricks.tricks.model.onednn_plan import PlanUnsupported, build_plan

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


def onednn_plan(q: Quantized, graph: Any, example: tuple[Any, ...]) -> Quantized:
    """Lower ``graph`` (the PT2E int8 graph) to a oneDNN plan for the example's shapes; see ``onednn_plan``.

    The plan runs every int8 op as one prebuilt oneDNN primitive (ResNet-18 at 160 px, Zen 4: 1.17-1.36x ONNX
    Runtime static int8, results/int8_breakdown.md). If it cannot be built, ``q.plan_error`` says why and calls keep
    the AOTInductor / torch.compile path.
    """
    from pytorchtricks.tricks.model.onednn_plan import PlanUnsupported, build_plan

    try:
        q.plans[torch.get_num_threads()] = build_plan(graph, example)
    except PlanUnsupported as exc:
        q.plan_error = str(exc)
        return q
    q.plan_source, q.plan_shapes = (graph, example), _shapes(example)
    return q
