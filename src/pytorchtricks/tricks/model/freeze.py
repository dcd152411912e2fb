"""Freeze a model or part of it: no gradients, no optimizer work, and BatchNorm statistics that stay put.

Why: frozen layers (a pretrained backbone, an embedding table) should cost neither backward compute nor gradient
memory, and their BatchNorm running statistics must not drift - ``requires_grad_(False)`` alone leaves BN in
train mode, so every forward still rewrites the statistics with the new data's (a classic fine-tuning bug).
When: transfer learning / fine-tuning heads, linear probing, partial training.
Caveats: frozen BatchNorm layers stay in eval mode even when you later call ``model.train()`` (this call pins
them); ``unfreeze_`` undoes both. Build the optimizer from the trainable parameters only, or pass
``filter(lambda p: p.requires_grad, model.parameters())``. Dropout in frozen parts still follows train/eval.
See also: fast_optimizer, 节省显存 / 冻结部分层.
"""

from __future__ import annotations

import types
import warnings
from collections.abc import Iterable

from torch import nn

from pytorchtricks.core import BenchCase, NoEffectWarning, PttError, TrickInfo
from pytorchtricks.tricks._cases import small_cnn_pair, train_step_case

__all__ = ["freeze_", "unfreeze_"]

TRICK = TrickInfo(gains=("speed", "memory"), phase=("train",), exact=True)


def _pinned_eval_train(self: nn.Module, mode: bool = True) -> nn.Module:
    return nn.Module.train(self, False)  # frozen BN: statistics are part of the frozen weights


def freeze_(model: nn.Module, *, keep: Iterable[str] = ()) -> nn.Module:
    """Stop gradients of every parameter and pin BatchNorm layers in eval mode, except submodules in ``keep``.

    Args:
        keep: qualified names of submodules that stay trainable (e.g. ``("fc",)`` for a classifier head).

    Example:
        >>> m = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.Flatten(), nn.LazyLinear(2))
        >>> m = ptt.freeze_(m, keep=["3"]).train()
        >>> m[0].weight.requires_grad, m[1].training, m[3].weight.requires_grad
        (False, False, True)
    """
    keep = tuple(keep)
    names = dict(model.named_modules())
    for k in keep:
        if k not in names:
            raise PttError(
                f"freeze_: no submodule named {k!r}; use one of the names in model.named_modules()."
            )
    kept = {id(p) for k in keep for p in names[k].parameters()}
    kept_mods = {id(m) for k in keep for m in names[k].modules()}
    changed = 0
    for p in model.parameters():
        if id(p) not in kept and p.requires_grad:
            p.requires_grad_(False)
            changed += 1
    for m in model.modules():
        if isinstance(m, nn.modules.batchnorm._BatchNorm) and id(m) not in kept_mods:
            if m.training or "train" not in vars(m):
                changed += 1
            m.train = types.MethodType(_pinned_eval_train, m)  # type: ignore[method-assign]
            m.eval()
    if changed == 0:
        warnings.warn(
            "freeze_ changed nothing: every parameter was already frozen.", NoEffectWarning, stacklevel=2
        )
    return model


def unfreeze_(model: nn.Module) -> nn.Module:
    """Make every parameter trainable again and let BatchNorm follow ``model.train()`` again.

    Example:
        >>> m = ptt.unfreeze_(ptt.freeze_(nn.Linear(2, 2)))
        >>> m.weight.requires_grad
        True
    """
    for p in model.parameters():
        p.requires_grad_(True)
    for m in model.modules():
        if "train" in vars(m):
            del m.train
            m.train(model.training)
    return model


def bench_case(size: str = "smoke", device: str = "cpu") -> BenchCase:
    """Fine-tuning step of a CNN: everything trainable vs backbone frozen (head trainable)."""
    base, treated, x = small_cnn_pair(
        lambda m: freeze_(m, keep=["11"]), size, device
    )  # the head: last Linear
    return train_step_case(
        base,
        treated,
        x,
        description=f"3-conv CNN train step, batch {len(x)}, {x.shape[-1]}px: all trainable vs frozen backbone",
    )
