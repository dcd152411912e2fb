"""Shared memory for loader workers: what ``/dev/shm`` holds, what a loader keeps there in flight, and the plan
that fits before the first worker starts.

A DataLoader worker hands each batch over in shared memory: torch puts every tensor it pickles into a file of
``/dev/shm`` (both of its sharing strategies, on Linux), and ptt's loaders build whole batches straight into such
buffers. A container's ``/dev/shm`` is a tmpfs of 64 MB unless it is told otherwise (Docker's default), so a loader
whose batches in flight are larger dies on its first batch with torch's "unable to allocate shared memory" (or a
bus error where the file was not allocated up front). Here a loader states its need before its workers start:

1. it fits: nothing changes;
2. it fits with fewer batches in flight (``prefetch_factor`` lowered, down to one per worker): said in a
   ``PttWarning``;
3. else the batches go through anonymous memory files (``memfd_create``): memory like ``/dev/shm``'s, outside
   its mount and so outside its size limit (the container's memory limit still holds), said in a ``PttWarning``;
4. else ``ShmError`` with ``/dev/shm``'s size, the need, and the fixes.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from pytorchtricks.core import Option, PttError, Spelt

SHM_DIR = (
    "/dev/shm"  # where torch's shared-memory tensors live on Linux (shm_open), whichever sharing strategy
)
# The batch the loop holds and the one it has just let go of (freed when the loop's next iteration rebinds its
# variable): besides the ``prefetch_factor`` batches each worker has in its queue, each worker's reused buffers
# may hold these two.
HELD_BATCHES = 2
# Left free in /dev/shm beyond the batches: the small tensors of each batch (labels, 4 KiB per tensor at the
# least), torch's semaphores, and other processes' files. A few pages per batch in flight, rounded up generously.
RESERVE_BYTES = 8 * 2**20


class ShmError(PttError):
    """A loader's batches in flight fit neither ``/dev/shm`` nor an anonymous memory file."""


@dataclass(frozen=True)
class ShmSpace:
    """``/dev/shm``'s size and free bytes (``os.statvfs``)."""

    path: str
    total_bytes: int
    free_bytes: int


def shm_space(path: str = SHM_DIR) -> ShmSpace | None:
    """The size and free bytes of ``path`` (default ``/dev/shm``), or None where it does not exist.

    Example:
        >>> s = shm_space(); s is None or s.free_bytes <= s.total_bytes
        True
    """
    try:
        st = os.statvfs(path)
    except OSError:
        return None
    return ShmSpace(path, st.f_blocks * st.f_frsize, st.f_bavail * st.f_frsize)


def in_flight_bytes(batch_bytes: int, workers: int, prefetch_factor: int) -> int:
    """The shared memory a loader holds at most: each worker's ``prefetch_factor`` queued batches and the
    ``HELD_BATCHES`` the loop may still hold, each of ``batch_bytes``.

    Example:
        >>> in_flight_bytes(10, workers=2, prefetch_factor=2)
        80
    """
    return max(1, workers) * (prefetch_factor + HELD_BATCHES) * batch_bytes


def memfd_available() -> bool:
    """True where anonymous memory files can be made (Linux >= 3.17, not refused by a seccomp profile)."""
    if not hasattr(os, "memfd_create"):
        return False
    try:
        os.close(os.memfd_create("ptt-probe", os.MFD_CLOEXEC))
    except OSError:
        return False
    return True


@dataclass(frozen=True)
class ShmPlan:
    """How a loader holds its batches in flight.

    ``prefetch_factor``: batches queued per worker (the asked one, or fewer). ``backing``: ``"shm"`` (``/dev/shm``)
    or ``"memfd"`` (anonymous memory files). ``need_bytes``: what the batches in flight take at this plan.
    ``space``: ``/dev/shm`` as measured (None where there is none). ``message``: what changed and why (None when
    nothing did): the loader gives it as a ``PttWarning``.
    """

    prefetch_factor: int
    backing: str
    need_bytes: int
    space: ShmSpace | None
    message: str | None = None

    def describe(self) -> str:
        """One line for the doctors: ``/dev/shm`` against this need."""
        if self.space is None:
            return f"no {SHM_DIR}: batches in flight {_mib(self.need_bytes)} ({self.backing})"
        where = "in /dev/shm" if self.backing == "shm" else "in anonymous memory files (outside /dev/shm)"
        return (
            f"{self.space.path} {_mib(self.space.total_bytes)} ({_mib(self.space.free_bytes)} free); batches in "
            f"flight {_mib(self.need_bytes)} {where}, prefetch_factor {self.prefetch_factor}"
        )


def plan_shm(
    who: str,
    batch_bytes: int,
    workers: int,
    prefetch_factor: int,
    *,
    space: ShmSpace | None = None,
    memfd: bool | None = None,
) -> ShmPlan:
    """The plan that fits ``who``'s batches of ``batch_bytes`` from ``workers`` workers (see the module's steps).

    ``space`` / ``memfd``: ``/dev/shm`` and whether anonymous memory files work, measured when None (tests pass
    them). Raises ``ShmError`` when nothing fits.

    Example:
        >>> small = ShmSpace("/dev/shm", 64 * 2**20, 64 * 2**20)
        >>> plan_shm("make_loader", 2**20, 2, 2, space=small).backing
        'shm'
        >>> p = plan_shm("make_loader", 8 * 2**20, 2, 2, space=small)
        >>> p.prefetch_factor, p.backing
        (1, 'shm')
        >>> plan_shm("make_loader", 40 * 2**20, 2, 2, space=small, memfd=True).backing
        'memfd'
    """
    space = shm_space() if space is None else space
    asked = in_flight_bytes(batch_bytes, workers, prefetch_factor)
    if space is None:  # no /dev/shm (not Linux): torch shares through its own means, nothing to plan
        return ShmPlan(prefetch_factor, "shm", asked, None)
    room = space.free_bytes - RESERVE_BYTES
    if asked <= room:
        return ShmPlan(prefetch_factor, "shm", asked, space)
    for p in range(prefetch_factor - 1, 0, -1):
        need = in_flight_bytes(batch_bytes, workers, p)
        if need <= room:
            return ShmPlan(
                p, "shm", need, space,
                f"{who}: {_need_text(batch_bytes, workers, prefetch_factor)} do not fit {_space_text(space)}; "
                f"it keeps {p} batch{'es' if p > 1 else ''} per worker in flight instead of {prefetch_factor} "
                f"({_mib(need)}). {COST_NOTE} {shm_fixes(asked, space)}",
            )  # fmt: skip
    if memfd if memfd is not None else memfd_available():
        return ShmPlan(
            prefetch_factor, "memfd", asked, space,
            f"{who}: {_need_text(batch_bytes, workers, prefetch_factor)} do not fit {_space_text(space)}, even at "
            f"one batch per worker; its workers hand batches over through anonymous memory files instead (memory "
            f"like /dev/shm's, outside its size limit; the container's memory limit still counts them). "
            f"{shm_fixes(asked, space)}",
        )  # fmt: skip
    raise ShmError(
        Spelt(
            "{who}: {need} do not fit {space}, even at one batch per worker ({one}), and this system cannot make "
            "anonymous memory files. {fixes} Or use fewer workers ({none} uses no shared memory) or a smaller batch.",
            who=who,
            need=_need_text(batch_bytes, workers, prefetch_factor),
            space=_space_text(space),
            one=_mib(in_flight_bytes(batch_bytes, workers, 1)),
            fixes=shm_fixes(asked, space),
            none=Option("num_workers", 0, flag="--workers"),
        )
    )


# What one batch in flight per worker cost where /dev/shm was large, measured by benchmarks/loader_shm.py
# (results/<cpu-class>/loader_shm.md): the figure the warning quotes.
COST_NOTE = (
    "What that costs: one batch per worker ran at 0.98x the throughput of two beside a device step of the "
    "loader's own batch time (0.98-1.01x over 3 rounds, Xeon, 2 workers; results/amx/loader_shm.md)."
)


def _need_text(batch_bytes: int, workers: int, prefetch_factor: int) -> str:
    n = max(1, workers) * (prefetch_factor + HELD_BATCHES)
    return (
        f"its batches in flight ({n} of {_mib(batch_bytes)}: {max(1, workers)} worker(s) x (prefetch_factor "
        f"{prefetch_factor} + {HELD_BATCHES} held), {_mib(n * batch_bytes)})"
    )


def _space_text(space: ShmSpace) -> str:
    return f"{space.path} ({_mib(space.total_bytes)}, {_mib(space.free_bytes)} free)"


def shm_fixes(need: int, space: ShmSpace) -> str:
    """How to give ``/dev/shm`` room for ``need`` more bytes than it has free (Docker, Kubernetes)."""
    size = _round_up_gib(need + RESERVE_BYTES + space.total_bytes - space.free_bytes)
    return (
        f"To give it room: `docker run --shm-size={size}` (Docker's default is 64 MB); on Kubernetes mount an "
        f"emptyDir with `medium: Memory` (sizeLimit >= {size}) at /dev/shm."
    )


def _round_up_gib(n: int) -> str:
    gib = -(-n // 2**30)
    return f"{gib}g"


def _mib(n: int) -> str:
    return f"{n / 2**20:.0f} MiB" if n >= 2**20 else f"{n / 2**10:.0f} KiB"
