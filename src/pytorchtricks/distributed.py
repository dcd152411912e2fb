"""Multi-process training setup from torchrun's environment: process group, device, rank-aware seeds, SyncBN.

``info = ptt.distributed.setup(seed=0)`` reads ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR`` and
``MASTER_PORT`` (set by ``torchrun``), initialises the process group with NCCL on CUDA or gloo on CPU, binds the
process to ``cuda:LOCAL_RANK`` and seeds every RNG with ``seed + rank`` (distinct augmentation per rank; DDP
broadcasts rank 0's weights at wrap time, so model init needs no equal seed). Without torchrun's variables it
returns a single-process ``DistInfo`` and initialises nothing, so the same script runs alone.

Example:
    >>> info = ptt.distributed.setup()
    >>> info.world_size, info.is_main
    (1, True)
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass

import torch
from torch import nn

from pytorchtricks.core import NoEffectWarning, PttError

__all__ = ["DistInfo", "cleanup", "rank_seed", "setup", "to_sync_batchnorm_"]

_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


@dataclass(frozen=True)
class DistInfo:
    """Where this process stands: rank, world size, local rank, its device and the backend (None: not initialised)."""

    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    backend: str | None
    seed: int | None

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.backend is not None


def rank_seed(seed: int, rank: int) -> int:
    """The seed of one rank: ``seed + rank`` (kept in [0, 2**32 - 1]).

    Example:
        >>> rank_seed(0, 3)
        3
    """
    return (int(seed) + int(rank)) % 2**32


def _env_int(name: str) -> int:
    value = os.environ[name]
    try:
        return int(value)
    except ValueError as exc:
        raise PttError(
            f"environment variable {name}={value!r} is not an integer; launch with torchrun."
        ) from exc


def setup(backend: str | None = None, *, seed: int | None = None, device: str | None = None) -> DistInfo:
    """Initialise ``torch.distributed`` from torchrun's environment (or return single-process info).

    Args:
        backend: ``"nccl"``/``"gloo"``; default NCCL when CUDA is available (and ``device`` is not cpu), else gloo.
        seed: when given, ``ptt.seed_everything(seed + rank)`` in this process.
        device: force ``"cpu"`` or ``"cuda"``; default CUDA when available.
    """
    from pytorchtricks.tricks.runtime.seed_everything import seed_everything

    present = [k for k in _ENV if k in os.environ]
    use_cuda = torch.cuda.is_available() if device is None else device.startswith("cuda")
    if device is not None and device.startswith("cuda") and not torch.cuda.is_available():
        raise PttError("device='cuda' was asked for but CUDA is not available; use device='cpu'.")
    if not present:
        dev = torch.device("cuda", 0) if use_cuda else torch.device("cpu")
        if seed is not None:
            seed_everything(rank_seed(seed, 0))
        return DistInfo(0, 1, 0, dev, None, None if seed is None else rank_seed(seed, 0))
    missing = [k for k in _ENV if k not in os.environ]
    if missing:
        raise PttError(
            f"torchrun environment incomplete: {', '.join(missing)} missing; launch with `torchrun ...`."
        )
    rank, world, local = _env_int("RANK"), _env_int("WORLD_SIZE"), _env_int("LOCAL_RANK")
    if not 0 <= rank < world:
        raise PttError(f"RANK={rank} is outside [0, WORLD_SIZE={world}); check the launcher.")
    backend = backend or ("nccl" if use_cuda else "gloo")
    if backend == "nccl" and not use_cuda:
        raise PttError("backend 'nccl' needs CUDA; use backend='gloo' on CPU.")
    if use_cuda:
        torch.cuda.set_device(local)
        dev = torch.device("cuda", local)
    else:
        dev = torch.device("cpu")
    dist = torch.distributed
    if not dist.is_initialized():
        dist.init_process_group(backend=backend, rank=rank, world_size=world)
    elif dist.get_backend() != backend:
        raise PttError(
            f"a process group with backend {dist.get_backend()!r} already exists; call cleanup() first."
        )
    s = None
    if seed is not None:
        s = rank_seed(seed, rank)
        seed_everything(s)
    return DistInfo(rank, world, local, dev, backend, s)


def cleanup() -> None:
    """Wait for every rank, then destroy the process group if one exists (call at the end of training).

    Without the barrier, the rank that hosts the rendezvous store (rank 0) can finish and exit while another rank
    is still tearing down its connections; that rank then dies with ``terminate called without an active
    exception`` (seen with gloo on a loaded 2-core machine).
    """
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        if torch.distributed.get_world_size() > 1:
            torch.distributed.barrier()
        torch.distributed.destroy_process_group()


def to_sync_batchnorm_(model: nn.Module) -> nn.Module:
    """Replace every BatchNorm by ``nn.SyncBatchNorm`` (statistics over all ranks' samples); returns the model.

    Use before wrapping in DDP when per-rank batches are small. SyncBatchNorm runs on CUDA (and XPU) only: on
    CPU/gloo keep plain BatchNorm. Warns ``NoEffectWarning`` when the model has no
    BatchNorm. The returned object may be a new module when ``model`` itself is a BatchNorm.

    Example:
        >>> m = ptt.distributed.to_sync_batchnorm_(nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4)))
        >>> type(m[1]).__name__
        'SyncBatchNorm'
    """
    if not any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules()):
        warnings.warn(
            "to_sync_batchnorm_ changed nothing: the model has no BatchNorm.", NoEffectWarning, stacklevel=2
        )
        return model
    return nn.SyncBatchNorm.convert_sync_batchnorm(model)
