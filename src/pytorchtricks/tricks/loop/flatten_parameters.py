"""Put all parameters, and all gradients, in one contiguous buffer each ("contiguous params"); step one tensor.

Why: an optimizer step over hundreds of small tensors pays per-tensor overhead (Python loop, kernel launches);
with every parameter a view into one flat buffer, the optimizer updates a single big tensor instead - the trick of
the ``contiguous_params`` package (2019), from before torch's multi-tensor ``foreach`` and ``fused`` optimizers.
When: element-wise optimizers (SGD, Adam, AdamW, RMSprop...) on models with very many small tensors - and only if
it beats ``fast_optimizer`` (foreach/fused) on your machine: measure with ``ptt bench flatten_parameters``.
Caveats: build the optimizer on ``flat_parameters(model)`` and clear gradients with
``optimizer.zero_grad(set_to_none=False)`` - setting grads to None (``model.zero_grad()`` default) detaches them
from the buffer (``flat_parameters`` then raises). Moving the model (``.to``, ``.cuda``, ``.half``) after
flattening breaks the views: flatten last. Optimizers that use per-tensor norms (LAMB, LARS, Adafactor) see one
tensor: wrong for them. Verdict (``make bench-loop``, results/loop-flatten/, AdamW over 384 tensors, 6.4M
parameters, 2-core Zen 4, shared machine so spreads are wide): median step per-tensor loop 400 ms, foreach 419 ms,
flattened 49 ms (paired 5.4x [3.0-74.5] over the loop), fused AdamW 29 ms. Fused (CPU kernels since torch 2.4:
``fast_optimizer(params, "adamw", fused=True)``) was fastest and has none of these caveats: prefer it; flatten
only where no fused kernel exists for your optimizer.
See also: fast_optimizer, 对优化器的优化 / contiguous params.
"""

from __future__ import annotations

import copy
import warnings

import torch
from torch import nn

from pytorchtricks.core import BenchCase, NoEffectWarning, PttError, TrickInfo
from pytorchtricks.fixtures import many_small_tensors

__all__ = ["flatten_parameters_", "flat_parameters"]

TRICK = TrickInfo(gains=("speed",), phase=("train",), exact=True)


def flatten_parameters_(model: nn.Module) -> nn.Module:
    """Make every trainable parameter (and its ``.grad``) a view into one flat buffer per (device, dtype).

    Returns ``model``. Values are unchanged; ``flat_parameters(model)`` gives the flat tensors to optimize.

    Example:
        >>> m = ptt.flatten_parameters_(nn.Sequential(nn.Linear(3, 4), nn.Linear(4, 2)))
        >>> [p.numel() for p in ptt.flat_parameters(m)]
        [26]
    """
    if getattr(model, "_ptt_flat", None) is not None:
        raise PttError("model is already flattened; flatten a fresh model.")
    groups: dict[tuple[torch.device, torch.dtype], list[nn.Parameter]] = {}
    seen: set[int] = set()
    for p in model.parameters():
        if p.requires_grad and id(p) not in seen:
            seen.add(id(p))
            groups.setdefault((p.device, p.dtype), []).append(p)
    if not groups:
        warnings.warn(
            "flatten_parameters_ changed nothing: no trainable parameters.", NoEffectWarning, stacklevel=2
        )
        return model
    flats = []
    for (device, dtype), params in groups.items():
        total = sum(p.numel() for p in params)
        data = torch.empty(total, device=device, dtype=dtype)
        grad = torch.zeros(total, device=device, dtype=dtype)
        offset = 0
        with torch.no_grad():
            for p in params:
                n = p.numel()
                data[offset : offset + n].copy_(p.detach().reshape(-1))
                if p.grad is not None:
                    grad[offset : offset + n].copy_(p.grad.reshape(-1))
                p.data = data[offset : offset + n].view_as(p)  # the parameter now lives inside the buffer
                p.grad = grad[offset : offset + n].view_as(p)  # autograd accumulates into this view in place
                offset += n
        flat = nn.Parameter(data)  # shares storage with every view above
        flat.grad = grad
        flats.append((flat, params))
    object.__setattr__(model, "_ptt_flat", flats)  # plain attribute: not registered as a parameter
    return model


def flat_parameters(model: nn.Module) -> list[nn.Parameter]:
    """The flat parameter tensors of a flattened model, for ``torch.optim.X(flat_parameters(model), ...)``.

    Raises PttError when a gradient was detached from the buffer (e.g. by ``zero_grad(set_to_none=True)``).
    """
    flats = getattr(model, "_ptt_flat", None)
    if flats is None:
        raise PttError("model is not flattened; call ptt.flatten_parameters_(model) first.")
    for flat, params in flats:
        if flat.grad is None:
            raise PttError("the flat gradient was set to None; use optimizer.zero_grad(set_to_none=False).")
        lo = flat.grad.untyped_storage().data_ptr()
        for p in params:
            if p.grad is None or p.grad.untyped_storage().data_ptr() != lo:
                raise PttError(
                    "a parameter's .grad no longer lives in the flat buffer (set to None by zero_grad?); use "
                    "zero_grad(set_to_none=False) on flattened models, and flatten after moving the model."
                )
    return [flat for flat, _ in flats]


def bench_case(size: str = "smoke", device: str = "cpu") -> BenchCase:
    """AdamW step on a model with many small tensors: per-tensor loop vs one flat tensor; peers foreach, fused."""
    depth, width = (24, 64) if size == "smoke" else (96, 256)
    dev = torch.device(device)
    torch.manual_seed(0)
    ref = many_small_tensors(depth, width).to(dev)
    grads = [torch.randn_like(p) * 1e-3 for p in ref.parameters()]
    models = {k: copy.deepcopy(ref) for k in ("loop", "flat", "foreach", "fused")}
    for m in models.values():  # deepcopy does not copy .grad: give every copy the same gradients
        for p, g in zip(m.parameters(), grads):
            p.grad = g.clone()
    flatten_parameters_(models["flat"])
    opts = {
        "loop": torch.optim.AdamW(models["loop"].parameters(), lr=1e-3, foreach=False),
        "flat": torch.optim.AdamW(flat_parameters(models["flat"]), lr=1e-3, foreach=False),
        "foreach": torch.optim.AdamW(models["foreach"].parameters(), lr=1e-3, foreach=True),
        "fused": torch.optim.AdamW(models["fused"].parameters(), lr=1e-3, fused=True),
    }

    def check(_a: object, _b: object) -> None:
        for p, q in zip(models["loop"].parameters(), models["flat"].parameters()):
            torch.testing.assert_close(q, p, rtol=1e-5, atol=1e-6)

    return BenchCase(
        baseline=opts["loop"].step,
        treated=opts["flat"].step,
        items_per_call=1,
        unit="steps",
        device=str(dev),
        description=f"AdamW step, {2 * depth} layers of width {width} ({4 * depth} tensors)",
        peers={"foreach": opts["foreach"].step, "fused": opts["fused"].step},
        check=check,
    )
