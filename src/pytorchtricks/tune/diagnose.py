"""The diagnosis phase of ``tune``: where the step time goes, what the model breaks, what memory holds.

Uses the analysis modules when this build has them (``ptt.lint``, ``ptt.memory_breakdown``, ``ptt.doctor_data``)
and otherwise does the core job itself with the measuring engine: ``Stopwatch`` for the step-time split,
``SavedTensorMeter`` for activation bytes, ``peak_memory`` for the step's peak.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from pytorchtricks.analysis.lint_rules import Finding
from pytorchtricks.analysis.profile import bf16_native  # one definition, shared with ptt profile's tips
from pytorchtricks.bench.alloc_events import quiet_peak_memory
from pytorchtricks.clock import SavedTensorMeter, Stopwatch
from pytorchtricks.quiet import filtered_stderr
from pytorchtricks.tune.runner import Runner
from pytorchtricks.tune.workload import Workload, pil_mode

INPUT_BOUND_SHARE = 0.30  # data wait above this share of the step: the loop waits for data


@dataclass
class Diagnosis:
    split_s: dict[str, float]  # seconds per step, per stage
    step_s: float
    verdict: str  # "input-bound" or "compute-bound"
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


def oversubscribed() -> str | None:
    """A message when other processes keep the CPU busy while OpenMP threads spin-wait (None otherwise).

    With more runnable processes than cores, torch's OpenMP threads spin waiting for each other and a step can
    run 10x slower (measured on a shared 2-core machine: ResNet-18 step 10 s vs 0.8 s with passive waiting).
    """
    try:
        load = os.getloadavg()[0]
    except OSError:
        return None
    cores = os.cpu_count() or 1
    if load <= cores or os.environ.get("OMP_WAIT_POLICY", "").upper() == "PASSIVE":
        return None
    return (
        f"load average {load:.1f} on {cores} cores: OpenMP threads spin-wait while other processes run, which can "
        "slow steps many-fold and makes every ratio noisy"
    )


def conv_bn_pairs(model: nn.Module) -> tuple[list[str], int]:
    """Conv layers feeding straight into a BatchNorm: (names of those that carry a bias, number of pairs), from
    the one graph-query module (``tricks._graph.conv_bn_links``: torch.fx, piece by piece where the whole does not
    trace)."""
    from pytorchtricks.tricks._graph import conv_bn_links

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


def _staged_step_s(w: Workload, steps: int) -> float | None:
    """Seconds of the same step with two batches staged in memory: what the step costs with no loader running."""
    from pytorchtricks.clock import time_call
    from pytorchtricks.tune.runner import stage_batches

    if w.data_kind == "synthetic" and w.num_workers == 0:
        return None
    r = Runner(w, (), batches=stage_batches(w, 2))
    try:
        r.step()
        return min(time_call(r.step, w.device)[1] for _ in range(max(1, min(steps, 3))))
    finally:
        r.close()


def step_split(runner: Runner, steps: int, warmup: int = 2) -> tuple[dict[str, float], float]:
    """Mean seconds per step in each stage over ``steps`` steps (after ``warmup``), and the mean step time."""
    for _ in range(warmup):
        runner.step()
    sw = Stopwatch(runner.w.device)
    for _ in range(steps):
        runner.step(sw)
    split = {k: v / steps for k, v in sw.totals_s.items()}
    return split, sum(split.values())


def memory_facts(runner: Runner, *, peak: bool = True) -> dict[str, Any]:
    """Bytes of parameters, gradients, optimizer state, saved activations and the measured peak of one step."""
    model = runner.model
    x, y = runner.w.example_batch()
    xd, yd = runner.prepare(x), y.to(runner.w.device)
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    out: dict[str, Any] = {"params_bytes": params}
    if runner.train:
        with SavedTensorMeter() as meter:
            _, loss = runner.loss_of(xd, yd)
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


def diagnose(w: Workload, *, budget_s: float = 30.0) -> Diagnosis:
    """Run the diagnosis on a fresh baseline configuration of ``w``, in about ``budget_s`` seconds.

    One warm-up step sizes the rest: up to 4 timed steps for the split, and the profiled peak-memory step only
    when it fits.
    """
    from pytorchtricks.clock import time_call

    notes: list[str] = []
    runner = Runner(w, ())
    try:
        runner.step()  # first call pays lazy init
        _, t0 = time_call(runner.step, w.device)
        steps = max(1, min(4, int(0.4 * budget_s / max(t0, 1e-6))))
        split, step_s = step_split(runner, steps, warmup=0)
        compute_alone_s = _staged_step_s(w, steps)
        memory = memory_facts(runner, peak=(steps + 4) * t0 < budget_s)
        if "step_peak_bytes" not in memory:
            notes.append(
                "the step's peak memory was not profiled in the diagnosis: the time budget was too short"
            )
        model = runner.model
        example = runner.prepare(w.example_batch(min(w.batch_size, 4))[0])
        bias_pairs, n_pairs = conv_bn_pairs(w.model_factory())
        has_conv2d = any(isinstance(m, nn.Conv2d) for m in model.modules())
        lint_found, lint_note = _lint_findings(w.model_factory(), example, w)
    finally:
        runner.close()
    if lint_note:
        notes.append(lint_note)
    from pytorchtricks.analysis.memory import memory_breakdown as breakdown

    if w.for_ == "train":
        try:  # per-module saved bytes from the analysis module (our own totals above stay the measured ones)
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
    findings = list(lint_found)
    if bias_pairs and not any(f.id == "PTL001" for f in findings):
        findings.append(
            Finding(
                "PTL001",
                "conv-bias-before-bn",
                ", ".join(bias_pairs[:4]) + (" ..." if len(bias_pairs) > 4 else ""),
                f"{len(bias_pairs)} conv layer(s) with a bias feed a BatchNorm, which subtracts it again",
                "a bias add per output element, undone by the BatchNorm",
                "ptt.remove_conv_bias_before_bn_(model)",
                source="tune",
            )
        )
    busy = oversubscribed()
    if busy:
        findings.append(
            Finding(
                "PTD004",
                "cpu-oversubscribed",
                "machine",
                busy,
                "noisy, slower steps",
                "OMP_WAIT_POLICY=PASSIVE ptt tune ... (set before Python starts)",
                source="tune",
            )
        )
    native = bf16_native(w.device)
    if native and w.device.type == "cpu":
        findings.append(
            Finding(
                "PTD003",
                "fp32-on-bf16-cpu",
                "model",
                "the step runs in fp32 on a CPU with native bf16 (avx512_bf16/AMX)",
                "the bf16 kernels this CPU has are left unused",
                'ptt.mixed_precision("cpu", dtype="bf16")',
                source="tune",
            )
        )
    wait_share = split.get("data wait", 0.0) / step_s if step_s > 0 else 0.0
    taken = max(0.0, 1 - compute_alone_s / step_s) if step_s > 0 and compute_alone_s else 0.0
    share = max(wait_share, taken)
    verdict = "input-bound" if share >= INPUT_BOUND_SHARE else "compute-bound"
    if verdict == "input-bound":
        findings.append(
            Finding(
                "PTD001",
                "input-bound",
                f"DataLoader(num_workers={w.num_workers})",
                f"the input pipeline costs {share:.0%} of the step ({step_s:.2f} s with the loader vs "
                f"{compute_alone_s:.2f} s with the batches staged; {wait_share:.0%} spent waiting for data, the rest "
                "the decoding workers taking cores from the training threads), loaded "
                + ("in the training process" if w.num_workers == 0 else f"by {w.num_workers} worker(s)"),
                f"{share:.0%} of every step",
                "decode less per step: ptt.make_loader (crop-aware decode), ptt.cache_in_ram or ptt pack; "
                "tune measures each below",
            )
        )
    if w.batch_size % 8 and not any(f.id == "PTL003" for f in findings):
        findings.append(
            Finding(
                "PTL003",
                "batch-not-multiple-of-8",
                "batch size",
                f"batch size {w.batch_size}",
                "kernels tile in multiples of 8",
                "use a multiple of 8",
                source="tune",
            )
        )
    stages = data_stages(w)
    compute_s = max(step_s - split.get("data wait", 0.0), 1e-4)
    doctor, why = run_data_doctor(w, compute_s, split.get("data wait", 0.0), 0.6 * budget_s)
    if doctor is None:
        notes.append(f"data doctor not run: {why}")
    elif doctor["verdict"].startswith("input-bound"):
        findings.append(
            Finding(
                "PTD002",
                "input-bound-even-with-make-loader",
                f"ptt.make_loader(num_workers={doctor['num_workers']})",
                f"even the fast loader keeps the step waiting ({doctor['verdict']})",
                "the step waits for data",
                doctor["fix"],
                source="ptt.doctor_data",
            )
        )
    return Diagnosis(
        split_s=split,
        step_s=step_s,
        verdict=verdict,
        input_share=share,
        compute_alone_s=compute_alone_s,
        findings=findings,
        memory=memory,
        data_stages_s=stages,
        conv_bias_pairs=bias_pairs,
        conv_bn_pairs=n_pairs,
        has_conv2d=has_conv2d,
        bf16_native=native,
        notes=notes,
        data_doctor=doctor,
    )
