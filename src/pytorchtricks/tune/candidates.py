"""The tricks ``tune`` can try: the catalogue's trick modules that declare a ``TUNE`` hook, and their checks.

Nothing here names a trick. A candidate is a catalogue trick (``pack``), or one of its variants (``pack[resize]``),
with the hook that says when it applies, what it changes and how it is checked (``pytorchtricks.tunable``).
``why_not`` says why a candidate cannot help on this workload; ``check`` proves a configuration keeps the results
right: ``exact`` tricks by output, gradient and updated-parameter equality on the same batch, ``approximate`` ones
by loss parity over a few training steps and the SQNR of the outputs, ``data`` ones by ``tune.datacheck``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from pytorchtricks.core import MissingExtraError, require
from pytorchtricks.tunable import TuneFacts, TuneSkip
from pytorchtricks.tune.hooks import Candidate, by_name, with_requirements
from pytorchtricks.tune.runner import Runner
from pytorchtricks.tune.workload import Workload

EXACT_REL_TOL = 5e-3  # max |a-b| / max |a|: fp32 reassociation (other kernels or layouts, through a deep net
# with train-mode BN) stays near 1e-3 on a ResNet-18; a real bug gives O(1)
LOSS_REL_TOL = 0.05  # approximate tricks: every loss of the first steps within 5% of fp32
MIN_SQNR_DB = 20.0  # approximate tricks: outputs at least 20 dB above the error (bf16 typically gives 30-45)
PARITY_STEPS = 3
# K micro-batches vs the batch at once: the same sums in another order. Compared in float64, where that order costs
# ~1e-15 (in fp32 it moved a small model's update by 1.4e-5 of its largest entry, a ResNet-18's by 5e-6): the bound
# is the 1e-5 relative; a real bug (a micro-batch mean not weighted, K optimizer steps) is off by O(1).
# BatchNorm layers are in eval mode for it: in train mode their statistics per micro-batch are a real difference,
# measured in fp32 (as the step runs) and named
UPDATE_REL_TOL = 1e-5
EXTRAS = {"data": "PIL", "infer": "torchao"}  # a module each extra brings, to tell whether it is installed


def why_not(c: Candidate, facts: TuneFacts) -> str | None:
    """Why ``c`` cannot help on this workload, or None when it is worth measuring."""
    if facts.phase not in c.phases:
        return (
            "applies to "
            + " and ".join("training" if p == "train" else "inference" for p in c.phases)
            + " only"
        )
    if "speed" not in c.gains and not facts.memory_search:
        return "saves memory, not time: tried when memory is the goal (--memory-budget SIZE or --goal memory)"
    if facts.task not in c.hook.tasks:
        return (
            f"not measured on {facts.task} workloads yet (it serves {' and '.join(c.hook.tasks)}): its hook "
            "builds and checks a classification step"
        )
    if facts.declared_step_s is not None and c.scope != "step":
        return (
            f"the step is declared ({facts.declared_step_s * 1e3:g} ms on the accelerator, --device-step-ms): "
            "tune projects the loaders against it; a model trick changes the accelerator's own step, which "
            "this machine cannot time - run ptt tune on the GPU machine for those"
        )
    for need in c.needs:
        if need == "cuda" and facts.device != "cuda":
            return "needs a CUDA GPU; this run is on the CPU"
        if need in EXTRAS:
            try:
                require(EXTRAS[need], need)
            except MissingExtraError:
                return f"not available in this build (pip install 'pytorchtricks[{need}]')"
    return c.hook.applies(facts)


# ----------------------------------------------------------------------------------------------- checks


@dataclass
class Check:
    kind: str
    passed: bool
    detail: str
    metrics: dict[str, float]


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.detach().float().cpu(), b.detach().float().cpu()
    scale = float(a.abs().max()) if a.numel() else 0.0
    return float((a - b).abs().max()) / max(scale, 1e-12) if a.numel() else 0.0


def _rel_all(a: list[Any], b: list[Any]) -> float:
    if not a:
        return 0.0
    scale = max(float(t.detach().abs().max()) for t in a)
    diff = max(float((x.detach().float() - y.detach().float()).abs().max()) for x, y in zip(a, b))
    return diff / max(scale, 1e-12)


def sqnr_db(ref: torch.Tensor, test: torch.Tensor) -> float:
    """Signal-to-quantization-noise ratio of ``test`` against ``ref`` in dB (inf when equal)."""
    ref, test = ref.detach().float().cpu(), test.detach().float().cpu()
    noise = float((ref - test).pow(2).sum())
    return math.inf if noise == 0 else 10 * math.log10(float(ref.pow(2).sum()) / noise)


def _opt_step(r: Runner, loss: torch.Tensor | None = None) -> None:
    if loss is not None:
        r.optimizer.zero_grad(set_to_none=True)
        r.mp.backward(loss) if r.mp is not None else loss.backward()
    r.mp.step(r.optimizer) if r.mp is not None else r.optimizer.step()


def _loss(r: Runner, x: Any, y: Any, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(outputs, loss) of ``r`` on the batch, with the random stream seeded: a detector samples anchors and
    proposals at random in its training forward, and the two sides of a check must sample the same ones."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return r.loss_on(x, y)


def _check_batch(w: Workload, samples: int) -> tuple[Any, Any]:
    """The batch a model check runs on: the evaluation geometry's first samples, or (detection) the first batch
    the user's pipeline reads."""
    if w.task == "detection":
        from pytorchtricks.tune.runner import stage_batches

        return stage_batches(w, 1)[0]
    return w.example_batch(min(w.batch_size, samples))


def _exact(
    w: Workload, tricks: tuple[str, ...], x: torch.Tensor, y: torch.Tensor, fp64: bool = False
) -> Check:
    base, trt = Runner(w, (), loader=False), Runner(w, tricks, loader=False)
    try:
        for r in (base, trt) if fp64 else ():
            r.to_float64()
        if not base.train:
            with torch.no_grad():
                rel = _rel(base.forward(base.prepare(x)), trt.forward(trt.prepare(x)))
            return Check(
                "exact: outputs", rel <= EXACT_REL_TOL, f"max rel. output diff {rel:.1e}", {"out_rel": rel}
            )
        metrics: dict[str, float] = {}
        out_b, loss_b = _loss(base, x, y, 0)
        out_t, loss_t = _loss(trt, x, y, 0)
        metrics["out_rel"] = _rel(out_b, out_t)
        loss_b.backward()
        loss_t.backward()
        pb, pt = dict(base.model.named_parameters()), dict(trt.model.named_parameters())
        common = [k for k in pb if k in pt and pb[k].grad is not None and pt[k].grad is not None]
        # relative to the largest gradient of the model: a conv bias before BN has a ~0 gradient of its own
        metrics["grad_rel"] = _rel_all([pb[k].grad for k in common], [pt[k].grad for k in common])
        _opt_step(base)
        _opt_step(trt)
        metrics["param_rel"] = _rel_all([pb[k] for k in common], [pt[k] for k in common])
        worst = max(metrics.values())
        return Check(
            "exact: outputs, grads, updated params" + (" (float64)" if fp64 else ""),
            worst <= EXACT_REL_TOL,
            f"max rel. diff out {metrics['out_rel']:.1e}, grad {metrics['grad_rel']:.1e}, "
            f"params after a step {metrics['param_rel']:.1e} ({len(common)} tensors)",
            metrics,
        )
    finally:
        base.close()
        trt.close()


def _exact_detector(w: Workload, tricks: tuple[str, ...], x: Any, y: Any) -> Check:
    """``_exact`` on a detector, again in float64 when fp32 differs: its step picks proposals by score (top-k,
    NMS) and samples them, so a rounding-level difference in a score can swap a proposal and move the gradient of
    the heads far more than the rounding itself (measured: channels_last on the 320 px detector, outputs within
    1.2e-6 and gradients 0.17 apart in fp32). In float64 the rounding is ~1e-16 and the same proposals are
    picked: the trick's math is what is compared."""
    fp32 = _exact(w, tricks, x, y)
    if fp32.passed:
        return fp32
    fp64 = _exact(w, tricks, x, y, fp64=True)
    return Check(
        fp64.kind,
        fp64.passed,
        f"{fp64.detail}; in fp32 {fp32.detail} (a detector's proposal selection amplifies rounding)",
        {**fp64.metrics, **{f"fp32_{k}": v for k, v in fp32.metrics.items()}},
    )


def _batchnorms(model: Any) -> list[Any]:
    return [m for m in model.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]


def _update_rel(
    w: Workload, tricks: tuple[str, ...], x: torch.Tensor, y: torch.Tensor, *, bn_eval: bool, fp64: bool
) -> tuple[float, int, int]:
    """(max rel. diff of the update of ``tricks`` vs the untreated step's on the same batch, the micro-batches
    of ``tricks``, its BatchNorm layers)."""
    base, trt = Runner(w, (), loader=False), Runner(w, tricks, loader=False)
    try:
        bns = len(_batchnorms(trt.model))
        for r in (base, trt):
            if fp64:
                r.to_float64()
            for m in _batchnorms(r.model) if bn_eval else []:
                m.eval()
        ub, ut = base.update_on(x, y), trt.update_on(x, y)
        keys = [k for k in ub if k in ut]
        return _rel_all([ub[k] for k in keys], [ut[k] for k in keys]), trt.micro_batches, bns
    finally:
        base.close()
        trt.close()


def _exact_update(w: Workload, tricks: tuple[str, ...], x: torch.Tensor, y: torch.Tensor) -> Check:
    """A configuration that changes the step (K micro-batches): its update on ``x`` equals the untreated step's
    on the whole batch, compared in float64 (BatchNorm in eval mode); in train mode BatchNorm's per-micro-batch
    statistics differ, and that difference, measured in fp32, is reported."""
    rel, k, bns = _update_rel(w, tricks, x, y, bn_eval=True, fp64=True)
    metrics = {"update_rel": rel}
    detail = (
        f"update of {k} micro-batches vs the batch of {len(x)} at once, in float64: max rel. diff {rel:.1e} "
        f"(bound {UPDATE_REL_TOL:.0e})"
    )
    if bns:
        metrics["update_rel_bn_train"] = _update_rel(w, tricks, x, y, bn_eval=False, fp64=False)[0]
        detail += (
            f", the {bns} BatchNorm layers in eval mode; in train mode they normalise each micro-batch of "
            f"{-(-len(x) // k)} by its own statistics (the one known difference): {metrics['update_rel_bn_train']:.1e} "
            "(fp32)"
        )
    return Check("exact: update vs the whole batch", rel <= UPDATE_REL_TOL, detail, metrics)


def _detection_update(w: Workload, tricks: tuple[str, ...], x: Any, y: Any) -> Check:
    """A detector's step in K micro-batches against the whole batch's: not equal by construction - torchvision's
    detectors sample anchors and proposals, normalise their losses and pad their images per batch (and a trainable
    BatchNorm sees micro-batches) - so the difference of the update is measured (fp32, the random stream seeded
    alike on both sides) and said with the configuration (``update_rel_detection``); what must hold is a finite
    update of every parameter the whole batch updates."""
    base, trt = Runner(w, (), loader=False), Runner(w, tricks, loader=False)
    try:
        updates = []
        for r in (base, trt):
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(0)
                updates.append(r.update_on(x, y))
        ub, ut = updates
        keys = [k for k in ub if k in ut]
        rel = _rel_all([ub[k] for k in keys], [ut[k] for k in keys])
        moved = [k for k in keys if bool(ub[k].any())]
        ok = all(bool(torch.isfinite(ut[k]).all()) for k in keys) and all(bool(ut[k].any()) for k in moved)
        return Check(
            "a detector's update vs the whole batch",
            ok,
            f"update of {trt.micro_batches} micro-batches vs the batch of {len(x)} at once: max rel. diff {rel:.1e} "
            "(a detector samples, normalises its losses and pads per batch: not the whole batch's update)",
            {"update_rel_detection": rel},
        )
    finally:
        base.close()
        trt.close()


def _approx(w: Workload, tricks: tuple[str, ...], x: torch.Tensor, y: torch.Tensor) -> Check:
    base, trt = Runner(w, (), loader=False), Runner(w, tricks, loader=False)
    try:
        if not base.train:
            with torch.inference_mode():
                ref = base.forward(base.prepare(x))
                with trt.autocast():
                    got = trt.forward(trt.prepare(x))
            s = sqnr_db(ref, got)
            return Check("approximate: SQNR of outputs", s >= MIN_SQNR_DB, f"SQNR {s:.1f} dB", {"sqnr_db": s})
        losses: dict[str, list[float]] = {"base": [], "trt": []}
        s = math.inf
        for i in range(PARITY_STEPS):
            for key, r in (("base", base), ("trt", trt)):
                out, loss = _loss(r, x, y, i)
                if key == "base":
                    ref = out.detach()
                elif i == 0:
                    s = sqnr_db(ref, out)
                losses[key].append(loss.detach().item())
                _opt_step(r, loss)
        # relative to the first fp32 loss: after a few steps on one batch the loss can be near 0
        rel = max(abs(a - b) for a, b in zip(losses["base"], losses["trt"])) / max(
            abs(losses["base"][0]), 1e-12
        )
        finite = all(math.isfinite(v) for v in losses["trt"])
        ok = finite and rel <= LOSS_REL_TOL and s >= MIN_SQNR_DB
        return Check(
            f"approximate: loss parity over {PARITY_STEPS} steps + SQNR",
            ok,
            f"max rel. loss diff {rel:.1e} (fp32 {losses['base'][-1]:.3f} vs {losses['trt'][-1]:.3f}), "
            f"output SQNR {s:.1f} dB",
            {"loss_rel": rel, "sqnr_db": s},
        )
    finally:
        base.close()
        trt.close()


def _data(w: Workload, tricks: tuple[str, ...]) -> Check:
    from pytorchtricks.tune.datacheck import check_data, check_device_data

    r = Runner(w, tricks, loader=False)
    try:
        s = r.setup
        if w.task == "detection":
            from pytorchtricks.tune.detection import check_loader

            got = check_loader(
                s.dataset, w.input_size, w.max_size or 1333, s.loader_kwargs,
                reference=None if s.dataset is w.dataset else w.dataset,  # a pack: against what it was made of
            )  # fmt: skip
        elif s.loader == "device":  # resident on the device: its own batching, checked the same way
            side = int(s.dataset.images.shape[-1])
            got = check_device_data(s.dataset, w.labels, w.files, size=w.input_size, side=side)
        else:
            got = check_data(
                s.dataset,
                w.labels,
                w.files,
                batch_size=w.batch_size,
                size=w.input_size,
                loader_kwargs=s.loader_kwargs,
            )
    finally:
        r.close()
    metrics = {"psnr_db": got.psnr_db} if got.psnr_db is not None else {}
    if got.sample_s is not None:
        metrics["loader_sample_s"] = got.sample_s
    return Check("data: every sample once, labels, dtype/shape, pixels", got.ok, got.detail, metrics)


def check(w: Workload, tricks: tuple[str, ...], samples: int = 16) -> Check:
    """Correctness of the configuration ``tricks`` against the baseline, by the checks its hooks name, on a batch
    of ``samples`` (at most the batch size). Raises ``TuneSkip`` when a hook cannot apply to this model."""
    tricks = with_requirements(tricks)
    kinds = {by_name(t).hook.check for t in tricks}
    model = tuple(t for t in tricks if by_name(t).hook.check != "data")
    checks: list[Check] = []
    try:
        if "data" in kinds and w.data_kind in ("files", "pack"):
            checks.append(_data(w, tuple(t for t in tricks if by_name(t).hook.check == "data")))
        if model:
            x, y = _check_batch(w, samples)
            exact = all(by_name(t).exact for t in model)
            steps = any(by_name(t).hook.changes == "step" for t in model)
            if exact and steps and w.task == "detection":
                checks.append(_detection_update(w, model, x, y))
            elif exact and w.task == "detection":
                checks.append(_exact_detector(w, model, x, y))
            else:
                checks.append(
                    (_exact_update if exact and steps else _exact if exact else _approx)(w, model, x, y)
                )
    except TuneSkip:
        raise
    except Exception as exc:  # a trick that crashes on this model fails its check, with the reason
        checks.append(Check("error", False, f"{type(exc).__name__}: {str(exc)[:200]}", {}))
    if not checks:
        return Check("none needed", True, "no model or data change", {})
    metrics: dict[str, float] = {}
    for c in checks:
        metrics.update(c.metrics)
    return Check(
        "; ".join(c.kind for c in checks),
        all(c.passed for c in checks),
        "; ".join(c.detail for c in checks),
        metrics,
    )
