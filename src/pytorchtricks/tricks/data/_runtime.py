"""The loader runtime under ``make_loader``, ``make_detection_loader`` and ``cache_in_ram``'s build: a loader is a
source, a recipe and this.

It holds what every loader here does the same way, written once:

- the epoch sampler: whole batches, shuffled per epoch or in order, split over ranks (``batches.rank_world``),
  every sample exactly once per epoch (``EpochBatches``; ``GroupedEpochBatches`` for aspect groups);
- the worker default (``batches.default_workers``) and the per-sample RNG the recipes draw from
  (``images.sample_rng``, keyed by ``(seed, epoch, index)``: the same whatever the workers or ranks);
- the reused batch slots and their plan against ``/dev/shm`` (``batches.plan_slots``);
- the DataLoader over whole batches: prefetch, persistent workers, pinned memory, the worker init;
- ``Loader``: epochs, resume of a stream, the copy to a device (``prefetch_to_device``), and shutdown with the
  DataLoader's workers.

A recipe (``data.images.SampleMaker`` for classification, ``data.recipes.DetectionRecipe`` through
``DetectionBatcher`` for detection) makes one batch from the indices the sampler hands out.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any, Literal

import numpy as np
import torch

from pytorchtricks.core import PttError
from pytorchtricks.data.batches import (
    BatchSlots,
    EpochBatches,
    default_workers,
    init_worker,
    plan_slots,
    rank_world,
)
from pytorchtricks.data.shm import ShmPlan

__all__ = ["Loader", "Workers", "epoch_sampler", "plan_workers", "whole_batches", "start"]

Batch = Any
Mode = Literal["train", "eval"]


def epoch_sampler(
    n: int,
    batch_size: int,
    *,
    shuffle: bool,
    drop_last: bool,
    seed: int,
    rank: int | None,
    world_size: int | None,
    groups: np.ndarray | None = None,
) -> EpochBatches:
    """Whole batches of indices ``[0, n)`` for this rank, exactly once per epoch across ranks; ``groups`` (one
    group id per sample): batches drawn within a group (aspect grouping)."""
    r, w = rank_world(rank, world_size)
    if groups is None:
        return EpochBatches(n, batch_size, shuffle, drop_last, seed, r, w)
    from pytorchtricks.data.detection_loader import GroupedEpochBatches

    return GroupedEpochBatches(n, batch_size, shuffle, drop_last, seed, r, w, groups)


@dataclasses.dataclass(frozen=True)
class Workers:
    """How a loader's workers run: ``count`` (resolved), batches in flight each (``prefetch_factor``), the reused
    batch ``slots`` and the ``/dev/shm`` plan they fit (``shm``: None without workers or a known batch size)."""

    count: int
    prefetch_factor: int
    slots: BatchSlots | None
    shm: ShmPlan | None

    def reusable_slots(self) -> BatchSlots:
        """The planned slots, or ``/dev/shm`` slots for the default depth where nothing was planned."""
        return self.slots or BatchSlots(self.count, self.prefetch_factor + 2)


def plan_workers(
    who: str, num_workers: int | None, prefetch_factor: int | None, batch_bytes: int | None
) -> Workers:
    """The worker count (``num_workers`` or the default), and the batches in flight planned to fit ``/dev/shm``
    (fewer per worker, else memory files, else a ``ShmError``; ``batch_bytes`` None: not known up front)."""
    count = default_workers(num_workers)
    depth = prefetch_factor or 2
    slots, shm = plan_slots(who, batch_bytes, count, depth)
    return Workers(count, shm.prefetch_factor if shm is not None else depth, slots, shm)


def whole_batches(
    batches: Any,
    workers: int,
    *,
    sampler: Any = None,
    prefetch_factor: int = 2,
    persistent_workers: bool = False,
    pin_memory: bool = False,
) -> torch.utils.data.DataLoader:  # type: ignore[type-arg]
    """The DataLoader over a dataset whose items are whole batches (``batch_size=None``): ``sampler`` hands out
    the keys, each worker makes a batch per key, ``prefetch_factor`` batches ahead each."""
    kwargs: dict[str, Any] = {}
    if workers > 0:
        kwargs.update(
            prefetch_factor=prefetch_factor, persistent_workers=persistent_workers, worker_init_fn=init_worker
        )
    return torch.utils.data.DataLoader(
        batches, batch_size=None, sampler=sampler, num_workers=workers, pin_memory=pin_memory, **kwargs
    )


def start(
    batches: Any,
    plan: Workers,
    *,
    sampler: Any,
    source: Any,
    batch_size: int,
    mode: Mode,
    dropped_per_epoch: int | None,
    persistent_workers: bool,
    pin_memory: bool,
    device: torch.device | None = None,
) -> Loader:
    """A ``Loader`` over ``batches`` run by ``plan``'s workers: the one way every loader here starts."""
    dl = whole_batches(
        batches,
        plan.count,
        sampler=sampler,
        prefetch_factor=plan.prefetch_factor,
        persistent_workers=persistent_workers,
        pin_memory=pin_memory,
    )
    return Loader(
        dl, source, batch_size, mode=mode, dropped_per_epoch=dropped_per_epoch, device=device, shm=plan.shm
    )


class Loader:
    """What ``make_loader`` returns: iterate for ``(images uint8 [N,3,H,W], labels int64 [N])`` batches.

    ``dropped_per_epoch``: samples no rank sees in an epoch because of ``drop_last`` (``None`` for a stream with
    drop_last, which splits itself and does not know its length). ``mode``: ``"train"`` or ``"eval"``.
    ``device``: where the batches arrive (``None``: where the workers made them, host memory); on another device
    each epoch's batches come through ``prefetch_to_device`` (pinned memory, side-stream copies, ahead of use).
    ``shm``: how the workers' batches in flight fit ``/dev/shm`` (``data.shm.ShmPlan``; None without workers or
    when the batch size is not known up front).
    """

    def __init__(
        self,
        dataloader: torch.utils.data.DataLoader,  # type: ignore[type-arg]
        source: Any,
        batch_size: int,
        *,
        mode: Mode = "train",
        dropped_per_epoch: int | None = 0,
        device: torch.device | None = None,
        shm: ShmPlan | None = None,
    ) -> None:
        self.dataloader, self._source, self.batch_size = dataloader, source, batch_size
        self.mode, self.dropped_per_epoch, self.device, self.shm = mode, dropped_per_epoch, device, shm
        self.epoch = 0
        self._explicit_epoch = False
        self._running = (0, 0)  # (epoch being read, batches handed out in it)

    def state_dict(self) -> dict[str, Any]:
        """Where the loop stands, to resume mid-epoch - also at another world size - with ``load_state_dict``.

        For a loader over a ``ShardStream``: the stream's state after the batches this loader has handed out
        (ranks step in lockstep, so any rank's state resumes every rank). Map-style datasets have no resume.
        """
        stream = getattr(self._source, "stream", None)
        if stream is None or not hasattr(stream, "state_dict"):
            raise PttError(
                "state_dict() resumes a loader over a ShardStream; this loader reads a map-style dataset "
                "(resume it by epoch: loader.set_epoch(epoch))."
            )
        epoch, batches = self._running
        state = dict(stream.state_dict(consumed=batches * self.batch_size))
        state["epoch"] = epoch
        return {"batches": batches, "stream": state}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state_dict()``: the next iteration reads the rest of that epoch at this world size."""
        stream = getattr(self._source, "stream", None)
        if stream is None or not hasattr(stream, "load_state_dict"):
            raise PttError(
                "load_state_dict() resumes a loader over a ShardStream; this one reads a map-style dataset."
            )
        stream.load_state_dict(state["stream"])
        self.set_epoch(int(state["stream"]["epoch"]))

    def _counted(self, it: Iterator[Batch], epoch: int) -> Iterator[Batch]:
        self._running = (epoch, 0)
        for batch in it:
            self._running = (epoch, self._running[1] + 1)  # handed out, as the loop sees it
            yield batch

    def set_epoch(self, epoch: int) -> None:
        """Fix the epoch of the next iteration (otherwise each ``iter()`` advances it by one)."""
        self.epoch, self._explicit_epoch = int(epoch), True

    def __len__(self) -> int:
        return len(self.dataloader)

    def __iter__(self) -> Iterator[Batch]:
        self._source.epoch = self.epoch
        if hasattr(self.dataloader.dataset, "epoch"):
            self.dataloader.dataset.epoch = self.epoch
        it = iter(self.dataloader)  # the sampler reads the epoch here, before any prefetch
        epoch = self.epoch
        if not self._explicit_epoch:
            self.epoch += 1
        self._explicit_epoch = False
        if self.device is None:
            return self._counted(it, epoch)
        from pytorchtricks.tricks.data.prefetch_to_device import prefetch_to_device

        return self._counted(iter(prefetch_to_device(_Started(it), self.device)), epoch)


class _Started:
    """An iterator already begun (its epoch fixed), as the iterable ``prefetch_to_device`` takes."""

    def __init__(self, it: Iterator[Batch]) -> None:
        self.it = it

    def __iter__(self) -> Iterator[Batch]:
        return self.it
