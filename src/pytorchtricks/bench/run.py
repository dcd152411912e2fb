"""Run catalogue bench cases through the measuring engine and turn them into result rows (JSONL-ready)."""

from __future__ import annotations

import inspect
import os
from collections.abc import Callable
from typing import Any

import torch

from pytorchtricks.catalogue import Trick, get
from pytorchtricks.clock import compare, environment, peak_memory, write_jsonl
from pytorchtricks.core import SIZES, PttError, resolve_device

ROUNDS = {"smoke": 3, "full": 7}
MIN_RUN_TIME_S = {"smoke": 0.05, "full": 0.3}


def _make_case(trick: Trick, size: str, device: torch.device) -> Any:
    mod = trick.load()
    fn = getattr(mod, "bench_case", None)
    if fn is None:
        raise PttError(f"trick {trick.name!r} has no bench case.")
    params = inspect.signature(fn).parameters
    if "device" in params:
        return fn(size, device=str(device))
    if device.type != "cpu":
        raise PttError(f"trick {trick.name!r} benchmarks on CPU only; drop --device {device}.")
    return fn(size)


def bench_trick(
    name: str,
    *,
    size: str = "smoke",
    device: str | torch.device = "cpu",
    rounds: int | None = None,
    memory: bool = True,
    on_round: Callable[[int], None] | None = None,
) -> list[dict[str, Any]]:
    """Measure one trick's bench case: baseline, treated and peers interleaved; one row per variant."""
    if size not in SIZES:
        raise PttError(f"unknown size {size!r}; use one of {', '.join(SIZES)}.")
    dev = resolve_device(device)
    trick = get(name)
    for need in trick.info.needs:
        if need == "cuda" and dev.type != "cuda":
            pass  # measured anyway: the row shows the (lack of) effect on this device honestly
    case = _make_case(trick, size, dev)
    variants: dict[str, Callable[[], Any]] = {"baseline": case.baseline, "treated": case.treated}
    variants.update({f"peer:{k}": v for k, v in case.peers.items()})
    try:
        if case.check is not None:
            case.check(case.baseline(), case.treated())
        cmp = compare(
            variants,
            rounds=rounds or ROUNDS[size],
            min_run_time_s=MIN_RUN_TIME_S[size],
            device=dev,
            on_round=on_round,
        )
        mem = {k: peak_memory(v, dev) for k, v in variants.items()} if memory else {}
    finally:
        if case.cleanup is not None:
            case.cleanup()
    env = environment(dev)
    rows = []
    for vname, res in cmp.variants.items():
        row: dict[str, Any] = {
            "kind": "bench",
            "trick": trick.name,
            "variant": vname,
            "size": size,
            "description": case.description,
            "unit": case.unit,
            "median_s": res.stats.median_s,
            "q1_s": res.stats.q1_s,
            "q3_s": res.stats.q3_s,
            "iqr_s": res.stats.iqr_s,
            "rounds": cmp.rounds,
            "interleaved": True,
            "items_per_s": case.items_per_call / res.stats.median_s,
            "ratio": res.ratio,
            "ratio_q1": res.ratio_q1,
            "ratio_q3": res.ratio_q3,
            "note": res.note,
            "env": env,
        }
        if vname in mem:
            row["peak_bytes"] = mem[vname].peak_bytes
            row["peak_method"] = mem[vname].method
        rows.append(row)
    return rows


def bench_many(
    names: list[str],
    *,
    size: str = "smoke",
    device: str | torch.device = "cpu",
    out_dir: str | None = None,
    progress: bool = True,
) -> tuple[list[dict[str, Any]], str | None]:
    """Benchmark several tricks with a progress bar; append rows to ``out_dir/bench-<size>-<device>.jsonl``."""
    from rich.progress import Progress

    rows: list[dict[str, Any]] = []
    dev = resolve_device(device)
    tricks = [get(n) for n in names]  # fail on a bad name before measuring anything
    with Progress(disable=not progress, transient=True) as bar:
        task = bar.add_task("benchmarking", total=len(tricks) * ROUNDS[size] if size in ROUNDS else None)
        for t in tricks:
            bar.update(task, description=f"bench {t.name}")
            rows.extend(bench_trick(t.name, size=size, device=dev, on_round=lambda _r: bar.advance(task)))
    path = None
    if out_dir is not None:
        path = os.path.join(out_dir, f"bench-{size}-{dev.type}.jsonl")
        write_jsonl(path, rows)
    return rows, path
