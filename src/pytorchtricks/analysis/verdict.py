"""The one verdict: a step split (and the CPU-seconds the job spent) -> input-bound / CPU-contended / compute-bound.

``ptt tune``, ``ptt doctor run``, ``ptt.watch``, ``ptt profile`` and ``ptt doctor data`` all judge a step here, so
they cannot disagree on the same job. The thresholds live in this module only, each with the reason for its value:

- ``INPUT_BOUND_SHARE`` (0.30): the loop waits for data in more than 30% of its step. Below that the wait is the
  loader's jitter around a step it mostly keeps up with (a queue that runs dry now and then); above it, even a
  perfect loader could at most speed the step by 1/(1-0.3) = 1.43x, a gain every tool here measures well outside
  its noise. The host->device copy counts as input when a caller times it apart (``ptt profile``).
- ``SATURATED`` (0.90): the job's processes (the training threads and the loader workers) used 90% or more of the
  core-seconds the cores it may run on supplied during the step: the kernel's scheduler can give neither side more,
  so every CPU-second the loader spends per batch is taken from the step. The 10% allowance is the scheduler's
  idle gaps between a worker's batches and the main thread's Python overhead, which is single-threaded.
- ``BUSY_CORES`` (0.10): another program held, on average, a tenth of a core the step's threads need. With
  OpenMP's spin-waiting barriers a thread that loses its core stalls the whole step, so such a neighbour slows the
  step by at least that tenth - twice the 5% margin ``ptt tune`` decides on - and by more when its load comes in
  bursts. Past it a measured ratio says more about the neighbour than about the trick.

A verdict is a value (``Verdict``) with its evidence and first fix; callers add their own refinements
(``ptt doctor run``'s optimizer-bound, ``ptt profile``'s sync-bound) on top of a compute-bound verdict.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pytorchtricks.clock import CpuUse

INPUT_BOUND_SHARE = 0.30
SATURATED = 0.90
BUSY_CORES = 0.10

INPUT_BOUND = "input-bound"
CPU_CONTENDED = "CPU-contended"
COMPUTE_BOUND = "compute-bound"
# the verdicts for which a loader that spends fewer CPU-seconds per sample (make_loader, a RAM cache, a pack) can
# speed the step up: waiting for data, or decoding on the cores the step needs
LOADER_CAN_HELP = (INPUT_BOUND, CPU_CONTENDED)

FIRST_FIX = {
    INPUT_BOUND: "decode less per step: ptt.make_loader (crop-aware scaled decode), ptt.cache_in_ram or ptt pack",
    CPU_CONTENDED: "spend fewer CPU-seconds per sample: ptt.cache_in_ram (decode once), ptt pack at the training "
    "size, or ptt.make_loader's crop-aware decode - fewer workers do not help, the work itself must shrink",
    COMPUTE_BOUND: "the model itself: ptt tune on it (precision, channels_last, compile), or ptt profile",
}


@dataclass(frozen=True)
class CoreSeconds:
    """CPU-seconds per step of the job's processes, and what the cores supplied in the same time."""

    main_s: float  # the training process, all threads
    workers_s: float  # its loader workers together
    cores: int
    step_s: float  # wall seconds of the step these were measured over

    @property
    def supplied_s(self) -> float:
        return self.cores * self.step_s

    @property
    def used_share(self) -> float:
        return (self.main_s + self.workers_s) / self.supplied_s if self.supplied_s > 0 else 0.0

    @property
    def saturated(self) -> bool:
        return self.used_share >= SATURATED

    @staticmethod
    def of(use: CpuUse, steps: int) -> CoreSeconds:
        """Per-step figures from the CPU accounting of ``steps`` steps."""
        n = max(1, steps)
        return CoreSeconds(use.main_cpu_s / n, use.workers_cpu_s / n, use.cores, use.wall_s / n)

    def text(self) -> str:
        return (
            f"per step the training process used {self.main_s:.2f} CPU-s and the loader workers "
            f"{self.workers_s:.2f} CPU-s, {self.used_share:.0%} of the {self.supplied_s:.2f} core-s that "
            f"{self.cores} core(s) supplied in the {self.step_s:.2f} s step"
        )

    def as_dict(self) -> dict[str, Any]:
        return {
            "main_cpu_s_per_step": round(self.main_s, 4),
            "workers_cpu_s_per_step": round(self.workers_s, 4),
            "cores": self.cores,
            "core_s_supplied_per_step": round(self.supplied_s, 4),
            "used_share": round(self.used_share, 3),
            "saturated": self.saturated,
        }


@dataclass(frozen=True)
class Verdict:
    name: str  # INPUT_BOUND, CPU_CONTENDED or COMPUTE_BOUND
    input_share: float  # the share of the step the input pipeline costs (waiting, or cores taken)
    wait_share: float  # the share spent waiting for the next batch
    evidence: str
    fix: str
    core_seconds: CoreSeconds | None = None
    notes: tuple[str, ...] = field(default=())

    @property
    def loader_can_help(self) -> bool:
        return self.name in LOADER_CAN_HELP


def judge(
    step_s: float,
    wait_s: float,
    *,
    compute_alone_s: float | None = None,
    core_seconds: CoreSeconds | None = None,
) -> Verdict:
    """The verdict on a step of ``step_s`` seconds that waited ``wait_s`` for its batch (host->device copies
    included when timed apart), with, where measured, the same step with its batches staged in memory
    (``compute_alone_s``: no loader running) and the job's CPU-seconds per step.

    - input-bound: the wait is ``INPUT_BOUND_SHARE`` or more of the step;
    - CPU-contended: the loop hardly waits, but the step with the loader beside it is ``INPUT_BOUND_SHARE`` slower
      than alone, or (not timed alone) the job saturated its cores and its workers took a share of them at least
      ``INPUT_BOUND_SHARE`` of the step's CPU-seconds: the loader's workers take the cores from the training
      threads (a CPU-only job);
    - compute-bound: neither.

    Example:
        >>> judge(1.0, 0.5).name, judge(1.0, 0.05).name
        ('input-bound', 'compute-bound')
        >>> judge(1.0, 0.05, compute_alone_s=0.5).name
        'CPU-contended'
    """
    wait = wait_s / step_s if step_s > 0 else 0.0
    taken = max(0.0, 1 - compute_alone_s / step_s) if compute_alone_s and step_s > 0 else 0.0
    cs = core_seconds
    worker_share = cs.workers_s / max(1e-9, cs.main_s + cs.workers_s) if cs is not None else 0.0
    notes: list[str] = []
    if cs is not None:
        notes.append(cs.text())
    if wait >= INPUT_BOUND_SHARE:
        name, share = INPUT_BOUND, max(wait, taken)
        evidence = f"the step waits {wait:.0%} of its {step_s:.2f} s for its next batch"
    elif taken >= INPUT_BOUND_SHARE or (
        cs is not None and cs.saturated and worker_share >= INPUT_BOUND_SHARE
    ):
        name = CPU_CONTENDED
        share = taken if compute_alone_s else worker_share
        alone = (
            f"the step takes {step_s:.2f} s beside its loader and {compute_alone_s:.2f} s alone ({taken:.0%} "
            "of it lost to the loader's workers)"
            if compute_alone_s
            else f"the loader's workers used {worker_share:.0%} of the job's CPU-seconds on saturated cores"
        )
        evidence = f"{alone}; it waits only {wait:.0%} for data"
    else:
        name, share = COMPUTE_BOUND, max(wait, taken)
        evidence = f"the input pipeline costs {share:.0%} of the {step_s:.2f} s step"
    if cs is not None:
        evidence += f"; {cs.text()}"
    return Verdict(name, share, wait, evidence, FIRST_FIX[name], cs, tuple(notes))


def threads_needed(threads: int, cores: int) -> int:
    """Cores the step's own threads need (one per OpenMP thread, at most the cores there are)."""
    return max(1, min(threads, cores))


def busy_intrusion(use: CpuUse, threads: int) -> float:
    """Cores other programs took from those the step's threads need, on average: their cores less the spare ones
    (the cores the job's threads leave free)."""
    spare = max(0, use.cores - threads_needed(threads, use.cores))
    return max(0.0, use.others_cores - spare)


def machine_busy(use: CpuUse | None, threads: int) -> str | None:
    """Why the figures of a phase measured with ``use`` cannot be trusted (None: the machine was quiet enough)."""
    if use is None:
        return None
    taken = busy_intrusion(use, threads)
    if taken <= BUSY_CORES:
        return None
    who = ", ".join(f"{t['name']} (pid {t['pid']}, {t['cpu_s']:.1f} CPU-s)" for t in use.top_others)
    stolen = use.steal_s / use.wall_s if use.wall_s > 0 else 0.0
    steal = f", {stolen:.0%} of a core stolen by the hypervisor" if stolen >= 0.01 else ""
    return (
        f"other processes took {use.busy_share:.0%} of the machine's {use.machine_cores} cores "
        f"({use.others_cores:.2f} cores on average over {use.wall_s:.0f} s{steal}), {taken:.2f} of them from the "
        f"{threads_needed(threads, use.cores)} the step's threads need"
        + (f"; the largest: {who}" if who else "")
    )


def oversubscription(threads: int, workers: int, cores: int) -> str | None:
    """A setting that asks for more cores than the job may use: the training threads plus the loader workers."""
    if threads + workers <= cores:
        return None
    return (
        f"{threads} training thread(s) + {workers} loader worker(s) on {cores} core(s): the workers and the "
        "training threads take turns on the same cores"
    )
