"""Fold each BatchNorm into the convolution (or Linear) before it, for inference.

Why: Conv->BN costs two kernels and an extra pass over the activation; folded, BN is free:
W' = W*g/sqrt(v+eps), b' = beta + (b-mu)*g/sqrt(v+eps).
When: eval / export of CNNs, before quantization (int8 needs BN folded) and before compile.
Caveats: eval mode only (BN statistics become constants). Pairs come from the real call graph (torch.fx; where a
forward is untraceable, its children are traced instead): a conv whose output also goes elsewhere, or that is
called at more than one site, is never folded (it warns: call ``unshare_modules_`` first); Linear->BN is folded only when
``example_inputs`` prove the Linear output is 2-D (BatchNorm1d on 3-D input normalises another axis). Conv 1d/2d/3d,
transposed and grouped convs are handled. Gains on CPU are small alone (1.02-1.04x on ResNet-18); the big win is
that int8 and compile need it.
See also: unshare_modules, reparameterize, 推理加速 / 操作融合.
"""

from __future__ import annotations

import copy
import warnings
from typing import Any

import torch
from torch import nn

from pytorchtricks.core import BenchCase, NoEffectWarning, PttError, TrickInfo
from pytorchtricks.tricks._cases import inference_case
from pytorchtricks.tricks.graph import (
    attr_users,
    call_sites,
    parent_of,
    registrations,
    runtime_calls,
    traced_pieces,
)
from pytorchtricks.tunable import TuneFacts, TuneHook, TuneSetup

__all__ = ["fuse_conv_bn_"]

TRICK = TrickInfo(gains=("speed",), phase=("infer",), exact=True)


def _tune_applies(facts: TuneFacts) -> str | None:
    return None if facts.conv_bn_pairs else "no Conv->BatchNorm pair to fold"


def _tune_apply(setup: TuneSetup, state: object) -> None:
    fuse_conv_bn_(setup.model.eval())


TUNE = TuneHook(
    changes="model",
    check="exact",
    receipt="ptt.fuse_conv_bn_(model.eval())  # exact: BN folded into the conv weights",
    apply=_tune_apply,
    applies=_tune_applies,
    order=20,
)

_CONVS = (nn.Conv1d, nn.Conv2d, nn.Conv3d)
_TCONVS = (nn.ConvTranspose1d, nn.ConvTranspose2d, nn.ConvTranspose3d)
_BN = nn.modules.batchnorm._BatchNorm


def fold_bn_into_(layer: Any, bn: Any) -> None:
    """Fold eval-mode ``bn`` into ``layer`` (conv, transposed conv or Linear) in place, in float64 for exactness."""
    w = layer.weight.detach().double()
    c_out = bn.num_features
    mean = bn.running_mean.double()
    scale = (bn.running_var.double() + bn.eps).rsqrt()
    shift = -mean * scale
    if bn.affine:
        scale = scale * bn.weight.detach().double()
        shift = shift * bn.weight.detach().double() + bn.bias.detach().double()
    bias = layer.bias.detach().double() if layer.bias is not None else torch.zeros(c_out, dtype=torch.float64)
    if isinstance(layer, _TCONVS):  # weight (C_in, C_out/groups, *k)
        g = layer.groups
        shape = w.shape
        w = (w.reshape(g, shape[0] // g, shape[1], -1) * scale.reshape(g, 1, shape[1], 1)).reshape(shape)
    else:  # conv (C_out, C_in/groups, *k) or Linear (C_out, C_in)
        w = w * scale.reshape(-1, *([1] * (w.dim() - 1)))
    new_bias = bias * scale + shift
    dtype = layer.weight.dtype
    with torch.no_grad():
        layer.weight.copy_(w.to(dtype))
        if layer.bias is None:
            layer.bias = nn.Parameter(new_bias.to(dtype=dtype, device=layer.weight.device))
        else:
            layer.bias.copy_(new_bias.to(dtype))


def _foldable(layer: Any, bn: Any) -> bool:
    if not isinstance(bn, _BN) or bn.running_mean is None or bn.running_var is None:
        return False
    # exact types: a subclass (e.g. a low-bit layer) may transform its weights before use
    if type(layer) in _CONVS + _TCONVS:
        return bool(layer.out_channels == bn.num_features)
    return type(layer) is nn.Linear and bool(layer.out_features == bn.num_features)


def fuse_conv_bn_(
    model: nn.Module,
    example_inputs: Any = None,
    *,
    check: bool = True,
    atol: float = 1e-4,
) -> nn.Module:
    """Fold every Conv/Linear -> BatchNorm pair of ``model`` into the conv, in place; BN becomes Identity.

    With ``example_inputs``, modules are also counted on a real forward (any module called twice is left
    alone), Linear->BN pairs can be folded, and a safety check compares outputs (``atol``) and guards the
    caller's inputs: a failure raises ``SafetyError`` with its report (nothing is stored on the model).

    Example:
        >>> m = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8)).eval()
        >>> ptt.fuse_conv_bn_(m)[1]
        Identity()
    """
    if model.training or any(m.training for m in model.modules() if isinstance(m, _BN)):
        raise PttError("fuse_conv_bn_ needs model.eval(): BN statistics are folded into the conv weights.")
    ref = None
    counts: dict[int, int] = {}
    ndims: dict[int, int] = {}
    if example_inputs is not None:
        from pytorchtricks.safety import reference_outputs

        ref = reference_outputs(model, example_inputs)
        counts, ndims = runtime_calls(model, example_inputs)
    regs = registrations(model)
    pairs: list[tuple[nn.Module, str]] = []  # (layer, qualified name of the BN)
    shared: list[str] = []  # BNs left alone because their conv or they are reused
    for prefix, root, gm in traced_pieces(model):
        sites = call_sites(gm, root)
        direct = attr_users(gm, root)
        for node in gm.graph.nodes:
            if node.op != "call_module" or len(node.users) != 1:
                continue
            user = next(iter(node.users))
            if user.op != "call_module" or not user.args or user.args[0] is not node:
                continue
            layer, bn = root.get_submodule(node.target), root.get_submodule(user.target)
            if not _foldable(layer, bn):
                continue
            if any(
                len(sites[id(m)]) != 1 or regs[id(m)] != 1 or counts.get(id(m), 1) > 1 for m in (layer, bn)
            ):
                shared.append(prefix + str(user.target))
                continue  # reused: folding would change the other use
            if any(id(m) in direct for m in (layer, bn)):
                continue  # its weights are read directly elsewhere
            if counts and (counts.get(id(layer)) != 1 or counts.get(id(bn)) != 1):
                continue  # not called on the example's forward
            if isinstance(layer, nn.Linear) and ndims.get(id(layer)) != 2:
                continue  # BatchNorm1d normalises dim 1, the Linear writes the last dim: equal only for 2-D
            pairs.append((layer, prefix + str(user.target)))
    for layer, bn_name in pairs:
        parent, leaf = parent_of(model, bn_name)
        fold_bn_into_(layer, getattr(parent, leaf))
        setattr(parent, leaf, nn.Identity())
    if not pairs:
        warnings.warn(
            "fuse_conv_bn_ found no foldable Conv/Linear -> BatchNorm pair (convs used elsewhere are skipped; "
            "call ptt.unshare_modules_(model) first).",
            NoEffectWarning,
            stacklevel=2,
        )
    elif shared:
        warnings.warn(
            f"fuse_conv_bn_ left {len(shared)} pair(s) unfolded because a module is reused "
            f"({', '.join(sorted(set(shared))[:3])}); call ptt.unshare_modules_(model) first to fold them too.",
            UserWarning,
            stacklevel=2,
        )
    if ref is not None and check:
        from pytorchtricks.safety import check_transform

        check_transform(
            model, example_inputs, ref, step="fuse_conv_bn", max_abs_diff=atol
        )  # raises SafetyError
    return model


def bench_case(size: str = "smoke", device: str = "cpu") -> BenchCase:
    """Eager ResNet-style small CNN with randomized BN vs the same net with BN folded."""
    from pytorchtricks.fixtures import randomize_bn_, small_cnn

    width, hw, batch = (16, 32, 8) if size == "smoke" else (64, 64, 16)
    torch.manual_seed(0)
    base = randomize_bn_(small_cnn(in_channels=3, width=width)).eval().to(device)
    treated = fuse_conv_bn_(copy.deepcopy(base))
    x = torch.randn(batch, 3, hw, hw, device=device)

    return inference_case(
        base,
        treated,
        x,
        description=f"small_cnn width {width}, {hw}px, batch {batch}",
        check=lambda a, b: torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4),
    )
