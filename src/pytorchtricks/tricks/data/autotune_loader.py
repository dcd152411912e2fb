"""Sweep num_workers x prefetch_factor x pin_memory x RAM cache on your own data, for a bounded time; keep the best.

Why: the right loader settings depend on the machine, the images and the step: more workers than cores
oversubscribe, pin_memory is not always faster, a RAM cache only pays when it fits. Guessing costs more than a
one-minute measurement.
When: once per machine and dataset, before a long run; pass the result's ``best`` to ``make_loader``.
Caveats: each setting is timed over a few batches after its warm-up batch (worker start-up excluded), one after
the other, so a busy machine adds noise: compare settings that differ by more than ~10%. Without ``step`` the
loader is timed alone, which favours more workers than a training job can afford: pass your training step as
``step=`` and every batch is consumed by it in this process, so the workers compete with the training threads
for the cores as they do in your job (on a 2-core CPU a RAM cache is then fastest read in-process, with no
workers at all). Worker counts are tried first at the first prefetch factor, then the other factors while the
budget lasts. The cache, if tried, is
built once (its cost is reported) and reused by later runs with the same key. The sweep stops at ``budget_s``
(always measuring at least one setting).
See also: make_loader, cache_in_ram, doctor_data; 预处理提速 / the right num_workers.
"""

from __future__ import annotations

import itertools
import os
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any

import torch

from pytorchtricks.clock import Deadline, now_s
from pytorchtricks.core import BenchCase, NoEffectWarning, PttError, TrickInfo, config_first, options_of
from pytorchtricks.tricks._cases import first_batch_case
from pytorchtricks.tunable import TuneFacts, TuneHook, TuneSetup, TuneSkip, unless_input_bound

if TYPE_CHECKING:
    from pytorchtricks.tricks.data.cache_in_ram import CacheConfig

__all__ = ["AutotuneConfig", "autotune_loader"]

TRICK = TrickInfo(gains=("speed",), phase=("train", "infer"), exact=True)

Step = Callable[
    [torch.Tensor, torch.Tensor], Any
]  # the training step run beside the loader: step(images, labels)


def _tune_applies(facts: TuneFacts) -> str | None:
    return unless_input_bound(facts, ("files", "pack"))


TUNE_BUDGET_S = 6.0  # the sweep's share of a tune run: every worker count once, with the step beside


def _nearest_first(current: int) -> tuple[int, ...]:
    """Worker counts to sweep (none, half the cores, the cores, twice the cores), the user's count and its
    neighbours first: a budget that runs out leaves out the settings least likely to win."""
    cores = len(os.sched_getaffinity(0))
    counts = {0, max(1, cores // 2), cores, 2 * cores, current}
    return tuple(sorted(counts, key=lambda n: (abs(n - current), n)))


def _tune_prepare(setup: TuneSetup) -> dict[str, Any]:
    # over the dataset as the loader hooks before it left it (the files, a pack, a RAM cache), each setting
    # timed with the user's step beside the loader; the RAM cache is a candidate of its own (cache_in_ram)
    try:
        res = autotune_loader(
            setup.dataset,
            setup.batch_size,
            crop=setup.input_size,
            workers=_nearest_first(int(setup.loader_kwargs.get("num_workers", 0))),
            cache=(False,),
            budget_s=TUNE_BUDGET_S,
            batches=3,
            step=setup.step_beside,
        )
    except PttError as exc:
        raise TuneSkip(str(exc)) from exc
    rows = [r for r in res.table if "images_per_s" in r]
    setup.notes.append(
        "swept with the training step beside the loader: "
        + ", ".join(f"{r['num_workers']} worker(s) {r['images_per_s']:.0f} images/s" for r in rows)
    )
    return {k: v for k, v in res.best.items() if k != "crop" and v is not None}


def _tune_apply(setup: TuneSetup, state: dict[str, Any]) -> None:
    setup.loader = "ptt"
    setup.loader_kwargs.update(state)


TUNE = TuneHook(
    changes="loader",
    check="data",
    receipt="loader = ptt.make_loader(dataset, {batch_size}, **ptt.autotune_loader(dataset, {batch_size}, "
    "crop={input_size}).best)  # the sweep's settings: workers, prefetch, pinning (and the crop)",
    apply=_tune_apply,
    applies=_tune_applies,
    prepare=_tune_prepare,
    order=110,
    requires=("make_loader",),
    last=True,
    bound="decoded pixels >= 30 dB PSNR vs PIL full decode",
)


@dataclass
class AutotuneResult:
    """``best``: make_loader keyword arguments; ``cache``: use ``dataset`` (cached when True); ``table``: all rows."""

    best: dict[str, Any]
    cache: bool
    dataset: Any
    table: list[dict[str, Any]] = field(default_factory=list)
    cache_build_s: float | None = None

    def loader(self, batch_size: int, **kwargs: Any) -> Any:
        """``make_loader(self.dataset, batch_size, **self.best, **kwargs)``."""
        from pytorchtricks.tricks.data.make_loader import make_loader

        return make_loader(self.dataset, batch_size, **{**self.best, **kwargs})


def _time_setting(
    dataset: Any, batch_size: int, batches: int, kwargs: dict[str, Any], step: Step | None = None
) -> float:
    from pytorchtricks.tricks.data.make_loader import make_loader

    with warnings.catch_warnings():  # more workers than cores is a setting under test, not a mistake
        warnings.filterwarnings("ignore", "This DataLoader will create", UserWarning)
        loader = make_loader(dataset, batch_size, persistent_workers=False, **kwargs)
        it = iter(loader)
    first = next(it)  # start-up: workers fork, first prefetch
    if step is not None:
        step(*first)  # the step's own warm-up (allocator, kernels) stays out of the timing too
    t0 = now_s()
    n = 0
    for x, y in itertools.islice(it, batches):
        if step is not None:
            step(x, y)
        n += int(x.shape[0])
    seconds = now_s() - t0
    del it  # stop this setting's workers before the next one starts
    return n / seconds if seconds > 0 and n else 0.0


@dataclass(frozen=True)
class AutotuneConfig:
    """``autotune_loader``'s options as one value: ``ptt.autotune_loader(ds, 64, ptt.AutotuneConfig(budget_s=30))``
    (the keywords of ``autotune_loader`` are a convenience over it; see there for what each does).
    ``cache_config``: ``cache_in_ram``'s options when the RAM cache is tried (its keywords, as a ``CacheConfig``).

    Example:
        >>> ds = [(torch.randint(0, 256, (3, 40, 40), dtype=torch.uint8), 0) for _ in range(40)]
        >>> cfg = ptt.AutotuneConfig(crop=32, workers=(0, 1), prefetch_factors=(2,), cache=(False,), batches=2)
        >>> [row["num_workers"] for row in ptt.autotune_loader(ds, 8, cfg).table]
        [0, 1]
    """

    crop: int | None = 224
    workers: tuple[int, ...] | None = None
    prefetch_factors: tuple[int, ...] = (2, 4)
    pin_memory: tuple[bool, ...] | None = None
    cache: tuple[bool, ...] = (False, True)
    cache_size: int = 256
    budget_s: float = 60.0
    batches: int = 4
    step: Step | None = None
    cache_config: CacheConfig | None = None


def _cache_config(config: AutotuneConfig | None, cache_kwargs: dict[str, Any]) -> CacheConfig | None:
    """``cache_in_ram``'s keywords given to ``autotune_loader`` as a ``CacheConfig`` (None: none given)."""
    if not cache_kwargs:
        return None
    if config is not None:
        raise PttError(
            f"with an AutotuneConfig, cache_in_ram's options ({', '.join(sorted(cache_kwargs))}) go in it: "
            "AutotuneConfig(cache_config=ptt.CacheConfig(...)), not as keywords."
        )
    from pytorchtricks.tricks.data.cache_in_ram import CacheConfig

    names = [f.name for f in fields(CacheConfig)]
    unknown = sorted(set(cache_kwargs) - set(names))
    if unknown:
        import difflib

        close = difflib.get_close_matches(unknown[0], names + [f.name for f in fields(AutotuneConfig)], n=1)
        guess = f" (did you mean {close[0]!r}?)" if close else ""
        raise PttError(
            f"autotune_loader got unknown keywords {unknown}{guess}: besides its own (AutotuneConfig's fields) it "
            f"takes cache_in_ram's ({', '.join(names)})."
        )
    return CacheConfig(**cache_kwargs)


@options_of(AutotuneConfig)
def autotune_loader(
    dataset: Any, batch_size: int, config: AutotuneConfig | None = None, **options: Any
) -> AutotuneResult:
    """Measure loader settings on ``dataset`` within ``budget_s`` seconds and return the fastest (images/s).

    ``step(x, y)``, when given, is called on every batch in this process (your training step): the rate is then
    that of the loop, loader and step together, and the winner is the setting your job runs fastest with.
    The options are ``AutotuneConfig``'s fields: one ``config``, or its fields as keywords (not both); other
    keywords are ``cache_in_ram``'s (``CacheConfig``'s fields), for the cached settings.

    Example:
        >>> ds = [(torch.randint(0, 256, (3, 40, 40), dtype=torch.uint8), 0) for _ in range(40)]
        >>> r = ptt.autotune_loader(ds, 8, crop=32, workers=(0, 1), cache=(False,), budget_s=10, batches=2)
        >>> sorted(r.best), len(r.table) >= 1
        (['crop', 'num_workers', 'pin_memory', 'prefetch_factor'], True)
    """
    own = {f.name for f in fields(AutotuneConfig)}
    cache_kwargs = {k: v for k, v in options.items() if k not in own}
    mine = {k: v for k, v in options.items() if k in own}
    if cache_kwargs:
        mine["cache_config"] = _cache_config(config, cache_kwargs)
    return _autotune(dataset, batch_size, config_first(config, AutotuneConfig, mine))


def _autotune(dataset: Any, batch_size: int, cfg: AutotuneConfig) -> AutotuneResult:
    crop, cache, step = cfg.crop, cfg.cache, cfg.step
    prefetch_factors, batches = cfg.prefetch_factors, cfg.batches
    if batch_size < 1 or batches < 1:
        raise PttError("batch_size and batches must be >= 1.")
    if len(dataset) < batch_size * (batches + 1):
        raise PttError(
            f"need at least {batch_size * (batches + 1)} samples to time {batches} batches + warm-up."
        )
    cores = len(os.sched_getaffinity(0))
    workers = cfg.workers or tuple(sorted({0, max(1, cores // 2), cores, 2 * cores}))
    pins = cfg.pin_memory or ((False, True) if torch.cuda.is_available() else (False,))
    deadline = Deadline(cfg.budget_s)
    table: list[dict[str, Any]] = []
    cached: Any = None
    build_s: float | None = None
    for use_cache in cache:
        data = dataset
        if use_cache:
            if deadline.expired and table:
                break
            from pytorchtricks.tricks.data.cache_in_ram import CachedDataset, cache_in_ram

            t0 = now_s()
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                cached = cache_in_ram(dataset, cfg.cache_size, cfg.cache_config)
            build_s = now_s() - t0
            if not isinstance(cached, CachedDataset):
                table.append({"cache": True, "skipped": str(caught[-1].message) if caught else "refused"})
                continue
            data = cached
        # every worker count first (it matters most), then the other prefetch factors while the budget lasts
        for pf, w, pin in itertools.product(prefetch_factors, workers, pins):
            if w == 0 and pf != prefetch_factors[0]:
                continue  # prefetch_factor means nothing without workers
            if deadline.expired and table:
                break
            kw = {"crop": crop, "num_workers": w, "prefetch_factor": pf if w else None, "pin_memory": pin}
            ips = _time_setting(data, batch_size, batches, kw, step)
            table.append({"cache": use_cache, **kw, "images_per_s": ips, "with_step": step is not None})
    timed = [r for r in table if "images_per_s" in r]
    if len(timed) < 2:
        warnings.warn(
            "autotune_loader measured one setting only: nothing was compared.", NoEffectWarning, stacklevel=3
        )
    best_row = max(timed, key=lambda r: r["images_per_s"])
    best = {k: best_row[k] for k in ("crop", "num_workers", "prefetch_factor", "pin_memory")}
    use = bool(best_row["cache"])
    return AutotuneResult(best, use, cached if use else dataset, table, build_s)


def bench_case(size: str = "smoke", device: str = "cpu") -> BenchCase:
    """A batch from the default settings (one worker per core) vs the tuned ones, on small JPEGs."""
    from pytorchtricks.tricks.data.make_loader import _photo_bytes, make_loader

    n = 16 if size == "smoke" else 64
    data = _photo_bytes(n * 4, (120, 160))
    tuned = autotune_loader(data, n, crop=64, workers=(0, 1), cache=(False,), budget_s=10, batches=2)
    base = make_loader(data, n, crop=64, num_workers=0)
    treat = tuned.loader(n)
    return first_batch_case(
        base,
        treat,
        n,
        device=device,
        description=f"first batch of {n} 64 px crops: num_workers=0 vs autotuned {tuned.best}",
    )
