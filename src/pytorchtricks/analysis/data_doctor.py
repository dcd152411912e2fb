"""The data doctor: where a batch's time goes (read, decode, augment, collate, host->device, wait) and what to fix.

Two measurements. (1) One process builds ``batches`` batches exactly as ``make_loader`` does, with a stopwatch around
each stage; the stages are timed separately from an outer clock around the whole loop, so their sum can be checked
against the measured total (it covers >= 90% of it: the rest is loop overhead). (2) The real loader with its
workers runs beside the caller's step - the real one (``step=``, a callable: on a CPU the workers then compete with
the training threads for the cores, as in the user's job) or a pause of ``step_time_s`` standing in for GPU work;
the time the loop blocks in ``next()`` is the wait-for-data. Input-bound when that wait exceeds 10% of the step.
The single-process pass also counts the pixels its JPEG decodes produced (``decoded_mp_per_sample``: the crop's
window at its DCT scale when the region-of-interest decode applies, the whole scaled image when it falls back) and
which files fell back, by reason.
"""

from __future__ import annotations

import os
import time
import warnings
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from pytorchtricks.analysis import verdict as judge
from pytorchtricks.clock import CpuMeter, CpuUse, Stopwatch, drain, now_s
from pytorchtricks.core import Option, PttError, PttWarning, Spelt, config_first, options_of, resolve_device
from pytorchtricks.data.batches import default_workers

__all__ = ["doctor_data", "DataDoctorConfig", "DataReport", "open_image_dataset"]

STAGES = ("read", "decode", "augment", "collate", "host_to_device")

FIXES = {
    "read": "cache_in_ram(dataset) - or pack the files into shards on local disk (ptt pack)",
    "decode": "decode smaller: pack with --resize (once), cache_in_ram(size=256), and crop-aware scaled decode "
    "(make_loader(crop=...))",
    "augment": "move augmentation to the device on whole batches (device_augment after prefetch_to_device)",
    "collate": "collate uint8 whole batches in the workers (make_loader) instead of per-sample float tensors",
    "host_to_device": "pin memory and copy uint8 on a side stream, normalize on the device (prefetch_to_device)",
}


@dataclass
class DataReport:
    """Result of ``doctor_data``: seconds per batch by stage, the wait-for-data, the verdict and the first fix."""

    batch_size: int
    batches: int
    stages_s: dict[str, float]  # per batch, single process
    total_s: float  # per batch, outer clock of the same loop
    num_workers: int
    loader_batch_s: float  # per batch, real loader (workers), no step
    wait_s: float | None  # per batch, blocked in next() while a step of step_time_s runs
    step_time_s: float | None
    verdict: str
    fix: str
    notes: list[str] = field(default_factory=list)
    decoded_mp_per_sample: float | None = None  # megapixels out of the JPEG decoder per sample (serial pass)
    window_decodes: int = 0  # samples decoded as a crop window (region-of-interest decode)
    decode_fallbacks: dict[str, int] = field(default_factory=dict)  # reason -> samples decoded whole instead
    # CPU-seconds per batch beside the step: the training process and the loader workers (analysis.verdict),
    # and who used the CPU meanwhile (clock.CpuUse.as_dict(): ``busy_share`` is what other programs took)
    core_seconds: dict[str, Any] | None = None
    cpu: dict[str, Any] | None = None
    workers_cpu_s_per_batch: float | None = None  # the loader alone: its workers' CPU-seconds per batch
    shm: str | None = (
        None  # /dev/shm's size against the loader's batches in flight (data.shm.ShmPlan.describe)
    )

    @property
    def stage_sum_s(self) -> float:
        return sum(self.stages_s.values())

    @property
    def loader_images_per_s(self) -> float:
        return self.batch_size / self.loader_batch_s if self.loader_batch_s > 0 else float("inf")

    def rows(self) -> list[tuple[str, float, float]]:
        """``(stage, ms per batch, share of the total)`` for printing."""
        return [(k, v * 1e3, v / self.total_s if self.total_s else 0.0) for k, v in self.stages_s.items()]


def open_image_dataset(
    path: str | os.PathLike[str],
    *,
    cache_dir: str | os.PathLike[str] | None = None,
    split: str | None = None,
) -> Any:
    """``path`` read once by ``data_source`` and opened by it (the one data road): an ImageFolder tree (or a ``ROOT/train`` +
    ``ROOT/val`` root's train split, or ``split``) -> ``JpegFolder``; a COCO / YOLO / VOC root (its ``split``,
    default the train split; bad annotations left out and listed in ``rejects``) -> ``DetectionDataset``; a ptt /
    lmdb pack folder or a pack's URL (``s3://...``, read through the node cache ``cache_dir``) -> ``ShardDataset``.
    A tar pack (read in order) is refused: the doctor reads by index."""
    from pytorchtricks.road import data_source

    src = data_source(path, cache_dir=cache_dir, split=split)  # what the path is, read once
    return src.check("the data doctor", by_index=True).open(on_error="skip")


def _serial(
    dataset: Any, batch_size: int, batches: int, crop: int | None, device: torch.device
) -> tuple[dict, float, dict[str, Any]]:
    from pytorchtricks.data.batches import stack_batch as _stack
    from pytorchtricks.data.decode import decode_image, decode_stats, decoded_since, image_size, resize_array
    from pytorchtricks.data.images import (
        crop_decode,
        hflip,
        is_encoded,
        read_item,
        rrc_box,
        sample_rng,
        to_hwc,
    )

    out = (crop, crop) if crop else None
    before = decode_stats()
    order = np.random.default_rng(0).permutation(len(dataset))[: batch_size * batches]
    sw = Stopwatch(device)
    t0 = now_s()
    for b in range(batches):
        images, labels = [], []
        for i in order[b * batch_size : (b + 1) * batch_size].tolist():
            with sw.stage("read"):
                raw, label = read_item(dataset, i)
            with sw.stage("augment"):  # the random part: crop box (from the header) and flip coin
                rng = sample_rng(0, 0, i)
                enc = is_encoded(raw)
                hw = image_size(raw) if enc else to_hwc(raw).shape[:2]
                box = rrc_box(hw[0], hw[1], (0.08, 1.0), (3 / 4, 4 / 3), rng) if out else None
                flip = rng.random() < 0.5
            with sw.stage("decode"):  # decode (crop-aware, scaled) and resize to the output size
                if enc:
                    arr = crop_decode(raw, hw, box, out) if out and box else decode_image(raw)
                else:
                    arr = to_hwc(raw)
                    if out and box:
                        t, lf, h, w = box
                        arr = resize_array(arr[t : t + h, lf : lf + w], out)
            with sw.stage("augment"):
                if flip:
                    arr = hflip(arr)
            images.append(arr)
            labels.append(label)
        with sw.stage("collate"):
            x, y = _stack(images, labels)
        with sw.stage("host_to_device", synchronize=True):
            x.to(device)
            y.to(device)
    total = now_s() - t0
    decoded = decoded_since(before)
    return {k: sw.totals_s.get(k, 0.0) / batches for k in STAGES}, total / batches, decoded


def _loader_times(
    loader: Any,
    batches: int,
    step_time_s: float | None,
    prefetched: int = 0,
    step: Any = None,
    cpu: dict[str, CpuUse] | None = None,
) -> tuple[float, float | None]:
    """(seconds per batch with nothing else running, wait per batch beside a step of ``step_time_s``).

    Workers fill a queue of ``prefetched`` batches ahead of the loop; those come for free, so they are taken
    untimed first (as far as the epoch allows) and the clock starts at the next batch's arrival. ``cpu``
    receives who used the CPU in each part: ``"loader"`` alone and ``"beside the step"``.
    """
    cpu = {} if cpu is None else cpu
    it = iter(loader)
    next(it)  # worker start-up and the first prefetch are not the steady state
    spare = len(loader) - 2 - (2 if step_time_s is not None else 1) * batches
    for _ in range(max(0, min(prefetched, spare))):
        next(it)
    next(it)  # the queue is empty now: time from one arrival to the next ones
    n, took_s, alone = drain(it, batches)
    free_s = took_s / max(n, 1)
    cpu["loader"], cpu["loader batches"] = alone, max(n, 1)  # type: ignore[assignment]
    if step_time_s is None:
        return free_s, None
    wait = 0.0
    m = 0
    beside = CpuMeter().__enter__()
    for _ in range(batches):
        if step is not None:
            step()  # the real step: its threads and the loader's workers share the cores
        else:
            time.sleep(
                step_time_s
            )  # stands in for the caller's step (GPU work leaves the CPU to the workers)
        t1 = now_s()
        try:
            next(it)
        except StopIteration:
            break
        wait += now_s() - t1
        m += 1
    beside.__exit__(None, None, None)
    assert beside.result is not None
    cpu["beside the step"], cpu["beside batches"] = beside.result, max(m, 1)  # type: ignore[assignment]
    return free_s, wait / max(m, 1)


@dataclass(frozen=True)
class DataDoctorConfig:
    """``doctor_data``'s options as one value: ``ptt.doctor_data(path, ptt.DataDoctorConfig(batches=8))``, or its
    fields as keywords (``ptt.doctor_data(path, batches=8)``).

    ``batch_size``: default 64 (classification) or 4 (detection). ``crop``: the random crop's side (None: the stored
    size). ``batches``: timed batches. ``num_workers``: the loader's (default: the loaders' own,
    ``data.batches.default_workers``). ``step_time_s``: the training step's seconds per batch, a pause standing in for
    it (None: no verdict, only the loader's rate). ``device``: where the host-to-device stage copies to. ``step``:
    the training step itself, a callable (its time is then measured). ``cache_dir``: the node cache for a pack's
    URL. ``split``: a detection root's split (default its train split). ``recipe``: a detection ``DetectionRecipe``
    or its name.

    Example:
        >>> cfg = ptt.DataDoctorConfig(batch_size=4, crop=32, batches=2, num_workers=0)
        >>> ptt.doctor_data([(torch.zeros(3, 40, 40, dtype=torch.uint8), 0)] * 20, cfg).batch_size
        4
    """

    batch_size: int | None = None
    crop: int | None = 224
    batches: int = 4
    num_workers: int | None = None
    step_time_s: float | None = None
    device: str | torch.device | None = "cpu"
    step: Any = None
    cache_dir: str | os.PathLike[str] | None = None
    split: str | None = None
    recipe: Any = "shortest_side"


@options_of(DataDoctorConfig)
def doctor_data(data: Any, config: DataDoctorConfig | None = None, **options: Any) -> DataReport:
    """Measure where the input pipeline spends its time on ``data`` (a dataset or a path) and say what to fix.

    Classification data is loaded as ``make_loader`` loads it (a random crop of ``crop`` px, None: the stored size;
    ``batch_size`` default 64); detection data (a COCO / YOLO / VOC root - its ``split``, default the train split -
    or pack) as ``make_detection_loader`` does (``recipe``: a ``DetectionRecipe`` or its name, default torchvision's
    detection reference, 800 px up to 1333, flip; ``batch_size`` default 4). The options are ``DataDoctorConfig``'s
    fields: one ``config``, or its fields as keywords (not both).

    ``step``: the caller's training step as a callable (one batch's work, data staged): it runs beside the loader,
    so the wait includes the cores the step takes from the workers; ``step_time_s`` is then measured from it.
    ``data`` may be a pack's URL (``s3://bucket/pack``): its shards are read through the node cache ``cache_dir``
    (the first pass downloads them; the timed batches then read the cache, as every later epoch does).

    Example:
        >>> ds = [(torch.randint(0, 256, (3, 48, 64), dtype=torch.uint8), 0) for _ in range(20)]
        >>> r = ptt.doctor_data(ds, batch_size=4, crop=32, batches=2, num_workers=0, step_time_s=0.0)
        >>> sorted(r.stages_s) == sorted(["read", "decode", "augment", "collate", "host_to_device"])
        True
    """
    from pytorchtricks.analysis import data_doctor_detection as det

    cfg = config_first(config, DataDoctorConfig, options)
    beside = cfg.step_time_s is not None  # a stand-in step: one batch more, timed beside it
    dataset, boxes, batch_size = _opened(data, cfg.cache_dir, cfg.split, cfg.batch_size, cfg.batches, beside)
    dev = resolve_device(cfg.device)
    step_time_s = _step_alone(cfg.step) if cfg.step is not None else cfg.step_time_s
    workers = default_workers(cfg.num_workers)
    rec = det.recipe_of(cfg.recipe) if boxes else None
    if rec is not None:  # detection data, as make_detection_loader builds its batches
        stages, total, decoded = det.detection_serial(dataset, batch_size, cfg.batches, rec, dev)
    else:
        stages, total, decoded = _serial(dataset, batch_size, cfg.batches, cfg.crop, dev)
    loader, notes = _real_loader(dataset, batch_size, rec, cfg.crop, workers)
    cpu: dict[str, Any] = {}
    loader_s, wait = _loader_times(
        loader, cfg.batches, step_time_s, prefetched=2 * workers, step=cfg.step, cpu=cpu
    )
    core_s = None
    if "beside the step" in cpu:
        core_s = judge.CoreSeconds.of(cpu["beside the step"], cpu["beside batches"])
    worst = max(stages, key=lambda k: stages[k])
    notes += det.rejects_note(dataset) if boxes else []
    rate = batch_size / loader_s if loader_s > 0 else float("inf")
    fixes = det.FIXES if boxes else FIXES
    verdict, fix = _verdict(step_time_s, wait, core_s, fixes[worst], rate, workers, notes)
    notes += _fallback_note(decoded)
    n = batch_size * cfg.batches
    return DataReport(
        batch_size=batch_size,
        batches=cfg.batches,
        stages_s=stages,
        total_s=total,
        num_workers=workers,
        loader_batch_s=loader_s,
        wait_s=wait,
        step_time_s=step_time_s,
        verdict=verdict,
        fix=fix,
        notes=notes,
        decoded_mp_per_sample=decoded["px"] / n / 1e6 if decoded["images"] else None,
        window_decodes=decoded["window"],
        decode_fallbacks=decoded["fallback"],
        core_seconds=core_s.as_dict() if core_s is not None else None,
        cpu={k: u.as_dict() for k, u in cpu.items() if isinstance(u, CpuUse)},
        workers_cpu_s_per_batch=cpu["loader"].workers_cpu_s / cpu["loader batches"],
        shm=loader.shm.describe() if loader.shm is not None else None,
    )


def _step_alone(step: Any) -> float:
    """The step's own seconds per call, alone (after one untimed call): what the wait is judged against."""
    step()
    t0 = now_s()
    step()
    return now_s() - t0


def _real_loader(
    dataset: Any, batch_size: int, rec: Any, crop: int | None, workers: int
) -> tuple[Any, list[str]]:
    """The loader a user gets on ``dataset`` (``make_detection_loader``'s for detection data, ``rec`` its recipe,
    else ``make_loader``'s) and, as notes, what it said about fitting its batches to /dev/shm."""
    from pytorchtricks.analysis import data_doctor_detection as det
    from pytorchtricks.tricks.data.make_loader import make_loader

    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always", PttWarning)
        loader = (
            det.detection_loader(dataset, batch_size, rec, workers)
            if rec is not None
            else make_loader(dataset, batch_size, crop=crop, num_workers=workers, persistent_workers=False)
        )
    notes = [
        str(w.message) for w in said if issubclass(w.category, PttWarning) and "/dev/shm" in str(w.message)
    ]
    return loader, notes


def _verdict(
    step_time_s: float | None,
    wait: float | None,
    core_s: Any,
    worst_fix: str,
    images_per_s: float,
    workers: int,
    notes: list[str],
) -> tuple[str, str]:
    """(verdict, first fix) from the step's time and the wait beside it (``analysis.verdict``'s one judgement);
    ``worst_fix``: the fix of the slowest stage. An input-bound loader with fewer workers than cores adds a note."""
    if step_time_s is None:
        unknown = Spelt(
            "unknown: the loader gives {rate:.0f} images/s; pass {o} (your training step's seconds per batch) to "
            "compare",
            rate=images_per_s,
            o=Option("step_time_s", flag="--step-time"),
        )
        return unknown, worst_fix
    v = judge.judge(step_time_s + (wait or 0.0), wait or 0.0, core_seconds=core_s)
    if v.name == judge.INPUT_BOUND:
        cores = len(os.sched_getaffinity(0))
        if workers < cores:
            notes.append(
                Spelt(
                    "{o} < {n} cores: try more workers first",
                    n=cores,
                    o=Option("num_workers", workers, flag="--workers"),
                )
            )
        return (
            f"input-bound: the step waits {(wait or 0.0) * 1e3:.1f} ms per batch for data ({v.evidence})",
            worst_fix,
        )
    if v.name == judge.CPU_CONTENDED:
        return f"CPU-contended: {v.evidence}", v.fix
    return (
        f"compute-bound: the loader keeps up with the step ({v.evidence})",
        "nothing in the input pipeline; speed up the step itself",
    )


def _fallback_note(decoded: dict[str, Any]) -> list[str]:
    """A note on the JPEGs decoded whole rather than as the crop's window, by reason (none: no note)."""
    if not decoded["fallback"]:
        return []
    why = ", ".join(f"{k}: {v}" for k, v in sorted(decoded["fallback"].items()))
    return [
        f"{sum(decoded['fallback'].values())} of {decoded['images']} JPEGs were decoded whole, not as the "
        f"crop's window ({why}); re-encoding them as baseline 4:2:0/4:4:4 JPEGs (ptt pack --quality 90) "
        "lets the region-of-interest decode skip what the crop does not need"
    ]


def _opened(
    data: Any, cache_dir: Any, split: str | None, batch_size: int | None, batches: int, beside: bool
) -> tuple[Any, bool, int]:
    """(the dataset, whether it holds boxes, the batch size): ``data`` opened when it is a path, and checked to
    hold enough samples for the measurement (``beside``: one batch more, timed beside the step)."""
    from pytorchtricks.analysis.data_doctor_detection import BATCH_SIZE, holds_boxes

    path = isinstance(data, str | os.PathLike)
    dataset = open_image_dataset(data, cache_dir=cache_dir, split=split) if path else data
    boxes = holds_boxes(dataset)
    batch_size = batch_size or (BATCH_SIZE if boxes else 64)
    need = batch_size * (batches + (3 if beside else 2))
    if len(dataset) < need:
        raise PttError(
            Spelt(
                "need at least {need} samples for {batches} batches of {bs} (+2 warm-up{beside}); got {n}. Lower "
                "{o1} or {o2}.",
                need=need,
                batches=batches,
                bs=batch_size,
                n=len(dataset),
                beside=", +1 beside the step" if beside else "",
                o1=Option("batch_size"),
                o2=Option("batches"),
            )
        )
    return dataset, boxes, batch_size
