"""``ptt doctor``: ``data`` (the input pipeline), ``run`` (a training script), ``script`` (its source)."""

from __future__ import annotations

import argparse
import os
from typing import Any

from pytorchtricks.cli._common import _console, add_split
from pytorchtricks.core import PttError, for_cli


def _add_doctor(sub: Any) -> None:
    p = sub.add_parser(
        "doctor", help="diagnose a bottleneck: `ptt doctor data DST`, `ptt doctor script train.py`"
    )
    dsub = p.add_subparsers(dest="what", metavar="WHAT")
    d = dsub.add_parser(
        "data", help="split a batch's time into read/decode/augment/collate/host->device/wait"
    )
    d.add_argument(
        "path",
        help="an ImageFolder tree, a COCO / YOLO / VOC root, a folder made by `ptt pack`, or a pack's URL (s3://...)",
    )
    add_split(d)
    d.add_argument("--cache-dir", default=None, help="node-shared shard cache for a URL (default: ~/.cache)")
    d.add_argument("--batch-size", type=int, default=None, help="default: 64; 4 for detection data")
    d.add_argument("--batches", type=int, default=4, help="batches to time (default: %(default)s)")
    d.add_argument(
        "--crop",
        type=int,
        default=224,
        help="RandomResizedCrop size of image folders; 0 keeps the stored size",
    )
    d.add_argument(
        "--recipe",
        default="shortest_side",
        choices=("shortest_side", "multiscale", "lsj", "ssd"),
        help="detection data: make_detection_loader's recipe (default: %(default)s, 800 px up to 1333, as "
        "torchvision's detection reference)",
    )
    d.add_argument("--workers", type=int, default=None, help="DataLoader workers (default: one per core)")
    d.add_argument(
        "--step-time", type=float, default=None, help="your step's seconds per batch, for the verdict"
    )
    d.add_argument("--device", default="cpu", help="where batches go (host->device is timed)")
    rn = dsub.add_parser(
        "run",
        help="run your unmodified script, timed per step: `ptt doctor run -- python train.py ARGS`",
        description="Runs the script in this process as python would (it executes the script's code), times each "
        "optimizer step (data wait, forward, backward, optimizer, other), finds its loaders, model and optimizer "
        "and the lines that build them, and says what bounds the step and the first fix.",
    )
    rn.add_argument("--steps", type=int, default=10, help="optimizer steps to measure (default: %(default)s)")
    rn.add_argument("--warmup", type=int, default=2, help="steps before measuring (default: %(default)s)")
    rn.add_argument(
        "--out", default="doctor-out", help="where results.jsonl and report.html go (default: %(default)s)"
    )
    rn.add_argument(
        "--tune",
        action="store_true",
        help="then run ptt tune on the script's own model, optimizer (its hyper-parameters kept) and data folder",
    )
    rn.add_argument("--time-budget", type=float, default=None, help="seconds for the tune run (default: 175)")
    rn.add_argument(
        "--device-step-ms",
        type=float,
        default=None,
        metavar="MS",
        help="with --tune: your accelerator's step in milliseconds; the loaders are projected for it (ptt tune "
        "--device-step-ms)",
    )
    rn.add_argument("--tune-out", default="tune-out", help="the tune receipt's folder (default: %(default)s)")
    rn.add_argument(
        "--compare",
        default=None,
        metavar="RESULTS",
        help="an earlier run's results.jsonl: say what changed (step, stage shares, loader settings, verdict)",
    )
    rn.add_argument(
        "run_command",
        metavar="COMMAND",
        nargs=argparse.REMAINDER,
        help="-- python train.py ARGS (or -- python -m pkg ARGS)",
    )
    sc = dsub.add_parser(
        "script", help="rules on a training script's source (PTS001...): what costs, where, the fix"
    )
    sc.add_argument("file", help="the training script (read, never run)")
    sc.add_argument(
        "--fix",
        action="store_true",
        help="rewrite the safe findings in place (the original kept as FILE.orig)",
    )
    sc.add_argument("--diff", action="store_true", help="print the diff of the safe rewrites; write nothing")
    p.set_defaults(handler=_cmd_doctor)


def _cmd_doctor_run(args: argparse.Namespace) -> int:
    from rich.markup import escape
    from rich.table import Table

    from pytorchtricks.analysis.script_run import STAGES, compare_runs, read_summary, run_script, write_run
    from pytorchtricks.analysis.step_split import optimizer_text

    command = args.run_command[1:] if args.run_command[:1] == ["--"] else args.run_command
    earlier = read_summary(args.compare) if args.compare is not None else None  # said before the script runs
    r = run_script(command, steps=args.steps, warmup=args.warmup)
    console = _console()
    m = r.mean_s()
    console.print(f"ran: {escape(' '.join(command))}", highlight=False)
    table = Table(title=f"time per step ({len(r.steps)} measured)")
    for col in ("stage", "ms / step", "share"):
        table.add_column(col, justify="left" if col == "stage" else "right")
    for st in STAGES:
        table.add_row(st, f"{m[st] * 1e3:.1f}", f"{m[st] / m['step']:.0%}" if m["step"] else "-")
    table.add_row("step", f"{m['step'] * 1e3:.1f}", "100%")
    console.print(table)

    def at(kind: str) -> str:
        w = r.sites.get(kind)
        return f" at {os.path.basename(w['file'])}:{w['line']}" if w else ""

    for i, x in enumerate(r.loaders):
        console.print(
            f"loader{at('loader') if i == 0 else ''}: {x['via']}"
            + (f" ({x['class']})" if x.get("class") not in (None, "DataLoader") else "")
            + f" over {x['dataset']} ({x['samples']} samples), "
            f"batch {x['batch_size']}"
            + (f" (from its {x['batch_sampler']})" if x.get("batch_sampler") else "")
            + (f", policy {x['policy']}" if x.get("policy") else "")
            + ", num_workers "
            f"{x['num_workers']}, pin_memory {x['pin_memory']}, persistent_workers {x['persistent_workers']}, "
            f"prefetch_factor {x['prefetch_factor']}"
            + (
                "; built from " + ", ".join(f"its {k}{at(k)}" for k in ("dataset", "sampler") if at(k))
                if i == 0 and (at("dataset") or at("sampler"))
                else ""
            ),
            highlight=False,
        )
        if x.get("shm"):
            console.print(f"  shared memory: {escape(x['shm']['text'])}", highlight=False)
    if r.model:
        console.print(
            f"model{at('model')}: {r.model['class']} ({r.model['params'] / 1e6:.1f} M params"
            + (f", {r.model['task']}" if r.model.get("task") else "")
            + f"), first batch {r.first_batch()}"
            + (f"; returns a dict ({', '.join(r.model['outputs'])})" if r.model.get("outputs") else ""),
            highlight=False,
        )
    if r.optimizer:
        console.print(
            f"optimizer{at('optimizer')}: {optimizer_text(r.optimizer)}",
            highlight=False,
        )
    for where, n in r.syncs[:5]:
        console.print(f"host sync: {escape(where)} {n:.1f} per step", highlight=False)
    if r.lint:
        ids = ", ".join(dict.fromkeys(f"{f['id']} {f['name']}" for f in r.lint))
        console.print(f"ptt lint on the model: {len(r.lint)} finding(s): {escape(ids)}", highlight=False)
    for line in cpu_lines(r.core_seconds, r.cpu):
        console.print(line, highlight=False)
    console.print(f"{r.ended}; verdict: [bold]{r.verdict}[/] - {escape(r.evidence)}")
    console.print(f"first fix: {escape(r.fix)}", highlight=False)
    compared = compare_runs(earlier, r) if earlier is not None else None
    for line in compared or []:
        console.print(f"changed since {args.compare}: {line}", highlight=False)
    path = write_run(r, args.out, compared, earlier["mean_s"] if earlier else None)
    console.print(f"results: {path}; report: {os.path.join(args.out, 'report.html')}", highlight=False)
    if not args.tune:
        return 0
    from pytorchtricks.analysis.script_run import tune_arguments, ultralytics_dataset
    from pytorchtricks.tune.console import RichProgress, receipt_table, summary_lines
    from pytorchtricks.tune.engine import tune_model

    yolo_ds = ultralytics_dataset(r)
    if yolo_ds is not None:
        return _tune_yolo(args, r, yolo_ds, command, console)
    kw = tune_arguments(r)
    console.print(
        f"tune on the script's objects: {r.model['class']}, {kw['optimizer'][0]} {kw['optimizer'][1]}, data "
        f"{kw['data']}, batch {kw['batch_size']}, input "
        f"{'x'.join(map(str, kw['input_shape'])) if kw['input_shape'] else 'images of any size'}, "
        f"{kw['num_workers']} workers" + (", detection" if kw.get("task") == "detection" else ""),
        highlight=False,
    )
    res = tune_model(
        kw["model"], kw["data"], batch_size=kw["batch_size"], input_shape=kw["input_shape"],
        num_workers=kw["num_workers"], optimizer=kw["optimizer"], script=kw["script"], time_budget_s=args.time_budget,
        out=args.tune_out, progress=RichProgress(console), task=kw.get("task", "classification"),
        device_step_ms=args.device_step_ms,
    )  # fmt: skip
    console.print(receipt_table(res))
    for line in summary_lines(res, args.tune_out):
        console.print(line, highlight=False)
    return 130 if res.interrupted else 0


def _tune_yolo(args: argparse.Namespace, r: Any, ds: Any, command: list[str], console: Any) -> int:
    """``--tune`` on Ultralytics' trainer: its data pipeline stock vs ``ptt.ultralytics.accelerate`` (tune.yolo)."""
    from rich.table import Table

    from pytorchtricks.tune.console import RichProgress
    from pytorchtricks.tune.yolo import tune_yolo, yolo_workload

    m = r.mean_s()
    loader = r.loaders[0] if r.loaders else {}
    w = yolo_workload(ds, r.captured.get("model"), loader, command, max(0.0, m["step"] - m["data wait"]))
    console.print(
        f"tune on Ultralytics' trainer: its {w.trainer} training set ({w.images} images), batch {w.batch}, "
        f"{w.workers} workers; candidates: its stock loader, ptt.ultralytics.accelerate (match stock, speed)",
        highlight=False,
    )
    p = tune_yolo(
        w, out=args.tune_out, time_budget_s=args.time_budget, device_step_ms=args.device_step_ms,
        progress=RichProgress(console),
    )  # fmt: skip
    table = Table(title=f"its data pipeline ({p['rounds']} interleaved rounds)")
    for col in ("candidate", "images/s", "vs stock (IQR)", "PSNR vs stock", "projected step", "recommended"):
        table.add_column(col, justify="left" if col == "candidate" else "right")
    for c in p["candidates"]:
        table.add_row(
            c["line"] or "stock",
            f"{c['images_per_s']:.1f}",
            f"{c['ratio']:.2f}x ({c['ratio_q1']:.2f}-{c['ratio_q3']:.2f})",
            "-" if c["psnr_db_median"] is None else f"{c['psnr_db_median']:.1f} dB",
            f"{c['projected_gain']:.2f}x" if c.get("projected_gain") else "-",
            "yes" if c["recommended"] else "",
        )
    console.print(table)
    console.print(f"projected with {p['step_from']}", highlight=False)
    console.print(("recommended: " if p["recommended"] else "") + p["why"], highlight=False)
    console.print(f"receipt: {args.tune_out} (apply.py, report.html, results.jsonl)", highlight=False)
    return 0


def _cmd_doctor_script(args: argparse.Namespace) -> int:
    from rich.markup import escape
    from rich.table import Table

    from pytorchtricks.analysis import script_rules as sr

    source = sr.read_script(args.file)
    found = sr.check_script(source)
    console = _console()
    table = Table(title=f"ptt doctor script {args.file}: {len(found)} finding(s)")
    for col in ("where", "rule", "found", "why it costs", "fix"):
        table.add_column(col, overflow="fold")
    for f in found:
        tag = "[green]fix[/]" if f.fixable else "advice"
        table.add_row(
            f"{f.line}:{f.col}",
            f"{f.id} {f.name}",
            escape(f.message),
            escape(f.why),
            f"{tag}: {escape(f.fix)}",
        )
    if found:
        console.print(table)
    else:
        console.print(
            f"ptt doctor script {escape(args.file)}: no finding (13 rules, PTS001-PTS013)", highlight=False
        )
    if args.fix or args.diff:
        fixed = sr.rewrite_script(source)
        diff = sr.unified_diff(source, fixed, args.file)
        console.print(escape(diff) if diff else "no safe rewrite applies", highlight=False)
        if args.fix and diff:
            backup = sr.write_fixed(args.file, fixed)
            console.print(f"rewrote {args.file} (the original is {backup})", highlight=False)
    return 0


def _cmd_doctor(args: argparse.Namespace) -> int:
    from rich.table import Table

    from pytorchtricks.analysis.data_doctor import doctor_data

    if getattr(args, "what", None) == "script":
        return _cmd_doctor_script(args)
    if getattr(args, "what", None) == "run":
        return _cmd_doctor_run(args)
    if getattr(args, "what", None) != "data":
        raise PttError("say what to diagnose: `ptt doctor data DST` or `ptt doctor script train.py`.")
    r = doctor_data(
        args.path,
        batch_size=args.batch_size,
        crop=args.crop or None,
        batches=args.batches,
        num_workers=args.workers,
        step_time_s=args.step_time,
        device=args.device,
        cache_dir=args.cache_dir,
        split=args.split,
        recipe=args.recipe,
    )
    table = Table(
        title=f"ptt doctor data {args.path}  (batch {r.batch_size}, {r.batches} batches, one process)"
    )
    for col in ("stage", "ms / batch", "share"):
        table.add_column(col, justify="right" if col != "stage" else "left")
    for name, ms, share in r.rows():
        table.add_row(name, f"{ms:.1f}", f"{share:.0%}")
    table.add_row("sum of stages", f"{r.stage_sum_s * 1e3:.1f}", f"{r.stage_sum_s / r.total_s:.0%}")
    table.add_row("measured total", f"{r.total_s * 1e3:.1f}", "100%")
    if r.decoded_mp_per_sample is not None:  # not a time: what the decoder produced, per sample
        table.add_row(
            "decoded megapixels / sample", f"{r.decoded_mp_per_sample:.2f}", f"{r.window_decodes} windows"
        )
    wait = "-" if r.wait_s is None else f"{r.wait_s * 1e3:.1f}"
    table.add_row(f"wait (loader, {r.num_workers} workers)", wait, "")
    console = _console()
    console.print(table)
    console.print(f"loader: {r.loader_images_per_s:.0f} images/s with {r.num_workers} workers")
    if r.shm is not None:
        console.print(f"shared memory: {r.shm}", highlight=False)
    if r.workers_cpu_s_per_batch is not None:
        console.print(
            f"loader alone: its workers used {r.workers_cpu_s_per_batch:.3f} CPU-s per batch "
            f"({r.workers_cpu_s_per_batch / r.batch_size * 1e3:.2f} CPU-ms per sample)",
            highlight=False,
        )
    for line in cpu_lines(r.core_seconds, (r.cpu or {}).get("beside the step")):
        console.print(line, highlight=False)
    console.print(f"verdict: {for_cli(r.verdict)}")
    console.print(f"first fix: {for_cli(r.fix)}")
    for note in r.notes:
        console.print(f"note: {for_cli(note)}")
    return 0


def cpu_lines(core_seconds: dict[str, Any] | None, cpu: dict[str, Any] | None) -> list[str]:
    """The CPU-seconds accounting of a run, as printed by ``ptt doctor run`` and ``ptt doctor data``."""
    out = []
    if core_seconds:
        cs = core_seconds
        out.append(
            f"CPU per step: training process {cs['main_cpu_s_per_step']:.3f} CPU-s, loader workers "
            f"{cs['workers_cpu_s_per_step']:.3f} CPU-s: {cs['used_share']:.0%} of the "
            f"{cs['core_s_supplied_per_step']:.3f} core-s {cs['cores']} core(s) supplied"
            + (" (saturated: the loader's CPU-seconds come out of the step's)" if cs["saturated"] else "")
        )
    if cpu:
        top = ", ".join(f"{t['name']} {t['cpu_s']:.1f} s" for t in cpu.get("top_others") or [])
        out.append(
            f"other programs took {cpu['busy_share']:.0%} of the machine's {cpu['machine_cores']} cores meanwhile"
            + (f" ({top})" if top else "")
        )
    return out
