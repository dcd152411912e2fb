"""Shared plumbing of the analysis tools: run a model once without changing it, and know which module ran an op."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

import torch
from torch import nn

from pytorchtricks.core import PttError


def as_args(example_inputs: Any) -> tuple[Any, ...]:
    """Normalise ``example_inputs`` (a tensor, or a tuple/list of positional arguments) to a tuple."""
    if isinstance(example_inputs, torch.Tensor):
        return (example_inputs,)
    if isinstance(example_inputs, tuple | list):
        return tuple(example_inputs)
    raise PttError(
        f"example_inputs must be a tensor or a tuple of positional arguments, got {type(example_inputs).__name__}."
    )


def check_module(model: Any) -> nn.Module:
    if not isinstance(model, nn.Module):
        raise PttError(f"expected a torch.nn.Module, got {type(model).__name__}; pass the model itself.")
    return model


@contextlib.contextmanager
def preserved_state(model: nn.Module) -> Iterator[None]:
    """Run probes on ``model`` and put its buffers (BatchNorm statistics), grads and mode back afterwards."""
    buffers = {n: b.detach().clone() for n, b in model.named_buffers()}
    grads = {n: (None if p.grad is None else p.grad.detach().clone()) for n, p in model.named_parameters()}
    modes = {n: m.training for n, m in model.named_modules()}
    try:
        yield
    finally:
        with torch.no_grad():
            for n, b in model.named_buffers():
                if n in buffers:
                    b.copy_(buffers[n])
        for n, p in model.named_parameters():
            if n in grads:
                p.grad = grads[n]
        for n, m in model.named_modules():
            if n in modes:
                m.training = modes[n]


class ModuleTracker:
    """Knows the innermost module whose ``forward`` is running (``.current``) and counts calls per module path.

    Registered with forward pre/post hooks on every submodule; ``with ModuleTracker(model) as t: model(x)``.
    """

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self.stack: list[str] = []
        self.calls: dict[str, int] = {}
        self.call_inputs: dict[str, list[list[tuple[int, ...]]]] = {}
        self.call_outputs: dict[str, list[list[tuple[int, ...]]]] = {}
        self._handles: list[Any] = []

    @property
    def current(self) -> str:
        return self.stack[-1] if self.stack else ""

    def _pre(self, name: str) -> Any:
        def hook(module: nn.Module, args: Sequence[Any]) -> None:
            self.stack.append(name)
            self.calls[name] = self.calls.get(name, 0) + 1
            self.call_inputs.setdefault(name, []).append(_shapes(args))

        return hook

    def _post(self, name: str) -> Any:
        def hook(module: nn.Module, args: Sequence[Any], output: Any) -> None:
            if self.stack and self.stack[-1] == name:
                self.stack.pop()
            self.call_outputs.setdefault(name, []).append(_shapes(output))

        return hook

    def __enter__(self) -> ModuleTracker:
        for name, module in self.model.named_modules():  # each module object once, under its first name
            self.calls.setdefault(name, 0)
            self._handles.append(module.register_forward_pre_hook(self._pre(name)))
            self._handles.append(module.register_forward_hook(self._post(name), always_call=True))
        return self

    def __exit__(self, *exc: object) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()


def _shapes(obj: Any) -> list[tuple[int, ...]]:
    if isinstance(obj, torch.Tensor):
        return [tuple(obj.shape)]
    if isinstance(obj, tuple | list):
        out: list[tuple[int, ...]] = []
        for o in obj:
            out.extend(_shapes(o))
        return out
    if isinstance(obj, dict):
        out = []
        for o in obj.values():
            out.extend(_shapes(o))
        return out
    return []


def display(path: str) -> str:
    return path or "(model)"
