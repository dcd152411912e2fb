"""Low-bit training: DoReFa k-bit weights/activations, TWN ternary and XNOR/BNN binary layers with straight-through grads.

Why: 4-bit weights and activations cut model size 8x and, on hardware with low-bit kernels, compute; trained with
quantization in the loop (QAT), accuracy stays near fp32 (micronet CIFAR-10: W8A8 91.03%, binary weights 90.93%,
binary W+A 86.23%). DoReFa: w = 2 Q_k(tanh(W) / (2 max|tanh W|) + 1/2) - 1, a = Q_k(clamp(x, 0, 1)),
Q_k(x) = round(x (2^k - 1)) / (2^k - 1); TWN: delta = 0.7 mean|W| per output channel, alpha = mean |W| above delta;
XNOR: sign(W) scaled by E|W| per output channel; BNN activations: sign(x) with the gradient zeroed where |x| >= 1.
When: when int8 is not small enough, or to study accuracy vs bits. Fine-tune from a trained fp32 model (``distill_``).
Caveats: this simulates low-bit arithmetic in fp32 (fake quantization): it proves accuracy, it does not make PyTorch
faster - deploying needs low-bit kernels. First and last layers stay fp32 by default (``skip_first_last``), as in
the papers. ``fold_bn_binary_`` folds an eval-mode BN into a binary layer's per-channel scale, keeping weights +-1.
See also: quantize, distill, prune_channels, 推理加速 / 低比特量化.
"""

from __future__ import annotations

import copy
import warnings
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from pytorchtricks.core import BenchCase, NoEffectWarning, PttError, TrickInfo

__all__ = ["quantize_lowbit_", "fold_bn_binary_", "LowBitConv2d", "LowBitLinear"]

TRICK = TrickInfo(gains=("memory",), phase=("train", "infer"), exact=False)

METHODS = ("dorefa", "twn", "xnor")


def _round_ste(x: torch.Tensor) -> torch.Tensor:
    return x + (torch.round(x) - x).detach()


def quantize_k(x: torch.Tensor, bits: int) -> torch.Tensor:
    """Q_k on [0, 1]: ``round(x (2^k-1)) / (2^k-1)`` with a straight-through gradient."""
    n = float(2**bits - 1)
    return _round_ste(x * n) / n


def _sign_ste(x: torch.Tensor) -> torch.Tensor:
    s = torch.where(x >= 0, torch.ones_like(x), -torch.ones_like(x))
    return x + (s - x).detach()


def weight_quant(w: torch.Tensor, bits: int, method: str) -> torch.Tensor:
    """Quantized weights (fake-quantized, fp32) for ``method`` in dorefa / twn / xnor."""
    dims = tuple(range(1, w.dim()))
    if method == "twn":
        delta = 0.7 * w.abs().mean(dim=dims, keepdim=True)
        mask = (w.abs() > delta).float()
        alpha = (w.abs() * mask).sum(dims, keepdim=True) / mask.sum(dims, keepdim=True).clamp_min(1.0)
        t = torch.sign(w) * mask * alpha
        return w + (t - w).detach()
    if method == "xnor" or bits == 1:
        scale = w.abs().mean(dim=dims, keepdim=True).detach()
        return _sign_ste(w) * scale
    if bits >= 32:
        return w
    t = torch.tanh(w)
    t = t / (2 * t.abs().max().detach()) + 0.5
    return 2 * quantize_k(t, bits) - 1


def act_quant(x: torch.Tensor, bits: int) -> torch.Tensor:
    """DoReFa activations ``Q_k(clamp(x, 0, 1))``; 1 bit: BNN ``sign(x)`` with grad zeroed where |x| >= 1."""
    if bits >= 32:
        return x
    if bits == 1:
        clipped = x.clamp(-1.0, 1.0)  # hardtanh: its gradient is the BNN straight-through estimator
        return clipped + (torch.where(x >= 0, 1.0, -1.0).to(x.dtype) - clipped).detach()
    return quantize_k(x.clamp(0.0, 1.0), bits)


class _LowBit:
    w_bits: int
    a_bits: int
    method: str
    post_scale: torch.Tensor | None

    def _q_weight(self) -> torch.Tensor:
        if getattr(self, "post_scale", None) is not None:  # BN folded: weights are +-1, scale lives here
            return self.weight  # type: ignore[attr-defined,no-any-return]
        return weight_quant(self.weight, self.w_bits, self.method)  # type: ignore[attr-defined]

    def _post(self, y: torch.Tensor, channel_dim: int) -> torch.Tensor:
        ps = getattr(self, "post_scale", None)
        if ps is None:
            return y
        shape = [1] * y.dim()
        shape[channel_dim] = -1
        return y * ps.reshape(shape)


class LowBitConv2d(nn.Conv2d, _LowBit):
    """``nn.Conv2d`` with fake-quantized weights and inputs (set up by ``quantize_lowbit_``)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self._conv_forward(act_quant(x, self.a_bits), self._q_weight(), None)
        y = self._post(y, 1)
        return y if self.bias is None else y + self.bias.reshape(1, -1, 1, 1)


class LowBitLinear(nn.Linear, _LowBit):
    """``nn.Linear`` with fake-quantized weights and inputs (set up by ``quantize_lowbit_``)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self._post(F.linear(act_quant(x, self.a_bits), self._q_weight()), -1)
        return y if self.bias is None else y + self.bias


def quantize_lowbit_(
    model: nn.Module, w_bits: int, a_bits: int, *, skip_first_last: bool = True, method: str = "dorefa"
) -> nn.Module:
    """Turn every Conv2d/Linear into its low-bit form in place (same parameters, same state_dict); returns model.

    ``method``: ``"dorefa"`` (k-bit weights; 1 bit = sign * E|W|), ``"twn"`` (ternary weights) or ``"xnor"``
    (binary weights). ``a_bits`` 32 keeps activations in fp32; 1 gives BNN sign activations.

    Example:
        >>> net = nn.Sequential(nn.Conv2d(1, 4, 3), nn.ReLU(), nn.Conv2d(4, 4, 3), nn.Flatten(), nn.LazyLinear(2))
        >>> _ = net(torch.randn(1, 1, 8, 8))
        >>> type(ptt.quantize_lowbit_(net, 4, 4)[2]).__name__
        'LowBitConv2d'
    """
    if method not in METHODS:
        raise PttError(f"unknown method {method!r}; use one of {', '.join(METHODS)}.")
    if not (1 <= w_bits <= 32 and 1 <= a_bits <= 32):
        raise PttError(f"bits must be in 1..32 (32 = keep fp32), got w_bits={w_bits}, a_bits={a_bits}.")
    layers = [m for m in model.modules() if type(m) in (nn.Conv2d, nn.Linear)]
    if skip_first_last:
        layers = layers[1:-1]
    for layer in layers:
        m: Any = layer
        m.__class__ = LowBitConv2d if isinstance(m, nn.Conv2d) else LowBitLinear
        m.w_bits, m.a_bits, m.method = w_bits, a_bits, method
        m.post_scale = None
    if not layers:
        warnings.warn("quantize_lowbit_ found no Conv2d/Linear to convert.", NoEffectWarning, stacklevel=2)
    return model


def fold_bn_binary_(model: nn.Module) -> nn.Module:
    """Fold each eval-mode BN after a binary (``xnor`` or 1-bit) layer into its per-channel scale, in place.

    Weights become exactly +-1 and the layer computes ``conv(x, sign W) * post_scale + bias``; the BN becomes
    Identity. The binarized weights are what a binary kernel would store.
    """
    from pytorchtricks.tricks.graph import call_sites, parent_of, registrations, trace

    if model.training:
        raise PttError("fold_bn_binary_ needs model.eval(): BN statistics are folded into the layer scale.")
    gm = trace(model)
    sites, regs = call_sites(gm, model), registrations(model)
    folded = 0
    for node in gm.graph.nodes:
        if node.op != "call_module" or len(node.users) != 1:
            continue
        user = next(iter(node.users))
        layer = model.get_submodule(str(node.target))
        if user.op != "call_module" or not isinstance(layer, _LowBit):
            continue
        bn = model.get_submodule(str(user.target))
        binary = layer.method == "xnor" or (layer.method == "dorefa" and layer.w_bits == 1)
        if not (isinstance(bn, nn.modules.batchnorm._BatchNorm) and binary and layer.post_scale is None):
            continue
        if any(len(sites[id(m)]) != 1 or regs[id(m)] != 1 for m in (layer, bn)):
            continue
        _fold_one(layer, bn)
        parent, leaf = parent_of(model, str(user.target))
        setattr(parent, leaf, nn.Identity())
        folded += 1
    if not folded:
        warnings.warn(
            "fold_bn_binary_ found no binary layer followed by BatchNorm.", NoEffectWarning, stacklevel=2
        )
    return model


def _fold_one(layer: Any, bn: Any) -> None:
    with torch.no_grad():
        w = layer.weight.double()
        dims = tuple(range(1, w.dim()))
        alpha = w.abs().mean(dim=dims)
        s = bn.running_var.double().add(bn.eps).rsqrt()
        shift = -bn.running_mean.double() * s
        if bn.affine:
            shift = shift * bn.weight.double() + bn.bias.double()
            s = s * bn.weight.double()
        bias = layer.bias.double() if layer.bias is not None else torch.zeros_like(alpha)
        layer.weight.copy_(torch.where(w >= 0, 1.0, -1.0).to(layer.weight.dtype))
        layer.post_scale = (alpha * s).to(layer.weight.dtype)
        new_bias = (bias * s + shift).to(layer.weight.dtype)
        if layer.bias is None:
            layer.bias = nn.Parameter(new_bias)
        else:
            layer.bias.copy_(new_bias)


def bench_case(size: str = "smoke", device: str = "cpu") -> BenchCase:
    """Training step of a small CNN: fp32 vs 4-bit DoReFa fake quantization (the cost of simulating low bits)."""
    from pytorchtricks.fixtures import small_cnn

    width, batch = (16, 32) if size == "smoke" else (32, 128)
    torch.manual_seed(0)
    models = {"fp32": small_cnn(in_channels=1, width=width).to(device)}
    models["w4a4"] = quantize_lowbit_(copy.deepcopy(models["fp32"]), 4, 4)
    x = torch.randn(batch, 1, 28, 28, device=device)
    y = torch.randint(0, 10, (batch,), device=device)

    def step(kind: str) -> torch.Tensor:
        loss = F.cross_entropy(models[kind](x), y)
        loss.backward()
        return loss.detach()

    return BenchCase(
        baseline=lambda: step("fp32"),
        treated=lambda: step("w4a4"),
        items_per_call=batch,
        unit="samples",
        device=device,
        description=f"small_cnn width {width}, batch {batch}: fp32 vs W4A4 DoReFa forward+backward",
    )
