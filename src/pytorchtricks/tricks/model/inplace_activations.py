"""Switch ReLU-family activations to ``inplace=True`` where the traced graph proves it safe.

Why: an out-of-place ReLU allocates a second activation-sized tensor per call; in place it overwrites its input,
so forward allocates less and the allocator touches less memory (the "inplace=True" tip). Outputs and gradients
are unchanged.
When: training or inference of CNNs whose activations follow a conv, linear, normalisation or add.
Caveats: only ReLU, ReLU6/Hardtanh and LeakyReLU (slope >= 0), whose backward needs only their output. An
activation is switched only when, at every call site in the ``torch.fx`` graph, its input comes straight from a
conv/linear/norm/add (ops that do not save their output for backward) and has no other user; otherwise it is left
alone. Models that ``torch.fx`` cannot trace raise ``PttError``. Often a small saving: BatchNorm still saves its
input, and the allocator may reuse freed blocks anyway.
See also: ptt lint (PTL012 inplace-activation), memory_breakdown, 节省显存 / inplace.
"""

from __future__ import annotations

import copy
import operator
import warnings
from typing import Any

import torch
from torch import nn

from pytorchtricks.core import BenchCase, NoEffectWarning, PttError, TrickInfo
from pytorchtricks.tunable import TuneHook, TuneSetup, applied_or_skip

__all__ = ["inplace_activations_"]

TRICK = TrickInfo(gains=("memory",), phase=("train", "infer"), exact=True)


def _tune_apply(setup: TuneSetup, state: object) -> None:
    applied_or_skip(inplace_activations_, setup.model)  # e.g. torchvision's ReLUs are in place already


TUNE = TuneHook(
    changes="model",
    check="exact",
    receipt="ptt.inplace_activations_(model)  # ReLUs whose input nothing else reads overwrite it",
    apply=_tune_apply,
    order=20,
)

# Their backward reads only the output, so overwriting the input in place leaves autograd correct.
_ACTIVATIONS: tuple[type[nn.Module], ...] = (nn.ReLU, nn.ReLU6, nn.Hardtanh, nn.LeakyReLU)
# Producers that do not save their output for backward and return a fresh tensor (not a view).
_SAFE_PRODUCER_MODULES: tuple[type[nn.Module], ...] = (
    nn.Conv1d,
    nn.Conv2d,
    nn.Conv3d,
    nn.ConvTranspose1d,
    nn.ConvTranspose2d,
    nn.ConvTranspose3d,
    nn.Linear,
    nn.modules.batchnorm._BatchNorm,
    nn.GroupNorm,
    nn.LayerNorm,
)
_SAFE_PRODUCER_FUNCTIONS = (operator.add, torch.add)


def _eligible(m: nn.Module) -> bool:
    if not isinstance(m, _ACTIVATIONS) or getattr(m, "inplace", True):
        return False
    return not (isinstance(m, nn.LeakyReLU) and m.negative_slope < 0)


def _safe_site(node: Any, modules: dict[str, nn.Module]) -> bool:
    if len(node.args) != 1 or node.kwargs:
        return False
    src = node.args[0]
    if not hasattr(src, "op") or len(src.users) != 1:
        return False  # the input is read again elsewhere (skip connection, model output): in place would corrupt it
    if src.op == "call_module":
        return isinstance(modules.get(src.target), _SAFE_PRODUCER_MODULES)
    if src.op == "call_function" and src.target in _SAFE_PRODUCER_FUNCTIONS:
        return not src.kwargs
    if src.op == "call_method" and src.target == "add":
        return not src.kwargs
    return False


def safe_inplace_candidates(model: nn.Module) -> list[str]:
    """Module paths of out-of-place activations that can safely become in-place (fx-traced proof).

    Raises:
        PttError: the model cannot be traced by ``torch.fx``.
    """
    import torch.fx

    try:
        graph = torch.fx.symbolic_trace(model).graph
    except Exception as exc:
        raise PttError(
            f"cannot prove in-place safety: torch.fx cannot trace {type(model).__name__} ({type(exc).__name__}: "
            f"{str(exc).splitlines()[0][:120]}). Set inplace=True by hand where an activation's input is not reused."
        ) from exc
    modules = dict(model.named_modules())
    sites: dict[str, list[bool]] = {}
    for node in graph.nodes:
        if node.op == "call_module" and _eligible(modules.get(node.target, nn.Identity())):
            sites.setdefault(node.target, []).append(_safe_site(node, modules))
    # a module object reachable under another name is traced under its first name only; every site must be safe
    return [path for path, ok in sites.items() if ok and all(ok)]


def inplace_activations_(model: nn.Module) -> nn.Module:
    """Set ``inplace=True`` on every ReLU/ReLU6/Hardtanh/LeakyReLU whose in-place use is provably safe.

    Example:
        >>> m = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU(), nn.Conv2d(8, 8, 3), nn.ReLU())
        >>> ptt.inplace_activations_(m)[2].inplace
        True
    """
    if not isinstance(model, nn.Module):
        raise PttError(f"inplace_activations_ needs a torch.nn.Module, got {type(model).__name__}.")
    paths = safe_inplace_candidates(model)
    modules = dict(model.named_modules())
    for path in paths:
        modules[path].inplace = True  # type: ignore[assignment]
    if not paths:
        warnings.warn(
            "inplace_activations_ changed nothing: no out-of-place ReLU-family activation has a safe input "
            "(a conv/linear/norm/add output used only by the activation).",
            NoEffectWarning,
            stacklevel=2,
        )
    return model


def _bench_model(width: int) -> nn.Module:
    layers: list[nn.Module] = []
    c_in = 3
    for _ in range(4):
        layers += [nn.Conv2d(c_in, width, 3, padding=1, bias=False), nn.BatchNorm2d(width), nn.ReLU()]
        c_in = width
    return nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(width, 10))


def bench_case(size: str = "smoke", device: str = "cpu") -> BenchCase:
    """A training step of a Conv-BN-ReLU stack with out-of-place vs in-place ReLUs; ``check`` compares losses."""
    width, hw, batch = (16, 32, 8) if size == "smoke" else (64, 64, 32)
    dev = torch.device(device)
    torch.manual_seed(0)
    base = _bench_model(width).to(dev)
    treated = inplace_activations_(copy.deepcopy(base))
    x = torch.randn(batch, 3, hw, hw, device=dev)
    y = torch.randint(0, 10, (batch,), device=dev)

    def step(model: nn.Module) -> torch.Tensor:
        model.zero_grad(set_to_none=True)
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        return loss.detach()

    def check(a: torch.Tensor, b: torch.Tensor) -> None:
        torch.testing.assert_close(a, b)

    return BenchCase(
        baseline=lambda: step(base),
        treated=lambda: step(treated),
        items_per_call=batch,
        unit="images",
        device=str(dev),
        description=f"train step, 4x Conv-BN-ReLU width {width}, {batch}x3x{hw}x{hw}",
        check=check,
    )
