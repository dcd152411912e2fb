"""Peak CPU memory of a callable from the allocator's own events, without starting the Kineto profiler.

``clock.cpu_tracked_peak_bytes`` replays the ``[memory]`` events of ``torch.profiler`` - which starts
Kineto, and Kineto prints ``USDT: profiler_start/stop`` pairs and, on a CUDA build without a driver,
``ERROR: gpuGetDeviceCount failed`` on every run. The allocator reports the same events (c10's
``ProfiledCPUMemoryReporter``: every CPU allocation and free made through PyTorch, in order) to torch's
CPU-only profiler state, which involves no Kineto at all; ``quiet_peak_memory`` replays those. Same method, same
numbers (``method="cpu_tracked"``), nothing on the terminal. Where this torch lacks the CPU-only profiler state,
it falls back to ``clock.peak_memory`` with the known harmless lines filtered (``quiet.filtered_stderr``).

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

__all__ = ["cpu_alloc_peak_bytes", "quiet_peak_memory"]


def cpu_alloc_peak_bytes(fn: Callable[[], Any]) -> int | None:
    """Peak of live CPU bytes allocated inside ``fn`` (allocator events replayed in order), or None when this
    torch has no CPU-only profiler state to collect them with."""
    try:
        from torch._C._profiler import _ExperimentalConfig
        from torch.autograd import (  # type: ignore[attr-defined]
            ProfilerConfig,
            ProfilerState,
            _disable_profiler_legacy,
            _enable_profiler_legacy,
        )
    except ImportError:
        return None
    # state CPU, record_shapes, profile_memory, with_stack, with_flops, with_modules
    config = ProfilerConfig(ProfilerState.CPU, False, True, False, False, False, _ExperimentalConfig())
    with filtered_stderr():  # a free of a block allocated before the start is reported as "unknown size"
        _enable_profiler_legacy(config)
        try:
            fn()
        finally:
            per_thread = _disable_profiler_legacy()
    events = sorted(
        (e.start_us(), t, i, e.cpu_memory_usage())  # type: ignore[attr-defined]
        for t, thread in enumerate(per_thread)
        for i, e in enumerate(thread)
        if e.kind() == "memory_alloc"
    )
    cur = peak = 0
    for *_, nbytes in events:
        cur += nbytes
        peak = max(peak, cur)
    return peak


def quiet_peak_memory(fn: Callable[[], Any], device: torch.device | str | None = "cpu") -> MemoryResult:
    """``clock.peak_memory`` without Kineto's terminal output: CPU peaks from ``cpu_alloc_peak_bytes``."""
    dev = torch.device(device or "cpu")
    if dev.type == "cpu":
        peak = cpu_alloc_peak_bytes(fn)
        if peak is not None:
            return MemoryResult(peak, "cpu_tracked")
    with filtered_stderr():
        return peak_memory(fn, dev)
