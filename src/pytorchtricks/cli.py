"""The ``pytorchtricks`` / ``ptt`` command line. Thin: parse, call the library, print.

Every subcommand is a ``_add_<name>(subparsers)`` that registers its arguments and sets ``handler``.
Errors from bad input (``PttError``) print one line with the fix and exit with status 2.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

from pytorchtricks.core import PttError

EXIT_USAGE = 2
# --input-shape defaults: C is the model's channels (its first convolution's in_channels; 3 without one)
_SHAPE_NOTE = "{}, C the model's input channels"
# subcommands that run models (and time them with torch.utils.benchmark, which imports torch.utils.cpp_extension)
MODEL_SPEC_HELP = (
    "torchvision:NAME, package.module:factory or path/to/file.py:factory; the last two EXECUTE code (import the "
    "module or run the file's top-level code, then call the factory): give only code you trust. The factory must "
    "return an nn.Module; built-ins and other callables are refused"
)
_TORCH_COMMANDS = ("bench", "doctor", "tune", "lint", "profile", "flops", "memory", "optimize")

Handler = Callable[[argparse.Namespace], int]


def _console() -> Any:
    from rich.console import Console

    # Piped output (CI logs, files) gets a wide fixed width so tables are not squeezed to 80 columns.
    return Console(width=None if sys.stdout.isatty() else 160)


# ----------------------------------------------------------------------------------------------- list / show


def _add_list(sub: Any) -> None:
    p = sub.add_parser("list", help="list the tricks in the catalogue")
    p.add_argument("--where", choices=None, help="data, loop, model or runtime")
    p.add_argument("--gains", help="speed, memory, reproducibility or accuracy")
    p.add_argument("--phase", help="train or infer")
    p.add_argument("--markdown", action="store_true", help="print the README's Markdown table")
    p.set_defaults(handler=_cmd_list)


def _cmd_list(args: argparse.Namespace) -> int:
    from rich.table import Table

    from pytorchtricks import catalogue

    tricks = catalogue.select(where=args.where, gains=args.gains, phase=args.phase)
    if args.markdown:
        sys.stdout.write(catalogue.to_markdown(tricks))
        return 0
    table = Table(title=f"pytorchtricks catalogue ({len(tricks)} tricks)")
    for col in ("trick", "where", "gains", "phase", "exact", "needs"):
        table.add_column(col, no_wrap=True)
    table.add_column("what it does", min_width=20)
    for t in tricks:
        table.add_row(
            t.name,
            t.where,
            ", ".join(t.info.gains),
            ", ".join(t.info.phase),
            "yes" if t.info.exact else "no",
            ", ".join(t.info.needs) or "-",
            t.summary,
        )
    _console().print(table)
    return 0


def _add_show(sub: Any) -> None:
    p = sub.add_parser("show", help="print a trick's card")
    p.add_argument("name")
    p.set_defaults(handler=_cmd_show)


def _cmd_show(args: argparse.Namespace) -> int:
    from pytorchtricks import catalogue

    t = catalogue.get(args.name)
    print(
        f"{t.name}  [{t.where}]  gains: {', '.join(t.info.gains)}  phase: {', '.join(t.info.phase)}  "
        f"exact: {'yes' if t.info.exact else 'no'}  needs: {', '.join(t.info.needs) or '-'}"
    )
    print(f"call: {', '.join('ptt.' + e for e in t.exports)}")
    print()
    print(t.card.strip())
    return 0


# ----------------------------------------------------------------------------------------------- bench / report


def _add_bench(sub: Any) -> None:
    p = sub.add_parser("bench", help="measure tricks against their baseline (interleaved A/B)")
    p.add_argument("names", nargs="*", help="trick names (see `ptt list`)")
    p.add_argument("--all", action="store_true", help="every trick in the catalogue")
    p.add_argument("--size", default="smoke", help="smoke (seconds) or full")
    p.add_argument("--device", default="cpu", help="cpu or cuda")
    p.add_argument(
        "--out", default="bench-results", help="folder for the JSONL results (default: %(default)s)"
    )
    p.set_defaults(handler=_cmd_bench)


def _cmd_bench(args: argparse.Namespace) -> int:
    from pytorchtricks import catalogue
    from pytorchtricks.bench.run import bench_many
    from pytorchtricks.core import resolve_device
    from pytorchtricks.report.table import render_rich

    resolve_device(args.device)
    names = catalogue.names() if args.all else list(args.names)
    if not names:
        raise PttError("name at least one trick (see `ptt list`) or pass --all.")
    rows, path = bench_many(names, size=args.size, device=args.device, out_dir=args.out)
    console = _console()
    console.print(render_rich(rows, title=f"ptt bench ({args.size}, {args.device})"))
    env = rows[0]["env"] if rows else {}
    console.print(
        f"ratio = baseline median / variant median (>1 is faster); medians and IQR over interleaved rounds. "
        f"{env.get('device_name')}, {env.get('threads')} threads, torch {env.get('torch')}."
    )
    if path:
        console.print(f"results appended to {path}")
    return 0


def _add_report(sub: Any) -> None:
    p = sub.add_parser("report", help="render a results JSONL file as a table, Markdown or CSV")
    p.add_argument("file")
    p.add_argument("--format", default="table", choices=("table", "md", "csv"))
    p.set_defaults(handler=_cmd_report)


def _cmd_report(args: argparse.Namespace) -> int:
    from pytorchtricks.report.table import read_jsonl, render_rich, to_csv, to_markdown

    rows = read_jsonl(args.file)
    if args.format == "md":
        print(to_markdown(rows))
    elif args.format == "csv":
        sys.stdout.write(to_csv(rows))
    else:
        _console().print(render_rich(rows, title=args.file))
    return 0


# ----------------------------------------------------------------------------------------------- doctor (data)


def _add_doctor(sub: Any) -> None:
    p = sub.add_parser(
        "doctor", help="diagnose a bottleneck: `ptt doctor data DST`, `ptt doctor script train.py`"
    )
    dsub = p.add_subparsers(dest="what", metavar="WHAT")
    d = dsub.add_parser(
        "data", help="split a batch's time into read/decode/augment/collate/host->device/wait"
    )
    d.add_argument(
        "path", help="an ImageFolder tree, a folder made by `ptt pack`, or a pack's URL (s3://...)"
    )
    d.add_argument("--cache-dir", default=None, help="node-shared shard cache for a URL (default: ~/.cache)")
    d.add_argument("--batch-size", type=int, default=64)
    d.add_argument("--batches", type=int, default=4, help="batches to time (default: %(default)s)")
    d.add_argument("--crop", type=int, default=224, help="RandomResizedCrop size; 0 keeps the stored size")
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
            f"loader{at('loader') if i == 0 else ''}: {x['via']} over {x['dataset']} ({x['samples']} samples), "
            f"batch {x['batch_size']}, num_workers "
            f"{x['num_workers']}, pin_memory {x['pin_memory']}, persistent_workers {x['persistent_workers']}, "
            f"prefetch_factor {x['prefetch_factor']}",
            highlight=False,
        )
    if r.model:
        console.print(
            f"model{at('model')}: {r.model['class']} ({r.model['params'] / 1e6:.1f} M params), first batch "
            f"{'x'.join(map(str, r.input_shape)) or '?'}",
            highlight=False,
        )
    if r.optimizer:
        console.print(
            f"optimizer{at('optimizer')}: " + ", ".join(f"{k}={v}" for k, v in r.optimizer.items()),
            highlight=False,
        )
    for where, n in r.syncs[:5]:
        console.print(f"host sync: {escape(where)} {n:.1f} per step", highlight=False)
    if r.lint:
        ids = ", ".join(dict.fromkeys(f"{f['id']} {f['name']}" for f in r.lint))
        console.print(f"ptt lint on the model: {len(r.lint)} finding(s): {escape(ids)}", highlight=False)
    console.print(f"{r.ended}; verdict: [bold]{r.verdict}[/] - {escape(r.evidence)}")
    console.print(f"first fix: {escape(r.fix)}", highlight=False)
    compared = compare_runs(earlier, r) if earlier is not None else None
    for line in compared or []:
        console.print(f"changed since {args.compare}: {line}", highlight=False)
    path = write_run(r, args.out, compared, earlier["mean_s"] if earlier else None)
    console.print(f"results: {path}; report: {os.path.join(args.out, 'report.html')}", highlight=False)
    if not args.tune:
        return 0
    from pytorchtricks.analysis.script_run import tune_arguments
    from pytorchtricks.tune.console import RichProgress, receipt_table, summary_lines
    from pytorchtricks.tune.engine import tune_model

    kw = tune_arguments(r)
    console.print(
        f"tune on the script's objects: {r.model['class']}, {kw['optimizer'][0]} {kw['optimizer'][1]}, data "
        f"{kw['data']}, batch {kw['batch_size']}, input {'x'.join(map(str, kw['input_shape']))}, "
        f"{kw['num_workers']} workers",
        highlight=False,
    )
    res = tune_model(
        kw["model"], kw["data"], batch_size=kw["batch_size"], input_shape=kw["input_shape"],
        num_workers=kw["num_workers"], optimizer=kw["optimizer"], script=kw["script"], time_budget_s=args.time_budget,
        out=args.tune_out, progress=RichProgress(console),
    )  # fmt: skip
    console.print(receipt_table(res))
    for line in summary_lines(res, args.tune_out):
        console.print(line, highlight=False)
    return 130 if res.interrupted else 0


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
    console.print(f"verdict: {r.verdict}")
    console.print(f"first fix: {r.fix}")
    for note in r.notes:
        console.print(f"note: {note}")
    return 0


# ----------------------------------------------------------------------------------------------- tune


def _add_tune(sub: Any) -> None:
    p = sub.add_parser(
        "tune", help="diagnose, A/B-measure every applicable trick, combine the winners, write a receipt"
    )
    p.add_argument(
        "--model",
        help=MODEL_SPEC_HELP + " (default: ResNet-18)",
    )
    p.add_argument(
        "--data",
        help="an image folder, a `ptt pack` folder, or `synthetic` (default: built-in wallpaper photo set)",
    )
    p.add_argument(
        "--batch-size",
        type=_batch_arg,
        default=None,
        help="default: 32; auto (with --memory-budget SIZE): the fastest batch that fits",
    )
    p.add_argument(
        "--input-shape",
        default=None,
        metavar="C,H,W",
        help="one sample's shape, e.g. 1,28,28 for MNIST (default: the model's first conv's channels, 64 px)",
    )
    p.add_argument("--input-size", type=int, default=None, help="just the image side in pixels (default: 64)")
    p.add_argument(
        "--num-workers",
        type=int,
        default=2,
        help="DataLoader workers your loop uses today: the baseline loads with them (default: 2, the common -j 2)",
    )
    p.add_argument(
        "--goal",
        default="speed",
        choices=("speed", "memory", "both"),
        help="speed (default); memory: the smallest step peak within 10%% of the best speed (memory tricks)",
    )
    p.add_argument(
        "--memory-budget",
        default=None,
        metavar="SIZE",
        help="the step peak to fit: 24GiB, 1.5G (a bare K/M/G is binary), 300MB, bytes, or 50%% of the baseline's "
        "measured peak; tune then recommends the fastest configuration of the memory tricks that fits (the batch "
        "stays --batch-size: only gradient accumulation splits it, with the same update)",
    )
    p.add_argument("--for", dest="for_", default="train", choices=("train", "inference"))
    p.add_argument("--time-budget", type=float, default=None, help="seconds for the whole run (default: 175)")
    p.add_argument("--device", default="cpu", help="cpu or cuda")
    p.add_argument(
        "--out", default="tune-out", help="receipt folder, replaced atomically (default: %(default)s)"
    )
    p.set_defaults(handler=_cmd_tune)


def _batch_arg(text: str) -> int | str:
    if text.strip().lower() == "auto":
        return "auto"
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"a positive integer or auto, not {text!r}") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"a positive integer or auto, not {text!r}")
    return n


def _cmd_tune(args: argparse.Namespace) -> int:
    from pytorchtricks.tune.console import RichProgress, memory_table, receipt_table, summary_lines
    from pytorchtricks.tune.engine import tune_model

    console = _console()
    res = tune_model(
        args.model, args.data, batch_size=args.batch_size, input_size=args.input_size,
        input_shape=args.input_shape, num_workers=args.num_workers, goal=args.goal, for_=args.for_,
        time_budget_s=args.time_budget, device=args.device, out=args.out, progress=RichProgress(console),
        memory_budget=args.memory_budget,
    )  # fmt: skip
    console.print(receipt_table(res))
    if res.memory is not None:
        console.print(memory_table(res))
    for line in summary_lines(res, args.out):
        console.print(line, highlight=False)
    return 130 if res.interrupted else 0


# ----------------------------------------------------------------------------------------------- pack / inspect


def _add_pack(sub: Any) -> None:
    p = sub.add_parser("pack", help="pack an image folder or CSV/JSONL list into ptt, tar or lmdb shards")
    p.add_argument("src", help="ImageFolder tree (a folder per class) or a .csv/.jsonl list of path,label")
    p.add_argument(
        "dst",
        help="output folder or bucket URL (s3://bucket/p, gs://, az://); re-running resumes an interrupted pack",
    )
    p.add_argument("--format", default="ptt", choices=("ptt", "tar", "lmdb"))
    p.add_argument("--resize", type=int, default=None, metavar="SHORT_SIDE", help="shrink the short side")
    p.add_argument("--max-side", type=int, default=None, metavar="N", help="shrink the long side to this")
    p.add_argument("--quality", type=int, default=None, help="re-encode JPEG at this quality")
    p.add_argument("--raw", action="store_true", help="store decoded uint8 pixels (no decode when reading)")
    p.add_argument("--shard-size", default="64MB", help="bytes per shard (default: %(default)s)")
    p.add_argument("--workers", type=int, default=None, help="processes (default: all cores)")
    p.add_argument("--no-shuffle", action="store_true", help="keep the listing order (no seeded permutation)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--strict", action="store_true", help="fail on the first bad file instead of listing it")
    p.add_argument(
        "--max-pixels",
        type=int,
        default=None,
        metavar="N",
        help="refuse (list in rejects) images whose header declares more pixels, before decoding (default: 178956970)",
    )
    p.add_argument("--verify", action="store_true", help="re-read every shard and record after packing")
    p.add_argument(
        "--distributed",
        action="store_true",
        help="under torchrun: every rank encodes its share, rank 0 writes shards and index (same bytes as one process)",
    )
    p.add_argument(
        "--staging-dir", default=None, help="local folder a bucket DST is packed in before the upload"
    )
    p.set_defaults(handler=_cmd_pack)


def _cmd_pack(args: argparse.Namespace) -> int:
    from pytorchtricks.tricks.data.pack import pack

    s = pack(
        args.src, args.dst, format=args.format, resize=args.resize, max_side=args.max_side, quality=args.quality,
        raw=args.raw, shard_size=args.shard_size, workers=args.workers, shuffle=not args.no_shuffle, seed=args.seed,
        strict=args.strict, verify=args.verify, progress=not args.distributed,
        distributed=args.distributed, staging_dir=args.staging_dir,
        **({"max_pixels": args.max_pixels} if args.max_pixels is not None else {}),
    )  # fmt: skip
    if args.distributed and os.environ.get("RANK", "0") != "0":
        return 0  # rank 0 reports
    console = _console()
    rate = s.get("images_per_s")
    console.print(
        f"packed {s['count']} of {s['files_in']} files into {len(s['shards'])} {s['format']} shard(s) in {args.dst}: "
        f"{s['bytes_in'] / 1e6:.1f} MB in, {s['bytes_out'] / 1e6:.1f} MB out"
        + (f", {rate:.0f} images/s" if rate else " (already complete)")
        + (f", {s['skipped_shards']} shard(s) kept from an earlier run" if s.get("skipped_shards") else ""),
        highlight=False,
    )
    rejects = s.get("rejects", [])
    note = " (listed in manifest.json)" if rejects else ""
    console.print(f"rejects: {len(rejects)}{note}", highlight=False)
    for r in rejects[:10]:
        console.print(f"  {r['path']}: {r['reason']}", highlight=False, markup=False)
    return 0


def _add_cache_options(p: Any) -> None:
    p.add_argument(
        "--cache-dir",
        default=None,
        help="node-shared shard cache for URLs (default: $PTT_CACHE_DIR or ~/.cache)",
    )
    p.add_argument(
        "--cache-limit", default=None, help="bound of the shard cache in bytes, e.g. 50GB (default: none)"
    )


def _add_inspect(sub: Any) -> None:
    p = sub.add_parser("inspect", help="counts, class histogram, sizes and checksums of a pack")
    p.add_argument(
        "dst", help="a folder written by `ptt pack`, or its URL (s3://bucket/p, gs://, az://, https://)"
    )
    p.add_argument("--no-verify", action="store_true", help="skip the sha256/CRC32 check")
    _add_cache_options(p)
    p.add_argument("--decode", action="store_true", help="also decode every image")
    p.set_defaults(handler=_cmd_inspect)


def _cmd_inspect(args: argparse.Namespace) -> int:
    from rich.table import Table

    from pytorchtricks.shards.inspect import inspect_shards

    r = inspect_shards(
        args.dst,
        verify=not args.no_verify,
        decode=args.decode,
        cache_dir=args.cache_dir,
        cache_limit=args.cache_limit,
    )
    console = _console()
    over = r["overhead"]
    console.print(
        f"{r['path']}: {r['format']}, {r['count']} samples in {r['shards']} shard(s), "
        f"{r['bytes_out'] / 1e6:.1f} MB ({r['payload_bytes'] / 1e6:.1f} MB payload"
        + (f", overhead {over:.2%}" if over is not None else "")
        + f"), {len(r['rejects'])} rejects",
        highlight=False,
    )
    table = Table(title="classes")
    table.add_column("class")
    table.add_column("samples", justify="right")
    for name, n in r["classes"].items():
        table.add_row(name, str(n))
    console.print(table)
    if r["problems"] is None:
        return 0
    for p in r["problems"]:
        console.print(f"problem: {p}", highlight=False, markup=False)
    console.print("integrity: ok" if not r["problems"] else f"integrity: {len(r['problems'])} problem(s)")
    return 1 if r["problems"] else 0


# ----------------------------------------------------------------------------------------------- lint / profile


def _model_and_input(spec: str, shape: str | None, default: str) -> tuple[Any, Any]:
    """The model and a random input: ``--input-shape`` as given, or ``default`` with the model's own channels
    (its first convolution's ``in_channels``: a 1-channel MNIST model gets 1 channel, not 3)."""
    import torch

    from pytorchtricks.bench.workloads import load_model, parse_shape
    from pytorchtricks.tune.workload import model_in_channels

    model = load_model(spec)
    dims = parse_shape(shape or default)
    channels = model_in_channels(model)
    if shape is None and channels is not None and len(dims) >= 2:
        dims = (dims[0], channels, *dims[2:])
    return model, torch.randn(dims)


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
    p.set_defaults(handler=_cmd_profile)


def _cmd_profile(args: argparse.Namespace) -> int:
    import torch

    from pytorchtricks.analysis.profile import profile
    from pytorchtricks.core import resolve_device

    dev = resolve_device(args.device)
    model, x = _model_and_input(args.model, args.input_shape, "8,3,224,224")
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
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

    def step(batch: tuple[Any, Any]) -> None:
        xb, yb = batch[0].to(dev, non_blocking=True), batch[1].to(dev, non_blocking=True)
        loss = torch.nn.functional.cross_entropy(model(xb), yb)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    rep = profile(
        step, args.steps, data=batches, profile_steps=args.profile_steps, trace_path=args.trace,
        max_trace_bytes=int(args.max_trace_mb * 2**20), device=dev,
    )  # fmt: skip
    _console().print(str(rep), markup=False, highlight=False, soft_wrap=True)
    return 0


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


# ----------------------------------------------------------------------------------------------- optimize


def _add_optimize(sub: Any) -> None:
    p = sub.add_parser(
        "optimize",
        help="build every inference engine for a model, check and time each, write the fastest correct one",
    )
    p.add_argument("model", help=MODEL_SPEC_HELP)
    p.add_argument("--input-shape", default="1,3,224,224", help="input shape N,C,H,W (default: %(default)s)")
    p.add_argument(
        "--precision",
        choices=("fp32", "bf16", "int8", "any"),
        default="fp32",
        help="what the candidates may compute in (default: %(default)s, exact up to float rounding)",
    )
    p.add_argument(
        "--min-sqnr",
        type=float,
        metavar="DB",
        help="the bound for bf16/int8 candidates, SQNR vs eager fp32 on held-out inputs (default: 30 dB; fp32 >= 60)",
    )
    p.add_argument(
        "--calibrate",
        metavar="DIR",
        help="folder of real .jpg/.png inputs: the first half calibrates int8, the rest is the held-out check set",
    )
    p.add_argument(
        "--engines",
        default="torch,ort",
        help="which engines to try: eager, aoti, onednn, ort; torch = eager,aoti,onednn (default: %(default)s)",
    )
    p.add_argument("--threads", type=int, help="intra-op threads for every engine (default: torch's)")
    p.add_argument("--rounds", type=int, default=5, help="interleaved timing rounds (default: %(default)s)")
    p.add_argument(
        "--out", help="write the winner as FILE.pt2 or FILE.onnx, and FILE.json (the table and the load line)"
    )
    p.set_defaults(handler=_cmd_optimize)


def _cmd_optimize(args: argparse.Namespace) -> int:
    import torch
    from rich.table import Table

    from pytorchtricks.bench.workloads import load_model, parse_shape
    from pytorchtricks.infer.picker import parse_engines, pick_artefact, summary, write_winner
    from pytorchtricks.infer.pipeline import load_calibration

    shape = parse_shape(args.input_shape)
    engines = parse_engines(args.engines)
    if args.threads is not None and args.threads < 1:
        raise PttError("--threads must be >= 1.")
    model = load_model(args.model).eval()
    console = _console()
    if args.calibrate:
        batches = load_calibration(args.calibrate, shape)
        if len(batches) < 2:
            raise PttError(
                f"--calibrate {args.calibrate!r} gives {len(batches)} batch of {shape[0]}: it needs at least 2 "
                "(one to calibrate, one held out to check); add images or lower the batch."
            )
        half = len(batches) // 2
        calib, held_out = batches[:half], batches[half:]
    else:
        gen = torch.Generator().manual_seed(0)
        calib = [torch.randn(*shape, generator=gen) for _ in range(4)]
        held_out = [torch.randn(*shape, generator=gen) for _ in range(2)]
        console.print(
            "note: no --calibrate DIR: int8 is calibrated and every candidate checked on random inputs; real "
            "inputs measure the SQNR your data gets",
            highlight=False,
        )
    picked = pick_artefact(
        model, held_out[0], calibration=calib, held_out=held_out, precision=args.precision, engines=engines,
        threads=args.threads, min_sqnr_db=args.min_sqnr, rounds=args.rounds,
        progress=lambda msg: console.print(f"[dim]{msg}[/]", highlight=False),
    )  # fmt: skip
    table = Table(title=f"ptt optimize {args.model} ({args.input_shape}, {picked.threads} threads)")
    for col in ("candidate", "precision", "status", "ms", "vs eager fp32 (IQR)", "SQNR dB", "build s"):
        table.add_column(col)
    for r in picked.rows:
        speed = "-" if r.speedup is None else f"{r.speedup:.2f}x"
        if r.speedup_q1 is not None and r.speedup_q3 is not None:
            speed += f" ({r.speedup_q1:.2f}-{r.speedup_q3:.2f})"
        sq = "-" if r.sqnr_db is None else "inf" if r.sqnr_db == float("inf") else f"{r.sqnr_db:.1f}"
        mark = " *" if r is picked.winner else ""
        table.add_row(
            r.name + mark, r.precision, r.status, "-" if r.median_ms is None else f"{r.median_ms:.2f}", speed, sq,
            "-" if r.build_s is None else f"{r.build_s:.0f}",
        )  # fmt: skip
    console.print(table)
    console.print(summary(picked), highlight=False)
    console.print(
        f"interleaved rounds: {picked.rounds}; checked on {picked.held_out} held-out inputs; torch {torch.__version__}",
        highlight=False,
    )
    if args.out and picked.winner is not None:
        path, receipt = write_winner(picked, args.out, model_spec=args.model)
        console.print(f"wrote {path} and {receipt}; load: m = ptt.load_artefact({path!r})", highlight=False)
    return 0 if picked.winner is not None else 1


# ----------------------------------------------------------------------------------------------- entry point

_COMMANDS: list[Callable[[Any], None]] = [
    _add_list,
    _add_show,
    _add_bench,
    _add_report,
    _add_doctor,
    _add_tune,
    _add_pack,
    _add_inspect,
    _add_lint,
    _add_profile,
    _add_flops,
    _add_memory,
    _add_optimize,
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ptt",
        description="pytorchtricks: PyTorch speed and memory tricks, tested and measured on your hardware.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for add in _COMMANDS:
        add(sub)
    return parser


def _script_given_to_tune(argv: Sequence[str]) -> str | None:
    """``ptt tune train.py``: the .py file given where tune takes options (a user with a training script)."""
    if list(argv[:1]) != ["tune"]:
        return None
    for i, tok in enumerate(argv[1:], start=1):
        if tok.endswith(".py") and not argv[i - 1].startswith("-"):
            return tok
    return None


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    script = _script_given_to_tune(argv)
    if script is not None:
        print(
            f"error: ptt tune takes a model and data (--model, --data), not a script. To tune {script} as it is "
            f"(its own model, optimizer and data), run it under the doctor: ptt doctor run --tune -- python {script} "
            "ARGS",
            file=sys.stderr,
        )
        return EXIT_USAGE
    args = parser.parse_args(argv)
    if not getattr(args, "handler", None):
        parser.print_help()
        return EXIT_USAGE
    if args.command in _TORCH_COMMANDS:  # `ptt list` and friends stay light: no torch import for them
        from pytorchtricks.quiet import import_cpp_extension_quietly

        import_cpp_extension_quietly()  # its "No CUDA runtime is found, using CUDA_HOME" is noise on a CPU run
    try:
        return int(args.handler(args) or 0)
    except PttError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
