"""Physically remove conv/Linear channels (structured pruning), dependency-aware, so the model is smaller and faster.

Why: masks make nothing faster (50% masked pruning measured 1.00x); removing channels does (50% of ResNet-18
channels removed, eager, 160 px, 1 thread: 2.81x / 2.69x at batch 1 / 8; results/inference_cpu.md). Channels tied by a residual add are pruned together, concatenations map
channel indices through, depthwise convs follow their input, BN is sliced along.
When: after training, followed by a short fine-tune (``distillation_loss`` from the unpruned teacher helps). Use
``network_slimming_step_`` (L1 on BN gamma) during training and ``criterion="bn_gamma"`` for network slimming.
Caveats: the call graph is traced with torch.fx; a channel dimension that reaches anything not understood (reshape,
the model output, a module called twice, a grouped non-depthwise conv) is left whole. Kept counts are rounded to
``round_to`` (8 suits SIMD/oneDNN blocking). Accuracy drops until fine-tuned. ``prune_unstructured_`` zeroes single
weights (``torch.nn.utils.prune``): smaller when compressed, NOT faster on dense kernels.
See also: distill, quantize_lowbit, 推理加速 / 剪枝.
"""

from __future__ import annotations

import copy
import warnings
from typing import Any

import torch
from torch import nn

from pytorchtricks.core import BenchCase, NoEffectWarning, PttError, TrickInfo
from pytorchtricks.tricks._cases import inference_case
from pytorchtricks.tricks.model._channel_graph import ChannelGraph, analyze

__all__ = ["prune_channels_", "network_slimming_step_", "prune_unstructured_"]

TRICK = TrickInfo(gains=("speed", "memory"), phase=("infer",), exact=False)


def _scores(cg: ChannelGraph, criterion: str) -> dict[int, torch.Tensor]:
    """Importance per channel for every prunable group root (higher = keep)."""
    scores: dict[int, torch.Tensor] = {}
    if criterion == "bn_gamma":
        for mid, segs in cg.bn_layout.items():
            bn = cg.modules[mid]
            gamma = bn.weight.detach().abs() if bn.weight is not None else torch.ones(bn.num_features)
            off = 0
            for g, n in segs:
                r = cg.find(g)
                scores[r] = scores.get(r, torch.zeros(n)) + gamma[off : off + n].float().cpu()
                off += n
    for g, mods in cg.producers.items():
        r = cg.find(g)
        if criterion == "bn_gamma":
            continue  # network slimming prunes only channels a BN scores
        for mod in mods:
            w: Any = mod.weight
            s = w.detach().abs().flatten(1).sum(1).float().cpu()
            scores[r] = scores.get(r, torch.zeros_like(s)) + s / max(1, w[0].numel())
    return scores


def _keep_count(n: int, amount: float, round_to: int) -> int:
    k = round(n * (1.0 - amount) / round_to) * round_to
    return min(n, max(round_to, k))


def _index(
    cg: ChannelGraph, keep: dict[int, torch.Tensor], segs: list[tuple[int, int]]
) -> torch.Tensor | None:
    if any(n == 0 for _, n in segs):  # unknown size (a model input): never pruned, nothing to slice
        return None
    parts, off = [], 0
    for g, n in segs:
        r = cg.find(g)
        parts.append(keep[r] + off if r in keep else torch.arange(n) + off)
        off += n
    return torch.cat(parts) if parts else torch.arange(0)


def _slice_(p: torch.Tensor | None, dim: int, idx: torch.Tensor) -> torch.nn.Parameter | torch.Tensor | None:
    if p is None:
        return None
    data = p.detach().index_select(dim, idx.to(p.device)).clone()
    return nn.Parameter(data, requires_grad=p.requires_grad) if isinstance(p, nn.Parameter) else data


def prune_channels_(
    model: nn.Module, amount: float, *, criterion: str = "l1", round_to: int = 8
) -> nn.Module:
    """Remove ``amount`` (0..1) of the channels of every prunable group, in place; returns ``model``.

    ``criterion``: ``"l1"`` (mean |w| of the producing filters) or ``"bn_gamma"`` (|gamma| of the BNs on the
    channels: network slimming). Output shape and the channels the model outputs never change.

    Example:
        >>> net = nn.Sequential(nn.Conv2d(3, 32, 3), nn.BatchNorm2d(32), nn.ReLU(), nn.Conv2d(32, 8, 1))
        >>> ptt.prune_channels_(net, 0.5)[0].out_channels, net[3].in_channels
        (16, 16)
    """
    if not 0.0 <= amount < 1.0:
        raise PttError(f"amount must be in [0, 1) (the fraction of channels to remove), got {amount}.")
    if criterion not in ("l1", "bn_gamma"):
        raise PttError(f"unknown criterion {criterion!r}; use 'l1' or 'bn_gamma'.")
    if round_to < 1:
        raise PttError("round_to must be >= 1.")
    cg = analyze(model)
    keep: dict[int, torch.Tensor] = {}
    for r, score in _scores(cg, criterion).items():
        n = cg.size[r]
        if cg.is_fixed(r) or n != len(score):
            continue
        k = _keep_count(n, amount, round_to)
        if k < n:
            keep[r] = torch.topk(score, k).indices.sort().values
    if not keep:
        warnings.warn(
            "prune_channels_ removed nothing: no prunable channel group (all fixed, or too small for round_to).",
            NoEffectWarning,
            stacklevel=2,
        )
        return model
    with torch.no_grad():
        _apply(cg, keep)
    return model


def _apply(cg: ChannelGraph, keep: dict[int, torch.Tensor]) -> None:
    for mid, m in cg.modules.items():
        if mid in cg.out_group and cg.find(cg.out_group[mid]) in keep:
            idx: torch.Tensor = keep[cg.find(cg.out_group[mid])]
            m.weight = _slice_(m.weight, 0, idx)
            m.bias = _slice_(m.bias, 0, idx)
            if isinstance(m, nn.Linear):
                m.out_features = len(idx)
            else:
                m.out_channels = len(idx)
        if mid in cg.in_layout:
            sel = _index(cg, keep, cg.in_layout[mid])
            if sel is not None and len(sel) != m.weight.shape[1]:
                m.weight = _slice_(m.weight, 1, sel)
                if isinstance(m, nn.Linear):
                    m.in_features = len(sel)
                else:
                    m.in_channels = len(sel)
        if mid in cg.dw_layout:
            sel = _index(cg, keep, cg.dw_layout[mid])
            if sel is not None and len(sel) != m.weight.shape[0]:
                m.weight = _slice_(m.weight, 0, sel)
                m.bias = _slice_(m.bias, 0, sel)
                m.in_channels = m.out_channels = m.groups = len(sel)
        if mid in cg.bn_layout:
            sel = _index(cg, keep, cg.bn_layout[mid])
            if sel is not None and len(sel) != m.num_features:
                m.weight = _slice_(m.weight, 0, sel)
                m.bias = _slice_(m.bias, 0, sel)
                if m.running_mean is not None:
                    m.running_mean = _slice_(m.running_mean, 0, sel)
                    m.running_var = _slice_(m.running_var, 0, sel)
                m.num_features = len(sel)


def network_slimming_step_(model: nn.Module, strength: float = 1e-4) -> nn.Module:
    """Add the L1 penalty ``strength * sign(gamma)`` to every BN weight's gradient (call after ``backward``).

    Network slimming (Liu et al. 2017): trains BN gammas towards sparsity so ``prune_channels_(criterion="bn_gamma")``
    removes channels that matter little.

    Example:
        >>> bn = nn.BatchNorm1d(2)
        >>> bn(torch.randn(4, 2)).sum().backward()
        >>> _ = ptt.network_slimming_step_(bn, 0.1)
        >>> bn.weight.grad.abs().min().item() >= 0.0
        True
    """
    for m in model.modules():
        if (
            isinstance(m, nn.modules.batchnorm._BatchNorm)
            and m.weight is not None
            and m.weight.grad is not None
        ):
            m.weight.grad.add_(torch.sign(m.weight.detach()), alpha=strength)
    return model


def prune_unstructured_(model: nn.Module, amount: float) -> nn.Module:
    """Zero the ``amount`` smallest-magnitude weights of each conv/Linear (permanent). Gives NO speed-up.

    Example:
        >>> lin = ptt.prune_unstructured_(nn.Linear(10, 10), 0.5)
        >>> int((lin.weight == 0).sum())
        50
    """
    from torch.nn.utils import prune

    if not 0.0 <= amount < 1.0:
        raise PttError(f"amount must be in [0, 1), got {amount}.")
    for m in model.modules():
        if isinstance(m, nn.Conv1d | nn.Conv2d | nn.Conv3d | nn.Linear):
            prune.l1_unstructured(m, "weight", amount=amount)
            prune.remove(m, "weight")
    return model


def bench_case(size: str = "smoke", device: str = "cpu") -> BenchCase:
    """ResNet-style CNN vs the same net with 50% of its channels physically removed (output shape unchanged)."""
    from pytorchtricks.fixtures import randomize_bn_, small_cnn

    width, hw, batch = (32, 32, 8) if size == "smoke" else (64, 64, 16)
    torch.manual_seed(0)
    base = randomize_bn_(small_cnn(in_channels=3, width=width)).eval().to(device)
    treated = prune_channels_(copy.deepcopy(base), 0.5)
    x = torch.randn(batch, 3, hw, hw, device=device)

    def check(a: torch.Tensor, b: torch.Tensor) -> None:
        if a.shape != b.shape:
            raise AssertionError(f"pruning changed the output shape {tuple(a.shape)} -> {tuple(b.shape)}")

    return inference_case(
        base,
        treated,
        x,
        description=f"small_cnn width {width}, {hw}px, batch {batch}: dense vs 50% channels removed",
        check=check,
    )
