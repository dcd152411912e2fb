"""``ptt lint``, ``ptt profile``, ``ptt flops``, ``ptt memory``: where a model's time and memory go."""

from __future__ import annotations

import argparse
from typing import Any

from pytorchtricks.cli._common import _SHAPE_NOTE, MODEL_SPEC_HELP, _console, _model_and_input
from pytorchtricks.core import PttError


def _add_lint(sub: Any) -> None:
    p = sub.add_parser("lint", help="check a model against the design rules (PTL001 ...): where, cost, fix")
    p.add_argument("model", help=MODEL_SPEC_HELP)
    p.add_argument(
        "--input-shape", help=f"example input shape (default: {_SHAPE_NOTE.format('1,C,224,224')})"
    )
    p.add_argument("--phase", default="train", choices=("train", "infer"), help="what the model is for")
    p.add_argument("--rules", help="comma-separated rule ids, e.g. PTL001,PTL010 (default: all)")
    p.add_argument("--fix", action="store_true", help="apply the safe fixes (exact) and report what changed")
    p.add_argument("--measure", action="store_true", help="time G1/G2 findings vs equal-FLOPs layers")
    p.add_argument("--details", action="store_true", help="one line per finding instead of grouped by rule")
    p.set_defaults(handler=_cmd_lint)


def _cmd_lint(args: argparse.Namespace) -> int:
    from pytorchtricks.analysis.lint import apply_lint_fixes_, lint

    model, x = _model_and_input(args.model, args.input_shape, "1,3,224,224")
    rules = [r.strip().upper() for r in args.rules.split(",") if r.strip()] if args.rules else None
    console = _console()
    if args.fix:
        rep = apply_lint_fixes_(model, x, phase=args.phase)
        report = rep.after
        out = f"{rep.before}\n\n--fix (ptt.apply_lint_fixes_ does the same to your model object):\n{rep}"
        console.print(out, markup=False, highlight=False, soft_wrap=True)
    else:
        report = lint(model, x, phase=args.phase, rules=rules)
    if args.measure:
        from pytorchtricks.analysis.design_rules import measure_findings

        measure_findings(model, x, report.findings)
    if not args.fix or args.measure:
        text = report.details() if args.details else str(report)
        console.print(text, markup=False, highlight=False, soft_wrap=True)
    return 0


def _add_profile(sub: Any) -> None:
    p = sub.add_parser("profile", help="profile a training step: time split, verdict, top ops")
    p.add_argument("model", help=MODEL_SPEC_HELP)
    p.add_argument("--input-shape", help=f"batch shape (default: {_SHAPE_NOTE.format('8,C,224,224')})")
    p.add_argument("--steps", type=int, default=10, help="timed steps (default: %(default)s)")
    p.add_argument("--profile-steps", type=int, default=3, help="steps under torch.profiler (0: skip)")
    p.add_argument("--device", default="cpu", help="cpu or cuda")
    p.add_argument("--trace", help="write a Chrome/Perfetto trace (.json) here")
    p.add_argument("--max-trace-mb", type=float, default=50.0)
    p.add_argument(
        "--task", choices=("classification", "detection"), default="classification",
        help="detection: a torchvision detector's training step (its loss dict summed) on real images with boxes",
    )  # fmt: skip
    p.add_argument("--data", help="--task detection: a COCO / YOLO / VOC root (default: the built-in photos)")
    p.add_argument("--batch-size", type=int, help="--task detection: images per step (default: 4)")
    p.add_argument(
        "--input-size", type=int, help="--task detection: the detector's shortest side (default: its own)"
    )
    p.set_defaults(handler=_cmd_profile)


def _cmd_profile(args: argparse.Namespace) -> int:
    import torch

    from pytorchtricks.core import resolve_device

    dev = resolve_device(args.device)
    if args.task == "detection":
        return _profile_detection(args, dev)
    if args.data or args.batch_size or args.input_size:
        raise PttError("--data, --batch-size and --input-size are for --task detection; give a classification "
                       "model its batch with --input-shape N,C,H,W.")  # fmt: skip
    model, x = _model_and_input(args.model, args.input_shape, "8,3,224,224")
    from pytorchtricks.analysis.step_split import model_task

    if model_task(model) == "detection":
        raise PttError(f"{args.model} is a detector (it trains on images with boxes and returns a loss dict): "
                       "profile its training step with --task detection [--data ROOT].")  # fmt: skip
    model.to(dev).train()
    try:
        with torch.no_grad():
            out = model(x[:1].to(dev))
    except Exception as exc:  # the model does not take this shape: say which one to pass
        raise PttError(
            f"the model fails on inputs of shape {tuple(x.shape)} ({type(exc).__name__}: "
            f"{str(exc).splitlines()[0] if str(exc) else ''}); pass the batch shape it takes with --input-shape "
            "N,C,H,W (e.g. 8,1,28,28 for an MNIST model)."
        ) from exc
    if not isinstance(out, torch.Tensor) or out.dim() != 2:
        raise PttError("ptt profile trains with cross-entropy on a [batch, classes] output; profile other models "
                       "from Python with ptt.profile(step_fn, data=...).")  # fmt: skip
    batches = [(x, torch.randint(0, out.shape[1], (x.shape[0],))) for _ in range(2)]  # synthetic, on the host

    def loss_of(batch: tuple[Any, Any]) -> Any:
        xb, yb = batch[0].to(dev, non_blocking=True), batch[1].to(dev, non_blocking=True)
        return torch.nn.functional.cross_entropy(model(xb), yb)

    return _profile_sgd(args, dev, model, loss_of, batches, "")


def _profile_sgd(
    args: argparse.Namespace, dev: Any, model: Any, loss_of: Any, batches: list[Any], head: str
) -> int:
    """Profile SGD steps of ``model`` on ``batches`` (``loss_of(batch)`` the step's loss); print ``head``, then the
    report."""
    import torch

    from pytorchtricks.analysis.profile import profile

    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

    def step(batch: Any) -> None:
        loss = loss_of(batch)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    rep = profile(
        step, args.steps, data=batches, profile_steps=args.profile_steps, trace_path=args.trace,
        max_trace_bytes=int(args.max_trace_mb * 2**20), device=dev,
    )  # fmt: skip
    _console().print(f"{head}{rep}", markup=False, highlight=False, soft_wrap=True)
    return 0


def _profile_detection(args: argparse.Namespace, dev: Any) -> int:
    """``ptt profile --task detection``: the detector's training step as ``ptt tune --task detection`` builds it
    (random weights, nothing downloaded; its loss dict summed; SGD), on two batches of real images with boxes from
    ``make_detection_loader`` at the detector's own size, held in memory (the step, not the loader)."""
    import itertools

    from pytorchtricks.tune import detection
    from pytorchtricks.tune.workload import build_workload

    if args.input_shape:
        raise PttError("--task detection takes --input-size (the detector's shortest side) and --batch-size, not "
                       "--input-shape: a detector's images differ in size.")  # fmt: skip
    w = build_workload(
        args.model, args.data, batch_size=args.batch_size or 4, input_size=args.input_size, num_workers=0,
        device=str(dev), task="detection",
    )  # fmt: skip
    model = w.model_factory().to(dev).train()
    loader = detection.our_loader(w.dataset, w.batch_size, w.input_size, w.max_size or 1333, {}, 0, True)
    batches = [detection.to_model_inputs(b, None, dev) for b in itertools.islice(iter(loader), 2)]
    head = (
        f"{w.model_spec} (detection, batch {w.batch_size}, shortest side {w.input_size}, longest {w.max_size}) on "
        f"{w.data_desc}: two batches of it held in memory\n"
    )
    return _profile_sgd(args, dev, model, lambda batch: detection.loss_of(model, *batch)[1], batches, head)


def _add_flops(sub: Any) -> None:
    p = sub.add_parser("flops", help="FLOPs, params and memory access cost per layer (1 MAC = 2 FLOPs)")
    p.add_argument("model", help=MODEL_SPEC_HELP)
    p.add_argument(
        "--input-shape", help=f"example input shape (default: {_SHAPE_NOTE.format('1,C,224,224')})"
    )
    p.add_argument("--top", type=int, default=20, help="layers to list, most FLOPs first")
    p.set_defaults(handler=_cmd_flops)


def _cmd_flops(args: argparse.Namespace) -> int:
    from pytorchtricks.analysis.flops import count_flops

    model, x = _model_and_input(args.model, args.input_shape, "1,3,224,224")
    r = count_flops(model, x)
    _console().print(f"{r}\n{r.table(top=args.top)}", markup=False, highlight=False, soft_wrap=True)
    return 0


def _add_memory(sub: Any) -> None:
    p = sub.add_parser("memory", help="training memory: params, grads, optimizer state, activations")
    p.add_argument("model", help=MODEL_SPEC_HELP)
    p.add_argument("--input-shape", help=f"batch shape (default: {_SHAPE_NOTE.format('8,C,224,224')})")
    p.add_argument("--optimizer", default="adamw", choices=("adamw", "sgd", "none"))
    p.add_argument("--no-measure", action="store_true", help="skip measuring the peak of a real step")
    p.set_defaults(handler=_cmd_memory)


def _cmd_memory(args: argparse.Namespace) -> int:
    import torch

    from pytorchtricks.analysis.memory import memory_breakdown

    model, x = _model_and_input(args.model, args.input_shape, "8,3,224,224")
    opt: Any = None
    if args.optimizer == "adamw":
        opt = torch.optim.AdamW(model.parameters())
    elif args.optimizer == "sgd":
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    b = memory_breakdown(model, x, opt, measure_peak=not args.no_measure)
    _console().print(f"{b}\n\n{b.table()}", markup=False, highlight=False, soft_wrap=True)
    return 0
