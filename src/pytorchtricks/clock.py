"""The measuring engine: the only module in pytorchtricks that reads a clock.

Timing is built on ``torch.utils.benchmark.Timer`` (blocked autorange, thread count pinned) with an explicit
device synchronisation. A/B comparisons run the variants *interleaved* in rotating order, round after round, so
slow drift of the machine (thermal, other tenants) hits every variant alike; each round yields one median per
variant, and ratios are computed per round (paired) before taking their median and IQR.

Memory comes in three kinds, always labelled by ``method``:
- ``cuda_max_allocated``: ``torch.cuda.max_memory_allocated`` delta on CUDA;
- ``cpu_tracked``: every CPU allocator event recorded by ``torch.profiler(profile_memory=True)``, replayed to a
  running total; exact for tensors allocated through PyTorch, blind to allocations outside it;
- ``rss_subprocess``: the resident-set high-water mark of a child process (everything, but coarse).
The activation meter counts the bytes autograd saves for backward, exactly, via ``saved_tensors_hooks``.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Collection, Iterator, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from pytorchtricks.core import config_first, options_of
from pytorchtricks.hardware import ISA_LIMIT_ENV, cpu_caps

# ---------------------------------------------------------------------------------------------------------------
# clocks


def now_s() -> float:
    """Monotonic seconds; the one clock every other module uses (deadlines, stage timers)."""
    return time.perf_counter()


def sync(device: torch.device | str | None) -> None:
    """Wait for queued device work, so a clock read after it sees the work done."""
    if device is not None and torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


class Stopwatch:
    """Accumulates wall time per named stage: ``with sw.stage("decode"): ...``; ``sw.totals_s``.

    Example:
        >>> sw = Stopwatch()
        >>> with sw.stage("a"):
        ...     pass
        >>> list(sw.totals_s)
        ['a']
    """

    def __init__(self, device: torch.device | str | None = None) -> None:
        self.device = device
        self.totals_s: dict[str, float] = {}
        self.counts: dict[str, int] = {}

    @contextlib.contextmanager
    def stage(self, name: str, *, synchronize: bool = False) -> Iterator[None]:
        if synchronize:
            sync(self.device)
        t0 = now_s()
        try:
            yield
        finally:
            if synchronize:
                sync(self.device)
            self.add(name, now_s() - t0)

    def add(self, name: str, seconds: float) -> None:
        self.totals_s[name] = self.totals_s.get(name, 0.0) + seconds
        self.counts[name] = self.counts.get(name, 0) + 1

    @property
    def total_s(self) -> float:
        return sum(self.totals_s.values())


class Deadline:
    """A time budget: ``Deadline(60).remaining_s``, ``.expired``."""

    def __init__(self, budget_s: float | None) -> None:
        self.budget_s = budget_s
        self.start_s = now_s()

    @property
    def elapsed_s(self) -> float:
        return now_s() - self.start_s

    @property
    def remaining_s(self) -> float:
        return float("inf") if self.budget_s is None else self.budget_s - self.elapsed_s

    @property
    def expired(self) -> bool:
        return self.remaining_s <= 0


def hold_s(seconds: float) -> None:
    """Hold the calling thread for ``seconds`` without using a core: what the host thread does while an
    accelerator runs a step it launched (``ptt tune --device-step-ms``'s stand-in step)."""
    import threading

    threading.Event().wait(max(0.0, seconds))


def time_call(fn: Callable[[], Any], device: torch.device | str | None = None) -> tuple[Any, float]:
    """Run ``fn`` once and return ``(result, seconds)``, synchronising the device on both sides."""
    sync(device)
    t0 = now_s()
    out = fn()
    sync(device)
    return out, now_s() - t0


# ---------------------------------------------------------------------------------------------------------------
# statistics


@dataclass
class Stats:
    """Summary of repeated timings of one callable (seconds per call)."""

    median_s: float
    q1_s: float
    q3_s: float
    n: int
    times_s: list[float] = field(repr=False, default_factory=list)

    @property
    def iqr_s(self) -> float:
        return self.q3_s - self.q1_s

    @classmethod
    def of(cls, times_s: list[float]) -> Stats:
        if not times_s:
            raise ValueError("no timings to summarise")
        q1, med, q3 = quantiles(times_s)
        return cls(median_s=med, q1_s=q1, q3_s=q3, n=len(times_s), times_s=list(times_s))


def quantiles(xs: list[float]) -> tuple[float, float, float]:
    """(Q1, median, Q3) with linear interpolation; degenerate inputs give equal quartiles.

    Example:
        >>> quantiles([1.0, 2.0, 3.0, 4.0, 5.0])
        (2.0, 3.0, 4.0)
    """
    if len(xs) == 1:
        return xs[0], xs[0], xs[0]
    q = statistics.quantiles(xs, n=4, method="inclusive")
    return q[0], statistics.median(xs), q[2]


def _timer_for(device: torch.device | str | None) -> Callable[[], float]:
    if device is not None and torch.device(device).type == "cuda":

        def timer() -> float:
            torch.cuda.synchronize(device)
            return time.perf_counter()

        return timer
    return time.perf_counter


def measure(
    fn: Callable[[], Any],
    *,
    device: torch.device | str | None = "cpu",
    min_run_time_s: float = 0.2,
    warmup: int = 1,
    num_threads: int | None = None,
) -> Stats:
    """Time ``fn`` with ``torch.utils.benchmark.Timer.blocked_autorange``; returns per-call statistics.

    Example:
        >>> s = measure(lambda: sum(range(100)), min_run_time_s=0.01)
        >>> s.median_s > 0
        True
    """
    from torch.utils.benchmark import Timer

    for _ in range(warmup):
        fn()
    sync(device)
    timer = Timer(
        stmt="fn()",
        globals={"fn": fn},
        num_threads=num_threads or torch.get_num_threads(),
        timer=_timer_for(device),
    )
    m = timer.blocked_autorange(min_run_time=min_run_time_s)
    return Stats.of(list(m.times))


@dataclass
class VariantResult:
    """One variant's timing inside an interleaved comparison, relative to the baseline."""

    name: str
    stats: Stats
    ratio: float  # baseline median / this median: > 1 means faster than baseline
    ratio_q1: float
    ratio_q3: float
    overlaps_baseline: bool

    @property
    def note(self) -> str:
        if self.name == "baseline":
            return "reference"
        if self.overlaps_baseline:
            return "spread overlaps baseline: difference not significant"
        return "faster" if self.ratio > 1 else "slower"


@dataclass
class Comparison:
    """Result of ``compare``: one ``VariantResult`` per variant, in the order given."""

    variants: dict[str, VariantResult]
    rounds: int
    order: list[list[str]] = field(repr=False, default_factory=list)  # the run order of each round

    def __getitem__(self, name: str) -> VariantResult:
        return self.variants[name]


@dataclass(frozen=True)
class CompareConfig:
    """``compare``'s options as one value: ``ptt.compare(variants, ptt.CompareConfig(rounds=7, warmup=1))`` (the
    keywords of ``compare`` are a convenience over it; see there for what each does).

    Example:
        >>> cfg = ptt.CompareConfig(rounds=2, min_run_time_s=0.001, warmup=0)
        >>> cmp = ptt.compare({"baseline": lambda: sum(range(100)), "fast": lambda: 4950}, cfg)
        >>> cmp.rounds, sorted(cmp.variants)
        (2, ['baseline', 'fast'])
    """

    baseline: str = "baseline"
    rounds: int = 5
    min_run_time_s: float = 0.1
    device: torch.device | str | None = "cpu"
    warmup: int = 2
    num_threads: int | None = None
    on_round: Callable[[int], None] | None = None
    before_block: Callable[[str], None] | None = None
    budget_s: float | None = None
    min_rounds: int = 3
    units_per_call: Mapping[str, int] | None = None
    single_call: Collection[str] = ()
    settle: int = 0


SETTLE_REL = 0.10  # two calls in a row within 10% of each other: the variant has reached its steady state


@options_of(CompareConfig)
def compare(
    variants: Mapping[str, Callable[[], Any]],
    config: CompareConfig | None = None,
    **options: Any,
) -> Comparison:
    """Interleaved A/B(/C...) timing: every round times each variant once, in rotated order.

    Returns per-variant median/IQR over rounds and the paired per-round speed ratio versus ``baseline``.
    ``before_block(name)``, when given, runs untimed right before each timed block of a variant (e.g. to drain
    a loader queue that worker processes filled while the other variants were being timed).
    ``budget_s``: stop before a round that would end past this many seconds (the mean round so far as its
    cost), once ``min_rounds`` are done; ``rounds`` is then the most.
    ``units_per_call[name]``: how many units of work one call of that variant does (e.g. one training step per
    loader worker, so a timed block spans whole cycles of the worker pool); its times are reported per unit.
    ``single_call``: variants timed by whole calls back to back for ``min_run_time_s`` (at least one), with no
    block-size estimate (a slow call, such as a training step through its loader, would pay it once more);
    with ``before_block`` they skip the warm-up calls too (their ``before_block`` warms them before every block).
    ``settle``: after every variant's warm-up, up to this many more calls of each (not ``single_call`` ones) until
    two calls in a row agree within 10%: a variant can stay slow for a few calls after the others first ran (a
    ResNet-18 step at 3.1, 2.7, 1.4 then 1.0 s once ten other configurations had warmed up beside it), which a
    fixed warm-up leaves inside the first timed blocks.
    The options are ``CompareConfig``'s fields: one ``config``, or its fields as keywords (not both).
    """
    return _compare(variants, config_first(config, CompareConfig, options))


def _settle(fn: Callable[[], Any], device: torch.device | str | None, most: int) -> None:
    """Call ``fn`` until two calls in a row agree within ``SETTLE_REL`` (at most ``most`` calls)."""
    last = None
    for _ in range(most):
        sync(device)
        t = now_s()
        fn()
        sync(device)
        took = now_s() - t
        if last is not None and abs(took - last) <= SETTLE_REL * min(took, last):
            return
        last = took


def _compare(variants: Mapping[str, Callable[[], Any]], cfg: CompareConfig) -> Comparison:
    baseline, device, before_block, single_call = cfg.baseline, cfg.device, cfg.before_block, cfg.single_call
    if baseline not in variants:
        raise ValueError(f"baseline {baseline!r} is not among the variants {list(variants)}")
    if cfg.rounds < 1:
        raise ValueError("rounds must be >= 1")
    names_ = list(variants)
    for name in names_:  # warm-up: first calls pay for lazy init, allocator growth, compilation
        if name in single_call and before_block is not None:
            continue  # warmed by its own before_block, before every block
        for _ in range(cfg.warmup):
            variants[name]()
    for name in names_ if cfg.settle > 0 else ():
        if name not in single_call:
            _settle(variants[name], device, cfg.settle)
    sync(device)
    per_round: dict[str, list[float]] = {n: [] for n in names_}
    order_log: list[list[str]] = []
    t0 = now_s()
    for r in range(cfg.rounds):
        spent = now_s() - t0
        if cfg.budget_s is not None and r >= max(1, cfg.min_rounds) and spent + spent / r > cfg.budget_s:
            break
        order = names_[r % len(names_) :] + names_[: r % len(names_)]
        order_log.append(order)
        for name in order:
            if before_block is not None:
                before_block(name)
            if name in single_call:  # calls back to back until the block lasts min_run_time_s (>= 1 call)
                sync(device)
                t_call, calls = now_s(), 0
                while calls == 0 or now_s() - t_call < cfg.min_run_time_s:
                    variants[name]()
                    calls += 1
                sync(device)
                seconds = (now_s() - t_call) / calls
            else:
                seconds = measure(
                    variants[name],
                    device=device,
                    min_run_time_s=cfg.min_run_time_s,
                    warmup=0,
                    num_threads=cfg.num_threads,
                ).median_s
            per_round[name].append(seconds / max(1, (cfg.units_per_call or {}).get(name, 1)))
        if cfg.on_round is not None:
            cfg.on_round(r)
    base = Stats.of(per_round[baseline])
    out: dict[str, VariantResult] = {}
    for name in names_:
        st = Stats.of(per_round[name])
        ratios = [b / v for b, v in zip(per_round[baseline], per_round[name])]
        rq1, rmed, rq3 = quantiles(ratios)
        overlap = not (st.q3_s < base.q1_s or st.q1_s > base.q3_s)
        out[name] = VariantResult(name, st, rmed, rq1, rq3, overlap if name != baseline else True)
    return Comparison(variants=out, rounds=len(order_log), order=order_log)


# ---------------------------------------------------------------------------------------------------------------
# memory


@dataclass
class MemoryResult:
    """Peak bytes above the starting level while running a callable, and how they were measured."""

    peak_bytes: int
    method: str


def peak_memory(fn: Callable[[], Any], device: torch.device | str | None = "cpu") -> MemoryResult:
    """Peak memory that ``fn`` allocates above what was live before it (CUDA allocator or CPU tracking)."""
    dev = torch.device(device or "cpu")
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
        start = torch.cuda.memory_allocated(dev)
        torch.cuda.reset_peak_memory_stats(dev)
        fn()
        torch.cuda.synchronize(dev)
        return MemoryResult(torch.cuda.max_memory_allocated(dev) - start, "cuda_max_allocated")
    return MemoryResult(cpu_tracked_peak_bytes(fn), "cpu_tracked")


def cpu_tracked_peak_bytes(fn: Callable[[], Any]) -> int:
    """Peak of live CPU tensor bytes allocated inside ``fn``: the profiler's allocation events replayed in order.

    A free counts only when its block was allocated inside ``fn``. The allocator's table of block sizes outlives a
    profiling session, so the free of a block allocated before ``fn`` - during an earlier measurement, or at an
    address an earlier measurement once used - is reported with a size, and replaying it would subtract bytes this
    measurement never added. Pairing each free with an allocation by address leaves them out. (In a sweep over
    models, one step read 0.56 MiB low this way - about the previous model's gradients.)

    Example:
        >>> cpu_tracked_peak_bytes(lambda: torch.ones(1024, 256).exp())  # input and output, 1 MiB each
        2097152
    """
    from torch._C._profiler import _EventType
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    events: list[tuple[int, int, int, int]] = []  # (time, free first on a tie, address, bytes)
    stack = list(prof.profiler.kineto_results.experimental_event_tree())
    while stack:
        node = stack.pop()
        stack.extend(node.children)
        if node.tag != _EventType.Allocation:
            continue
        f = node.extra_fields
        if f.device.type != "cpu":  # CUDA blocks are the CUDA allocator's job (peak_memory)
            continue
        events.append((node.start_time_ns, 0 if f.alloc_size < 0 else 1, f.ptr, f.alloc_size))
    events.sort()
    live: dict[int, int] = {}
    cur = peak = 0
    for _, _, ptr, nbytes in events:
        if nbytes > 0:
            cur += nbytes - live.get(ptr, 0)  # an address allocated twice without a free seen: count it once
            live[ptr] = nbytes
            peak = max(peak, cur)
        elif ptr in live:
            cur -= live.pop(ptr)
    return peak


def rss_peak_subprocess(code: str, *, timeout_s: float = 600) -> MemoryResult:
    """Run Python ``code`` in a child process and return its resident-set high-water mark."""
    probe = (
        code
        + "\nimport resource, sys\nsys.stdout.write('\\n__RSS__%d' % resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)\n"
    )
    res = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=timeout_s)
    if res.returncode != 0:
        raise RuntimeError(f"subprocess failed: {res.stderr.strip()[-2000:]}")
    kib = int(res.stdout.rsplit("__RSS__", 1)[1])
    return MemoryResult(kib * 1024, "rss_subprocess")


class SavedTensorMeter:
    """Counts the bytes autograd saves for backward inside the ``with`` block, exactly.

    Tensors are deduplicated by storage (two views of one buffer count once). Parameters (leaf tensors that
    require grad, and views of them such as the ``weight.t()`` a Linear saves) are counted separately in
    ``param_bytes``: they live anyway, so they are not activation memory.

    Example:
        >>> lin = torch.nn.Linear(4, 3)
        >>> with SavedTensorMeter() as meter:
        ...     y = torch.relu(lin(torch.randn(2, 4)))
        >>> meter.saved_bytes  # input of the Linear (2x4 fp32) and output of the ReLU (2x3 fp32)
        56
    """

    def __init__(self) -> None:
        self._seen: dict[tuple[int, int], int] = {}
        self._params: dict[tuple[int, int], int] = {}
        self._ctx: Any = None

    def _pack(self, t: torch.Tensor) -> torch.Tensor:
        st = t.untyped_storage()
        key = (st.data_ptr(), st.nbytes()) if t.device.type != "meta" else (id(st), st.nbytes())
        base = t._base if t._base is not None else t  # Linear saves weight.t(): a view of the parameter
        target = self._params if (base.is_leaf and base.requires_grad) else self._seen
        target[key] = st.nbytes()
        return t

    def __enter__(self) -> SavedTensorMeter:
        self._ctx = torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t)
        self._ctx.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._ctx.__exit__(*exc)

    @property
    def saved_bytes(self) -> int:
        return sum(self._seen.values())

    @property
    def param_bytes(self) -> int:
        return sum(self._params.values())


# ---------------------------------------------------------------------------------------------------------------
# CPU time: who used the cores while a phase ran (the kernel's CPU-time counters, read through psutil)


@dataclass
class CpuUse:
    """Core-seconds spent during one phase, by whom. ``others`` is the machine's busy time (all cores, steal
    excluded) minus this process and its descendants (the loader workers): what other programs took.

    A ``CpuUse`` is plain data, so diagnosis logic is tested with made-up figures (no machine needed)."""

    wall_s: float
    cores: int  # cores this process may run on (sched affinity)
    machine_cores: int
    main_cpu_s: float  # this process (all its threads)
    workers_cpu_s: float  # its descendants: loader workers, a compile worker
    others_cpu_s: float  # other programs on the machine
    steal_s: float = 0.0  # time the hypervisor gave this VM's vCPUs to other guests (Linux, VMs)
    run_queue: float | None = (
        None  # mean runnable tasks on the machine (/proc/stat procs_running), ours included
    )
    top_others: list[dict[str, Any]] = field(default_factory=list)  # [{name, pid, cpu_s}], largest first
    workers: int = 0  # descendants seen

    @property
    def others_cores(self) -> float:
        """Cores other programs (and the hypervisor's steal) held on average: 1.0 = one core, all the time."""
        return (self.others_cpu_s + self.steal_s) / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def busy_share(self) -> float:
        """The share of the machine's cores taken by others (0-1)."""
        return self.others_cores / max(1, self.machine_cores)

    @property
    def own_cores(self) -> float:
        return (self.main_cpu_s + self.workers_cpu_s) / self.wall_s if self.wall_s > 0 else 0.0

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["others_cores"] = round(self.others_cores, 3)
        d["busy_share"] = round(self.busy_share, 3)
        return d

    @staticmethod
    def added(parts: list[CpuUse]) -> CpuUse | None:
        """Several phases as one (sums; the run queue weighted by wall time; the top programs merged)."""
        if not parts:
            return None
        wall = sum(p.wall_s for p in parts)
        rq = [(p.run_queue, p.wall_s) for p in parts if p.run_queue is not None]
        top: dict[tuple[str, int], float] = {}
        for p in parts:
            for t in p.top_others:
                top[(t["name"], t["pid"])] = top.get((t["name"], t["pid"]), 0.0) + t["cpu_s"]
        return CpuUse(
            wall_s=wall,
            cores=parts[0].cores,
            machine_cores=parts[0].machine_cores,
            main_cpu_s=sum(p.main_cpu_s for p in parts),
            workers_cpu_s=sum(p.workers_cpu_s for p in parts),
            others_cpu_s=sum(p.others_cpu_s for p in parts),
            steal_s=sum(p.steal_s for p in parts),
            run_queue=sum(a * b for a, b in rq) / max(1e-9, sum(b for _, b in rq)) if rq else None,
            top_others=_top(top),
            workers=max(p.workers for p in parts),
        )


def _top(cpu: dict[tuple[str, int], float], n: int = 3) -> list[dict[str, Any]]:
    big = sorted(((s, k) for k, s in cpu.items() if s >= 0.05), reverse=True)[:n]
    return [{"name": name, "pid": pid, "cpu_s": round(s, 2)} for s, (name, pid) in big]


def _procs_running() -> int | None:
    try:
        with open("/proc/stat", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("procs_running"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


class CpuMeter:
    """Account the CPU time of a phase: this process, its descendants, and everyone else.

    ``with CpuMeter() as m: ...`` then ``m.result`` (a ``CpuUse``). A sampler thread reads this process tree's
    counters every ``interval_s`` (a loader worker that exits mid-phase keeps the time last read, so at most one
    interval of its CPU is counted as another program's), and the run queue; the machine's counters and every
    program's are read at the start and the end (``top_others``). Costs ~1 ms of CPU per sample.
    """

    def __init__(self, interval_s: float = 0.2) -> None:
        self.interval_s = interval_s
        self.result: CpuUse | None = None
        self._stop: Any = None  # threading.Event, made on entry
        self._thread: Any = None

    def __enter__(self) -> CpuMeter:
        import threading

        import psutil

        self._me = psutil.Process()
        self._t0 = now_s()
        self._sys0 = psutil.cpu_times()
        self._all0 = _every_program()
        self._main0 = _own_cpu(self._me)
        self._tree: dict[int, tuple[float, float]] = {}  # pid -> (first seen, last seen) CPU seconds
        self._queue: list[int] = []
        self._started = False
        self._sample()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="ptt-cpu-meter", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        assert self._stop is not None
        while not self._stop.wait(self.interval_s):
            self._sample()

    def _sample(self) -> None:
        import psutil

        try:
            kids = self._me.children(recursive=True)
        except psutil.Error:
            kids = []
        for k in kids:
            try:
                c = _own_cpu(k)
            except psutil.Error:
                continue
            first = self._tree.get(k.pid, (None, 0.0))[0]
            if (
                first is None
            ):  # seen at the start: only what it spends from now; born during the phase: all of it
                first = c if not self._started else 0.0
            self._tree[k.pid] = (first, c)
        self._started = True
        q = _procs_running()
        if q is not None:
            self._queue.append(q)

    def __exit__(self, *exc: Any) -> None:
        import psutil

        assert self._stop is not None and self._thread is not None
        self._stop.set()
        self._thread.join()
        self._sample()
        wall = now_s() - self._t0
        sys1 = psutil.cpu_times()
        main = _own_cpu(self._me) - self._main0
        workers = sum(max(0.0, last - first) for first, last in self._tree.values())
        busy = _busy(sys1) - _busy(self._sys0)
        steal = max(0.0, getattr(sys1, "steal", 0.0) - getattr(self._sys0, "steal", 0.0))
        ours = {self._me.pid, *self._tree}
        top: dict[tuple[str, int], float] = {}
        for pid, (name, cpu) in _every_program().items():
            if pid not in ours:
                before = self._all0.get(pid, (name, 0.0))[1]
                top[(name, pid)] = cpu - before
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
        machine = psutil.cpu_count() or cores
        # the kernel counts CPU time in ticks (10 ms per core at USER_HZ 100) and the counters are read at
        # slightly different instants: over a phase of a fraction of a second that error alone can exceed the
        # wall time. Nobody can hold more than the machine's cores for the phase, so others are bounded by
        # what our processes left of them.
        room = max(0.0, wall * machine - main - workers)
        others = min(room, max(0.0, busy - main - workers))
        self.result = CpuUse(
            wall_s=wall,
            cores=cores,
            machine_cores=machine,
            main_cpu_s=main,
            workers_cpu_s=workers,
            others_cpu_s=others,
            steal_s=min(steal, room - others),
            run_queue=sum(self._queue) / len(self._queue) if self._queue else None,
            top_others=_top(top),
            workers=len(self._tree),
        )


def drain(it: Any, n: int) -> tuple[int, float, CpuUse]:
    """Take up to ``n`` items from the iterator ``it`` (fewer if it ends): (items taken, seconds, the CPU they
    cost: this process, its workers and everyone else). How a loader's own rate is read."""
    t0 = now_s()
    taken = 0
    with CpuMeter() as meter:
        for _ in range(n):
            try:
                next(it)
            except StopIteration:
                break
            taken += 1
    assert meter.result is not None
    return taken, now_s() - t0, meter.result


def _own_cpu(p: Any) -> float:
    t = p.cpu_times()
    return float(t.user + t.system)


def _busy(t: Any) -> float:
    """Busy seconds of all cores from ``psutil.cpu_times()``: everything but idle, I/O wait and steal (steal is
    time the vCPU did not run at all; it is reported apart). guest time is already inside user on Linux."""
    return float(sum(t) - t.idle - getattr(t, "iowait", 0.0) - getattr(t, "steal", 0.0)
                 - getattr(t, "guest", 0.0) - getattr(t, "guest_nice", 0.0))  # fmt: skip


def _every_program() -> dict[int, tuple[str, float]]:
    import psutil

    out = {}
    for p in psutil.process_iter(["name", "cpu_times"]):
        t = p.info.get("cpu_times")
        if t is not None:
            out[p.pid] = (p.info.get("name") or "?", float(t.user + t.system))
    return out


# ---------------------------------------------------------------------------------------------------------------
# environment


def _cpu_info() -> tuple[str, tuple[str, ...]]:
    caps = cpu_caps()
    return caps.model, caps.flags


def _git(*args: str) -> subprocess.CompletedProcess[str]:
    """``git ARGS`` in this package's folder (5 s at most), output captured."""
    return subprocess.run(
        ["git", *args],
        capture_output=True,
        text=True,
        timeout=5,
        cwd=os.path.dirname(os.path.abspath(__file__)),
    )


def _git_sha() -> str | None:
    try:
        res = _git("rev-parse", "--short", "HEAD")
        sha = res.stdout.strip()
        if res.returncode != 0 or not sha:
            return None
        dirty = _git("status", "--porcelain", "--untracked-files=no").stdout.strip()
        return sha + ("-dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return None


def environment(device: torch.device | str | None = "cpu") -> dict[str, Any]:
    """The fingerprint stored with every result: software, hardware, threads, code version, command line."""
    dev = torch.device(device or "cpu")
    cpu_model, flags = _cpu_info()
    env: dict[str, Any] = {
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "device": str(dev),
        "device_name": torch.cuda.get_device_name(dev) if dev.type == "cuda" else cpu_model,
        "cpu": cpu_model,
        "cpu_flags": list(flags),
        # the class results are filed under, after the ISA limits in force (ATEN_CPU_CAPABILITY, ONEDNN_MAX_CPU_ISA)
        "cpu_class": cpu_caps().cpu_class,
        "isa_limits": {k: os.environ[k] for k in ISA_LIMIT_ENV if os.environ.get(k)},
        "cpu_count": os.cpu_count(),
        "threads": torch.get_num_threads(),
        "git_sha": _git_sha(),
        "command": " ".join(sys.argv),
        "time_utc": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
    }
    return env


def write_jsonl(path: str | os.PathLike[str], rows: list[dict[str, Any]]) -> None:
    """Append rows to a JSONL file (one JSON object per line), creating folders as needed."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "a", encoding="utf-8") as fh:
        for row in rows:
            fh.write(json.dumps(row, default=_json_default, sort_keys=True) + "\n")


def write_results(stem: str | os.PathLike[str], rows: list[dict[str, Any]], markdown: str) -> None:
    """One benchmark run's results: ``STEM.jsonl`` (replaced, not appended: the Markdown quotes exactly these
    rows) and ``STEM.md``; each written to a temporary file and renamed, so an interrupted run leaves the old pair.
    """
    stem = os.fspath(stem)
    tmp = f"{stem}.tmp{os.getpid()}"
    if os.path.exists(tmp + ".jsonl"):
        os.remove(tmp + ".jsonl")
    write_jsonl(tmp + ".jsonl", rows)
    with open(tmp + ".md", "w", encoding="utf-8") as fh:
        fh.write(markdown)
    os.replace(tmp + ".jsonl", stem + ".jsonl")
    os.replace(tmp + ".md", stem + ".md")


def publish(stem: str | os.PathLike[str], rows: list[dict[str, Any]], markdown: str) -> int:
    """A benchmark script's last step: ``write_results`` and the Markdown printed; returns 0 (its exit status)."""
    write_results(stem, rows, markdown)
    print(markdown)
    return 0


def _json_default(obj: Any) -> Any:
    if hasattr(obj, "__dataclass_fields__"):
        return asdict(obj)
    if isinstance(obj, torch.device | torch.dtype):
        return str(obj)
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")
