"""Peak memory of a callable, measured without torch's C++ log lines on the terminal.

``clock.peak_memory`` on the CPU replays the allocation events of ``torch.profiler``, which starts Kineto, and
Kineto prints ``USDT: profiler_start/stop`` pairs and, on a CUDA build without a driver,
``ERROR: gpuGetDeviceCount failed`` on every run; the allocator adds "Memory block of unknown size" for tensors
from before the measurement. ``quiet_peak_memory`` is the same measurement with exactly those lines dropped
(``quiet.filtered_stderr``): same method, same numbers, nothing alarming on the terminal.

An earlier version read the events of torch's CPU-only legacy profiler to avoid starting Kineto. Those events
carry no block address, so a free could not be paired with its allocation, and the free of a block allocated
during an earlier measurement subtracted bytes the current one never added (``clock.cpu_tracked_peak_bytes``
explains it): the peaks of ``ptt tune``'s candidates, measured one after another, could read low.

Example:
    >>> r = quiet_peak_memory(lambda: torch.ones(1024, 256).sum())  # 1 MiB of fp32 at once
    >>> r.method, r.peak_bytes >= 2**20
    ('cpu_tracked', True)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from pytorchtricks.clock import MemoryResult, peak_memory
from pytorchtricks.quiet import filtered_stderr

__all__ = ["quiet_peak_memory"]


def quiet_peak_memory(fn: Callable[[], Any], device: torch.device | str | None = "cpu") -> MemoryResult:
    """``clock.peak_memory`` with torch's known harmless C++ log lines dropped from the terminal.

    ``fn`` runs with file descriptor 2 redirected (``filtered_stderr``): do not start processes inside it.
    """
    with filtered_stderr():
        return peak_memory(fn, device)
