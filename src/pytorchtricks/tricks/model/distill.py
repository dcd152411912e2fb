"""Knowledge distillation: train a pruned or low-bit student to match its full-precision teacher's soft outputs.

Why: after channel pruning or low-bit quantization a student recovers accuracy faster from the teacher's soft
targets (``KL(softmax(t/T) || softmax(s/T)) * T^2``) than from hard labels alone (Hinton et al. 2015).
When: fine-tuning a compressed model whose uncompressed original you still have.
Caveats: the teacher runs a forward per step (about +1/3 compute for a same-size teacher); the T^2 factor keeps the
soft-target gradients on the scale of the hard-label ones; the teacher is put in eval mode and gets no gradients.
See also: prune_channels, quantize_lowbit, quantize, 训练策略 / 知识蒸馏.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from pytorchtricks.core import BenchCase, PttError, TrickInfo, config_first, options_of

__all__ = ["DistillConfig", "distillation_loss", "distill_"]

TRICK = TrickInfo(gains=("accuracy",), phase=("train",), exact=False)


def distillation_loss(
    student_logits: torch.Tensor,
    teacher_logits: torch.Tensor,
    labels: torch.Tensor | None = None,
    T: float = 4.0,
    alpha: float = 0.9,
) -> torch.Tensor:
    """``alpha * T^2 * KL(teacher_T || student_T) + (1 - alpha) * CE(student, labels)``.

    With ``labels=None`` the loss is the soft term alone (``alpha`` is then ignored).

    Example:
        >>> s = torch.tensor([[2.0, 0.0]]); t = torch.tensor([[2.0, 0.0]])
        >>> float(ptt.distillation_loss(s, t, torch.tensor([0]), T=2.0, alpha=1.0))
        0.0
    """
    if T <= 0:
        raise PttError(f"temperature T must be > 0, got {T}.")
    if not 0.0 <= alpha <= 1.0:
        raise PttError(f"alpha must be in [0, 1], got {alpha}.")
    if student_logits.shape != teacher_logits.shape:
        raise PttError(
            f"student logits {tuple(student_logits.shape)} and teacher logits {tuple(teacher_logits.shape)} differ."
        )
    soft = F.kl_div(
        F.log_softmax(student_logits / T, dim=-1),
        F.log_softmax(teacher_logits.detach() / T, dim=-1),
        reduction="batchmean",
        log_target=True,
    ) * (T * T)
    if labels is None:
        return soft
    return alpha * soft + (1.0 - alpha) * F.cross_entropy(student_logits, labels)


@dataclass(frozen=True)
class DistillConfig:
    """``distill_``'s options as one value: ``ptt.distill_(student, teacher, x, y, ptt.DistillConfig(epochs=3))``
    (the keywords of ``distill_`` are a convenience over it; see there for what each does).

    ``epochs`` may be fractional; ``lr`` peaks the one-cycle schedule; ``T`` and ``alpha`` are
    ``distillation_loss``'s; ``after_backward(student)`` runs after every backward (e.g. a slimming penalty).

    Example:
        >>> cfg = ptt.DistillConfig(epochs=0.5, lr=0.01, batch_size=4, T=2.0)
        >>> x, y = torch.randn(8, 6), torch.randint(0, 3, (8,))
        >>> ptt.distill_(nn.Linear(6, 3), nn.Linear(6, 3), x, y, cfg).training
        False
    """

    epochs: float = 1.0
    lr: float = 0.05
    batch_size: int = 256
    T: float = 4.0
    alpha: float = 0.9
    seed: int = 0
    after_backward: Callable[[nn.Module], None] | None = None


@options_of(DistillConfig)
def distill_(
    student: nn.Module,
    teacher: nn.Module,
    images: torch.Tensor,
    labels: torch.Tensor,
    config: DistillConfig | None = None,
    **options: Any,
) -> nn.Module:
    """Fine-tune ``student`` in place from ``teacher`` on in-memory ``(images, labels)``; returns it in eval mode.

    SGD with momentum and a one-cycle schedule (``bench.fashion_mnist.train``); the teacher is frozen in eval mode.
    The options are ``DistillConfig``'s fields: one ``config``, or its fields as keywords (not both).
    """
    cfg = config_first(config, DistillConfig, options)
    from pytorchtricks.fashion_mnist import train

    teacher.eval()
    for p in teacher.parameters():
        p.requires_grad_(False)

    def loss_fn(logits: torch.Tensor, y: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            t = teacher(x)
        return distillation_loss(logits, t, y, T=cfg.T, alpha=cfg.alpha)

    return train(
        student,
        images,
        labels,
        epochs=cfg.epochs,
        lr=cfg.lr,
        batch_size=cfg.batch_size,
        seed=cfg.seed,
        loss_fn=loss_fn,
        after_backward=cfg.after_backward,
    )


def bench_case(size: str = "smoke", device: str = "cpu") -> BenchCase:
    """One training step of a small CNN: plain cross-entropy vs distillation (adds the teacher forward)."""
    from pytorchtricks.fixtures import small_cnn

    width, batch = (16, 32) if size == "smoke" else (32, 128)
    torch.manual_seed(0)
    teacher = small_cnn(in_channels=1, width=2 * width).to(device).eval()
    students = {k: small_cnn(in_channels=1, width=width).to(device) for k in ("ce", "kd")}
    opts = {k: torch.optim.SGD(m.parameters(), lr=0.01) for k, m in students.items()}
    x = torch.randn(batch, 1, 28, 28, device=device)
    y = torch.randint(0, 10, (batch,), device=device)

    def step(kind: str) -> torch.Tensor:
        logits = students[kind](x)
        if kind == "kd":
            with torch.no_grad():
                t = teacher(x)
            loss = distillation_loss(logits, t, y)
        else:
            loss = F.cross_entropy(logits, y)
        opts[kind].zero_grad()
        loss.backward()
        opts[kind].step()
        return loss.detach()

    return BenchCase(
        baseline=lambda: step("ce"),
        treated=lambda: step("kd"),
        items_per_call=batch,
        unit="samples",
        device=device,
        description=f"small_cnn width {width} student, width {2 * width} teacher, batch {batch}",
    )
