"""``ordered_map``: a function over jobs in spawned worker processes, results in input order, and a worker that
dies (the OOM killer, kill -9, a crash in a decoder) fails the whole map within a second instead of hanging.

concurrent.futures rather than multiprocessing.Pool: Pool replaces a worker killed by a signal and waits forever
for the lost task; ProcessPoolExecutor fails every pending task at once (``BrokenProcessPool``). That alone was not
enough: the kill test (a worker killed as soon as it appears) saw a pack still running 30 s later, in CI and on a
loaded machine, a few times in many runs; so the workers' exit codes are polled while waiting too. Workers exit
when the parent is gone, and on any failure the rest are killed rather than waited for.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable, Generator, Sequence
from typing import Any

from pytorchtricks.core import PttError

BATCH = 8  # jobs per task sent to a worker: amortises the pickling round trip
IN_FLIGHT = 4  # batches per worker in flight: memory stays bounded whatever the number of jobs

WorkerDied = Callable[[], str]  # the error message to raise (as PttError) when a worker dies


def _apply(fn: Callable[[Any], Any], jobs: list[Any]) -> list[Any]:
    return [fn(job) for job in jobs]


def _watch_parent(parent: int) -> None:
    """Worker initializer: exit when the parent process is gone (killed -9), instead of idling forever."""
    import threading
    import time

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(1.0)
        os._exit(1)

    threading.Thread(target=watch, name="ptt-pool-parent-watch", daemon=True).start()


def _processes(pool: Any) -> list[Any]:
    return list((getattr(pool, "_processes", None) or {}).values())


def _result_or_dead_worker(future: Any, pool: Any) -> Any:
    """``future.result()``, but a worker that exited with an error fails it within a second."""
    from concurrent.futures import TimeoutError as FutureTimeout
    from concurrent.futures.process import BrokenProcessPool

    while True:
        try:
            return future.result(timeout=1.0)
        except FutureTimeout:
            dead = [p for p in _processes(pool) if p.exitcode not in (None, 0)]
            if dead:
                raise BrokenProcessPool(f"worker {dead[0].pid} exited with code {dead[0].exitcode}") from None


def ordered_map(
    fn: Callable[[Any], Any], jobs: Sequence[Any], workers: int, died: WorkerDied
) -> Generator[Any, None, None]:
    """``fn(job)`` for every job, in order; with ``workers`` > 1 in a pool of spawned processes (``fn`` must be a
    module-level function). A dead worker raises ``PttError(died())``.

    Example:
        >>> list(ordered_map(abs, [-1, 2, -3], workers=0, died=lambda: "unused"))
        [1, 2, 3]
    """
    if workers <= 1 or len(jobs) < 2:
        yield from map(fn, jobs)
        return
    import functools
    import multiprocessing as mp
    from collections import deque
    from concurrent.futures import Future, ProcessPoolExecutor
    from concurrent.futures.process import BrokenProcessPool

    task = functools.partial(_apply, fn)
    batches = iter([list(jobs[k : k + BATCH]) for k in range(0, len(jobs), BATCH)])
    pool = ProcessPoolExecutor(
        workers, mp_context=mp.get_context("spawn"), initializer=_watch_parent, initargs=(os.getpid(),)
    )
    ok = False
    try:
        window: deque[Future[list[Any]]] = deque()

        def submit(batch: list[Any]) -> None:
            try:  # submit starts workers on demand: one killed while it starts breaks the pipe it is fed by
                window.append(pool.submit(task, batch))
            except OSError as exc:
                raise BrokenProcessPool(f"a worker died while starting ({exc})") from exc

        try:
            for batch in itertools.islice(batches, IN_FLIGHT * workers):
                submit(batch)
            while window:
                out = _result_or_dead_worker(window.popleft(), pool)
                nxt = next(batches, None)
                if nxt is not None:
                    submit(nxt)
                yield from out
        except BrokenProcessPool as exc:
            raise PttError(died()) from exc
        ok = True
    finally:  # on an error or an interrupt, do not wait for the batches still queued
        if not ok:
            for proc in _processes(pool):  # nothing left to do for them; a live one would hold the exit
                proc.kill()
        pool.shutdown(wait=ok, cancel_futures=not ok)
