"""Where a training step's time goes: ``profile(step_fn, steps=..., data=...)`` and a one-line verdict.

Three passes over the user's own step function:
1. timed steps, split into data wait (``next(data)``), host->device copies, forward (outermost module calls),
   backward (``torch.autograd.backward``), optimizer (``Optimizer.step`` hooks) and synchronisations (``.item()``,
   ``.cpu()``, ``.tolist()``, ``torch.cuda.synchronize``); the rest is "other" (Python in the step, loss, logging).
   On CUDA each segment ends with a device sync, so GPU time lands in the segment that queued it;
2. ``torch.profiler`` with a schedule (wait 0, warm-up 1, active N): the top ops table and, when asked, a
   Chrome/Perfetto trace, gzipped or dropped if it exceeds a size limit;
3. ``cProfile`` over a couple of steps: Python-side hotspots.
The verdict names the bottleneck (input-bound, sync-bound, compute-bound, or overhead-bound) and the first trick
to try - filtered by the device it runs on: bf16 only where it is native (CPU: avx512_bf16/AMX, not limited away;
CUDA: ``torch.cuda.is_bf16_supported()``), since emulated bf16 is several times slower than fp32. Clock reads go
through ``clock.now_s``; Kineto's log lines of a run that went well are dropped (``quiet``).
"""

from __future__ import annotations

import contextlib
import cProfile
import gzip
import os
import pstats
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

from pytorchtricks.analysis import verdict as judge
from pytorchtricks.clock import now_s, sync
from pytorchtricks.core import PttError, config_first, options_of
from pytorchtricks.hardware import cpu_caps
from pytorchtricks.quiet import filtered_stderr

__all__ = ["ProfileConfig", "ProfileReport", "profile"]

SEGMENTS = ("data", "h2d", "forward", "backward", "optimizer", "sync", "other")
MiB = 2**20

FIRST_TRICK = {
    "input-bound": "feed faster: ptt.make_loader (workers, pinned memory, prefetch), ptt.cache_in_ram or "
    "ptt.dataset_on_device; decode smaller (JPEG draft mode)",
    "sync-bound": "remove per-step host syncs (.item(), .cpu(), printing tensors): log every N steps, keep "
    "metrics on the device",
    "compute-bound": "do less or cheaper math: ptt.mixed_precision (bf16), ptt.to_channels_last_, ptt.compile_",
    "overhead-bound": "cut Python and launch overhead: larger batches, ptt.compile_, fewer small ops per step",
}
# where bf16 is not native (emulated through fp32, several times slower) the compute-bound tip goes without it
COMPUTE_BOUND_NO_BF16 = "do less or cheaper math: ptt.to_channels_last_, ptt.compile_"
NO_BF16_NOTE = "no bf16 tip: {where} has no native bf16; emulated bf16 runs slower than fp32"


def bf16_native(device: torch.device) -> bool:
    """True when ``device`` computes bf16 natively: CUDA ``is_bf16_supported()``; CPU avx512_bf16 or AMX, not
    limited away by ``ATEN_CPU_CAPABILITY``/``ONEDNN_MAX_CPU_ISA`` (``hardware.cpu_caps``)."""
    if device.type == "cuda":
        return bool(torch.cuda.is_bf16_supported())
    return device.type == "cpu" and cpu_caps().native_bf16


def first_trick(verdict: str, device: torch.device) -> tuple[str, str | None]:
    """The first trick to try for ``verdict`` on ``device``, and a note when advice was left out for it.

    Example:
        >>> first_trick("sync-bound", torch.device("cpu"))[0].startswith("remove per-step host syncs")
        True
    """
    if verdict == "compute-bound" and not bf16_native(device):
        where = "this CPU" if device.type == "cpu" else f"this {device.type} device"
        return COMPUTE_BOUND_NO_BF16, NO_BF16_NOTE.format(where=where)
    return FIRST_TRICK[verdict], None


@dataclass
class ProfileReport:
    """Result of ``profile``: per-step seconds by segment, the verdict, top ops, Python hotspots, trace path."""

    steps: int
    split_s: dict[str, float]  # mean seconds per step, by segment (SEGMENTS)
    verdict: str
    first_trick: str
    top_ops: list[dict[str, Any]] = field(default_factory=list)
    hotspots: list[dict[str, Any]] = field(default_factory=list)
    trace_path: str | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def step_s(self) -> float:
        return sum(self.split_s.values())

    def fractions(self) -> dict[str, float]:
        total = self.step_s or 1.0
        return {k: v / total for k, v in self.split_s.items()}

    def line(self) -> str:
        fr = self.fractions()
        main = {
            "input-bound": fr["data"] + fr["h2d"],
            "sync-bound": fr["sync"],
            "overhead-bound": fr["other"],
        }.get(self.verdict, fr["forward"] + fr["backward"] + fr["optimizer"])
        return f"verdict: {self.verdict} ({main:.0%} of the step). First trick to try: {self.first_trick}."

    def __str__(self) -> str:
        fr = self.fractions()
        lines = [f"ptt profile: {self.steps} steps, {self.step_s * 1e3:.2f} ms per step (data wait included)"]
        lines += [f"  {k:<10} {self.split_s[k] * 1e3:>9.2f} ms  {fr[k]:>6.1%}" for k in SEGMENTS]
        lines.append(self.line())
        if self.top_ops:
            lines.append("top ops (torch.profiler, self time):")
            lines += [
                f"  {r['name'][:48]:<48} {r['calls']:>7} calls {r['self_ms']:>9.2f} ms {r['share']:>6.1%}"
                for r in self.top_ops
            ]
        if self.hotspots:
            lines.append("python hotspots (cProfile, own time):")
            lines += [
                f"  {r['function'][:60]:<60} {r['calls']:>7} calls {r['tottime_ms']:>9.2f} ms"
                for r in self.hotspots
            ]
        if self.trace_path:
            lines.append(f"trace: {self.trace_path} (open in https://ui.perfetto.dev or chrome://tracing)")
        lines += [f"note: {n}" for n in self.notes]
        return "\n".join(lines)


def _verdict(split: dict[str, float]) -> str:
    total = sum(split.values()) or 1.0
    fr = {k: v / total for k, v in split.items()}
    shares = {
        "input-bound": fr["data"] + fr["h2d"],
        "sync-bound": fr["sync"],
        "compute-bound": fr["forward"] + fr["backward"] + fr["optimizer"],
        "overhead-bound": fr["other"],
    }
    if judge.judge(total, split["data"] + split["h2d"]).name == judge.INPUT_BOUND:  # the one definition
        return "input-bound"
    if shares["sync-bound"] >= 0.25:
        return "sync-bound"
    return max(shares, key=lambda k: shares[k])


class _Segments:
    """Exclusive wall time per segment: a segment nested in another is subtracted from its parent."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.totals = dict.fromkeys(SEGMENTS, 0.0)
        self._stack: list[list[Any]] = []  # [name, start_s, child_s]
        self.module_depth = 0
        self.in_backward = 0

    def enter(self, name: str) -> None:
        self._stack.append([name, now_s(), 0.0])

    def exit(self, synchronize: bool = False) -> None:
        if synchronize:
            sync(self.device)
        name, start, child = self._stack.pop()
        elapsed = now_s() - start
        self.totals[name] += elapsed - child
        if self._stack:
            self._stack[-1][2] += elapsed

    @contextlib.contextmanager
    def segment(self, name: str, synchronize: bool = False) -> Iterator[None]:
        self.enter(name)
        try:
            yield
        finally:
            self.exit(synchronize)


_SYNC_METHODS = {"item", "tolist", "cpu", "numpy", "__bool__", "__int__", "__float__"}


class _CopySpy(TorchFunctionMode):
    """Times host->device copies and device->host synchronisations issued from Python."""

    def __init__(self, seg: _Segments) -> None:
        super().__init__()
        self.seg = seg

    def __torch_function__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None
    ) -> Any:
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        kind = None
        src = args[0] if args and isinstance(args[0], torch.Tensor) else None
        if src is not None and name in ("to", "cuda") and src.device.type == "cpu":
            target = kwargs.get("device") or next(
                (a for a in args[1:] if isinstance(a, str | torch.device)), None
            )
            if name == "cuda" or (target is not None and torch.device(target).type != "cpu"):
                kind = "h2d"
        elif src is not None and name in _SYNC_METHODS and src.device.type != "cpu":
            kind = "sync"
        if kind is None:
            return func(*args, **kwargs)
        with self.seg.segment(kind, synchronize=kind == "h2d"):
            return func(*args, **kwargs)


@contextlib.contextmanager
def _instrument(seg: _Segments) -> Iterator[None]:
    """Global hooks for forward (outermost module calls), backward, optimizer steps and explicit syncs."""
    from torch.nn.modules import module as module_mod
    from torch.optim import optimizer as optim_mod

    cuda = seg.device.type == "cuda"

    def fwd_pre(mod: Any, args: Any) -> None:
        if seg.in_backward:  # recomputation inside backward (checkpointing) is backward time
            return
        seg.module_depth += 1
        if seg.module_depth == 1:
            seg.enter("forward")

    def fwd_post(mod: Any, args: Any, out: Any) -> None:
        if seg.in_backward:
            return
        seg.module_depth -= 1
        if seg.module_depth == 0:
            seg.exit(synchronize=cuda)

    def opt_pre(opt: Any, args: Any, kwargs: Any) -> None:
        seg.enter("optimizer")

    def opt_post(opt: Any, args: Any, kwargs: Any) -> None:
        seg.exit(synchronize=cuda)

    real_backward = torch.autograd.backward

    def timed_backward(*args: Any, **kwargs: Any) -> Any:
        seg.in_backward += 1
        try:
            with seg.segment("backward", synchronize=cuda):
                return real_backward(*args, **kwargs)
        finally:
            seg.in_backward -= 1

    real_sync = torch.cuda.synchronize

    def timed_sync(*args: Any, **kwargs: Any) -> Any:
        with seg.segment("sync"):
            return real_sync(*args, **kwargs)

    handles = [
        module_mod.register_module_forward_pre_hook(fwd_pre),
        module_mod.register_module_forward_hook(fwd_post, always_call=True),
        optim_mod.register_optimizer_step_pre_hook(opt_pre),
        optim_mod.register_optimizer_step_post_hook(opt_post),
    ]
    torch.autograd.backward = timed_backward  # type: ignore[assignment]
    torch.cuda.synchronize = timed_sync  # type: ignore[assignment]
    try:
        with _CopySpy(seg):
            yield
    finally:
        torch.autograd.backward = real_backward  # type: ignore[assignment]
        torch.cuda.synchronize = real_sync  # type: ignore[assignment]
        for h in handles:
            h.remove()


class _Batches:
    """Cycles over ``data`` (restarting an exhausted iterable); ``None`` means the step takes no batch."""

    def __init__(self, data: Iterable[Any] | None) -> None:
        self.data = data
        self.it = iter(data) if data is not None else None

    def next(self) -> Any:
        if self.it is None or self.data is None:
            return None
        try:
            return next(self.it)
        except StopIteration:
            self.it = iter(self.data)
            try:
                return next(self.it)
            except StopIteration:
                raise PttError("data is empty; pass an iterable that yields at least one batch.") from None


def _call(step_fn: Callable[..., Any], batches: _Batches, seg: _Segments | None = None) -> None:
    if seg is not None:
        with seg.segment("data"):
            batch = batches.next()
    else:
        batch = batches.next()
    _run(step_fn, batches, batch)


def _run(step_fn: Callable[..., Any], batches: _Batches, batch: Any) -> None:
    if batches.data is None:
        step_fn()
    else:
        step_fn(batch)


def _top_ops(prof: Any, top: int, device: torch.device) -> list[dict[str, Any]]:
    events = [e for e in prof.key_averages() if not e.key.startswith("ProfilerStep")]
    use_device = device.type == "cuda"

    def self_us(e: Any) -> float:
        return float(getattr(e, "self_device_time_total", 0.0) if use_device else e.self_cpu_time_total)

    total = sum(self_us(e) for e in events) or 1.0
    rows = sorted(events, key=lambda e: -self_us(e))[:top]
    return [
        {"name": e.key, "calls": int(e.count), "self_ms": self_us(e) / 1e3, "share": self_us(e) / total}
        for e in rows
    ]


def _guard_trace(tmp: str, path: str, max_trace_bytes: int) -> tuple[str | None, str]:
    """Move the exported trace ``tmp`` to ``path``; gzip it when too large (Perfetto reads .gz); drop it if still
    too large."""
    if not os.path.exists(tmp):
        return None, "no trace was exported (the profiler recorded no complete cycle)"
    size = os.path.getsize(tmp)
    if size <= max_trace_bytes:
        os.replace(tmp, path)
        return path, ""
    gz_path = path + ".gz"
    with open(tmp, "rb") as src, gzip.open(gz_path + ".tmp", "wb") as dst:
        dst.write(src.read())
    os.remove(tmp)
    if os.path.getsize(gz_path + ".tmp") <= max_trace_bytes:
        os.replace(gz_path + ".tmp", gz_path)
        return (
            gz_path,
            f"trace was {size / MiB:.1f} MiB > {max_trace_bytes / MiB:.0f} MiB limit: written gzipped",
        )
    os.remove(gz_path + ".tmp")
    return None, (
        f"trace dropped: {size / MiB:.1f} MiB exceeds the {max_trace_bytes / MiB:.0f} MiB limit even gzipped; "
        "profile fewer steps (profile_steps=1) or raise max_trace_bytes"
    )


def _hotspots(step_fn: Callable[..., Any], batches: _Batches, steps: int, top: int) -> list[dict[str, Any]]:
    prof = cProfile.Profile()
    prof.enable()
    try:
        for _ in range(steps):
            _call(step_fn, batches)
    finally:
        prof.disable()
    stats = pstats.Stats(prof)
    rows = []
    for (filename, line, func), (_cc, nc, tt, ct, _) in stats.stats.items():  # type: ignore[attr-defined]
        where = f"{os.path.basename(filename)}:{line}({func})" if line else func
        rows.append({"function": where, "calls": int(nc), "tottime_ms": tt * 1e3, "cumtime_ms": ct * 1e3})
    rows.sort(key=lambda r: -r["tottime_ms"])
    return rows[:top]


@dataclass(frozen=True)
class ProfileConfig:
    """``profile``'s options as one value: ``ptt.profile(step, 10, ptt.ProfileConfig(trace_path="t.json"), data=dl)``
    (the keywords of ``profile`` are a convenience over it; see there for what each does). The step, its step
    count and its data stay arguments of their own: they are what is profiled.

    Example:
        >>> cfg = ptt.ProfileConfig(warmup=1, profile_steps=0, hotspot_steps=0, device="cpu")
        >>> rep = ptt.profile(lambda x: x.sum(), 2, cfg, data=[torch.ones(4)])
        >>> rep.steps, sorted(rep.split_s)[:2]
        (2, ['backward', 'data'])
    """

    warmup: int = 2
    profile_steps: int = 3
    hotspot_steps: int = 2
    trace_path: str | None = None
    max_trace_bytes: int = 50 * MiB
    top: int = 12
    device: str | torch.device | None = None


@options_of(ProfileConfig)
def profile(
    step_fn: Callable[..., Any],
    steps: int = 10,
    config: ProfileConfig | None = None,
    *,
    data: Iterable[Any] | None = None,
    **options: Any,
) -> ProfileReport:
    """Profile a training step: time split, verdict with the first trick to try, top ops, Python hotspots.

    ``step_fn(batch)`` runs one step on a batch drawn from ``data`` (the time spent drawing it is the data wait);
    without ``data``, ``step_fn()`` takes no argument. ``steps`` timed steps follow ``warmup`` untimed ones; then
    ``profile_steps`` steps under ``torch.profiler`` (0 skips; ``trace_path`` writes a Chrome/Perfetto trace,
    gzipped or dropped beyond ``max_trace_bytes``) and ``hotspot_steps`` under cProfile (0 skips).
    The options are ``ProfileConfig``'s fields: one ``config``, or its fields as keywords (not both).

    Example:
        >>> model = nn.Linear(64, 64)
        >>> opt = torch.optim.SGD(model.parameters(), lr=0.1)
        >>> def step(x):
        ...     opt.zero_grad()
        ...     model(x).square().mean().backward()
        ...     opt.step()
        >>> rep = ptt.profile(step, steps=3, data=[torch.randn(32, 64)], profile_steps=0, hotspot_steps=0)
        >>> sorted(rep.split_s) == sorted(["data", "h2d", "forward", "backward", "optimizer", "sync", "other"])
        True
    """
    cfg = config_first(config, ProfileConfig, options)
    warmup, profile_steps, hotspot_steps, top = cfg.warmup, cfg.profile_steps, cfg.hotspot_steps, cfg.top
    trace_path, max_trace_bytes, device = cfg.trace_path, cfg.max_trace_bytes, cfg.device
    if not callable(step_fn):
        raise PttError(f"step_fn must be callable, got {type(step_fn).__name__}.")
    if steps < 1 or warmup < 0 or profile_steps < 0 or hotspot_steps < 0:
        raise PttError("steps must be >= 1 and warmup/profile_steps/hotspot_steps >= 0.")
    dev = (
        torch.device(device)
        if device is not None
        else torch.device("cuda" if torch.cuda.is_available() else "cpu")
    )
    batches = _Batches(data)
    for _ in range(warmup):
        _call(step_fn, batches)
    seg = _Segments(dev)
    with _instrument(seg):
        for _ in range(steps):
            sync(dev)
            seg.enter("other")
            _call(step_fn, batches, seg)
            seg.exit(synchronize=True)
    split = {k: v / steps for k, v in seg.totals.items()}
    verdict = _verdict(split)
    tip, left_out = first_trick(verdict, dev)
    report = ProfileReport(steps=steps, split_s=split, verdict=verdict, first_trick=tip)
    if profile_steps:
        from torch.profiler import ProfilerActivity, schedule
        from torch.profiler import profile as torch_profile

        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev.type == "cuda" else [])
        sched = schedule(wait=0, warmup=1, active=profile_steps)
        tmp = (trace_path + ".tmp") if trace_path else None
        if tmp:
            os.makedirs(os.path.dirname(os.path.abspath(tmp)) or ".", exist_ok=True)

        def on_ready(p: Any) -> None:
            if tmp:
                p.export_chrome_trace(tmp)

        prof = torch_profile(activities=activities, schedule=sched, acc_events=True, on_trace_ready=on_ready)
        # Kineto prints USDT start/stop markers (and, on a CUDA build without a driver, a device-count ERROR)
        # at start, stop and schedule steps: filtered there. Batches are drawn outside the filter, since a loader
        # may fork its workers then, and a child would inherit the filter's temporary file as its stderr.
        with filtered_stderr():
            prof.start()
        try:
            for _ in range(1 + profile_steps):
                batch = batches.next()
                with filtered_stderr():
                    _run(step_fn, batches, batch)
                    prof.step()
        finally:
            with filtered_stderr():
                prof.stop()
        report.top_ops = _top_ops(prof, top, dev)
        if trace_path and tmp:
            report.trace_path, note = _guard_trace(tmp, trace_path, max_trace_bytes)
            if note:
                report.notes.append(note)
    if hotspot_steps:
        report.hotspots = _hotspots(step_fn, batches, hotspot_steps, top)
    if left_out:
        report.notes.append(left_out)
    return report
