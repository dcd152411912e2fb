"""Shared vocabulary of the catalogue: trick metadata, bench cases, warnings and errors.

Everything here is dependency-free (torch is imported lazily by callers), so any layer may import it.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

Size = Literal["smoke", "full"]
Gain = Literal["speed", "memory", "reproducibility", "accuracy"]
Phase = Literal["train", "infer"]

SIZES: tuple[str, ...] = ("smoke", "full")


@dataclass(frozen=True)
class TrickInfo:
    """Catalogue metadata of one trick, declared as ``TRICK = TrickInfo(...)`` in its module.

    Attributes:
        gains: what the trick buys: ``"speed"``, ``"memory"``, ``"reproducibility"`` or ``"accuracy"``.
        phase: where it applies: ``"train"`` and/or ``"infer"``.
        exact: True when outputs are bit-for-bit or tolerance-equal to the untreated path.
        needs: requirements beyond the core install: ``"cuda"`` or the name of an extra (``"data"``, ``"infer"``).
    """

    gains: tuple[str, ...]
    phase: tuple[str, ...]
    exact: bool
    needs: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        bad = [g for g in self.gains if g not in ("speed", "memory", "reproducibility", "accuracy")]
        if bad or not self.gains:
            raise ValueError(
                f"TrickInfo.gains must name speed/memory/reproducibility/accuracy, got {self.gains}"
            )
        if not self.phase or any(p not in ("train", "infer") for p in self.phase):
            raise ValueError(f"TrickInfo.phase must be train and/or infer, got {self.phase}")


@dataclass
class BenchCase:
    """What ``bench_case(size)`` returns: the untreated and treated callables, measured by ``bench/``.

    The trick builds the inputs once; ``clock.py`` calls ``baseline`` and ``treated`` interleaved.
    ``items_per_call`` turns seconds into a throughput (images, samples, steps). ``peers`` holds optional
    third-party implementations of the same work, measured in the same rounds. ``check``, when set, is called
    once with the outputs of baseline and treated and raises if they disagree (exactness at bench time).
    ``cleanup`` restores any process-wide state after measuring.
    """

    baseline: Callable[[], Any]
    treated: Callable[[], Any]
    items_per_call: int = 1
    unit: str = "calls"
    device: str = "cpu"
    description: str = ""
    peers: dict[str, Callable[[], Any]] = field(default_factory=dict)
    check: Callable[[Any, Any], None] | None = None
    cleanup: Callable[[], None] | None = None


class PttError(Exception):
    """Base class of errors raised by pytorchtricks on bad input; the message always says how to fix it."""


class MissingExtraError(PttError, ImportError):
    """An optional dependency is not installed."""


class NoEffectWarning(UserWarning):
    """A trick was applied but changed nothing (e.g. no Conv->BN pair to fuse)."""


class PttWarning(UserWarning):
    """A notice: the call did what was asked, with a consequence worth knowing (samples dropped every epoch, an
    arena left in ``/dev/shm``). Silence it with ``warnings.filterwarnings("ignore", category=ptt.PttWarning)``."""


def require(module: str, extra: str, *, package: str | None = None) -> Any:
    """Import an optional dependency or raise ``MissingExtraError`` naming the extra to install.

    Example:
        >>> require("math", "core").sqrt(4.0)
        2.0
    """
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        pkg = package or module.split(".")[0]
        raise MissingExtraError(
            f"{pkg} is not installed; install it with `pip install 'pytorchtricks[{extra}]'` (or `pip install {pkg}`)."
        ) from exc


def resolve_device(device: str | Any | None) -> Any:
    """Turn ``"cpu"``, ``"cuda"``, ``"cuda:1"`` or a ``torch.device`` into a ``torch.device``, or fail clearly.

    ``None`` picks CUDA when available, else CPU.

    Example:
        >>> resolve_device("cpu")
        device(type='cpu')
    """
    import torch

    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise PttError(f"unknown device {device!r}; use 'cpu' or 'cuda' (optionally 'cuda:N').") from exc
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise PttError("device 'cuda' was asked for but no CUDA device is available; use --device cpu.")
    if dev.type not in ("cpu", "cuda", "mps", "xpu"):
        raise PttError(f"unsupported device {device!r}; use 'cpu' or 'cuda'.")
    return dev
