"""Keep the terminal for what matters: C++ log lines that torch prints on a normal, successful run are dropped.

A CUDA build of torch on a machine without a CUDA driver, profiled on the CPU, writes lines such as::

    USDT:... SyncActivityProfilerHandler.cpp:39] profiler_start
    ERROR:... DeviceProperties.cpp:56] gpuGetDeviceCount failed with code 35
    [W... CPUAllocator.cpp:245] Memory block of unknown size was allocated before the profiling started, ...
    W... torch/utils/cpp_extension.py:183] No CUDA runtime is found, using CUDA_HOME='/usr/local'

None of them is a failure (USDT lines are tracepoint markers for tools; the device count fails because there is
no GPU, which is why the run is on the CPU; the allocator's unknown-size blocks are tensors from before the
measurement), but a user reads "ERROR" and believes the run failed. C++ writes straight to file descriptor 2, so
``filtered_stderr`` drops these exact lines at the descriptor and passes every other line through, in order.

Bottom floor: standard library only (torch is imported inside ``import_cpp_extension_quietly``).

Example:
    >>> import os
    >>> with filtered_stderr():
    ...     _ = os.write(2, b"USDT:2026-01-01 1:1 SyncActivityProfilerHandler.cpp:39] profiler_start\\n")
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import tempfile
from collections.abc import Iterator

__all__ = ["NOISE", "filtered_stderr", "import_cpp_extension_quietly", "is_noise"]

# Lines dropped, and only these: each is printed by torch/Kineto on a run that went well.
NOISE: tuple[re.Pattern[bytes], ...] = (
    re.compile(rb"^USDT:"),  # Kineto's tracepoint markers (profiler_start / profiler_stop)
    re.compile(rb"^ERROR:.*DeviceProperties\.cpp:\d+\] gpuGetDeviceCount failed"),  # no CUDA driver
    re.compile(rb"CPUAllocator\.cpp:\d+\] Memory block of unknown size was allocated before the profiling"),
)


def is_noise(line: bytes) -> bool:
    """True when ``line`` is one of the known harmless C++ log lines (``NOISE``).

    Example:
        >>> is_noise(b"ERROR:2026 1:1 DeviceProperties.cpp:56] gpuGetDeviceCount failed with code 35")
        True
        >>> is_noise(b"ERROR: something real")
        False
    """
    return any(p.search(line) for p in NOISE)


@contextlib.contextmanager
def filtered_stderr() -> Iterator[None]:
    """Inside the block, file descriptor 2 goes to a temporary file; on exit its lines come back minus ``NOISE``.

    Python's ``sys.stderr`` writes to the same descriptor, so warnings raised inside the block are kept too (they
    appear when the block ends). Keep the block short and do not start processes in it: a child forked inside
    would inherit the temporary file as its stderr. Where descriptor 2 cannot be redirected (no real file
    descriptor), the block runs unfiltered.
    """
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError, AttributeError):
        yield
        return
    with tempfile.TemporaryFile() as tmp:
        os.dup2(tmp.fileno(), 2)
        try:
            yield
        finally:
            with contextlib.suppress(OSError, ValueError, AttributeError):
                sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            tmp.seek(0)
            kept = [line for line in tmp.read().splitlines(keepends=True) if not is_noise(line)]
            if kept:
                os.write(2, b"".join(kept))


def import_cpp_extension_quietly() -> None:
    """Import ``torch.utils.cpp_extension`` without its "No CUDA runtime is found, using CUDA_HOME=..." warning.

    ``torch.utils.benchmark`` (behind every timing) imports it, and on a CUDA build without a driver it warns
    that extensions would be compiled against a toolkit it found - irrelevant here: nothing is compiled against
    CUDA, and the run is on the CPU. Other warnings of that logger after the import are untouched.
    """
    if "torch.utils.cpp_extension" in sys.modules:
        return
    import logging

    log = logging.getLogger("torch.utils.cpp_extension")
    old = log.level
    log.setLevel(logging.ERROR)
    try:
        import torch.utils.cpp_extension  # noqa: F401
    finally:
        log.setLevel(old)
