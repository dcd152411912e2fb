"""The diagnosis phase of ``tune``: where the step time goes, what the model breaks, what memory holds.

Uses the analysis modules when this build has them (``ptt.lint``, ``ptt.memory_breakdown``, ``ptt.doctor_data``)
and otherwise does the core job itself with the measuring engine: ``Stopwatch`` for the step-time split,
``SavedTensorMeter`` for activation bytes, ``peak_memory`` for the step's peak.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from pytorchtricks.analysis import verdict as judge
from pytorchtricks.analysis.lint_rules import Finding
from pytorchtricks.analysis.profile import bf16_native  # one definition, shared with ptt profile's tips
from pytorchtricks.bench.alloc_events import quiet_peak_memory
from pytorchtricks.clock import CpuMeter, CpuUse, SavedTensorMeter, Stopwatch, quantiles
from pytorchtricks.core import PttError
from pytorchtricks.quiet import filtered_stderr
from pytorchtricks.tune.runner import Runner
from pytorchtricks.tune.workload import Workload, pil_mode

# a staged step whose own loader workers used more than this share of one core while it was timed was not alone
WORKERS_ALIVE_CORES = 0.05
ALONE_WINDOW_S = (
    0.5  # the staged step is timed for at least this long: 50 of the kernel's 10 ms CPU-time ticks
)
# compute alone may come out this much above the whole step it is part of before the pair counts as inconsistent:
# the timer's own spread on a quiet machine (a step's IQR is a few percent)
ALONE_ABOVE_WHOLE = 1.10
# the stages of a step (data wait, host->device, forward, backward, optimizer) cover it but for the loop's own
# Python between them (microseconds): below this share of the wall time, the split does not add up
SPLIT_COVERS = 0.90
LOOK_S = 1.0  # the shortest window the machine's load is judged on (a neighbour's burst is tens of ms)


@dataclass
class Diagnosis:
    split_s: dict[str, float]  # seconds per step, per stage
    step_s: float
    verdict: str  # analysis.verdict: "input-bound", "CPU-contended" or "compute-bound"
    findings: list[Finding]
    memory: dict[str, Any]
    data_stages_s: dict[str, float]  # seconds per sample, per pipeline stage
    conv_bias_pairs: list[str]
    conv_bn_pairs: int
    has_conv2d: bool
    bf16_native: bool
    # the share of the step the input pipeline costs: waiting for data, or (on a CPU) the cores its workers take
    # from the step - 1 - (step with data staged) / (step with the loader), whichever is larger
    input_share: float = 0.0
    compute_alone_s: float | None = None  # the step with its batches staged in memory (no loader running)
    notes: list[str] = field(default_factory=list)
    # ptt.doctor_data on the workload's files: what ptt.make_loader would deliver there (None: not run)
    data_doctor: dict[str, Any] | None = None
    evidence: str = ""  # the verdict's measured evidence (analysis.verdict)
    # CPU-seconds per whole step of the training process and of its loader workers (analysis.verdict.CoreSeconds)
    core_seconds: dict[str, Any] | None = None
    # who used the CPU while each part of the diagnosis was measured (clock.CpuUse.as_dict(), by part)
    cpu: dict[str, Any] = field(default_factory=dict)
    # why the diagnosis's figures are not to be trusted (a busy machine, figures that contradict each other)
    unreliable: list[str] = field(default_factory=list)
    remeasured: list[str] = field(default_factory=list)  # what was measured again, and why
    busy: str | None = None  # analysis.verdict.machine_busy while the diagnosis measured (None: quiet enough)
    # detection: the reference pipeline's and our loader's own rates, each alone (tune.detection.loader_rates)
    loader_rates: dict[str, dict[str, float]] = field(default_factory=dict)
    step_q1_s: float | None = None  # the spread of the whole step over the split's steps
    step_q3_s: float | None = None

    @property
    def certain(self) -> bool:
        return not self.unreliable

    @property
    def loader_can_help(self) -> bool:
        """A loader that spends fewer CPU-seconds per sample may speed this step up (or the figures cannot
        rule it out)."""
        return self.verdict in judge.LOADER_CAN_HELP or not self.certain


def conv_bn_pairs(model: nn.Module) -> tuple[list[str], int]:
    """Conv layers feeding straight into a BatchNorm: (names of those that carry a bias, number of pairs), from
    the one graph-query module (``tricks.graph.conv_bn_links``: torch.fx, piece by piece where the whole does not
    trace)."""
    from pytorchtricks.tricks.graph import conv_bn_links

    links = conv_bn_links(model)
    return [lk.first_name for lk in links if getattr(lk.first, "bias", None) is not None], len(links)


def data_stages(w: Workload, n: int = 24) -> dict[str, float]:
    """Seconds per sample in each stage of the user's pipeline (PIL: read, decode, RandomResizedCrop + flip,
    ToTensor + Normalize), measured in-process on the first ``n`` samples; synthetic data: generation."""
    from PIL import Image
    from torchvision import transforms as tf

    sw = Stopwatch()
    n = min(n, len(w.dataset))
    items = []
    if w.files is not None:
        import io

        size = (w.input_size, w.width or w.input_size)
        crop, to_tensor = tf.Compose([tf.RandomResizedCrop(size), tf.RandomHorizontalFlip()]), tf.ToTensor()
        norm = tf.Normalize([0.5] * w.channels, [0.25] * w.channels)
        for i in range(n):
            with sw.stage("read file"), open(w.files[i], "rb") as fh:
                raw = fh.read()
            with sw.stage("decode"):
                im: Any = Image.open(io.BytesIO(raw)).convert(pil_mode(w.channels))
            with sw.stage("resize"):
                im = crop(im)
            with sw.stage("to tensor"):
                items.append(norm(to_tensor(im)))
    else:
        for i in range(n):
            with sw.stage("generate"):
                items.append(w.dataset[i][0])
    with sw.stage("collate"):
        torch.stack(items)
    return {k: v / n for k, v in sw.totals_s.items()}


def run_data_doctor(w: Workload, compute_s: float, data_s: float, budget_s: float) -> tuple[dict | None, str]:
    """``ptt.doctor_data`` on the workload's files with ``ptt.make_loader`` (crop to the input size, the tune's
    worker count), judged against the measured compute step: what the fast loader would do on this data.

    Returns (summary or None, why it was skipped). ``data_s`` (seconds per batch of the in-process loader) sizes
    the cost: about 6 batches of decoding plus worker start-up.
    """
    from pytorchtricks.analysis.data_doctor import doctor_data as doctor

    src = w.source
    if src is None:
        return None, "the data is generated in memory: no files to read or decode"
    if w.channels != 3 or w.width is not None:
        return None, (
            f"ptt.make_loader delivers square RGB crops; this workload takes {w.shape_text()} inputs"
        )
    if w.device.type != "cpu" and w.device.type != "cuda":
        return None, f"the data doctor measures host->device copies to CPU or CUDA, not {w.device.type}"
    batch = min(w.batch_size, len(w.dataset) // 8)  # type: ignore[arg-type]  # 2 timed + 2 warm-up + queue
    if batch < 1:
        return None, "too few samples for eight batches"
    if 6 * data_s * batch / w.batch_size + 2 * compute_s + 2.0 > budget_s:
        return None, f"skipped: it needs more than the {budget_s:.0f} s left for the diagnosis"
    runner = None
    if w.device.type == "cpu" and batch == w.batch_size:
        from pytorchtricks.tune.runner import stage_batches

        # the real step beside the loader: on a CPU its threads take cores from the decoding workers
        runner = Runner(w, (), batches=stage_batches(w, 2))
    try:
        r = doctor(
            src,
            batch_size=batch,
            crop=w.input_size,
            batches=2,
            num_workers=max(1, w.num_workers),
            step_time_s=None if runner is not None else compute_s * batch / w.batch_size,
            device=w.device,
            step=runner.step if runner is not None else None,
        )
    except Exception as exc:  # the diagnosis goes on without it, saying why
        return None, f"ptt.doctor_data failed ({type(exc).__name__}: {str(exc)[:160]})"
    finally:
        if runner is not None:
            runner.close()
    return {
        "batch_size": batch,
        "num_workers": r.num_workers,
        "stages_ms_per_batch": {k: v * 1e3 for k, v in r.stages_s.items()},
        "total_ms_per_batch": r.total_s * 1e3,
        "loader_images_per_s": r.loader_images_per_s,
        "wait_ms_per_batch": None if r.wait_s is None else r.wait_s * 1e3,
        "verdict": r.verdict,
        "fix": r.fix,
    }, ""


class WorkersAlive(PttError):
    """The compute step was timed while loader workers of ours were still running: the figure is refused."""


def _staged_step_s(w: Workload, steps: int) -> tuple[float | None, CpuUse | None]:
    """Seconds of the same step with two batches staged in memory: what the step costs with no loader running,
    and who used the CPU meanwhile. No loader process of ours may be alive then: the batches are read (and their
    loader shut down) first, and a timing during which descendants of this process still used CPU is refused
    (``WorkersAlive``) - see ``staged_alone``."""
    from pytorchtricks.clock import time_call
    from pytorchtricks.tune.runner import stage_batches

    if w.data_kind == "synthetic" and w.num_workers == 0:
        return None, None
    batches = stage_batches(w, 2)  # its loader (and workers) are closed when it returns
    r = Runner(w, (), batches=batches)
    try:
        r.step()
        times: list[float] = []
        with CpuMeter() as cm:  # at least ALONE_WINDOW_S of steps: the kernel counts CPU time in 10 ms ticks
            while len(times) < max(1, min(steps, 3)) or (sum(times) < ALONE_WINDOW_S and len(times) < 200):
                times.append(time_call(r.step, w.device)[1])
    finally:
        r.close()
    assert cm.result is not None
    staged_alone(cm.result)
    return min(times), cm.result


def staged_alone(use: CpuUse) -> None:
    """Raise ``WorkersAlive`` when processes of ours (loader workers) used CPU while the staged step was timed."""
    if use.wall_s > 0 and use.workers_cpu_s / use.wall_s > WORKERS_ALIVE_CORES:
        raise WorkersAlive(
            f"{use.workers} process(es) of this job used {use.workers_cpu_s:.2f} CPU-s while the compute step "
            f"was timed alone ({use.wall_s:.2f} s): a loader was still running, so the figure is refused"
        )


def step_split(
    runner: Runner, steps: int, warmup: int = 2, per_step: list[float] | None = None
) -> tuple[dict[str, float], float]:
    """Mean seconds per step in each stage over ``steps`` steps (after ``warmup``), and the mean step time;
    ``per_step`` (when given) receives each step's own seconds."""
    for _ in range(warmup):
        runner.step()
    sw = Stopwatch(runner.w.device)
    for _ in range(steps):
        before = sw.total_s
        runner.step(sw)
        if per_step is not None:
            per_step.append(sw.total_s - before)
    split = {k: v / steps for k, v in sw.totals_s.items()}
    return split, sum(split.values())


def inconsistencies(
    step_s: float,
    step_q1_s: float,
    step_q3_s: float,
    alone_s: float | None,
    wait_s: float,
    wall_s: float | None = None,
) -> list[str]:
    """What in the diagnosis's own figures contradicts itself, or is too noisy to decide on (empty: none).

    - compute alone above the whole step it is part of (beyond ``ALONE_ABOVE_WHOLE``): one of the two was timed
      on a machine doing something else;
    - a spread wider than the effect: the steps' own quartiles put the input pipeline's share on both sides of
      the input-bound threshold, so the verdict would depend on which step was timed;
    - a split that does not add up: the stages' seconds cover less than ``SPLIT_COVERS`` of the wall time the
      same steps took (``wall_s`` per step), so time went where no stage was timed."""
    out = []
    if wall_s is not None and wall_s > 0 and step_s < SPLIT_COVERS * wall_s:
        out.append(
            f"the step's stages add up to {step_s:.3f} s of the {wall_s:.3f} s each step took: "
            f"{1 - step_s / wall_s:.0%} of it was not in any stage"
        )
    if alone_s is not None and alone_s > ALONE_ABOVE_WHOLE * step_s:
        out.append(
            f"the compute step alone ({alone_s:.3f} s) was slower than the whole step it is part of "
            f"({step_s:.3f} s with the loader)"
        )
    t = judge.INPUT_BOUND_SHARE

    def share(x: float) -> float:
        return max(wait_s / x if x > 0 else 0.0, (1 - alone_s / x) if alone_s and x > 0 else 0.0)

    lo, hi = sorted((share(step_q1_s), share(step_q3_s)))
    if lo < t <= hi:
        out.append(
            f"the whole step's spread ({step_q1_s:.3f}-{step_q3_s:.3f} s) puts the input pipeline's share at "
            f"{lo:.0%}-{hi:.0%}, on both sides of the {t:.0%} that decides the verdict"
        )
    return out


def memory_facts(runner: Runner, *, peak: bool = True) -> dict[str, Any]:
    """Bytes of parameters, gradients, optimizer state, saved activations and the measured peak of one step."""
    model = runner.model
    if runner.w.task == "detection":  # a batch as the loader gives it: images and their boxes
        from pytorchtricks.tune.runner import stage_batches

        x, y = stage_batches(runner.w, 2)[0]
    else:
        x, y = runner.w.example_batch()
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    out: dict[str, Any] = {"params_bytes": params}
    if runner.train:
        with SavedTensorMeter() as meter:
            _, loss = runner.loss_on(x, y)
        loss.backward()
        out["activations_bytes"] = meter.saved_bytes
        out["grads_bytes"] = sum(
            p.grad.numel() * p.grad.element_size() for p in model.parameters() if p.grad is not None
        )
        runner.optimizer.step()
        state = runner.optimizer.state
        out["optimizer_bytes"] = sum(
            t.numel() * t.element_size()
            for s in state.values()
            for t in s.values()
            if isinstance(t, torch.Tensor)
        )
        runner.optimizer.zero_grad(set_to_none=True)
    if peak:
        res = quiet_peak_memory(runner.step, runner.w.device)
        out["step_peak_bytes"] = res.peak_bytes
        out["peak_method"] = res.method
    return out


def _lint_findings(model: nn.Module, example: torch.Tensor, w: Workload) -> tuple[list[Finding], str | None]:
    """``ptt.lint`` on a small probe batch of the workload's input shape, its findings stated for the workload's
    batch (``batch_size=``): the receipt describes the user's run, never the probe."""
    from pytorchtricks.analysis.lint import lint

    try:
        found = lint(model, (example,), phase=w.for_, batch_size=w.batch_size)
    except Exception as exc:  # a linter failure must not stop the tuning
        return [], f"ptt.lint failed ({type(exc).__name__}: {exc}); tune ran its own checks"
    out = list(found.findings)
    return out, None


def _whole(runner: Runner, steps: int) -> tuple[dict[str, float], float, list[float], CpuUse]:
    """The whole step (the loader beside it) over ``steps`` steps: split, mean, each step, who used the CPU."""
    per: list[float] = []
    with CpuMeter() as cm:
        split, step_s = step_split(runner, steps, warmup=0, per_step=per)
    assert cm.result is not None
    return split, step_s, per, cm.result


def _alone(w: Workload, steps: int, notes: list[str]) -> tuple[float | None, CpuUse | None]:
    """``_staged_step_s``, once more after a pause when our own loader workers were still running the first time
    (they finish the batches in hand before they exit); a second refusal leaves the figure out, said."""
    from pytorchtricks.clock import Deadline

    for attempt in range(2):
        try:
            return _staged_step_s(w, steps)
        except WorkersAlive as exc:
            if attempt:
                notes.append(f"compute alone not measured: {exc}")
                return None, None
            dl = Deadline(2.0)
            while not dl.expired:  # the workers' shutdown, not a fixed sleep: poll our children
                if not _children_alive():
                    break
    return None, None


def _look(seconds: float) -> CpuUse:
    """Who uses the CPU over ``seconds`` while this process waits."""
    import threading

    with CpuMeter() as cm:
        threading.Event().wait(seconds)
    assert cm.result is not None
    return cm.result


def _children_alive() -> bool:
    import psutil

    try:
        return any(c.status() != psutil.STATUS_ZOMBIE for c in psutil.Process().children(recursive=True))
    except psutil.Error:
        return False


def diagnose(w: Workload, *, budget_s: float = 30.0) -> Diagnosis:
    """Run the diagnosis on a fresh baseline configuration of ``w``, in about ``budget_s`` seconds.

    One warm-up step sizes the rest: up to 4 timed whole steps for the split (with the CPU-seconds of the training
    process and its loader workers), the compute step alone once the loader has shut down, and the profiled
    peak-memory step only when it fits. The figures check each other (``inconsistencies``): when they disagree the
    step is measured once more, and what still disagrees makes the diagnosis ``unreliable``, as does a machine
    other programs kept busy (``analysis.verdict.machine_busy``).

    In steps: the baseline's timing and the model's facts (``_first_look``), the figures checked and measured
    again (``_checked``), the machine's load (``_machine_load``), the verdict, the modules that hold memory
    (``_top_modules``), the findings in families (model, machine, compute, input, batch), then the data side
    (``_data_side``) and what the data doctor found.
    """
    notes: list[str] = []
    remeasured: list[str] = []
    threads = torch.get_num_threads()
    timing, facts = _first_look(w, budget_s, notes)
    timing, q1, q3, problems = _checked(w, timing, budget_s, notes, remeasured)
    cpu, busy = _machine_load(timing, threads)
    unreliable = list(problems)
    if busy:
        unreliable.append(f"the machine was busy while the diagnosis measured: {busy}")
    cs = judge.CoreSeconds.of(timing.whole_use, len(timing.per))
    v = judge.judge(timing.step_s, timing.wait_s, compute_alone_s=timing.alone_for_verdict, core_seconds=cs)
    if facts.lint_note:
        notes.append(facts.lint_note)
    _top_modules(w, facts.example, facts.memory, notes)
    native = bf16_native(w.device)
    findings = [
        *facts.lint_found,
        *_conv_bias_findings(facts),
        *_busy_findings(busy),
        *_oversubscribed_findings(w, timing, threads),
        *_bf16_findings(w, native),
        *_input_findings(w, v),
        *_batch_findings(w, facts.lint_found),
    ]
    stages, doctor, rates = _data_side(w, timing, budget_s, notes)
    findings += _doctor_findings(doctor)
    return Diagnosis(
        split_s=timing.split,
        step_s=timing.step_s,
        verdict=v.name,
        input_share=v.input_share,
        compute_alone_s=timing.compute_alone_s,
        evidence=v.evidence,
        core_seconds=cs.as_dict(),
        cpu={k: u.as_dict() for k, u in cpu.items()},
        unreliable=unreliable,
        remeasured=remeasured,
        busy=busy,
        step_q1_s=q1,
        step_q3_s=q3,
        findings=findings,
        memory=facts.memory,
        data_stages_s=stages,
        conv_bias_pairs=facts.bias_pairs,
        conv_bn_pairs=facts.n_pairs,
        has_conv2d=facts.has_conv2d,
        bf16_native=native,
        notes=notes,
        data_doctor=doctor,
        loader_rates=rates,
    )


@dataclass
class _Timing:
    """The whole step (the loader beside it) over ``steps`` steps and the compute step alone: what the verdict
    reads."""

    steps: int
    split: dict[str, float]
    step_s: float
    per: list[float]  # each whole step's own seconds
    whole_use: CpuUse
    compute_alone_s: float | None = None
    alone_use: CpuUse | None = None

    @property
    def wait_s(self) -> float:
        """Seconds per step the step waited for its input: the data wait and the host->device copy."""
        return self.split.get("data wait", 0.0) + self.split.get("host->device", 0.0)

    @property
    def alone_for_verdict(self) -> float | None:
        """Compute alone, unless still above the whole step: not a figure to conclude from."""
        if self.compute_alone_s is not None and self.compute_alone_s > ALONE_ABOVE_WHOLE * self.step_s:
            return None
        return self.compute_alone_s

    def check(self) -> tuple[float, float, list[str]]:
        """The whole step's quartiles and what in the figures contradicts itself (``inconsistencies``)."""
        q1, _, q3 = quantiles(self.per)
        wall_s = self.whole_use.wall_s / len(self.per)
        return q1, q3, inconsistencies(self.step_s, q1, q3, self.compute_alone_s, self.wait_s, wall_s)


@dataclass
class _Facts:
    """What the diagnosis learns of the model on the baseline runner: memory, Conv->BN pairs, lint."""

    memory: dict[str, Any]
    bias_pairs: list[str]
    n_pairs: int
    has_conv2d: bool
    example: Any  # the probe batch lint ran on (None: a detector, not linted here)
    lint_found: list[Finding]
    lint_note: str | None


def _first_look(w: Workload, budget_s: float, notes: list[str]) -> tuple[_Timing, _Facts]:
    """One baseline runner: the first step pays lazy init, a second sizes the timed whole steps (at most 4, in
    0.4 of the budget), then the model's facts (``_model_facts``). Its loader's workers end before it returns:
    compute alone is timed with none of ours running."""
    from pytorchtricks.clock import time_call

    runner = Runner(w, ())
    try:
        runner.step()  # first call pays lazy init
        _, t0 = time_call(runner.step, w.device)
        steps = max(1, min(4, int(0.4 * budget_s / max(t0, 1e-6))))
        timing = _Timing(steps, *_whole(runner, steps))
        facts = _model_facts(w, runner, peak=(steps + 4) * t0 < budget_s, notes=notes)
    finally:
        runner.close()  # the loader's workers end here: compute alone is timed with none of ours running
    return timing, facts


def _model_facts(w: Workload, runner: Runner, *, peak: bool, notes: list[str]) -> _Facts:
    """The step's memory (not measured here for a declared step; its peak only when ``peak``: the budget allows),
    the Conv->BN pairs, whether there is a Conv2d, and ``ptt.lint`` on a probe batch (not on a detector)."""
    if w.device_step_s is not None:  # the step runs on the accelerator: its memory is not this machine's
        memory = {"params_bytes": sum(p.numel() * p.element_size() for p in runner.model.parameters())}
        notes.append("the step is declared (--device-step-ms): its memory was not measured here")
    else:
        memory = memory_facts(runner, peak=peak)
    if "step_peak_bytes" not in memory and w.device_step_s is None:
        notes.append(
            "the step's peak memory was not profiled in the diagnosis: the time budget was too short"
        )
    bias_pairs, n_pairs = conv_bn_pairs(w.model_factory())
    has_conv2d = any(isinstance(m, nn.Conv2d) for m in runner.model.modules())
    if w.task == "detection":  # a list of images in, a dict of losses out: linted as the doctor does
        example: Any = None
        lint_found: list[Finding] = []
        lint_note: str | None = "ptt lint not run in tune on a detector (ptt doctor run lints it)"
    else:
        example = runner.prepare(w.example_batch(min(w.batch_size, 4))[0])
        lint_found, lint_note = _lint_findings(w.model_factory(), example, w)
    return _Facts(memory, bias_pairs, n_pairs, has_conv2d, example, lint_found, lint_note)


def _checked(
    w: Workload, timing: _Timing, budget_s: float, notes: list[str], remeasured: list[str]
) -> tuple[_Timing, float, float, list[str]]:
    """Compute alone (``_alone``), then the figures checked against each other (``_Timing.check``): when they
    disagree the step is measured once more, with twice the steps, before anything is concluded from them -
    unless that does not fit the budget (said in ``remeasured``). Returns the timing, its quartiles and what
    still disagrees."""
    timing.compute_alone_s, timing.alone_use = _alone(w, timing.steps, notes)
    q1, q3, problems = timing.check()
    step_s = timing.step_s
    again_s = (2 * timing.steps + 1) * step_s + (timing.steps + 1) * (timing.compute_alone_s or step_s)
    if problems and again_s > budget_s:
        remeasured.append(
            f"not measured again: it would take ~{again_s:.0f} s of the {budget_s:.0f} s the diagnosis has "
            f"({'; '.join(problems)})"
        )
    elif problems:
        remeasured.append("; ".join(problems))
        runner = Runner(w, ())
        try:
            runner.step()
            timing = _Timing(timing.steps, *_whole(runner, 2 * timing.steps))
        finally:
            runner.close()
        timing.compute_alone_s, timing.alone_use = _alone(w, timing.steps, notes)
        q1, q3, problems = timing.check()
    return timing, q1, q3, problems


def _machine_load(timing: _Timing, threads: int) -> tuple[dict[str, CpuUse], str | None]:
    """Who used the CPU while each part was measured, and ``analysis.verdict.machine_busy`` on all of it (a fast
    step's windows are too short to judge the load on: then the machine is watched for ``LOOK_S``)."""
    cpu = {"whole step": timing.whole_use}
    if timing.alone_use is not None:
        cpu["compute alone"] = timing.alone_use
    seen = CpuUse.added(list(cpu.values()))
    if seen is not None and seen.wall_s < LOOK_S:
        seen = _look(LOOK_S)
    return cpu, judge.machine_busy(seen, threads)


def _top_modules(w: Workload, example: Any, memory: dict[str, Any], notes: list[str]) -> None:
    """``memory["top_modules"]``: the five modules that save the most bytes for backward, from
    ``ptt.memory_breakdown`` on the probe batch scaled to the workload's (training a classifier on this machine
    only; a failure is a note). Our own totals in ``memory`` stay the measured ones."""
    from pytorchtricks.analysis.memory import memory_breakdown as breakdown

    if w.for_ == "train" and w.device_step_s is None and w.task == "classification":
        try:
            m = w.model_factory().to(w.device)
            opt = torch.optim.SGD(m.parameters(), lr=0.01, momentum=0.9)
            with filtered_stderr():  # its probe step is metered with torch.profiler: Kineto's lines dropped
                b = breakdown(m, example, opt, measure_peak=False)
            scale = w.batch_size / example.shape[0]  # probed on a small batch; saved bytes are linear in it
            memory["top_modules"] = [
                f"{path} ({kind}): {n * scale / 2**20:.1f} MiB at batch {w.batch_size}"
                for path, kind, n in b.per_module[:5]
            ]
        except Exception as exc:
            notes.append(f"ptt.memory_breakdown failed ({type(exc).__name__}: {str(exc)[:120]})")


def _conv_bias_findings(facts: _Facts) -> list[Finding]:
    """The model: PTL001 for conv biases a BatchNorm subtracts again, unless lint said so already."""
    pairs = facts.bias_pairs
    if not pairs or any(f.id == "PTL001" for f in facts.lint_found):
        return []
    return [
        Finding(
            "PTL001",
            "conv-bias-before-bn",
            ", ".join(pairs[:4]) + (" ..." if len(pairs) > 4 else ""),
            f"{len(pairs)} conv layer(s) with a bias feed a BatchNorm, which subtracts it again",
            "a bias add per output element, undone by the BatchNorm",
            "ptt.remove_conv_bias_before_bn_(model)",
            source="tune",
        )
    ]


def _busy_findings(busy: str | None) -> list[Finding]:
    """The machine: PTD004 when other programs kept it busy while the diagnosis measured."""
    if not busy:
        return []
    return [
        Finding(
            "PTD004",
            "machine-busy",
            "machine",
            busy,
            "steps slower and noisier than the job's own: ratios and the verdict are uncertain",
            "rerun when the machine is quiet; if it never is, OMP_WAIT_POLICY=PASSIVE ptt tune ... (set before "
            "Python starts) stops OpenMP threads spinning against the other programs",
            source="tune",
        )
    ]


def _oversubscribed_findings(w: Workload, timing: _Timing, threads: int) -> list[Finding]:
    """The machine: PTD005 when the training threads and the loader workers ask for more cores than the job has,
    with what it costs (the step beside its loader against the step alone)."""
    over = judge.oversubscription(threads, w.num_workers, timing.whole_use.cores)
    alone_s, step_s = timing.compute_alone_s, timing.step_s
    if not (over and alone_s):
        return []
    cost = max(0.0, 1 - alone_s / step_s)
    return [
        Finding(
            "PTD005",
            "cpu-oversubscribed",
            f"torch.set_num_threads({threads}) + DataLoader(num_workers={w.num_workers})",
            f"{over}; measured: the step takes {step_s:.2f} s beside its loader and {alone_s:.2f} s "
            f"alone ({cost:.0%} of it)",
            f"{cost:.0%} of every step",
            "spend fewer CPU-seconds per sample (ptt.cache_in_ram, ptt pack at the training size): tune "
            "measures each below",
            source="tune",
        )
    ]


def _bf16_findings(w: Workload, native: bool) -> list[Finding]:
    """Compute: PTD003 when the step runs in fp32 on a CPU with native bf16."""
    if not (native and w.device.type == "cpu"):
        return []
    return [
        Finding(
            "PTD003",
            "fp32-on-bf16-cpu",
            "model",
            "the step runs in fp32 on a CPU with native bf16 (avx512_bf16/AMX)",
            "the bf16 kernels this CPU has are left unused",
            'ptt.mixed_precision("cpu", dtype="bf16")',
            source="tune",
        )
    ]


def _input_findings(w: Workload, v: judge.Verdict) -> list[Finding]:
    """Input: PTD001 (input-bound) or PTD006 (CPU-contended) when a cheaper loader may speed the step up."""
    if not v.loader_can_help:
        return []
    return [
        Finding(
            "PTD001" if v.name == judge.INPUT_BOUND else "PTD006",
            v.name.lower(),
            f"DataLoader(num_workers={w.num_workers})",
            f"{v.evidence}; loaded "
            + ("in the training process" if w.num_workers == 0 else f"by {w.num_workers} worker(s)"),
            f"{v.input_share:.0%} of every step",
            v.fix + "; tune measures each below",
            source="tune",
        )
    ]


def _batch_findings(w: Workload, lint_found: list[Finding]) -> list[Finding]:
    """The batch: PTL003 for a batch size that is not a multiple of 8, unless lint said so already."""
    if not w.batch_size % 8 or any(f.id == "PTL003" for f in lint_found):
        return []
    return [
        Finding(
            "PTL003",
            "batch-not-multiple-of-8",
            "batch size",
            f"batch size {w.batch_size}",
            "kernels tile in multiples of 8",
            "use a multiple of 8",
            source="tune",
        )
    ]


def _data_side(
    w: Workload, timing: _Timing, budget_s: float, notes: list[str]
) -> tuple[dict[str, float], dict[str, Any] | None, dict[str, dict[str, float]]]:
    """The input pipeline itself: a classifier's per-stage seconds (``data_stages``) and ``ptt.doctor_data`` in
    0.6 of the budget; a detector's two loaders' own rates (``tune.detection.loader_rates``). What did not run
    is a note. Returns (stages, the doctor's summary or None, the loaders' rates)."""
    split = timing.split
    stages = data_stages(w) if w.task == "classification" else {}
    rates: dict[str, dict[str, float]] = {}
    compute_s = max(timing.step_s - split.get("data wait", 0.0), 1e-4)
    if w.task == "classification":
        doctor, why = run_data_doctor(w, compute_s, split.get("data wait", 0.0), 0.6 * budget_s)
    else:
        doctor = None
        why = (
            "tune measures the detection loaders' own rates below; `ptt doctor data ROOT` splits their batch"
        )
        from pytorchtricks.tune.detection import loader_rates

        try:  # the two loaders' own rates, side by side (no step beside them)
            rates = loader_rates(w)
        except Exception as exc:  # the diagnosis goes on without them, saying why
            notes.append(f"the detection loaders' own rates were not measured ({type(exc).__name__}: {exc})")
    if doctor is None:
        notes.append(f"data doctor not run: {why}")
    return stages, doctor, rates


def _doctor_findings(doctor: dict[str, Any] | None) -> list[Finding]:
    """Input: PTD002 when even ``ptt.make_loader`` keeps the step waiting (the data doctor's verdict)."""
    if doctor is None or not doctor["verdict"].startswith("input-bound"):
        return []
    return [
        Finding(
            "PTD002",
            "input-bound-even-with-make-loader",
            f"ptt.make_loader(num_workers={doctor['num_workers']})",
            f"even the fast loader keeps the step waiting ({doctor['verdict']})",
            "the step waits for data",
            doctor["fix"],
            source="ptt.doctor_data",
        )
    ]
