"""In-place activated BatchNorm: BN + LeakyReLU (or BN before a conv/linear) that keeps only its output for backward.

Why: BN saves its input and the activation saves its own input or output: two activation-sized tensors per layer.
In-Place ABN (Rota Bulo et al. 2018) keeps only y = act(BN(x)) and, in backward, recovers z = act^-1(y) and
x_hat = (z - beta) / gamma by inverting the activation and the affine map; the next conv saves the same y, so
the layer's own saved bytes drop to ~zero (up to 50% of activation memory in BN-heavy nets, for a little compute).
When: training BN + LeakyReLU networks (or BN followed directly by a conv/linear) short of activation memory.
Caveats: pure PyTorch (a custom autograd.Function), so it saves memory, not time, and writes y to a new tensor
instead of over x (x is freed when nothing else holds it). ReLU is NOT invertible (negative inputs collapse to
0): BN->ReLU pairs are refused - replace ReLU by LeakyReLU (changes the model) or pass ``on_relu="keep"`` to leave
them untouched. |gamma| is clamped to >= 1e-5 for the inversion. Gradients equal standard BN within 1e-5 (tested).
SyncBatchNorm is not converted.
See also: checkpoint_activations_, 节省显存 / In-Place ABN.
"""

from __future__ import annotations

import copy
import warnings
from typing import Any

import torch
from torch import nn

from pytorchtricks.core import BenchCase, NoEffectWarning, PttError, TrickInfo
from pytorchtricks.tricks._cases import train_step_case
from pytorchtricks.tricks.graph import set_submodule, successors
from pytorchtricks.tunable import TuneHook, TuneSetup, applied_or_skip

__all__ = ["to_inplace_abn_", "InPlaceABN"]

TRICK = TrickInfo(gains=("memory",), phase=("train",), exact=True)

_BN = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d)


def _tune_apply(setup: TuneSetup, state: object) -> None:
    # BN -> ReLU pairs stay (not invertible): tune never changes the model's function
    applied_or_skip(to_inplace_abn_, setup.model, on_relu="keep")


TUNE = TuneHook(
    changes="model",
    check="exact",
    receipt='ptt.to_inplace_abn_(model, on_relu="keep")  # BN -> LeakyReLU / BN -> conv keep only their output',
    apply=_tune_apply,
    order=25,
)
_GAMMA_MIN = 1e-5


def _compute_dtype(x: torch.Tensor) -> torch.dtype:
    return torch.float64 if x.dtype == torch.float64 else torch.float32  # bf16/fp16 math in fp32


def _shape(x: torch.Tensor) -> list[int]:
    return [1, -1] + [1] * (x.dim() - 2)


class _ABNFunction(torch.autograd.Function):
    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any,
        x: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor,
        mean: torch.Tensor,
        invstd: torch.Tensor,
        slope: float,
        batch_stats: bool,
    ) -> torch.Tensor:
        sh = _shape(x)
        scale = (invstd * weight).view(sh)
        z = (x.to(_compute_dtype(x)) - mean.view(sh)) * scale + bias.view(sh)
        y = torch.where(z >= 0, z, z * slope).to(x.dtype) if slope != 1.0 else z.to(x.dtype)
        ctx.save_for_backward(y, weight, bias, invstd)  # y only: no activation-sized input is kept
        ctx.slope, ctx.batch_stats = slope, batch_stats
        return y

    @staticmethod
    def backward(ctx: Any, dy: torch.Tensor) -> tuple[Any, ...]:  # type: ignore[override]
        y, weight, bias, invstd = ctx.saved_tensors
        sh = _shape(y)
        dims = [d for d in range(y.dim()) if d != 1]
        cdt = _compute_dtype(y)
        yf, dyf = y.to(cdt), dy.to(cdt)
        if ctx.slope != 1.0:
            neg = yf < 0
            z = torch.where(neg, yf / ctx.slope, yf)  # invert LeakyReLU
            dz = torch.where(neg, dyf * ctx.slope, dyf)
        else:
            z, dz = yf, dyf
        sign = torch.where(weight < 0, -1.0, 1.0)
        w = torch.where(weight.abs() < _GAMMA_MIN, sign * _GAMMA_MIN, weight)  # gamma ~ 0 cannot be inverted
        xhat = (z - bias.view(sh)) / w.view(sh)  # invert the affine map
        dbias = dz.sum(dims)
        dweight = (dz * xhat).sum(dims)
        if ctx.batch_stats:
            m = y.numel() // y.shape[1]
            # dx = invstd * w * (dz - mean(dz) - xhat * mean(dz * xhat)): the batch statistics depend on x too
            dx = (dz - (dbias / m).view(sh) - xhat * (dweight / m).view(sh)) * (invstd * weight).view(sh)
        else:
            dx = dz * (invstd * weight).view(sh)
        return dx.to(dy.dtype), dweight, dbias, None, None, None, None


class InPlaceABN(nn.modules.batchnorm._BatchNorm):
    """BatchNorm fused with LeakyReLU(``activation_slope``) (1.0 = identity) that saves only its output.

    Same parameters, buffers and state_dict keys as the BatchNorm it replaces.
    """

    activation_slope: float = 1.0

    def _check_input_dim(self, input: torch.Tensor) -> None:
        if input.dim() < 2:
            raise PttError(f"InPlaceABN expects (N, C, ...) input, got shape {tuple(input.shape)}.")

    def extra_repr(self) -> str:
        return super().extra_repr() + f", activation_slope={self.activation_slope}"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self._check_input_dim(x)
        batch_stats = self.training or not self.track_running_stats
        c = x.shape[1]
        cdt = _compute_dtype(x)
        ones, zeros = x.new_ones(c, dtype=cdt), x.new_zeros(c, dtype=cdt)
        weight = self.weight if self.affine else ones
        bias = self.bias if self.affine else zeros
        with torch.no_grad():
            if batch_stats:
                dims = [d for d in range(x.dim()) if d != 1]
                var, mean = torch.var_mean(x.to(cdt), dim=dims, correction=0)
                if self.training and self.track_running_stats:
                    self._update_stats(mean, var, x.numel() // c)
            else:
                assert self.running_mean is not None and self.running_var is not None
                mean, var = self.running_mean.to(cdt), self.running_var.to(cdt)
            invstd = torch.rsqrt(var + self.eps)
        return _ABNFunction.apply(x, weight, bias, mean, invstd, float(self.activation_slope), batch_stats)

    def _update_stats(self, mean: torch.Tensor, var: torch.Tensor, n: int) -> None:
        assert self.running_mean is not None and self.running_var is not None
        assert self.num_batches_tracked is not None
        self.num_batches_tracked.add_(1)
        f = 1.0 / float(self.num_batches_tracked) if self.momentum is None else self.momentum
        unbiased = var * (n / max(n - 1, 1))
        self.running_mean.mul_(1 - f).add_(mean.to(self.running_mean.dtype), alpha=f)
        self.running_var.mul_(1 - f).add_(unbiased.to(self.running_var.dtype), alpha=f)


def to_inplace_abn_(model: nn.Module, *, on_relu: str = "raise") -> nn.Module:
    """Replace BN -> LeakyReLU pairs (and BN feeding a conv/linear) by ``InPlaceABN``, in place; returns ``model``.

    Args:
        on_relu: ``"raise"`` (default) refuses BN -> ReLU (not invertible); ``"keep"`` leaves those pairs as they are.

    Example:
        >>> m = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.LeakyReLU(0.01), nn.Conv2d(4, 4, 1))
        >>> m = ptt.to_inplace_abn_(m)
        >>> type(m[1]).__name__, type(m[2]).__name__
        ('InPlaceABN', 'Identity')
    """
    if on_relu not in ("raise", "keep"):
        raise PttError(f"on_relu must be 'raise' or 'keep', got {on_relu!r}.")
    links = [link for link in successors(model, _BN) if type(link.first) in _BN]
    relu = [link.first_name for link in links if isinstance(link.second, nn.ReLU | nn.ReLU6)]
    if relu and on_relu == "raise":
        raise PttError(
            f"to_inplace_abn_: {len(relu)} BatchNorm(s) feed a ReLU ({relu[0]!r}...), which is not invertible (negative "
            "inputs all map to 0), so the input cannot be recovered from the output. Use nn.LeakyReLU(0.01) instead "
            "(changes the model), or pass on_relu='keep' to leave those pairs alone."
        )
    changed = 0
    for link in links:
        bn, nxt = link.first, link.second
        if isinstance(nxt, nn.LeakyReLU):
            if nxt.negative_slope <= 0:
                continue  # slope 0 is ReLU; negative slopes flip signs and are not handled
            slope = float(nxt.negative_slope)
            assert link.second_name is not None
            set_submodule(model, link.second_name, nn.Identity())
        elif isinstance(nxt, nn.modules.conv._ConvNd | nn.Linear):
            slope = 1.0  # the next layer saves y anyway; BN's input is no longer kept
        else:
            continue
        bn.__class__ = InPlaceABN  # same parameters and buffers, same state_dict keys
        setattr(bn, "activation_slope", slope)  # noqa: B010
        changed += 1
    if changed == 0:
        warnings.warn(
            "to_inplace_abn_ changed nothing: no BatchNorm feeds a LeakyReLU or a conv/linear directly.",
            NoEffectWarning,
            stacklevel=2,
        )
    return model


def bench_case(size: str = "smoke", device: str = "cpu") -> BenchCase:
    """Training step of a Conv-BN-LeakyReLU stack: standard BN vs InPlaceABN (a memory trick: compare peak bytes)."""
    batch, px, width = (16, 32, 32) if size == "smoke" else (64, 64, 64)
    dev = torch.device(device)
    torch.manual_seed(0)
    layers: list[nn.Module] = []
    c = 3
    for _ in range(4):
        layers += [nn.Conv2d(c, width, 3, padding=1, bias=False), nn.BatchNorm2d(width), nn.LeakyReLU(0.01)]
        c = width
    base = nn.Sequential(*layers, nn.Conv2d(width, 10, 1)).to(dev)
    treated = to_inplace_abn_(copy.deepcopy(base))
    x = torch.randn(batch, 3, px, px, device=dev)

    return train_step_case(
        base,
        treated,
        x,
        lr=None,
        description=f"4x Conv->BN->LeakyReLU train step, batch {batch}, {px}px",
        check=lambda a, b: torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-4),
    )
