"""``ptt optimize``: every inference engine built as a file, checked and timed; the fastest correct one."""

from __future__ import annotations

import argparse
from typing import Any

from pytorchtricks.cli._common import MODEL_SPEC_HELP, _console
from pytorchtricks.core import PttError


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
